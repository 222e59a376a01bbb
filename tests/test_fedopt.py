"""FedAvgM and FedOpt: server momentum over one and two rounds and one Adam / Yogi / Adagrad
step by hand, the defaults, refusals, checkpointed state and digits runs that resume."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from cfl_bench.core.context import Upload
from cfl_bench.core.errors import UserError
from cfl_bench.strategies.base import Component
from cfl_bench.strategies.compose import build_strategy
from cfl_bench.strategies.fedopt import FedAvgM, FedOpt
from tests.helpers import client, env, linear_model, server
from tests.test_resume import assert_resumes_after_crash, uninterrupted
from tests.test_zoo_cli import run


def fedavgm(**values: object) -> FedAvgM:
    component = FedAvgM(values)
    component.setup(env())
    return component


def fedopt(**values: object) -> FedOpt:
    component = FedOpt(values)
    component.setup(env())
    return component


def _round(component: Component, old: list[float], mean: list[float]) -> torch.Tensor:
    """One server round: θ_g = ``old`` while two uploads arrive, the engine's mean is
    ``mean``; returns the aggregator's θ_g."""
    model = linear_model(in_features=2, classes=1)
    srv = server(model, [client(0, None), client(1, None)])
    srv.global_params = torch.tensor(old)
    for k in range(2):
        component.receive_upload(Upload(k, torch.zeros(2), torch.zeros(0), 1), srv)
    srv.global_params = torch.tensor(mean)
    component.aggregate(srv)
    return srv.global_params


def test_server_momentum_over_two_rounds_by_hand() -> None:
    avgm = fedavgm()  # β = 0.7, η_s = 1
    # round 1: v = θ_old − θ_avg = [1, 1] − [0, 3] = [1, −2]; θ_g = [1, 1] − v = [0, 3]
    assert torch.allclose(_round(avgm, [1.0, 1.0], [0.0, 3.0]), torch.tensor([0.0, 3.0]))
    assert avgm.velocity is not None and torch.allclose(avgm.velocity, torch.tensor([1.0, -2.0]))
    # round 2: v = 0.7·[1, −2] + ([0, 3] − [−1, 3]) = [1.7, −1.4]; θ_g = [0, 3] − v
    theta = _round(avgm, [0.0, 3.0], [-1.0, 3.0])
    assert torch.allclose(avgm.velocity, torch.tensor([1.7, -1.4]))
    assert torch.allclose(theta, torch.tensor([-1.7, 4.4]))


def test_server_momentum_with_a_server_learning_rate() -> None:
    avgm = fedavgm(momentum=0.5, server_lr=0.5)
    # round 1: v = [1, −2]; θ_g = [1, 1] − 0.5·v = [0.5, 2]
    assert torch.allclose(_round(avgm, [1.0, 1.0], [0.0, 3.0]), torch.tensor([0.5, 2.0]))
    # round 2: v = 0.5·[1, −2] + ([0.5, 2] − [0.5, 1]) = [0.5, 0]; θ_g = [0.25, 2]
    assert torch.allclose(_round(avgm, [0.5, 2.0], [0.5, 1.0]), torch.tensor([0.25, 2.0]))


def test_momentum_zero_is_fedavg() -> None:
    assert torch.allclose(
        _round(fedavgm(momentum=0.0), [1.0, 1.0], [3.0, -2.0]), torch.tensor([3.0, -2.0])
    )


def _expected(delta: float, v: float, lr: float = 0.01, beta1: float = 0.9) -> float:
    """θ_old = 1 and m_{−1} = 0: 1 + η·(1 − β1)Δ/(√v + τ), τ = 1e-3."""
    return 1.0 + lr * (1.0 - beta1) * delta / (math.sqrt(v) + 1e-3)


def test_one_adam_step_by_hand() -> None:
    opt = fedopt()  # η = 0.01 (auto for adam), β1 = 0.9, β2 = 0.99, τ = 1e-3
    theta = _round(opt, [1.0, 1.0], [1.1, 0.98])  # Δ = [0.1, −0.02]
    # m = 0.1·Δ = [0.01, −0.002]; v = 0.99·τ² + 0.01·Δ² = [1.0099e-4, 4.99e-6]
    assert opt.moments is not None
    assert torch.allclose(opt.moments[0], torch.tensor([0.01, -0.002]))
    assert torch.allclose(opt.moments[1], torch.tensor([1.0099e-4, 4.99e-6]), rtol=1e-6)
    # θ = 1 + 0.01·m/(√v + τ) = [1.0090503, 0.9938154]
    expected = torch.tensor([_expected(0.1, 1.0099e-4), _expected(-0.02, 4.99e-6)])
    assert torch.allclose(theta, expected)
    assert torch.allclose(theta, torch.tensor([1.0090503, 0.9938154]))


def test_yogi_and_adagrad_second_moments_by_hand() -> None:
    yogi = fedopt(server_opt="yogi")
    _round(yogi, [1.0, 1.0], [1.1, 0.98])
    # Δ² > v = τ², sign(v − Δ²) = −1: v = τ² + 0.01·Δ² = [1.01e-4, 5e-6] (Adam: 0.99·τ² + …)
    assert yogi.moments is not None
    assert torch.allclose(yogi.moments[1], torch.tensor([1.01e-4, 5e-6]), rtol=1e-6)
    # step 2, Δ = [0.001, 0]: v > Δ², so Yogi shrinks v additively by 0.01·Δ² = [1e-8, 0]
    _round(yogi, [1.0, 1.0], [1.001, 1.0])
    assert torch.allclose(yogi.moments[1], torch.tensor([1.01e-4 - 1e-8, 5e-6]), rtol=1e-6)
    adagrad = fedopt(server_opt="adagrad")  # η = 0.1 (auto for adagrad)
    theta = _round(adagrad, [1.0, 1.0], [1.1, 0.98])
    # v = τ² + Δ² = [0.010001, 4.01e-4]; θ = 1 + 0.1·0.1·Δ/(√v + τ)
    assert adagrad.moments is not None
    assert torch.allclose(adagrad.moments[1], torch.tensor([0.010001, 4.01e-4]), rtol=1e-6)
    expected = [_expected(0.1, 0.010001, lr=0.1), _expected(-0.02, 4.01e-4, lr=0.1)]
    assert torch.allclose(theta, torch.tensor(expected))


def test_defaults_auto_server_lr_and_explicit_values() -> None:
    # FedNTD's config and code
    assert FedAvgM().resolved_options() == {"momentum": 0.7, "server_lr": 1.0}
    assert FedOpt().resolved_options() == {
        "server_opt": "adam",
        "server_lr": None,
        "beta1": 0.9,
        "beta2": 0.99,
        "tau": 1e-3,
    }
    assert fedopt(server_opt="adam").hyper == (0.01, 0.9, 0.99, 1e-3)
    assert fedopt(server_opt="yogi").hyper[0] == 0.01
    adagrad = fedopt(server_opt="adagrad")
    assert adagrad.hyper[0] == 0.1 and adagrad.resolved_options()["server_lr"] == 0.1
    assert fedopt(server_opt="adagrad", server_lr=0.5).hyper[0] == 0.5
    assert build_strategy("fedopt:server_opt=yogi").name == "fedavg+fedopt:server_opt=yogi"


def test_state_survives_a_checkpoint() -> None:
    opt, avgm = fedopt(), fedavgm()
    _round(opt, [1.0, 1.0], [1.1, 0.98])
    _round(avgm, [1.0, 1.0], [0.0, 3.0])
    opt_again, avgm_again = fedopt(), fedavgm()
    opt_again.load_state_dict(opt.state_dict())
    avgm_again.load_state_dict(avgm.state_dict())
    assert opt.moments is not None and opt_again.moments is not None
    assert all(torch.equal(a, b) for a, b in zip(opt.moments, opt_again.moments, strict=True))
    assert avgm.velocity is not None and avgm_again.velocity is not None
    assert torch.equal(avgm.velocity, avgm_again.velocity)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("fedavgm:momentum=1", r"fedavgm:momentum must be a number in \[0, 1\)"),
        ("fedavgm:server_lr=0", r"fedavgm:server_lr must be .*> 0"),
        ("fedopt:server_opt=sgd", r"fedopt:server_opt must be one of adam, yogi, adagrad"),
        ("fedopt:beta2=1", r"fedopt:beta2 must be a number in \[0, 1\)"),
        ("fedopt:tau=0", r"fedopt:tau must be .*> 0"),
        ("fedavgm+fedopt", r"overrides aggregation twice \(fedavgm and fedopt\)"),
        ("fedopt+feddyn", r"overrides aggregation twice \(fedopt and feddyn\)"),
    ],
)
def test_bad_configurations_are_refused(text: str, message: str) -> None:
    with pytest.raises(UserError, match=message):
        build_strategy(text)


@pytest.mark.parametrize("strategy", ["fedavgm", "fedopt:server_opt=yogi", "fedopt+scaffold"])
def test_digits_run_finishes_and_resumes_identically(tmp_path: Path, strategy: str) -> None:
    extra = {"model": "mlp", "participation": 0.5}
    whole = uninterrupted(tmp_path, strategy, **extra)
    assert_resumes_after_crash(tmp_path / "crashed", strategy, whole, **extra)


def test_server_momentum_learns_on_digits(tmp_path: Path) -> None:
    summary, _ = run(tmp_path, "fedavgm")
    assert summary["Acc_T"] > 20  # chance is 10 %
