"""FedProj's paper variants: the client memory loss without T, g_glob on the whole memory,
the round-0 supervised warm-up on the labelled holdout, the anchor of the γ term, CIFAR-100
as public set — each changing what it should, and the defaults leaving runs unchanged."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from torch.nn import functional as F

from cfl_bench.core.context import ServerState, Upload
from cfl_bench.core.errors import UserError
from cfl_bench.core.flat import FlatModel
from cfl_bench.engine.one_client import OneClientStep
from cfl_bench.strategies.compose import Strategy
from cfl_bench.strategies.fedavg import FedAvg
from cfl_bench.strategies.fedproj import FedProj
from tests.helpers import (
    client,
    digits_federation,
    env,
    inputs_for,
    linear_model,
    local_round,
    server,
)
from tests.synthetic_data import write_tiny_cifar100


def holdout_fedproj(public_x: torch.Tensor, **values: object) -> FedProj:
    """A FedProj whose public memory is ``public_x`` (task 0's holdout)."""
    fp = FedProj({"public": "holdout", "public_size": public_x.shape[0], **values})
    fp.setup(env(input_shape=tuple(public_x.shape[1:]), batch_size=4))
    fp.on_task_start(server(linear_model(), []), 0, public_x)
    return fp


def memory_grad(fp: FedProj, model: FlatModel, z: torch.Tensor, batch: int = 32) -> torch.Tensor:
    """∇ of the client's memory loss at ``model``, with Z_ens = z broadcast to the client."""
    fp.remember(z)
    cl = client(0, None)
    srv = server(model, [cl])
    inputs = inputs_for(fp, cl, local_round(model, srv, fp.broadcast(srv)))
    assert inputs is not None
    return fp.memory_gradient(inputs["received"], OneClientStep(model, cl, batch))


# -- memory_temperature ---------------------------------------------------------------------------
def test_memory_temperature_one_is_the_papers_loss_and_t_scales_it() -> None:
    # W = 0, one memory example x = e_1, Z_ens = (1, -1): f = (0, 0), q = (1/2, 1/2).
    # ∂KL/∂f_0 = (q_0 − p_0)/τ with p_0 = σ(2/τ); ∂W[c, 0] = ∂f_c (x = e_1), the rest 0.
    # τ = 1: p_0 = σ(2) = 0.880797 → ∂f_0 = −0.380797
    # τ = 3: p_0 = σ(2/3) = 0.660756 → ∂f_0 = −0.160756/3 = −0.053585
    x, z = torch.tensor([[1.0, 0.0, 0.0]]), torch.tensor([[1.0, -1.0]])
    for option, expected in (("1", 0.380797), ("T", 0.053585)):
        model = linear_model()
        model.params.zero_()
        fp = holdout_fedproj(x, memory_temperature=option)
        g = memory_grad(fp, model, z).view(2, 3)
        assert torch.allclose(g[:, 0], torch.tensor([-expected, expected]), atol=1e-6)
        assert torch.equal(g[:, 1:], torch.zeros(2, 2))
    # the server keeps T: the distillation teacher is σ(Z_ens/T) for both
    fp = holdout_fedproj(x, memory_temperature="1")
    assert torch.allclose(fp.remember(z), F.log_softmax(z / 3.0, dim=1))


# -- memory ---------------------------------------------------------------------------------------
def test_memory_all_equals_a_batch_covering_the_whole_memory() -> None:
    x = torch.randn(6, 3, generator=torch.Generator().manual_seed(3))
    z = torch.randn(6, 2, generator=torch.Generator().manual_seed(4))
    batched = memory_grad(holdout_fedproj(x), linear_model(seed=1), z, batch=32)
    whole = memory_grad(holdout_fedproj(x, memory="all"), linear_model(seed=1), z, batch=32)
    assert torch.allclose(batched, whole, atol=1e-6)  # the same 6 examples, another order
    small = memory_grad(holdout_fedproj(x), linear_model(seed=1), z, batch=2)
    assert not torch.allclose(small, whole, atol=1e-4)  # 2 of 6 differ from all 6
    assert torch.allclose(  # and memory=all ignores the batch size
        memory_grad(holdout_fedproj(x, memory="all"), linear_model(seed=1), z, batch=2), whole
    )


# -- warmup_epochs --------------------------------------------------------------------------------
def test_warmup_takes_one_adam_step_on_the_labelled_holdout() -> None:
    """One epoch of one full batch: Adam's first step moves each weight by −lr·g/(|g| + ε),
    i.e. by lr against the sign of ∇CE."""
    x = torch.randn(4, 3, generator=torch.Generator().manual_seed(5))
    y = torch.tensor([0, 1, 1, 0])
    fp = holdout_fedproj(x, warmup_epochs=1, distill_lr=0.01)
    model = linear_model(seed=2)
    srv = server(model, [])
    theta = srv.global_params.clone()
    model.zero_grad()
    F.cross_entropy(model.module(x), y).backward()
    expected = theta - 0.01 * torch.sign(model.grads)
    fp.on_holdout_labels(srv, 0, x, y)
    assert torch.allclose(srv.global_params, expected, atol=1e-6)
    assert srv.global_params.data_ptr() != model.params.data_ptr()
    later = srv.global_params.clone()
    fp.on_holdout_labels(srv, 1, x, y)  # round 0 only: later tasks' holdouts are not trained on
    assert torch.equal(srv.global_params, later)


def test_warmup_lowers_the_holdout_loss_and_is_off_by_default() -> None:
    x = torch.randn(16, 3, generator=torch.Generator().manual_seed(6))
    y = (x[:, 0] > 0).long()
    model = linear_model(seed=3)
    srv = server(model, [])
    before = srv.global_params.clone()
    holdout_fedproj(x).on_holdout_labels(srv, 0, x, y)
    assert torch.equal(srv.global_params, before)  # warmup_epochs = 0

    def loss(params: torch.Tensor) -> float:
        model.load(params)
        with torch.no_grad():
            return float(F.cross_entropy(model.module(x), y))

    holdout_fedproj(x, warmup_epochs=20, distill_lr=0.05).on_holdout_labels(srv, 0, x, y)
    assert loss(srv.global_params) < 0.5 * loss(before)


def test_warmup_refused_without_a_holdout(tmp_path: Path) -> None:
    write_tiny_cifar100(tmp_path, n=6)
    with pytest.raises(UserError, match=r"warmup_epochs.*public=holdout"):
        FedProj({"public": "cifar100", "warmup_epochs": 2}).setup(
            env(input_shape=(3, 32, 32), data_root=str(tmp_path))
        )


def test_the_engine_hands_the_holdout_labels_over() -> None:
    seen: list[tuple[int, int, int]] = []

    class Spy(FedProj):
        def on_holdout_labels(
            self, server: ServerState, task: int, x: torch.Tensor, y: torch.Tensor
        ) -> None:
            assert y.dtype == torch.long and int(y.min()) >= 0 and int(y.max()) < 10
            seen.append((task, x.shape[0], y.shape[0]))
            super().on_holdout_labels(server, task, x, y)

    spy = Spy({"public_size": 20, "warmup_epochs": 1})
    out = digits_federation(Strategy(FedAvg(), [spy]), train_size=400, test_size=100).run()
    assert out.status == "finished"
    assert seen == [(0, 20, 20), (1, 20, 20)]


# -- anchor ---------------------------------------------------------------------------------------
def anchor_after_round(anchor: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Two uploads a = (1, 2, 3, 4, 5, 6) with 10 samples and b = (3, 2, 1, 0, -1, -2) with 30;
    θ_g before the round = (0.5, …); θ_avg = the samples-weighted mean (1a + 3b)/4."""
    fp = holdout_fedproj(torch.randn(4, 3), gamma=1.0, anchor=anchor)
    model = linear_model()
    srv = server(model, [])
    srv.global_params = torch.full((6,), 0.5)
    a, b = torch.arange(1.0, 7.0), torch.tensor([3.0, 2.0, 1.0, 0.0, -1.0, -2.0])
    fp.receive_upload(Upload(0, a, torch.empty(0), 10), srv)
    fp.receive_upload(Upload(1, b, torch.empty(0), 30), srv)
    theta_avg = (a + 3 * b) / 4
    return fp.anchor_params(theta_avg), theta_avg


def test_anchor_values() -> None:
    snapshot, theta_avg = anchor_after_round("snapshot")
    assert snapshot is theta_avg
    mean, _ = anchor_after_round("mean")  # (a + b)/2 = (2, 2, 2, 2, 2, 2)
    assert torch.equal(mean, torch.full((6,), 2.0))
    previous, _ = anchor_after_round("global")  # θ_g as the round began
    assert torch.equal(previous, torch.full((6,), 0.5))


def test_anchor_pulls_the_distilled_model_towards_it() -> None:
    """A huge γ keeps θ at its anchor: anchor=global ends nearer the previous θ_g than the
    snapshot anchor does."""
    x = torch.randn(8, 3, generator=torch.Generator().manual_seed(8))

    def distilled(anchor: str) -> tuple[torch.Tensor, torch.Tensor]:
        fp = holdout_fedproj(x, gamma=100.0, anchor=anchor, distill_lr=0.05, distill_epochs=5)
        model = linear_model(seed=4)
        srv = server(model, [])
        previous = srv.global_params.clone()
        for seed in (5, 6):
            cl = client(seed, None)
            model.load(linear_model(seed=seed).params)
            upload = Upload(seed, model.params.clone(), model.buffers, 10)
            fp.after_local(cl, upload, local_round(model, srv))
            fp.receive_upload(upload, srv)
        srv.global_params = (linear_model(seed=5).params + linear_model(seed=6).params) / 2
        fp.aggregate(srv)
        return srv.global_params, previous

    to_global, previous = distilled("global")
    to_snapshot, _ = distilled("snapshot")
    assert (to_global - previous).norm() < 0.5 * (to_snapshot - previous).norm()


def test_anchor_refused_without_gamma() -> None:
    with pytest.raises(UserError, match=r"anchor=mean.*gamma"):
        FedProj({"public": "holdout", "anchor": "mean"}).setup(env())


# -- public=cifar100, defaults --------------------------------------------------------------------
def test_cifar100_public_set_for_colour_streams(tmp_path: Path) -> None:
    write_tiny_cifar100(tmp_path, n=6)
    fp = FedProj({"public": "cifar100", "public_size": 5})
    fp.setup(env(input_shape=(3, 32, 32), data_root=str(tmp_path)))
    assert fp.public_x is not None and fp.public_x.shape == (5, 3, 32, 32)
    assert fp.holdout_per_task(1000) == 0 and fp.protocol_changes() == {}


def test_defaults_stay_out_of_the_config() -> None:
    """Runs recorded before the variants keep their config (and protocol hash)."""
    fp = FedProj()
    fp.setup(env(input_shape=(1, 8, 8)))
    recorded = {"public", "public_size", "temperature", "gamma", "distill_epochs"}
    assert set(fp.resolved_options()) == recorded | {"distill_lr", "eps"}
    chosen = FedProj({"memory": "batch", "anchor": "snapshot"})
    chosen.setup(env(input_shape=(1, 8, 8)))
    assert {"memory", "anchor"} <= set(chosen.resolved_options())  # written once chosen
    assert math.isclose(fp.client_temperature, 3.0) and fp.memory == "batch"
    assert fp.anchor == "snapshot" and fp.warmup_epochs == 0
