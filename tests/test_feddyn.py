"""FedDyn: the client's dynamic regulariser and h_k, the server's h and θ_g, by hand."""

from __future__ import annotations

from pathlib import Path
from typing import cast

import pytest
import torch

from cfl_bench.core.context import Upload
from cfl_bench.core.errors import UserError
from cfl_bench.strategies.compose import build_strategy
from cfl_bench.strategies.feddyn import FedDyn, dynamic_penalty
from tests.helpers import client, env, inputs_for, linear_model, local_round, server
from tests.test_resume import assert_resumes_after_crash, uninterrupted


def feddyn(**values: object) -> FedDyn:
    component = FedDyn(values)
    component.setup(env())
    return component


def test_penalty_value_and_gradient_by_hand() -> None:
    theta = torch.tensor([1.0, 2.0, 3.0])
    anchor = torch.tensor([0.0, 1.0, 1.0])
    h = torch.tensor([0.5, -1.0, 2.0])
    grads, value = dynamic_penalty(theta, torch.ones(3), anchor, h, alpha=0.5)
    # θ − θ_g = [1, 1, 2]; (α/2)‖·‖² = 0.25·6 = 1.5; ⟨h, θ⟩ = 0.5 − 2 + 6 = 4.5
    assert torch.isclose(value, torch.tensor(1.5 - 4.5))
    # + α(θ − θ_g) − h = [0.5, 0.5, 1] − [0.5, −1, 2] = [0, 1.5, −1]
    assert torch.allclose(grads, torch.tensor([1.0, 2.5, 0.0]))


def test_component_penalty_matches_autograd_and_h_starts_at_zero() -> None:
    model = linear_model()
    cl = client(0, None)
    srv = server(model, [cl])
    dyn = feddyn(alpha=0.3)
    inputs = inputs_for(dyn, cl, local_round(model, srv))
    assert inputs is not None
    h = cast(torch.Tensor, cl.state_for("feddyn")["h"])
    assert torch.equal(h, torch.zeros(6)) and inputs["h"] is h
    h.copy_(torch.arange(6.0) - 2)  # as after some rounds
    with torch.no_grad():
        model.params.add_(torch.arange(6.0) / 10)  # local training moved θ away from θ_g
    penalized = dyn.penalty(model.params, torch.zeros(6), inputs)
    theta = model.params.clone().requires_grad_(True)
    expected = -(h * theta).sum() + 0.15 * ((theta - srv.global_params) ** 2).sum()
    expected.backward()
    assert penalized is not None and torch.isclose(penalized[1], expected.detach())
    assert theta.grad is not None and torch.allclose(penalized[0], theta.grad)


def test_h_k_update_by_hand() -> None:
    model = linear_model(in_features=3, classes=1)
    cl = client(0, None)
    srv = server(model, [cl])
    srv.global_params = torch.tensor([0.0, 1.0, 1.0])
    dyn = feddyn(alpha=0.5)
    local = local_round(model, srv)
    cl.state_for("feddyn")["h"] = torch.tensor([0.5, -1.0, 2.0])
    with torch.no_grad():
        model.params.copy_(torch.tensor([1.0, 2.0, 3.0]))
    dyn.after_local(cl, Upload(0, model.params, model.buffers, 1), local)
    # h_k − α(θ_k − θ_g) = [0.5, −1, 2] − 0.5·[1, 1, 2] = [0, −1.5, 1]
    assert torch.equal(cl.state_for("feddyn")["h"], torch.tensor([0.0, -1.5, 1.0]))


def test_converged_local_training_leaves_h_k_at_the_local_gradient() -> None:
    """Stationarity: at the minimiser of L_k − ⟨h_k, θ⟩ + (α/2)‖θ − θ_g‖², the updated h_k
    equals ∇L_k(θ_k) (the paper's recursion), here with L_k = ½‖θ − c‖², ∇L_k = θ − c."""
    model = linear_model(in_features=3, classes=1)
    cl = client(0, None)
    srv = server(model, [cl])
    srv.global_params = torch.tensor([1.0, -1.0, 0.5])
    c = torch.tensor([3.0, 2.0, -1.0])
    dyn = feddyn(alpha=0.5)
    local = local_round(model, srv)
    cl.state_for("feddyn")["h"] = torch.tensor([0.2, -0.4, 1.0])
    inputs = inputs_for(dyn, cl, local)
    assert inputs is not None
    for _ in range(200):
        penalized = dyn.penalty(model.params, model.params - c, inputs)  # ∇L_k + penalty
        assert penalized is not None
        model.params.sub_(penalized[0], alpha=0.5)
    # the minimiser (c + h_k + αθ_g)/(1 + α), reached
    expected = (c + torch.tensor([0.2, -0.4, 1.0]) + 0.5 * srv.global_params) / 1.5
    assert torch.allclose(model.params, expected, atol=1e-6)
    dyn.after_local(cl, Upload(0, model.params, model.buffers, 1), local)
    assert torch.allclose(cl.state_for("feddyn")["h"], model.params - c, atol=1e-6)


def _round(dyn: FedDyn, uploads: list[list[float]], global_now: list[float]) -> torch.Tensor:
    """One server round of four clients (N = 4), the given ones uploading; returns θ_g."""
    model = linear_model(in_features=2, classes=1)
    clients = [client(k, None) for k in range(4)]
    srv = server(model, clients)
    srv.global_params = torch.tensor(global_now)
    for k, params in enumerate(uploads):
        dyn.receive_upload(Upload(k, torch.tensor(params), torch.zeros(0), 10 * (k + 1)), srv)
    srv.global_params = torch.tensor([-100.0, -100.0])  # the engine's weighted mean
    dyn.aggregate(srv)
    return srv.global_params


def test_server_h_and_global_model_by_hand_with_partial_participation() -> None:
    dyn = feddyn(alpha=0.5)
    # round 1: θ_old = [1, 1]; two of four clients upload [2, 0] and [4, 2]
    theta = _round(dyn, [[2.0, 0.0], [4.0, 2.0]], [1.0, 1.0])
    # Σ(θ_k − θ_old) = [1, −1] + [3, 1] = [4, 0]; h = −(0.5/4)·[4, 0] = [−0.5, 0]
    assert dyn.h is not None and torch.allclose(dyn.h, torch.tensor([-0.5, 0.0]))
    # θ_g = mean [3, 1] − h/α = [3, 1] + [1, 0] = [4, 1] (the weighted mean is not used)
    assert torch.allclose(theta, torch.tensor([4.0, 1.0]))
    # round 2: one client returns θ_old unchanged: h stays, θ_g = [4, 1] + [1, 0]
    theta = _round(dyn, [[4.0, 1.0]], [4.0, 1.0])
    assert torch.allclose(dyn.h, torch.tensor([-0.5, 0.0]))
    assert torch.allclose(theta, torch.tensor([5.0, 1.0]))


def test_weighted_mean_takes_the_engines_mean() -> None:
    dyn = feddyn(alpha=0.5, mean="weighted")
    theta = _round(dyn, [[2.0, 0.0], [4.0, 2.0]], [1.0, 1.0])
    # the engine's mean [−100, −100] − h/α with h = [−0.5, 0]
    assert torch.allclose(theta, torch.tensor([-99.0, -100.0]))


def test_state_survives_a_checkpoint_and_defaults() -> None:
    dyn = feddyn(alpha=0.5)
    _round(dyn, [[2.0, 0.0]], [1.0, 1.0])
    again = feddyn(alpha=0.5)
    again.load_state_dict(dyn.state_dict())
    assert again.h is not None and dyn.h is not None and torch.equal(again.h, dyn.h)
    assert FedDyn().resolved_options() == {"alpha": 0.1, "mean": "uniform"}  # FedNTD's dyn_alpha


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("feddyn:alpha=0", r"feddyn:alpha must be .*> 0"),
        ("feddyn:mean=samples", r"feddyn:mean must be one of uniform, weighted"),
        ("feddyn+fedproj", r"overrides aggregation twice \(feddyn and fedproj\)"),
    ],
)
def test_bad_configurations_are_refused(text: str, message: str) -> None:
    with pytest.raises(UserError, match=message):
        build_strategy(text)


def test_digits_run_finishes_and_resumes_identically(tmp_path: Path) -> None:
    extra = {"model": "mlp", "participation": 0.5}
    whole = uninterrupted(tmp_path, "feddyn", **extra)
    summary = (whole / "summary.json").read_text()
    assert '"status": "finished"' in summary
    assert_resumes_after_crash(tmp_path / "crashed", "feddyn", whole, **extra)
