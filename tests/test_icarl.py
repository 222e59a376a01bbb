"""Federated iCaRL (``strategies.icarl``): herding, the old-class distillation, the exemplar
memory under its budget, the refusals, and a resumed run.

Hand-computed values throughout: the herding order of a 4-row feature matrix, the
distillation of a 2-row batch from the equation with ``math``, the exemplars kept per class.
Runs use tiny CIFAR-format files of random pixels (``tests.synthetic_data``) and the MLP.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any, TypeVar

import pytest
import torch
from torch import nn

from cfl_bench.core.context import ClientState
from cfl_bench.core.errors import UserError
from cfl_bench.core.flat import FlatModel
from cfl_bench.flower.kind import check_flower
from cfl_bench.strategies.base import ModelFacts
from cfl_bench.strategies.compose import build_strategy
from cfl_bench.strategies.declarations import ICaRLOptions
from cfl_bench.strategies.icarl import (
    ICaRL,
    class_feature_sums,
    herding,
    nme_scores,
    old_class_kd,
    random_memory_split,
    sigmoid_loss,
)
from tests.data_free_runs import two_task_values
from tests.helpers import env
from tests.synthetic_data import write_tiny_cifar10
from tests.test_cli import in_process
from tests.test_resume import assert_config_resumes_after_crash

ICaRLType = TypeVar("ICaRLType", bound=ICaRL)


@pytest.fixture(scope="module")
def cifar_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("cifar-format")
    write_tiny_cifar10(root, n=40, n_test=20)
    return root


def test_herding_takes_the_hand_computed_order() -> None:
    # mean (1.25, 0.75). k=1: distances 0.79, 1.27, 0.35, 1.77 -> row 2. k=2 (sum (1, 1)):
    # means (1, .5), (.5, 1), (2, 1) -> 0.35, 0.79, 0.79 -> row 0. k=3 (sum (2, 1)):
    # (2/3, 2/3) -> 0.59, (5/3, 2/3) -> 0.42 -> row 3; then row 1. The rows nearest the mean
    # would be 2, 0, 1, 3: herding differs at its third pick.
    features = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [3.0, 1.0]])
    assert herding(features, 4).tolist() == [2, 0, 3, 1]
    assert herding(features, 2).tolist() == [2, 0]
    assert herding(features, 9).tolist() == [2, 0, 3, 1]  # no more rows than there are


def kd_reference(z: list[float], z_old: list[float], old: list[int], t: float) -> float:
    """−Σ_{c∈old} softmax(z_old/T)_c · log softmax(z/T)_c, softmaxes over the old classes."""
    zs = [z[c] / t for c in old]
    zt = [z_old[c] / t for c in old]
    lse_s = math.log(sum(math.exp(v) for v in zs))
    lse_t = math.log(sum(math.exp(v) for v in zt))
    return -sum(math.exp(b - lse_t) * (a - lse_s) for a, b in zip(zs, zt, strict=True))


def test_old_class_distillation_follows_the_equation() -> None:
    z = [[1.0, 2.0, 3.0], [0.5, -1.0, 4.0]]
    z_old = [[2.0, 0.0, 5.0], [1.0, 1.0, -2.0]]
    # row 1 by hand: student log-softmax of (0.5, 1) = (-0.9741, -0.4741), teacher softmax of
    # (1, 0) = (0.7311, 0.2689): 0.7311·0.9741 + 0.2689·0.4741 = 0.8396
    assert kd_reference(z[0], z_old[0], [0, 1], 2.0) == pytest.approx(0.8396, abs=1e-4)
    want = (
        kd_reference(z[0], z_old[0], [0, 1], 2.0) + kd_reference(z[1], z_old[1], [0, 1], 2.0)
    ) / 2
    outputs = torch.tensor(z, requires_grad=True)
    got = old_class_kd(outputs, torch.tensor(z_old), torch.tensor([1.0, 1.0, 0.0]), 2.0)
    assert float(got.detach()) == pytest.approx(want, rel=1e-6)
    got.backward()
    assert outputs.grad is not None
    assert outputs.grad[:, 2].tolist() == [0.0, 0.0]  # the new class is not distilled
    # a padded batch's mask keeps the real rows only
    masked = old_class_kd(
        torch.tensor(z),
        torch.tensor(z_old),
        torch.tensor([1.0, 1.0, 0.0]),
        2.0,
        torch.tensor([True, False]),
    )
    assert float(masked) == pytest.approx(kd_reference(z[0], z_old[0], [0, 1], 2.0), rel=1e-6)


def test_defaults_are_the_official_codes() -> None:
    # TARGET's methods/base.py sets args["memory_size"] = 2000 (over main.py's 300) and
    # methods/icarl.py samples it with np.random.choice; T = 2; loss = loss_clf + loss_kd.
    o = ICaRLOptions()
    assert (o.memory, o.selection, o.loss, o.temperature, o.weight, o.classifier) == (
        2000,
        "random",
        "softmax",
        2.0,
        1.0,
        "cnn",
    )


def bce(p: float, q: float) -> float:
    """Binary cross-entropy of probability p against target q."""
    return -(q * math.log(p) + (1 - q) * math.log(1 - p))


def sigmoid(v: float) -> float:
    return 1 / (1 + math.exp(-v))


def test_the_papers_sigmoid_loss_follows_its_equation() -> None:
    # task 1 of 2-class tasks: classes 0, 1 old (targets σ(z_old)), 2, 3 new (one-hot of
    # y = 2), classes 4, 5 not seen yet (no term)
    z = [1.0, -1.0, 0.5, 2.0, 3.0, -3.0]
    z_old = [0.5, 0.0, 9.0, 9.0, 9.0, 9.0]
    want = (
        bce(sigmoid(1.0), sigmoid(0.5))
        + bce(sigmoid(-1.0), 0.5)
        + bce(sigmoid(0.5), 1.0)
        + bce(sigmoid(2.0), 0.0)
    )
    got = sigmoid_loss(
        torch.tensor([z]),
        torch.tensor([z_old]),
        torch.tensor([2]),
        torch.tensor([1.0, 1.0, 0.0, 0.0, 0.0, 0.0]),
        torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0, 0.0]),
    )
    assert float(got) == pytest.approx(want, rel=1e-6)


class Identity(nn.Module):
    """A model whose features are its 2-d inputs (so herding's choice is known)."""

    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(2, 4)

    def representation(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(x)


def set_up(learner: ICaRLType, tasks: int) -> ICaRLType:
    """``learner`` set up on a class-IL test stream of ``tasks`` tasks × 2 classes, with a
    model that offers its features (identity): herding reads the inputs as features."""
    facts = ModelFacts("identity", frozenset({"features"}))
    e = dataclasses.replace(env("seq-test", "class-il", tasks, 2), classes_per_task=2, model=facts)
    learner.setup(e)
    return learner


def icarl(**options: Any) -> ICaRL:
    return set_up(ICaRL(options), 4)


def enter(learner: ICaRL, client: ClientState, x: torch.Tensor, y: torch.Tensor) -> None:
    client.train_x, client.train_y = learner.local_data(client, x, y)


def test_herding_keeps_memory_over_seen_classes_per_class() -> None:
    learner = icarl(memory=6, selection="herding")
    client = ClientState(index=0, generator=torch.Generator().manual_seed(0), buffer=None)
    model = FlatModel(Identity())
    # class 0: four unit rows at 0°, 90°, 45°, 60°; class 1: three rows
    c0 = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.7071, 0.7071], [0.5, 0.8660]])
    c1 = torch.tensor([[1.0, 0.2], [0.9, 0.1], [0.3, 0.3]])
    enter(learner, client, torch.cat([c0, c1]), torch.tensor([0, 0, 0, 0, 1, 1, 1]))
    learner.on_task_end(client, 0, model)
    state = client.state_for("icarl")
    # m = 6 // 2 classes = 3. Class 0's mean is (0.552, 0.643); k=1: distances 0.78, 0.66,
    # 0.17, 0.23 -> 45°; k=2: 0.42, 0.29, 0.15 -> 60°; k=3: 0.22, 0.26 -> 0°. Class 1 keeps
    # all three of its rows.
    kept = state["y"]
    assert isinstance(kept, torch.Tensor)
    assert kept.tolist() == [0, 0, 0, 1, 1, 1]
    assert state["x"][:3].tolist() == [c0[2].tolist(), c0[3].tolist(), c0[0].tolist()]  # type: ignore[index]
    # task 1 trains on its 5 rows plus the 6 exemplars
    new = torch.tensor([[0.0, 1.0], [0.1, 1.0], [1.0, 0.0], [1.0, 0.1], [0.5, 0.5]])
    enter(learner, client, new, torch.tensor([2, 2, 3, 3, 3]))
    assert client.num_samples == 11
    learner.on_task_end(client, 1, model)
    # m = 6 // 4 = 1 per class: each old class keeps its first exemplar, each new class one
    assert state["y"].tolist() == [0, 1, 2, 3]  # type: ignore[union-attr]
    assert state["x"][0].tolist() == c0[2].tolist()  # type: ignore[index]


def test_random_memory_is_a_uniform_draw_of_everything_seen() -> None:
    learner = icarl(memory=5)
    client = ClientState(index=0, generator=torch.Generator().manual_seed(0), buffer=None)
    model = FlatModel(Identity())
    enter(learner, client, torch.rand(4, 2), torch.tensor([0, 0, 1, 1]))
    learner.on_task_end(client, 0, model)
    state = client.state_for("icarl")
    assert state["y"].tolist() == [0, 0, 1, 1]  # type: ignore[union-attr]  # 4 ≤ 5: all kept
    enter(learner, client, torch.rand(6, 2), torch.tensor([2, 2, 2, 3, 3, 3]))
    learner.on_task_end(client, 1, model)
    assert state["y"].shape == (5,) and state["seen"] == 10  # type: ignore[union-attr]
    # the old share of a uniform 8-subset of 10 old + 30 new examples is hypergeometric,
    # mean 8·10/40 = 2, sd 1.11: the mean of 4000 draws is within 0.08 (4.5 sd of the mean)
    gen = torch.Generator().manual_seed(1)
    draws = [random_memory_split(10, 30, 8, gen) for _ in range(4000)]
    assert sum(draws) / len(draws) == pytest.approx(2.0, abs=0.08)
    assert random_memory_split(3, 4, 8, gen) == 3


def run_args(root: Path, out: Path, strategy: str, *extra: str) -> list[str]:
    return [
        "run",
        *("--stream", "seq-cifar10", "--data-root", str(root), "--model", "mlp"),
        *("--strategy", strategy, "--tasks", "2", "--rounds-per-task", "1", "--epochs", "1"),
        *("--clients", "2", "--threads", "1", "--out", str(out), *extra),
    ]


@pytest.mark.parametrize(
    ("strategy", "extra", "fragment"),
    [
        ("icarl:memory=0", (), "option icarl:memory must be"),
        ("icarl:selection=best", (), "option icarl:selection must be one of random, herding"),
        (
            "icarl:loss=sigmoid,temperature=3",
            (),
            "icarl:temperature has no effect with loss=sigmoid",
        ),
        ("icarl:temperature=0", (), "option icarl:temperature must be"),
        ("icarl:classifier=nme", (), "classifier=nme classifies by the means of the exemplars"),
        ("icarl", ("--executor", "vectorized"), "not on the exemplars 'icarl' adds"),
        (
            "icarl:loss=sigmoid",
            ("--executor", "vectorized"),
            "which 'icarl' replaces with its own loss",
        ),
        ("icarl:selection=herding", ("--model", "linear"), "which model 'linear' does not"),
    ],
)
def test_bad_choices_are_refused_in_one_line(
    cifar_root: Path, tmp_path: Path, strategy: str, extra: tuple[str, ...], fragment: str
) -> None:
    out = tmp_path / "run"
    code, output = in_process(*run_args(cifar_root, out, strategy, *extra))
    assert code == 2, output
    assert fragment in " ".join(output.split()) and "Traceback" not in output
    assert not (out / "records.csv").exists()


def test_the_papers_loss_replaces_the_cross_entropy(cifar_root: Path, tmp_path: Path) -> None:
    """loss=sigmoid trains: the reported loss of task 1 (no teacher: every seen class against
    its one-hot label) is the binary one, not CE's (ln 10 = 2.30 for a fresh 10-class model);
    two seen classes at σ ≈ 1/2 give about 2 · ln 2 = 1.39 per example."""
    out = tmp_path / "sigmoid"
    code, output = in_process(*run_args(cifar_root, out, "icarl:loss=sigmoid"))
    assert code == 0, output
    rows = [line.split(",") for line in (out / "records.csv").read_text().splitlines()[1:]]
    loss = [float(r[5]) for r in rows if r[0] == "1" and r[4] == "train_loss"]
    assert loss and 0.5 < loss[0] < 1.9


def test_the_learner_s_own_term_joins_the_loss_terms() -> None:
    assert [c.name for c in build_strategy("icarl+fedprox").loss_terms] == ["icarl", "fedprox"]
    assert [c.name for c in build_strategy("der+fedprox").loss_terms] == ["fedprox"]


def test_the_flower_executor_refuses_exemplars(monkeypatch: pytest.MonkeyPatch) -> None:
    import cfl_bench.flower

    monkeypatch.setattr(cfl_bench.flower, "require_flwr", lambda: None)
    run = SimpleNamespace(
        config=SimpleNamespace(clients_per_chunk=None, compile=False),
        stream=SimpleNamespace(per_round=False),
        strategy=build_strategy("icarl"),
    )
    with pytest.raises(UserError, match="keep history or exemplars of earlier tasks"):
        check_flower(run)  # type: ignore[arg-type]


def test_a_domain_il_stream_is_refused(tmp_path: Path) -> None:
    code, output = in_process(
        "run", "--stream", "rot-digits", "--strategy", "icarl", "--out", str(tmp_path / "r")
    )
    assert code == 2, output
    assert "needs a class-incremental stream" in " ".join(output.split())
    assert "Traceback" not in output


def test_a_crashed_run_resumes_to_identical_records(cifar_root: Path, tmp_path: Path) -> None:
    """Exemplars and the server's class sums survive a checkpoint: crashed after task 1's
    last round, the resumed run trains on the exemplars and scores round 3 by NME."""
    strategy = "icarl:memory=30,selection=herding,classifier=nme"
    values = two_task_values(cifar_root, strategy, model="mlp")
    values["eval_every_round"] = True  # round 3 scores NME with the means of round 2's request
    assert_config_resumes_after_crash(values, tmp_path, 2)  # after task 1's end


def test_nearest_mean_scores_are_the_hand_computed_distances() -> None:
    # class 0: two exemplars summing to (2, 0) -> mean (1, 0); class 1: one at (3, 4) ->
    # mean (0.6, 0.8) after dividing by its norm; class 2: no exemplar anywhere
    sums = torch.tensor([[2.0, 0.0, 2.0], [3.0, 4.0, 1.0], [0.0, 0.0, 0.0]])
    features = torch.tensor([[0.6, 0.8], [1.0, 0.0]])
    scores = nme_scores(features, sums)
    # (0.6, 0.8): 0.16 + 0.64 = 0.8 to class 0, 0 to class 1; (1, 0): 0 and 0.16 + 0.64
    assert scores[:, :2].flatten().tolist() == pytest.approx([-0.8, 0.0, 0.0, -0.8], abs=1e-6)
    assert scores[:, 2].tolist() == [float("-inf")] * 2
    assert scores.argmax(dim=1).tolist() == [1, 0]


def test_federated_class_means_equal_the_centralised_ones() -> None:
    """Each client sends per-class sums and counts; the server's Σ gives the means of the
    union of the clients' exemplars (PyCIL's class means: the mean, divided by its norm)."""
    gen = torch.Generator().manual_seed(0)
    f1, y1 = torch.randn(5, 3, generator=gen), torch.tensor([0, 1, 1, 2, 0])
    f2, y2 = torch.randn(4, 3, generator=gen), torch.tensor([1, 1, 0, 0])
    total = class_feature_sums(f1, y1, 4) + class_feature_sums(f2, y2, 4)
    assert total[:, -1].tolist() == [4.0, 4.0, 1.0, 0.0]
    everyone, labels = torch.cat([f1, f2]), torch.cat([y1, y2])
    query = torch.randn(6, 3, generator=gen)
    for c in range(3):
        mean = everyone[labels == c].mean(dim=0)
        mean = mean / mean.norm()
        want = -((query - mean) ** 2).sum(dim=1)
        assert torch.allclose(nme_scores(query, total)[:, c], want, atol=1e-6)


def test_nme_runs_and_counts_the_class_sums(cifar_root: Path, tmp_path: Path) -> None:
    out = tmp_path / "nme"
    strategy = "icarl:memory=20,selection=herding,classifier=nme"
    code, output = in_process(*run_args(cifar_root, out, strategy))
    assert code == 0, output
    summary = json.loads((out / "summary.json").read_text())
    # 2 task ends x 2 clients x 10 classes x (100 MLP features + 1 count) x 4 bytes
    assert summary["bytes_by_payload"]["up:icarl.class_sums"] == 2 * 2 * 10 * 101 * 4
    rows = [line.split(",") for line in (out / "records.csv").read_text().splitlines()[1:]]
    # before task 2 is trained its classes have no mean: NME never predicts them
    assert [r[5] for r in rows if r[:5] == ["1", "0", "1", "global", "acc"]] == ["0.0"]
    # the classifier changes the evaluation only: classifier=cnn trains the same
    cnn = tmp_path / "cnn"
    code, output = in_process(*run_args(cifar_root, cnn, "icarl:memory=20,selection=herding"))
    assert code == 0, output

    def losses(run: Path) -> list[str]:
        return [x for x in (run / "records.csv").read_text().splitlines() if "train_loss" in x]

    assert losses(cnn) == losses(out) and len(losses(out)) == 2


def test_nme_asks_only_the_clients_that_have_joined(cifar_root: Path, tmp_path: Path) -> None:
    """``--arrivals``: client 1 joins at task 2, so the first task end asks client 0 only
    (one client never there would hold no exemplars, and must not be counted); the second
    asks both (client 0 keeps its task-1 data: ⌊1 · 0.9⌋ = 0 of the one client there
    receive task 2)."""
    out = tmp_path / "arrivals"
    strategy = "icarl:memory=20,selection=herding,classifier=nme"
    arrivals = ("--arrivals", "glfc:initial=1,new=1,per_round=2")
    partition = ("--partition", "class-subsets:classes_per_client=2")
    code, output = in_process(*run_args(cifar_root, out, strategy, *arrivals, *partition))
    assert code == 0, output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["bytes_by_payload"]["up:icarl.class_sums"] == (1 + 2) * 10 * 101 * 4


def test_the_cnn_classifier_scores_only_the_classes_of_the_tasks_so_far() -> None:
    """PyCIL's and GLFC's heads grow with the tasks: in task 1 of 2-class tasks the argmax is
    over classes 0-1, so the untouched output of class 3 (logit 9) must not win; once task 2
    has started, classes 0-3 are known and it does."""
    learner = icarl()
    assert (learner.num_classes, learner.classes_per_task) == (4, 2)
    classify = learner.evaluation_classifier()
    assert classify is not None
    module = nn.Linear(4, 4, bias=False)
    with torch.no_grad():
        module.weight.copy_(torch.eye(4))
    x = torch.tensor([[1.0, 3.0, 0.5, 9.0]])
    learner.on_round_start(SimpleNamespace(task=0))  # type: ignore[arg-type]
    first = classify(module, x)
    assert first is not None and first[0, :2].tolist() == [1.0, 3.0]
    assert torch.isinf(first[0, 2:]).all() and int(first.argmax()) == 1
    learner.on_round_start(SimpleNamespace(task=1))  # type: ignore[arg-type]
    second = classify(module, x)
    assert second is not None and second[0].tolist() == [1.0, 3.0, 0.5, 9.0]
    assert int(second.argmax()) == 3
