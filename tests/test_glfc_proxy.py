"""GLFC's proxy server wired into ``glfc`` (``proxy=code``): which clients upload and when,
which old model a client distils from, which global model the server keeps as best_1 and
best_2, the bytes that travel, one tiny end-to-end run and the refusals.

Expected values are worked by hand from the official code's rules (conditionWang/FCIL,
``src/GLFC.py`` ``train`` / ``proto_grad_sharing``, ``src/ProxyServer.py`` ``dataloader``)
and written in the comments; the prototype's SGD is re-derived with ``math``.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import nn

from cfl_bench.core.context import ClientState
from cfl_bench.core.errors import UserError
from cfl_bench.core.flat import FlatModel
from cfl_bench.strategies.base import ModelFacts
from cfl_bench.strategies.glfc import GLFC, old_model_choice
from cfl_bench.strategies.glfc_proxy import (
    monitor_accuracy,
    prototype_index,
    refine_prototype,
)
from tests.helpers import env
from tests.synthetic_data import write_tiny_cifar10
from tests.test_cli import in_process


@pytest.fixture(scope="module")
def cifar_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("cifar-format")
    write_tiny_cifar10(root, n=40, n_test=20)
    return root


def proxy_learner(shape: tuple[int, ...] = (1, 2, 2), **options: Any) -> GLFC:
    """``glfc`` set up on a class-IL stream of 3 tasks × 2 classes with inputs ``shape``."""
    facts = ModelFacts("identity", frozenset({"features"}))
    e = dataclasses.replace(
        env("seq-test", "class-il", 6, 3), classes_per_task=2, model=facts, input_shape=shape
    )
    learner = GLFC(options)
    learner.setup(e)
    return learner


def test_the_old_model_each_round_as_the_codes_train() -> None:
    # GLFC_model.train: model_old = [best_1, best_2]; best_2 there -> best_2 on the signal
    # round, best_1 otherwise (none while best_1 is None); no best_2 -> none on a signal
    # round (best_1 is None too), and the client's old model is left as it was otherwise
    assert old_model_choice(True, True, True) == "best_2"
    assert old_model_choice(False, True, True) == "best_1"
    assert old_model_choice(False, False, True) == "none"
    assert old_model_choice(True, False, True) == "best_2"
    assert old_model_choice(True, False, False) == "none"
    assert old_model_choice(False, False, False) == "keep"


def test_a_client_signals_in_the_first_round_of_each_task_it_receives() -> None:
    learner = proxy_learner()
    mover = ClientState(index=0, generator=torch.Generator(), buffer=None)
    keeper = ClientState(index=1, generator=torch.Generator(), buffer=None)
    absent = ClientState(index=2, generator=torch.Generator(), buffer=None)
    for c in (mover, keeper):
        c.train_y = torch.zeros(1, dtype=torch.long)
    server = SimpleNamespace(clients=[mover, keeper, absent], task=0)
    signals = []
    # the mover trains tasks 0, 0, 1, 1, 2; the keeper stays on task 0 (it gets no new data)
    for task in (0, 0, 1, 1, 2):
        mover.task = task
        learner.on_round_start(server)  # type: ignore[arg-type]
        signals.append((mover.state_for("glfc")["signal"], keeper.state_for("glfc")["signal"]))
    assert signals == [(True, True), (False, False), (True, False), (False, False), (True, False)]
    assert absent.extras == {}  # a client that has not joined checks nothing


def test_the_old_model_comes_from_the_broadcast_and_stays_between_rounds() -> None:
    learner = proxy_learner()
    client = ClientState(index=0, generator=torch.Generator(), buffer=None)
    client.task = 2
    state = client.state_for("glfc")
    theta = torch.zeros(3)
    best_1 = torch.tensor([1.0, 1.0, 1.0, 10.0])  # 3 parameters, then 1 buffer
    best_2 = torch.tensor([2.0, 2.0, 2.0, 20.0])
    payloads = {
        "glfc.best_1": best_1,
        "glfc.best_2": best_2,
        "glfc.best_classes": torch.tensor([2, 4]),
    }

    def inputs(signal: bool, sent: dict[str, torch.Tensor]) -> Any:
        state["signal"] = signal
        broadcast = SimpleNamespace(params=theta, buffers=torch.zeros(1), payloads=sent)
        return learner.client_inputs(client, SimpleNamespace(broadcast=broadcast))  # type: ignore[arg-type]

    first = inputs(True, payloads)  # the task's first round: best_2, kept at 4 classes
    assert first["teacher"].tolist() == [2.0, 2.0, 2.0]
    assert first["teacher_buffers"].tolist() == [20.0]
    assert first["old"].tolist() == [1.0, 1.0, 1.0, 1.0, 0.0, 0.0]
    assert first["seen"].tolist() == [1.0] * 6 and float(first["weight"]) == 1.0
    later = inputs(False, payloads)  # later rounds: best_1, kept at 2 classes
    assert later["teacher"].tolist() == [1.0, 1.0, 1.0]
    assert later["old"].tolist() == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    # nothing kept by the server yet: the client keeps the old model it had ...
    assert inputs(False, {})["teacher"].tolist() == [1.0, 1.0, 1.0]
    # ... except in a first round, which drops it (L_GC alone)
    none = inputs(True, {})
    assert float(none["weight"]) == 0.0 and none["old"].sum() == 0


def linear_server(weight: list[list[float]], task: int, round_index: int) -> Any:
    """A server whose θ_g is a 2-class linear model without bias."""
    module = nn.Linear(2, 2, bias=False)
    model = FlatModel(module)
    params = torch.tensor(weight).flatten()
    return SimpleNamespace(
        model=model,
        global_params=params,
        global_buffers=torch.zeros(0),
        task=task,
        round_index=round_index,
    )


def test_the_server_keeps_best_2_and_moves_it_to_best_1_on_new_gradients(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    learner = proxy_learner()
    # the rebuilt set: 4 samples, labels 0, 0, 1, 1 (inversion replaced: its rows are the
    # one-hot directions, so the identity scores 100 and the swap 0)
    x = torch.tensor([[1.0, 0.0], [2.0, 0.0], [0.0, 1.0], [0.0, 2.0]])
    y = torch.tensor([0, 0, 1, 1])
    monkeypatch.setattr(learner, "_rebuild", lambda pool, r: (x, y))
    identity, swap = [[1.0, 0.0], [0.0, 1.0]], [[0.0, 1.0], [1.0, 0.0]]
    half = [[1.0, 0.0], [1.0, 0.0]]  # always class 0 (ties to the first): 2 of 4 right
    learner._pool = [torch.zeros(1)]
    learner.after_aggregate(linear_server(half, 0, 1))  # new set; 50 >= 0: best_2 = half
    assert learner.best_perf == 50 and learner.best_1.numel() == 0
    assert learner.best_2.tolist() == [1.0, 0.0, 1.0, 0.0]
    learner.after_aggregate(linear_server(swap, 0, 2))  # 0 < 50: kept
    assert learner.best_2.tolist() == [1.0, 0.0, 1.0, 0.0]
    learner.after_aggregate(linear_server(identity, 0, 3))  # 100 >= 50
    assert learner.best_perf == 100 and learner.best_2.tolist() == [1.0, 0.0, 0.0, 1.0]
    assert learner.best_classes.tolist() == [0, 2]
    # task 1's first round brings gradients: best_1 <- best_2, then θ_g scores 50 on the new
    # set, below the best score of the old set (never reset): best_2 stays the identity
    learner._pool = [torch.zeros(1)]
    learner.after_aggregate(linear_server(half, 1, 4))
    assert learner.best_1.tolist() == [1.0, 0.0, 0.0, 1.0]
    assert learner.best_2.tolist() == [1.0, 0.0, 0.0, 1.0] and learner.best_perf == 100
    assert learner.best_classes.tolist() == [2, 2] and learner._pool == []
    sent = learner.broadcast(SimpleNamespace())  # type: ignore[arg-type]
    assert sorted(sent) == ["glfc.best_1", "glfc.best_2", "glfc.best_classes"]


def test_the_score_is_the_codes_integer_percent_over_the_seen_classes() -> None:
    # 2 of 3 right: 100·2 // 3 = 66 (not 66.7); column 2 (not seen) would win row 0
    outputs = torch.tensor([[1.0, 0.0, 5.0], [0.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    assert monitor_accuracy(outputs, torch.tensor([0, 1, 1]), 2) == 66
    assert monitor_accuracy(outputs, torch.tensor([0, 1, 1]), 3) == 33


def test_the_prototype_is_the_row_nearest_its_class_mean() -> None:
    # rows (1, 0), (0, 1), (0.6, 0.8): mean (0.533, 0.6); distances 0.78, 0.68, 0.21
    features = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]])
    assert prototype_index(features) == 2


def test_the_prototype_moves_50_sgd_steps_on_the_bce() -> None:
    # one output z = a·x (a = 0.5), target 1: d/dx −log σ(a·x) = −a·(1 − σ(a·x)); each step
    # x ← x − lr·(that + 1e-5·x), lr = 0.2, from x = 0.3
    a, lr, value = 0.5, 0.2, 0.3
    for _ in range(50):
        grad = -a * (1 - 1 / (1 + math.exp(-a * value)))
        value -= lr * (grad + 1e-5 * value)
    model = nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        model.weight.fill_(a)
    moved = refine_prototype(nn.Sequential(nn.Flatten(), model), torch.tensor([[[0.3]]]), 0, 1, lr)
    assert float(moved.flatten()[0]) == pytest.approx(value, rel=1e-5)
    assert float(model.weight) == a  # the model is not trained


def test_the_cost_probes_copy_neither_moves_prototypes_nor_uploads() -> None:
    learner = proxy_learner()
    client = ClientState(index=0, generator=torch.Generator(), buffer=None)
    client.state_for("glfc")["signal"] = True  # a first round: it would upload
    upload = SimpleNamespace(extras={})
    learner.probe_copy()
    learner.after_local(client, upload, SimpleNamespace())  # type: ignore[arg-type]
    assert upload.extras == {}


def test_inputs_that_are_not_images_are_refused() -> None:
    with pytest.raises(UserError, match=r"reads images .* gives inputs of shape \(3,\)"):
        proxy_learner((3,))
    proxy_learner((3,), proxy="none")  # the client-only variant runs on anything


def run_args(root: Path, out: Path, strategy: str, *extra: str) -> list[str]:
    return [
        "run",
        *("--stream", "seq-cifar10", "--data-root", str(root), "--model", "mlp"),
        *("--strategy", strategy, "--tasks", "2", "--rounds-per-task", "2", "--epochs", "1"),
        *("--clients", "2", "--threads", "1", "--out", str(out), *extra),
    ]


@pytest.mark.parametrize(
    ("strategy", "fragment"),
    [
        ("glfc:proxy=server", "option glfc:proxy must be one of"),
        ("glfc:inversion_iterations=0", "option glfc:inversion_iterations must be"),
        ("glfc:proxy=none,inversion_iterations=5", "has no effect with proxy=none"),
    ],
)
def test_bad_proxy_options_are_refused_in_one_line(
    cifar_root: Path, tmp_path: Path, strategy: str, fragment: str
) -> None:
    out = tmp_path / "run"
    code, output = in_process(*run_args(cifar_root, out, strategy))
    assert code == 2, output
    assert fragment in " ".join(output.split()) and "Traceback" not in output
    assert not (out / "records.csv").exists()


def test_a_tiny_run_uploads_in_first_rounds_and_broadcasts_the_kept_models(
    cifar_root: Path, tmp_path: Path
) -> None:
    """2 clients, 2 tasks × 2 rounds, IID: each client holds both classes of its task."""
    out = tmp_path / "proxy"
    code, output = in_process(
        *run_args(cifar_root, out, "glfc:memory=20,inversion_iterations=1", "--partition", "iid")
    )
    assert code == 0, output
    rows = [line.split(",") for line in (out / "records.csv").read_text().splitlines()[1:]]
    sent = {(int(r[0]), r[4]): float(r[5]) for r in rows if r[4].startswith("bytes_")}
    model = sent[(1, "bytes_down")] / 2  # round 1: θ_g to each client, nothing else yet
    # the encoder's gradient at 3×32×32 and 10 classes: 900 + 12 + 3600 + 12 + 3600 + 12 +
    # 768·10 + 10 = 15,826 floats, 63,304 bytes; one per class and client in first rounds
    grads = 2 * 2 * 63_304
    assert sent[(1, "bytes_up")] == 2 * model + grads  # task 1's first round
    assert sent[(2, "bytes_up")] == 2 * model
    assert sent[(3, "bytes_up")] == 2 * model + grads  # task 2's first round
    assert sent[(4, "bytes_up")] == 2 * model
    # down: θ_g, best_2 (kept after round 1) and the 2 class counts (16 bytes) per client;
    # best_1 (best_2 moved by round 3's gradients) joins from round 4
    assert sent[(2, "bytes_down")] == 2 * (2 * model + 16)
    assert sent[(3, "bytes_down")] == 2 * (2 * model + 16)
    assert sent[(4, "bytes_down")] == 2 * (3 * model + 16)
