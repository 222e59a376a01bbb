"""LwF and online EWC: the two methods written after the client contract, each one module
plus one registry line. Their terms by hand, their per-client state across a task change,
and both executors agreeing on them composed with FedGP.
"""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import cast

import pytest
import torch

from cfl_bench.strategies.ewc import OnlineEWC, elastic_penalty
from cfl_bench.strategies.lwf import LwF, softened_cross_entropy
from tests.helpers import client, digits_federation, env
from tests.test_vectorized import one_thread  # noqa: F401 - the fixture
from tests.test_vectorized_fl import assert_same_client_state
from tests.test_vectorized_replay import REPLAY, run_both


def local(params: torch.Tensor) -> SimpleNamespace:
    """A client's side of a round whose broadcast carries ``params`` (no buffers)."""
    broadcast = SimpleNamespace(params=params, buffers=torch.zeros(0), device=params.device)
    return SimpleNamespace(broadcast=broadcast)


# -- LwF --------------------------------------------------------------------------------------
def test_softened_cross_entropy_by_hand() -> None:
    # T = 2, z_old = (2 ln 3, 0): softmax(z_old/T) = (3/4, 1/4). z = (0, 0): log softmax =
    # (−ln 2, −ln 2), so CE = ln 2, and ∂CE/∂z = (softmax(z/T) − p)/T = (−1/8, 1/8).
    z = torch.zeros(1, 2, requires_grad=True)
    teacher = torch.tensor([[2 * math.log(3.0), 0.0]])
    value = softened_cross_entropy(z, teacher, 2.0)
    assert value.item() == pytest.approx(math.log(2.0), rel=1e-6)
    (grad,) = torch.autograd.grad(value, z)
    assert torch.allclose(grad, torch.tensor([[-0.125, 0.125]]))
    # A padded row (junk logits, mask 0) changes nothing.
    padded = torch.cat([z.detach(), torch.tensor([[9.0, -9.0]])])
    junk = torch.cat([teacher, torch.tensor([[-9.0, 9.0]])])
    masked = softened_cross_entropy(padded, junk, 2.0, torch.tensor([1.0, 0.0]))
    assert masked.item() == pytest.approx(math.log(2.0), rel=1e-6)


def test_lwf_term_is_weighted_and_silent_before_a_teacher() -> None:
    lwf = LwF({"weight": 0.5, "temperature": 2.0})
    lwf.setup(env())
    outputs, teacher = torch.zeros(1, 2), torch.tensor([[2 * math.log(3.0), 0.0]])
    values = {"teacher_outputs": teacher, "weight": torch.tensor(1.0)}
    term = lwf.loss_term(outputs, None, torch.zeros(1).long(), None, values)
    assert term.item() == pytest.approx(0.5 * math.log(2.0), rel=1e-6)
    values["weight"] = torch.tensor(0.0)
    assert lwf.loss_term(outputs, None, torch.zeros(1).long(), None, values).item() == 0.0
    silent = LwF({"weight": 0.0})
    silent.setup(env())
    assert silent.round_inputs(None) is None  # type: ignore[arg-type]


def test_lwf_teacher_is_the_model_received_when_the_task_changed() -> None:
    lwf = LwF()
    lwf.setup(env())
    cl = client(0, None)
    first = lwf.client_inputs(cl, local(torch.ones(3)))  # type: ignore[arg-type]
    assert first["weight"].item() == 0.0  # task 0: no previous task, no term
    assert lwf.client_inputs(cl, local(torch.full((3,), 2.0)))["weight"].item() == 0.0  # type: ignore[arg-type]
    cl.task = 1
    ended = torch.full((3,), 3.0)  # θ_g at the client's first round of task 1
    inputs = lwf.client_inputs(cl, local(ended))  # type: ignore[arg-type]
    assert inputs["weight"].item() == 1.0 and torch.equal(inputs["teacher"], ended)
    later = lwf.client_inputs(cl, local(torch.full((3,), 4.0)))  # type: ignore[arg-type]
    assert torch.equal(later["teacher"], ended)  # the teacher stays for the whole task


# -- online EWC -------------------------------------------------------------------------------
def test_elastic_penalty_by_hand_for_one_client_and_a_chunk() -> None:
    # θ = (1, 2), θ* = (0, 1), F = (2, 3), λ = 0.5: θ − θ* = (1, 1), ∇ += λF(θ − θ*) =
    # (1, 1.5), value (λ/2)·Σ F(θ − θ*)² = 0.25·5 = 1.25.
    theta, anchor, fisher = (
        torch.tensor([1.0, 2.0]),
        torch.tensor([0.0, 1.0]),
        torch.tensor([2.0, 3.0]),
    )
    grads, value = elastic_penalty(theta, torch.zeros(2), fisher, anchor, 0.5)
    assert grads.tolist() == [1.0, 1.5] and value.item() == 1.25
    rows = torch.stack([theta, anchor])  # the second client sits at its anchor: no penalty
    chunk, values = elastic_penalty(rows, torch.zeros(2, 2), fisher, anchor, 0.5)
    assert chunk.tolist() == [[1.0, 1.5], [0.0, 0.0]] and values.tolist() == [1.25, 0.0]


def test_running_fisher_folds_with_decay_when_the_task_changes() -> None:
    ewc = OnlineEWC({"gamma": 0.5})
    ewc.setup(env())
    cl = client(0, None)
    start = ewc.client_inputs(cl, local(torch.ones(2)))  # type: ignore[arg-type]
    assert torch.equal(start["fisher"], torch.zeros(2))  # no task ended: no penalty
    state = cl.state_for("ewc")
    state["pending"] = torch.tensor([4.0, 2.0])  # what after_local left: task 0's F_0
    assert torch.equal(ewc.client_inputs(cl, local(torch.ones(2)))["fisher"], torch.zeros(2))  # type: ignore[arg-type]
    cl.task = 1
    inputs = ewc.client_inputs(cl, local(torch.full((2,), 7.0)))  # type: ignore[arg-type]
    assert inputs["fisher"].tolist() == [4.0, 2.0] and inputs["anchor"].tolist() == [7.0, 7.0]
    state["pending"] = torch.tensor([2.0, 2.0])  # F_1
    cl.task = 2
    inputs = ewc.client_inputs(cl, local(torch.full((2,), 9.0)))  # type: ignore[arg-type]
    assert inputs["fisher"].tolist() == [0.5 * 4 + 2, 0.5 * 2 + 2]  # γF* + F_1
    assert inputs["anchor"].tolist() == [9.0, 9.0]


# -- every executor -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("strategy", "component"),
    [("lwf+fedgp", "lwf"), ("der+lwf:weight=2+fedgp", "lwf"), ("ewc:lam=50+fedgp", "ewc")],
)
def test_sequential_and_vectorized_agree(strategy: str, component: str) -> None:
    # 2 tasks × 2 rounds: the second task trains with the teacher / the folded Fisher.
    seq, vec = run_both(strategy)
    states = [cast(dict, c.state_for(component)) for c in seq.clients]
    if component == "lwf":
        assert all("teacher" in s for s in states)
    else:
        assert all(float(cast(torch.Tensor, s["fisher"]).sum()) > 0 for s in states)
    assert_same_client_state(seq, vec, component)


def test_the_methods_change_training() -> None:
    # The same run without the method and with it: the second task trains differently.
    def final(strategy: str) -> torch.Tensor:
        federation = digits_federation(strategy, **REPLAY)  # type: ignore[arg-type]
        federation.run()
        return federation.server.global_params

    base = final("fedgp")
    for strategy in ("lwf:weight=5+fedgp", "ewc:lam=500+fedgp"):
        assert float((final(strategy) - base).abs().max()) > 1e-3, strategy
