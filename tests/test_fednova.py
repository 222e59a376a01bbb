"""FedNova: the normalising vector (with and without momentum), the paper's weights for
unequal local steps by hand, the τ payload, refusals and a digits run that resumes."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from cfl_bench.core.context import LocalRound, Upload
from cfl_bench.core.errors import UserError
from cfl_bench.engine.optim import FlatSGD
from cfl_bench.runner.config import make_config
from cfl_bench.runner.run import execute
from cfl_bench.strategies.compose import build_strategy
from cfl_bench.strategies.fednova import TAU, FedNova, momentum_steps
from tests.helpers import broadcast, client, env, linear_model, server
from tests.test_resume import assert_resumes_after_crash, options, uninterrupted
from tests.test_zoo_cli import CLIENTS, per_round, run


def fednova(optimizer: str = "sgd", momentum: float = 0.0) -> FedNova:
    component = FedNova()
    component.setup(dataclasses.replace(env(), optimizer=optimizer, momentum=momentum))
    return component


def test_normalising_vector_by_hand() -> None:
    assert momentum_steps(6, 0.0) == 6.0  # plain SGD: a_k = τ_k
    # ρ = 0.5, τ = 2: step 1's gradient moves θ by η(1 + ρ), step 2's by η → 2.5
    assert momentum_steps(2, 0.5) == 2.5
    # τ = 3: (1 + ρ + ρ²) + (1 + ρ) + 1 = 1.75 + 1.5 + 1 = 4.25
    assert momentum_steps(3, 0.5) == 4.25


@pytest.mark.parametrize(("steps", "rho"), [(1, 0.9), (5, 0.5), (7, 0.9), (4, 0.0)])
def test_normalising_vector_is_the_local_optimizers_displacement(steps: int, rho: float) -> None:
    """τ steps of the engine's SGD on a constant gradient 1 move θ by exactly η·a_k."""
    params, grads = torch.zeros(1, dtype=torch.float64), torch.ones(1, dtype=torch.float64)
    sgd = FlatSGD(params, grads, lr=0.1, momentum=rho, weight_decay=0.0)
    for _ in range(steps):
        sgd.step()
    assert torch.isclose(-params[0], torch.tensor(0.1 * momentum_steps(steps, rho)).double())


def _round(nova: FedNova, uploads: list[tuple[list[float], int, int]]) -> torch.Tensor:
    """θ_old = [0, 0]; each upload is (θ_k, τ_k, n_k). Returns the new θ_g."""
    model = linear_model(in_features=2, classes=1)
    clients = [client(k, None) for k in range(len(uploads))]
    srv = server(model, clients)
    srv.global_params = torch.zeros(2)
    for k, (params, tau, n) in enumerate(uploads):
        extras = {TAU: torch.tensor([float(tau)])}
        nova.receive_upload(Upload(k, torch.tensor(params), torch.zeros(0), n, extras), srv)
    srv.global_params = torch.tensor([-100.0, -100.0])  # the engine's mean: replaced
    nova.aggregate(srv)
    return srv.global_params


def test_unequal_local_steps_get_the_papers_weights() -> None:
    # τ = 2 and 6, equal data: d_k = (θ_old − θ_k)/a_k = [2, 0]/2 and [0, 6]/6 = [1, 0], [0, 1];
    # τ_eff = ½·2 + ½·6 = 4; θ_g = −4·(½[1, 0] + ½[0, 1]) = [−2, −2]: the updates
    # [−2, 0] and [0, −6] weigh 1 and 1/3 (FedAvg: [−1, −3], the 6-step client dominates).
    theta = _round(fednova(), [([-2.0, 0.0], 2, 10), ([0.0, -6.0], 6, 10)])
    assert torch.allclose(theta, torch.tensor([-2.0, -2.0]))
    # n = 10 and 30: p = ¼, ¾; τ_eff = ¼·2 + ¾·6 = 5; θ_g = −5·[¼, ¾] = [−1.25, −3.75]
    theta = _round(fednova(), [([-2.0, 0.0], 2, 10), ([0.0, -6.0], 6, 30)])
    assert torch.allclose(theta, torch.tensor([-1.25, -3.75]))


def test_unequal_local_steps_with_momentum() -> None:
    # ρ = 0.5: a_1 = 2.5; a_2 = [6 − 0.5(1 − 1/64)/0.5]/0.5 = 2·(6 − 63/64) = 10.03125;
    # τ_eff = (2.5 + 10.03125)/2 = 6.265625; θ_g = −τ_eff·½·[2/2.5, 6/10.03125]
    #       = [−2.50625, −1.8738318]
    theta = _round(fednova(momentum=0.5), [([-2.0, 0.0], 2, 10), ([0.0, -6.0], 6, 10)])
    assert torch.allclose(theta, torch.tensor([-2.50625, -1.8738318]))


def test_equal_local_steps_are_fedavg_and_empty_clients_are_skipped() -> None:
    uploads = [([-2.0, 1.0], 4, 10), ([1.0, 3.0], 4, 30), ([50.0, 50.0], 0, 0)]
    theta = _round(fednova(momentum=0.9), uploads)
    # ¼·[−2, 1] + ¾·[1, 3] = [0.25, 2.5]
    assert torch.allclose(theta, torch.tensor([0.25, 2.5]))


def test_client_uploads_its_local_steps() -> None:
    model = linear_model()
    cl = client(0, None)
    srv = server(model, [cl])
    upload = Upload(0, model.params, model.buffers, 1)
    fednova().after_local(cl, upload, LocalRound(model, broadcast(srv), lr=0.1, steps=7))
    assert torch.equal(upload.extras[TAU], torch.tensor([7.0]))


def test_local_adam_is_refused() -> None:
    with pytest.raises(UserError, match=r"'fednova' normalises local SGD.*--optimizer adam"):
        fednova(optimizer="adam")
    with pytest.raises(UserError, match=r"overrides aggregation twice \(fednova and fedopt\)"):
        build_strategy("fednova+fedopt")


def test_a_run_with_adam_is_refused_before_training(tmp_path: Path) -> None:
    values = options("fednova", tmp_path / "adam", optimizer="adam")
    with pytest.raises(UserError, match="--optimizer sgd or drop 'fednova'"):
        execute(make_config(values))
    assert not (tmp_path / "adam" / "records.csv").exists()


def test_digits_run_counts_tau_and_resumes_identically(tmp_path: Path) -> None:
    summary, records = run(tmp_path, "fednova")
    assert summary["Acc_T"] > 20
    assert summary["bytes_by_payload"]["up:fednova.tau"] == 4 * CLIENTS * 4  # 4 bytes each
    assert len(per_round(records, "bytes_up")) == 4
    extra = {"model": "mlp", "participation": 0.5, "momentum": 0.5}
    whole = uninterrupted(tmp_path, "fednova", **extra)
    assert_resumes_after_crash(tmp_path / "crashed", "fednova", whole, **extra)
