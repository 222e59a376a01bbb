"""FedWeIT: the composed weight, TF's 'same' max-pool, the loss terms, the channels a client
sends, the server's per-channel aggregation (all against values worked out by hand from the
official code's equations), the bytes of a digits run, its resume after a crash, and the
refusals."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from cfl_bench.core.context import ClientState, Upload
from cfl_bench.core.errors import UserError
from cfl_bench.runner.config import make_config
from cfl_bench.runner.run import execute
from cfl_bench.strategies.base import ModelFacts
from cfl_bench.strategies.compose import build_strategy
from cfl_bench.strategies.declarations import FedWeITOptions
from cfl_bench.strategies.decomposed import DecomposedLinear, LayerPrivate, max_pool_same
from cfl_bench.strategies.fedweit import (
    FedWeIT,
    Layout,
    aggregate_bases,
    code_counted_upload,
    keep_mask,
    prune,
    regulariser,
)
from tests.helpers import env
from tests.test_resume import assert_config_resumes_after_crash


def tiny_layer(training: bool) -> DecomposedLinear:
    """2→2: B = [[1, 2], [3, 4]], σ(m) = (0.5, 0.75), A = [[0.1, 0], [0, −0.2]], kb = (I,
    swap), α = (0.5, 2), bias (0.5, −1)."""
    layer = DecomposedLinear(2, 2)
    with torch.no_grad():
        layer.shared.copy_(torch.tensor([[1.0, 2.0], [3.0, 4.0]]))
    kb = torch.tensor([[[1.0, 0.0], [0.0, 1.0]], [[0.0, 1.0], [1.0, 0.0]]])
    layer.private = LayerPrivate(
        mask=torch.tensor([0.0, math.log(3.0)]),
        adaptive=torch.tensor([[0.1, 0.0], [0.0, -0.2]]),
        atten=torch.tensor([0.5, 2.0]),
        bias=torch.tensor([0.5, -1.0]),
        kb=kb,
        fixed_mask=None,
        l1_thr=0.15,
        mask_thr=0.0,
    )
    layer.train(training)
    return layer


def test_the_composed_weight_is_b_sigma_m_plus_a_plus_attended_kb() -> None:
    # row 0: [0.5, 1] + [0.1, 0] + 0.5·[1, 0] + 2·[0, 1] = [1.1, 3.0]
    # row 1: [2.25, 3] + [0, −0.2] + 0.5·[0, 1] + 2·[1, 0] = [4.25, 3.3]
    layer = tiny_layer(training=True)
    theta, _ = layer.composed()
    assert torch.allclose(theta, torch.tensor([[1.1, 3.0], [4.25, 3.3]]))
    out = layer(torch.tensor([[1.0, 1.0]]))
    assert torch.allclose(out, torch.tensor([[4.6, 6.55]]))


def test_evaluation_prunes_a_by_the_l1_threshold() -> None:
    # |0.1| ≤ 0.15 is dropped, −0.2 kept: row 0 becomes [1.0, 3.0].
    out = tiny_layer(training=False)(torch.tensor([[1.0, 1.0]]))
    assert torch.allclose(out, torch.tensor([[4.5, 6.55]]))


@pytest.mark.parametrize(("mask_grad", "reaches_m"), [("round", False), ("step", True)])
def test_the_code_s_forward_mask_takes_no_gradient_from_the_loss(
    mask_grad: str, reaches_m: bool
) -> None:
    # The code's layer reads σ(m) computed at the round start (a constant in its tape).
    layer = tiny_layer(training=True)
    assert layer.private is not None
    mask = layer.private.mask.clone().requires_grad_(True)
    fixed = torch.sigmoid(mask).detach() if mask_grad == "round" else None
    layer.private = dataclasses.replace(layer.private, mask=mask, fixed_mask=fixed)
    layer(torch.tensor([[1.0, 1.0]])).sum().backward()
    assert (mask.grad is not None) == reaches_m
    if reaches_m:  # ∂/∂m_o of Σ_i B_oi·σ(m_o)·x_i = σ'(m_o)·Σ_i B_oi: (0.25·3, 0.1875·7)
        assert mask.grad is not None
        assert mask.grad.tolist() == pytest.approx([0.75, 1.3125])


def test_max_pool_pads_after_as_tensorflow_same() -> None:
    # 4×4 → 2×2; TF pads one row/column after: windows rows {0,1,2}, {2,3}.
    x = torch.arange(1.0, 17.0).view(1, 1, 4, 4)
    assert max_pool_same(x).view(-1).tolist() == [11.0, 12.0, 15.0, 16.0]


LAYOUT = Layout(((0, 4, 2),), head=(1, 1))  # one layer: 2 channels of 2 entries
OPTS = FedWeITOptions(wd=0.1, lambda_l1=0.01, lambda_mask=0.5, lambda_l2=2.0)
BASES = torch.tensor([1.0, 2.0, 3.0, 4.0])
MASK = torch.tensor([0.0, 2.0])
ADAPTIVE = torch.tensor([0.1, -0.2, 0.0, 0.3])


def test_the_first_task_loss_decays_a_m_and_b() -> None:
    # 0.1·½(0.14 + 4) + 0.01·0.6 + 0.5·2 + 0.1·½·30 = 0.207 + 0.006 + 1 + 1.5
    value = regulariser(BASES, MASK, ADAPTIVE, [], LAYOUT, OPTS)
    assert value.item() == pytest.approx(2.713)


def test_the_retroactive_term_pulls_b_towards_the_past_composition() -> None:
    # past: m₁ = 0 (σ = ½), A₁ = 0, target B'⊙σ(m₁) with B' = 1: 0.5 everywhere.
    # B⊙½ − 0.5 = [0, 0.5, 1, 1.5]: 2·½·3.5 = 3.5, no ‖B‖² after the first task.
    bases = BASES.clone().requires_grad_(True)
    past = [(torch.zeros(2), torch.zeros(4), torch.full((4,), 0.5))]
    value = regulariser(bases, MASK, ADAPTIVE, past, LAYOUT, OPTS)
    assert value.item() == pytest.approx(0.207 + 0.006 + 1.0 + 3.5)
    (grad,) = torch.autograd.grad(value, bases)  # 2·(B⊙½ − 0.5)⊙½
    assert grad.tolist() == pytest.approx([0.0, 0.5, 1.0, 1.5])


def test_a_client_keeps_the_channels_above_the_sparsity_quantile() -> None:
    # |m| sorted: 0.05, 0.1, 0.2, 0.3, 0.5; ⌊5·0.3⌋ = 1 → threshold 0.1, kept if above.
    layout = Layout(((0, 5, 5),), head=(1, 1))
    mask = torch.tensor([0.3, -0.1, 0.5, -0.05, 0.2])
    assert keep_mask(mask, layout, 0.3).tolist() == [1.0, 0.0, 1.0, 0.0, 1.0]


def test_the_server_averages_each_channel_over_the_clients_that_sent_it() -> None:
    # client 1 keeps channel 0 only: [1, 2, 0, 0]; client 2 both: [5, 6, 7, 8].
    pruned = torch.tensor([1.0, 2.0, 0.0, 0.0]) + torch.tensor([5.0, 6.0, 7.0, 8.0])
    kept = torch.tensor([1.0, 0.0]) + torch.tensor([1.0, 1.0])
    assert aggregate_bases(pruned, kept, LAYOUT).tolist() == pytest.approx([3.0, 4.0, 7.0, 8.0])
    assert code_counted_upload(torch.tensor([1.0, 2.0, 0.0, 0.0])) == 2


# perm-digits (1×8×8) with one head per task: the LeNet's bases are 5·5·20 + 5·5·20·50 +
# 200·800 + 800·500 = 585,500 floats, its channels 20 + 50 + 800 + 500 = 1,370.
BASES_BYTES = 585_500 * 4
KEEP_BYTES = 1_370 * 4
RUN: dict[str, Any] = {
    "stream": "perm-digits",
    "heads": "per-task",
    "model": "fedweit-lenet",
    "strategy": "fedavg+fedweit",
    "tasks": 2,
    "rounds_per_task": 2,
    "clients": 3,
    "epochs": 1,
    "threads": 1,
    "optimizer": "adam",
    "lr": 0.001,
    "train_size": 120,
    "test_size": 60,
}


def bytes_by_round(run_dir: Path, kind: str) -> list[int]:
    rows = (run_dir / "records.csv").read_text().splitlines()
    head = rows[0].split(",")
    at = head.index("metric")
    return [int(float(r.split(",")[at + 1])) for r in rows[1:] if r.split(",")[at] == kind]


@pytest.mark.parametrize("crash_round", [2, 3])
def test_a_digits_run_resumes_identically_and_counts_what_travels(
    tmp_path: Path, crash_round: int
) -> None:
    # The crash after round 2 (task 1's end) leaves the knowledge base built and not yet
    # sent, and every client's masks, A's, heads and bases in its state: all must survive.
    # After round 3 each client's kept task-1 model (m, A, α, bias, kb, head) must too: the
    # round-4 evaluation scores it.
    assert_config_resumes_after_crash(RUN, tmp_path, crash_round=crash_round)
    up = bytes_by_round(tmp_path / "whole", "bytes_up")
    down = bytes_by_round(tmp_path / "whole", "bytes_down")
    every = 3 * (BASES_BYTES + KEEP_BYTES)  # B ⊙ keep (counted dense) and keep
    assert up == [every, every + 3 * BASES_BYTES, every, every + 3 * BASES_BYTES]
    # θ_g to each client every round; task 2's first round adds the 3 × 585,500 kb.
    assert down == [3 * BASES_BYTES, 3 * BASES_BYTES, 3 * 4 * BASES_BYTES, 3 * BASES_BYTES]
    # Each client's own model on each task it has trained, at each task end: (round, task).
    own = bytes_by_round(tmp_path / "whole", "own_acc")
    assert len(own) == 3 * (1 + 2)
    summary = json.loads((tmp_path / "whole" / "summary.json").read_text())
    assert summary["Acc_T"] == pytest.approx(sum(summary["client_Acc_T"]) / 3)
    assert summary["acc_matrix"] is None and summary["global_not_scored"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "fedweit:client_sparsity=1",
            "option fedweit:client_sparsity must be a fraction in [0, 1), got '1'.",
        ),
        (
            "fedweit:mask_grad=always",
            "option fedweit:mask_grad must be one of round, step, got 'always'.",
        ),
        ("fedweit:kb_self=no", "option fedweit:kb_self must be one of keep, drop, got 'no'."),
    ],
)
def test_bad_options_are_refused_in_one_line(text: str, message: str) -> None:
    with pytest.raises(UserError) as caught:
        build_strategy(text)
    assert str(caught.value) == message


def test_other_models_and_streams_without_task_identity_are_refused() -> None:
    component = FedWeIT()
    with pytest.raises(UserError) as caught:
        component.setup(dataclasses.replace(env(scenario="task-il"), model=ModelFacts("mlp")))
    assert str(caught.value) == (
        "fedweit composes decomposed layers and model 'mlp' has none; use --model fedweit-lenet."
    )
    with pytest.raises(UserError) as caught:
        component.setup(env(scenario="class-il"))
    assert str(caught.value).endswith("but the stream is class-il; add --heads per-task.")


SEQUENTIAL_ONLY = (
    "its clients train private masks and task-adaptive weights outside θ, which only the "
    "sequential executor's one working model carries"
)


@pytest.mark.parametrize(
    ("executor", "message"),
    [
        ("vectorized", f"the vectorized executor cannot run 'fedweit': {SEQUENTIAL_ONLY}; "),
        ("flower", f"--executor flower cannot run 'fedweit': {SEQUENTIAL_ONLY}; "),
    ],
)
def test_the_other_executors_are_refused_in_one_line(
    executor: str, message: str, tmp_path: Path
) -> None:
    out = tmp_path / "r"
    with pytest.raises(UserError) as caught:
        execute(make_config({**RUN, "executor": executor, "out": str(out)}))
    assert str(caught.value) == message + "use --executor sequential."
    assert not out.exists()


def fedweit(**values: object) -> FedWeIT:
    component = FedWeIT(values or None)
    component.setup(dataclasses.replace(env(scenario="task-il"), model=ModelFacts("fedweit-lenet")))
    return component


def test_the_knowledge_base_holds_each_client_s_pruned_a_in_client_order() -> None:
    # A is pruned at |A| > λ1 = 1e-3 before it leaves the client (0.001 itself is dropped).
    assert prune(torch.tensor([0.0005, -0.25, 0.001]), 1e-3).tolist() == [0.0, -0.25, 0.0]
    component = fedweit()
    server = SimpleNamespace(clients=[0, 1, 2], global_params=torch.zeros(3), task=1)
    for index, a in ((2, [0.0, 0.375, 0.0]), (0, [0.5, 0.0, -0.25])):
        extras = {"fedweit.adaptive": torch.tensor(a)}
        upload = Upload(index, torch.zeros(3), torch.zeros(0), 1, extras)
        component.receive_upload(upload, server)  # type: ignore[arg-type]
    component.after_aggregate(server)  # type: ignore[arg-type]
    assert component.kb is not None  # client 1 sent none: a zero row
    assert component.kb.tolist() == [[0.5, 0.0, -0.25], [0.0, 0.0, 0.0], [0.0, 0.375, 0.0]]
    server.round_in_task = 0  # sent in the next task's first round only
    assert component.broadcast(server)["fedweit.kb"] is component.kb  # type: ignore[arg-type]
    server.round_in_task = 1
    assert component.broadcast(server) == {}  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kb_self", "own_row"), [("keep", [4.0, 5.0, 6.0, 7.0]), ("drop", [0.0] * 4)]
)
def test_a_new_task_keeps_the_past_and_starts_a_from_the_initial_bases(
    kb_self: str, own_row: list[float]
) -> None:
    component = fedweit(kb_self=kb_self)
    state: dict[str, object] = {
        "task": 0,
        "past": [],
        "base": torch.ones(4),  # B' = 1
        "initial": torch.full((4,), 3.0),  # B₀ = 3: A starts at 1
        "task_vector": torch.zeros(2 + 4 + 2),  # m = 0, A = 0, bias 0 (task 0: no α)
        "head": torch.tensor([9.0]),
        "kb": torch.zeros(0, 4),
    }
    client = ClientState(1, torch.Generator(), None, task=1)
    component.enter_task(state, client, torch.arange(12.0).view(3, 4), LAYOUT)
    # Task 0's model is kept whole for its evaluation: its vector, head and (empty) kb.
    kept = component.task_model(state, 0)
    assert kept is not None
    assert [t.tolist() for t in kept] == [[0.0] * 8, [9.0], []]
    assert component.task_model(state, 2) is None
    kb = state["kb"]
    assert isinstance(kb, torch.Tensor)
    assert kb[1].tolist() == own_row and kb[0].tolist() == [0.0, 1.0, 2.0, 3.0]
    vector = state["task_vector"]
    assert isinstance(vector, torch.Tensor)
    assert vector.shape == (2 + 4 + 3 + 2,)  # m, A, α over K = 3 rows (one layer), bias
    assert vector[2:6].tolist() == [1.0] * 4
    assert state["targets"] == [pytest.approx(torch.full((4,), 0.5))]  # B'⊙σ(0) + 0
