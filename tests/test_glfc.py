"""GLFC's clients (``strategies.glfc``): the compensation weights, the two losses, herding with
repeats, the per-client exemplar budget, the refusals, a resumed run and a run with clients
joining over time.

References are written from the equations with ``math`` (not the module re-run), with
hand-computed values in the comments. Runs use tiny CIFAR-format files of random pixels
(``tests.synthetic_data``) and the MLP.
"""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from cfl_bench.core.context import ClientState
from cfl_bench.core.errors import UserError
from cfl_bench.core.flat import FlatModel
from cfl_bench.flower.kind import check_flower
from cfl_bench.strategies.compose import build_strategy
from cfl_bench.strategies.declarations import GLFCOptions
from cfl_bench.strategies.glfc import (
    GLFC,
    compensation_weights,
    glfc_loss,
    herding_with_repeats,
)
from cfl_bench.strategies.glfc_proxy import (
    best_model,
    encoder,
    gradient_label,
    inversion_gap,
    reconstruct,
    sample_gradient,
)
from tests.data_free_runs import two_task_values
from tests.synthetic_data import write_tiny_cifar10
from tests.test_cli import in_process
from tests.test_icarl import Identity, enter, set_up
from tests.test_resume import assert_config_resumes_after_crash

LN3 = math.log(3.0)


@pytest.fixture(scope="module")
def cifar_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("cifar-format")
    write_tiny_cifar10(root, n=40, n_test=20)
    return root


def test_defaults_are_the_official_codes() -> None:
    # src/option.py: --memory_size 2000; GLFC.py _compute_loss: 0.5 * loss_cur + 0.5 * loss_old
    o = GLFCOptions()
    assert (o.memory, o.gc_weight, o.rd_weight) == (2000, 0.5, 0.5)


def test_compensation_weights_normalise_old_and_new_rows_apart() -> None:
    # classes 0, 1 learned. Row 0 (y=0, old): σ(0) = 1/2, g = 1/2, alone in its group: w = 1.
    # Row 1 (y=2, new): σ(0) -> g = 1/2; row 2 (y=3, new): σ(ln 3) = 3/4 -> g = 1/4; the
    # new group's mean g is 3/8, so w = 4/3 and 2/3.
    z = torch.zeros(3, 4)
    z[2, 3] = LN3
    w = compensation_weights(z, torch.tensor([0, 2, 3]), torch.tensor([1.0, 1, 0, 0]), None)
    assert w.tolist() == pytest.approx([1.0, 4 / 3, 2 / 3], rel=1e-6)
    # nothing learned yet: every row weighs 1 (the code's `g.clone().fill_(1.)`)
    none = compensation_weights(z, torch.tensor([0, 2, 3]), torch.zeros(4), None)
    assert none.tolist() == [1.0, 1.0, 1.0]
    # a padded row weighs 0 and leaves its group's mean alone
    masked = compensation_weights(
        z, torch.tensor([0, 2, 3]), torch.tensor([1.0, 1, 0, 0]), torch.tensor([1, 1, 0])
    )
    assert masked.tolist() == pytest.approx([1.0, 1.0, 0.0], rel=1e-6)


def bce(z: float, q: float) -> float:
    """Binary cross-entropy of σ(z) against the target q."""
    p = 1 / (1 + math.exp(-z))
    return -(q * math.log(p) + (1 - q) * math.log(1 - p))


def reference(
    z: list[list[float]],
    z_old: list[list[float]],
    y: list[int],
    seen: int,
    old: int,
    learned: set[int],
) -> tuple[float, float]:
    """L_GC and L_RD from the paper's/code's equations, over the first ``seen`` classes; the
    first ``old`` distilled against σ(z_old)."""
    g = [1 - 1 / (1 + math.exp(-row[t])) for row, t in zip(z, y, strict=True)]
    groups = [[i for i, t in enumerate(y) if (t in learned) == flag] for flag in (True, False)]
    w = [1.0] * len(y)
    if learned:
        for group in groups:
            mean = sum(g[i] for i in group) / len(group) if group else 0.0
            for i in group:
                w[i] = g[i] / mean
    gc = rd = 0.0
    for i, row in enumerate(z):
        for c in range(seen):
            onehot = 1.0 if c == y[i] else 0.0
            gc += w[i] * bce(row[c], onehot)
            q = 1 / (1 + math.exp(-z_old[i][c])) if c < old else onehot
            rd += bce(row[c], q)
    n = len(z) * seen
    return gc / n, rd / n


def test_the_loss_follows_the_equations() -> None:
    # 6 classes, tasks of 2: task 1, classes 0, 1 old, 0..3 seen, the client learned class 0
    z = [[1.0, -1.0, 0.5, 2.0, 3.0, -3.0], [0.0, 0.2, -0.4, 1.5, 9.0, 9.0]]
    z_old = [[0.5, 0.0, 9.0, 9.0, 9.0, 9.0], [-1.0, 2.0, 9.0, 9.0, 9.0, 9.0]]
    y = [0, 3]
    gc, rd = reference(z, z_old, y, 4, 2, {0})
    values = {
        "old": torch.tensor([1.0, 1, 0, 0, 0, 0]),
        "seen": torch.tensor([1.0, 1, 1, 1, 0, 0]),
        "learned": torch.tensor([1.0, 0, 0, 0, 0, 0]),
        "weight": torch.tensor(1.0),
    }
    args = (torch.tensor(z), torch.tensor(z_old), torch.tensor(y), values)
    got = glfc_loss(*args, (0.5, 0.5))
    assert float(got) == pytest.approx(0.5 * gc + 0.5 * rd, rel=1e-6)
    assert float(glfc_loss(*args, (1.0, 0.0))) == pytest.approx(gc, rel=1e-6)
    assert float(glfc_loss(*args, (0.0, 1.0))) == pytest.approx(rd, rel=1e-6)
    # without an old model the loss is L_GC at weight 1 (the code's first branch)
    alone = glfc_loss(*args[:3], {**values, "weight": torch.tensor(0.0)}, (0.5, 0.5))
    assert float(alone) == pytest.approx(gc, rel=1e-6)


def test_a_zero_output_model_loses_ln_2_per_class() -> None:
    # σ(0) = 1/2 against any target in [0, 1]: BCE = ln 2 for each seen class; no learned
    # classes, so w = 1 and L_GC = ln 2 = 0.6931; L_RD against σ(0) = 1/2 is ln 2 as well
    values = {
        "old": torch.tensor([1.0, 0, 0]),
        "seen": torch.tensor([1.0, 1, 0]),
        "learned": torch.zeros(3),
        "weight": torch.tensor(1.0),
    }
    got = glfc_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.tensor([0, 1]), values, (0.5, 0.5))
    assert float(got) == pytest.approx(0.693147, abs=1e-6)


def test_herding_repeats_a_row_as_the_code_does() -> None:
    # normalised rows 0°, 90°, 45°: their mean is (0.569, 0.569). Step 1: 45° is 0.195 away,
    # the others 0.714. Step 2 (sum (.707, .707)): 45° again -> 0.195, 0° -> (.854, .354)
    # 0.357. Step 3: 45° -> 0.195, 0° -> (.805, .471) 0.255. iCaRL's herding would take
    # 2, 0, 1.
    s = math.sqrt(0.5)
    features = torch.tensor([[1.0, 0.0], [0.0, 1.0], [s, s]])
    assert herding_with_repeats(features, 3).tolist() == [2, 2, 2]
    assert herding_with_repeats(features, 5).shape == (5,)  # m rows even from 3


def glfc(**options: Any) -> GLFC:
    """A set-up learner on a 3-feature stream: without the proxy server, whose encoder
    reads images (the proxy's tests set up their own)."""
    return set_up(GLFC({"proxy": "none", **options}), 6)


def test_the_memory_is_split_over_the_classes_the_client_learned() -> None:
    learner = glfc(memory=6)
    client = ClientState(index=0, generator=torch.Generator().manual_seed(0), buffer=None)
    model = FlatModel(Identity())
    c0 = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.5, 0.5], [2.0, 0.1]])
    c1 = torch.tensor([[1.0, 0.2], [0.9, 0.1]])
    enter(learner, client, torch.cat([c0, c1]), torch.tensor([0, 0, 0, 0, 1, 1]))
    learner.on_task_end(client, 0, model)
    state = client.state_for("glfc")
    # m = 6 // 2 classes = 3 each; class 1 has two rows and still keeps three (a repeat)
    assert state["y"].tolist() == [0, 0, 0, 1, 1, 1]  # type: ignore[union-attr]
    # this client then holds class 4 only (a 6-class-subset client of GLFC): 3 classes
    # learned, m = 2 (iCaRL's global count, 6 classes seen, would give 1)
    enter(learner, client, torch.tensor([[0.0, 1.0], [0.2, 1.0]]), torch.tensor([4, 4]))
    assert client.num_samples == 8
    inputs = learner.client_inputs(client, local_round(client))
    assert inputs["learned"].tolist() == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    learner.on_task_end(client, 1, model)
    assert state["y"].tolist() == [0, 0, 1, 1, 4, 4]  # type: ignore[union-attr]


def local_round(client: ClientState) -> Any:
    params = torch.zeros(3)
    client.task = 1
    return SimpleNamespace(broadcast=SimpleNamespace(params=params, buffers=torch.zeros(0)))


def test_entering_task_2_keeps_the_global_model_as_the_old_model() -> None:
    learner = glfc()
    client = ClientState(index=0, generator=torch.Generator().manual_seed(0), buffer=None)
    first = SimpleNamespace(
        broadcast=SimpleNamespace(params=torch.zeros(3), buffers=torch.zeros(0))
    )
    client.task = 0
    inputs = learner.client_inputs(client, first)  # type: ignore[arg-type]
    assert float(inputs["weight"]) == 0.0 and inputs["old"].sum() == 0  # task 1: L_GC alone
    theta = torch.tensor([1.0, 2.0, 3.0])
    entered = SimpleNamespace(broadcast=SimpleNamespace(params=theta, buffers=torch.zeros(0)))
    client.task = 1
    inputs = learner.client_inputs(client, entered)  # type: ignore[arg-type]
    assert float(inputs["weight"]) == 1.0
    assert inputs["old"].tolist() == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    assert inputs["seen"].tolist() == [1.0, 1.0, 1.0, 1.0, 0.0, 0.0]
    later = SimpleNamespace(broadcast=SimpleNamespace(params=theta * 2, buffers=torch.zeros(0)))
    # a later round of the same task keeps the model the client entered the task with
    assert learner.client_inputs(client, later)["teacher"].tolist() == [1.0, 2.0, 3.0]  # type: ignore[arg-type]


def run_args(root: Path, out: Path, strategy: str, *extra: str, clients: int = 2) -> list[str]:
    return [
        "run",
        *("--stream", "seq-cifar10", "--data-root", str(root), "--model", "mlp"),
        *("--strategy", strategy, "--tasks", "2", "--rounds-per-task", "1", "--epochs", "1"),
        *("--clients", str(clients), "--threads", "1", "--out", str(out), *extra),
    ]


@pytest.mark.parametrize(
    ("strategy", "extra", "fragment"),
    [
        ("glfc:memory=0", (), "option glfc:memory must be"),
        ("glfc:gc_weight=-1", (), "option glfc:gc_weight must be"),
        ("glfc:old=1", (), "unknown option 'old' for 'glfc'"),
        ("glfc", ("--executor", "vectorized"), "which 'glfc' replaces with its own loss"),
        ("glfc", ("--model", "linear"), "which model 'linear' does not expose"),
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


def test_a_domain_il_stream_is_refused(tmp_path: Path) -> None:
    code, output = in_process(
        "run", "--stream", "rot-digits", "--strategy", "glfc", "--out", str(tmp_path / "r")
    )
    assert code == 2, output
    assert "glfc keeps exemplars" in output and "Traceback" not in output


def test_the_flower_executor_refuses_exemplars(monkeypatch: pytest.MonkeyPatch) -> None:
    import cfl_bench.flower

    monkeypatch.setattr(cfl_bench.flower, "require_flwr", lambda: None)
    run = SimpleNamespace(
        config=SimpleNamespace(clients_per_chunk=None, compile=False),
        stream=SimpleNamespace(per_round=False),
        strategy=build_strategy("glfc"),
    )
    with pytest.raises(UserError, match="keep history or exemplars of earlier tasks"):
        check_flower(run)  # type: ignore[arg-type]


def test_clients_joining_over_time_run_end_to_end(cifar_root: Path, tmp_path: Path) -> None:
    """GLFC's protocol: 2 clients at task 1, 1 joins at task 2; the loss reported in task 1
    is the binary one (two seen classes at σ ≈ 1/2: about ln 2 per class, not CE's ln 10)."""
    out = tmp_path / "arrive"
    arrivals = ("--arrivals", "glfc:initial=2,new=1,receive=0.5,per_round=2")
    code, output = in_process(
        *run_args(
            cifar_root, out, "glfc:memory=20,proxy=none", *arrivals, "--partition", "iid", clients=3
        )
    )
    assert code == 0, output
    rows = [line.split(",") for line in (out / "records.csv").read_text().splitlines()[1:]]
    loss = [float(r[5]) for r in rows if r[0] == "1" and r[4] == "train_loss"]
    assert loss and 0.3 < loss[0] < 1.0


def test_a_crashed_run_resumes_to_identical_records(cifar_root: Path, tmp_path: Path) -> None:
    """The exemplars and each client's teacher survive a checkpoint."""
    strategy = "glfc:memory=20,inversion_iterations=1"
    values = two_task_values(cifar_root, strategy, model="mlp")
    assert_config_resumes_after_crash(values, tmp_path, 2)  # after task 1's end


# -- the proxy server's building blocks (strategies.glfc_proxy) ---------------------------------


def test_the_encoder_is_the_codes_lenet() -> None:
    # myNetwork.LeNet(channel=3, hideen=768, num_classes=100): 32x32 -> 16 -> 8 after the two
    # stride-2 convolutions, 12 channels: 12*8*8 = 768 features; weights_init: U[-0.5, 0.5]
    model = encoder((3, 32, 32), 100, torch.Generator().manual_seed(0))
    assert model.fc.in_features == 768 and model.fc.out_features == 100
    sizes = [p.numel() for p in model.parameters()]
    assert sizes == [900, 12, 3600, 12, 3600, 12, 76800, 100]  # 85,036 floats per gradient
    assert all(float(p.detach().abs().max()) <= 0.5 for p in model.parameters())


def test_the_label_is_the_lowest_row_of_the_last_weight_gradient() -> None:
    rows = torch.tensor([[1.0, 2.0], [-1.0, -0.5], [0.3, 0.0]])  # sums 3, -1.5, 0.3
    assert gradient_label([torch.zeros(1), rows, torch.zeros(3)]) == 1
    model = encoder((1, 8, 8), 4, torch.Generator().manual_seed(0))
    x = torch.rand((1, 8, 8), generator=torch.Generator().manual_seed(1))
    assert [gradient_label(sample_gradient(model, x, y)) for y in range(4)] == [0, 1, 2, 3]


def test_gradient_inversion_recovers_the_sample() -> None:
    # a fixed-seed property: on the tiny LeNet (8x8 grey inputs, 4 classes) 10 L-BFGS steps
    # from N(0, 1) rebuild the client's sample within 1e-3 relative (measured: 1.7e-4),
    # where the all-zero image's gradient is 0.70 away (squared)
    model = encoder((1, 8, 8), 4, torch.Generator().manual_seed(0))
    x = torch.rand((1, 8, 8), generator=torch.Generator().manual_seed(1))
    gradient = sample_gradient(model, x, 2)
    kept = reconstruct(model, gradient, (1, 8, 8), torch.Generator().manual_seed(2), 10, 3)
    assert kept.shape == (3, 1, 8, 8)
    assert float((kept[-1] - x).norm() / x.norm()) < 1e-3
    assert (
        inversion_gap(model, gradient, kept[-1])
        < 1e-6
        < inversion_gap(model, gradient, torch.zeros(1, 8, 8))
    )


def test_the_proxy_keeps_the_most_accurate_model_the_latest_on_ties() -> None:
    assert best_model([10.0, 30.0, 30.0, 20.0]) == 2
    assert best_model([5.0]) == 0
