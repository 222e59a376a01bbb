"""FedProj: one-sided client projection against the ensemble's memory gradient, server
distillation of the logit ensemble into θ_avg (γ anchored to a snapshot), the logit
upload / Z_ens broadcast, and the public-data options."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from cfl_bench.core.context import ClientState, ServerState, Upload
from cfl_bench.core.errors import UserError
from cfl_bench.core.flat import FlatModel
from cfl_bench.engine.one_client import OneClientStep
from cfl_bench.strategies.compose import Strategy
from cfl_bench.strategies.fedavg import FedAvg
from cfl_bench.strategies.fedproj import FedProj, distill, memory_batch, teacher_log_probs
from tests.helpers import (
    client,
    digits_federation,
    env,
    inputs_for,
    linear_model,
    local_round,
    server,
)
from tests.synthetic_data import write_tiny_mnist

T = 3.0


def project(fp: FedProj, cl: ClientState, model: FlatModel, batch: int = 32) -> None:
    """The client receives the round's broadcast (Z_ens, once there is one) and projects
    the gradient in ``model.grads`` as the sequential executor does (``OneClientStep``)."""
    srv = server(model, [cl])
    inputs = inputs_for(fp, cl, local_round(model, srv, fp.broadcast(srv)))
    if inputs is not None:
        model.grads.copy_(fp.transform(model.grads, inputs, OneClientStep(model, cl, batch)))


def send(fp: FedProj, cl: ClientState, upload: Upload, srv: ServerState) -> None:
    """The client labels the public set with its model (``srv.model``); the server
    collects the upload — the two halves of an upload in a round."""
    fp.after_local(cl, upload, local_round(srv.model, srv))
    fp.receive_upload(upload, srv)


def holdout_fedproj(public_x: torch.Tensor, *, batch_size: int = 4, **values: object) -> FedProj:
    """A FedProj whose public memory is ``public_x`` (one holdout slice, task 0)."""
    fp = FedProj({"public": "holdout", "public_size": public_x.shape[0], **values})
    fp.setup(env(input_shape=tuple(public_x.shape[1:]), batch_size=batch_size))
    fp.on_task_start(server(linear_model(), []), 0, public_x)
    return fp


def memory_grad_by_hand(
    W: torch.Tensor, x: torch.Tensor, z: torch.Tensor, temperature: float
) -> torch.Tensor:
    """∇_W (1/n)·Σ_i Σ_c p_ic (log p_ic − log q_ic), p = σ(z/T), q = σ(x Wᵀ / T)."""
    W = W.detach().clone().requires_grad_(True)
    p = torch.softmax(z / temperature, dim=1)
    log_q = torch.log_softmax(x @ W.T / temperature, dim=1)
    loss = (p * (p.log() - log_q)).sum() / x.shape[0]
    loss.backward()
    assert W.grad is not None
    return W.grad.reshape(-1)


def ce_grad(model: FlatModel, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Fill the flat gradient with ∇ CE on (x, y), as the engine's backward does."""
    model.zero_grad()
    F.cross_entropy(model.module(x), y).backward()
    return model.grads.clone()


# -- client projection --------------------------------------------------------------------------
def projection_setup(
    teacher_labels: torch.Tensor, **values: object
) -> tuple[FedProj, FlatModel, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Linear 3→2 model; public set = the batch x; Z_ens confident on ``teacher_labels``."""
    model = linear_model(seed=1)
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(6, 3, generator=gen)
    y = torch.tensor([0, 1, 1, 0, 1, 0])
    z = 4.0 * (2.0 * F.one_hot(teacher_labels, 2).float() - 1.0)
    fp = holdout_fedproj(x, **values)
    fp.remember(z)
    return fp, model, x, y, z


def test_projection_removes_conflict_with_memory_gradient() -> None:
    y = torch.tensor([0, 1, 1, 0, 1, 0])
    fp, model, x, y, z = projection_setup(1 - y)  # teacher says the opposite of the labels
    cl = client(0, None)
    g_glob = memory_grad_by_hand(model.params.view(2, 3), x, z, T)
    g = ce_grad(model, x, y)
    dot = torch.dot(g, g_glob)
    assert dot < 0, "the test data gradient must conflict with g_glob"
    project(fp, cl, model)
    expected = g - dot / torch.dot(g_glob, g_glob) * g_glob
    assert torch.allclose(model.grads, expected, atol=1e-6)
    assert torch.dot(model.grads, g_glob) >= -1e-6
    assert model.module.training and model.check_views()
    assert isinstance(cl.state_for("fedproj")["generator"], torch.Generator)


def test_projection_leaves_gradient_alone_without_conflict() -> None:
    y = torch.tensor([0, 1, 1, 0, 1, 0])
    fp, model, x, y, z = projection_setup(y)  # teacher agrees with the labels
    cl = client(0, None)
    g = ce_grad(model, x, y)
    assert torch.dot(g, memory_grad_by_hand(model.params.view(2, 3), x, z, T)) > 0
    project(fp, cl, model)
    assert torch.equal(model.grads, g)


def test_no_projection_when_memory_gradient_is_below_eps() -> None:
    y = torch.tensor([0, 1, 1, 0, 1, 0])
    fp, model, x, y, _ = projection_setup(1 - y, eps=1e6)  # ‖g_glob‖² ≤ eps
    cl = client(0, None)
    g = ce_grad(model, x, y)
    project(fp, cl, model)
    assert torch.equal(model.grads, g)


def test_no_projection_before_the_first_ensemble() -> None:
    model = linear_model(seed=1)
    x, y = torch.randn(6, 3, generator=torch.Generator().manual_seed(3)), torch.ones(6).long()
    fp = holdout_fedproj(x)
    cl = client(0, None)
    g = ce_grad(model, x, y)
    project(fp, cl, model)
    assert torch.equal(model.grads, g)
    assert fp.broadcast(server(model, [cl])) == {}


# -- server distillation ------------------------------------------------------------------------
def tiny_mlp(seed: int) -> FlatModel:
    """Non-linear, so the logit ensemble differs from the logits of the averaged weights."""
    torch.manual_seed(seed)
    return FlatModel(nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 2)))


def kl_at(model: FlatModel, params: torch.Tensor, x: torch.Tensor, z: torch.Tensor) -> float:
    """KL(σ(z/T) ‖ σ(f(x; params)/T)), batchmean, by hand."""
    model.load(params)
    with torch.no_grad():
        p = torch.softmax(z / T, dim=1)
        log_q = torch.log_softmax(model.module(x) / T, dim=1)
        return float((p * (p.log() - log_q)).sum() / x.shape[0])


def two_client_round(
    gamma: float, epochs: int = 5
) -> tuple[FedProj, FlatModel, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Two clients upload public logits; θ_avg is their mean; the server distils.

    Returns the component, the server model, the public x, θ_avg and Z_ens (by hand).
    """
    x = torch.randn(16, 3, generator=torch.Generator().manual_seed(7))
    fp = holdout_fedproj(x, distill_lr=0.05, distill_epochs=epochs, gamma=gamma)
    model = tiny_mlp(0)
    # large weights saturate tanh, so the ensemble is far from the averaged model
    theta_a, theta_b = 4 * tiny_mlp(1).params, 4 * tiny_mlp(2).params
    c0, c1 = client(0, None), client(1, None)
    srv = server(model, [c0, c1])
    logits = []
    for cl, theta in ((c0, theta_a), (c1, theta_b)):
        model.load(theta)
        with torch.no_grad():
            logits.append(model.module(x))
        send(fp, cl, Upload(cl.index, model.params, model.buffers, 10), srv)
    theta_avg = (theta_a + theta_b) / 2
    srv.global_params = theta_avg.clone()
    fp.aggregate(srv)
    assert not torch.equal(srv.global_params, theta_avg)
    return fp, model, x, theta_avg, srv.global_params


def test_distillation_lowers_kl_to_the_ensemble() -> None:
    fp, model, x, theta_avg, distilled = two_client_round(gamma=0.0)
    assert fp.z_ens is not None
    before = kl_at(model, theta_avg, x, fp.z_ens)
    after = kl_at(model, distilled, x, fp.z_ens)
    assert before > 1e-3
    assert after < 0.5 * before


def test_gamma_keeps_distilled_model_nearer_theta_avg() -> None:
    _, _, _, theta_avg, free = two_client_round(gamma=0.0)
    _, _, _, theta_avg_2, anchored = two_client_round(gamma=5.0)
    assert torch.equal(theta_avg, theta_avg_2)
    assert (anchored - theta_avg).norm() < 0.5 * (free - theta_avg).norm()


def test_theta_avg_is_a_snapshot_so_gamma_acts_from_the_second_step() -> None:
    """One full-batch Adam step: θ = θ_avg, so γ's gradient is 0 and γ changes nothing; from
    the second step θ ≠ θ_avg and γ must matter (with a live alias it never would)."""
    x = torch.randn(8, 3, generator=torch.Generator().manual_seed(9))
    teacher = teacher_log_probs(torch.randn(8, 2, generator=torch.Generator().manual_seed(10)), T)

    def run(gamma: float, epochs: int) -> torch.Tensor:
        model = tiny_mlp(0)
        anchor = model.params.detach().clone()
        distill(
            model,
            x,
            teacher,
            anchor,
            temperature=T,
            gamma=gamma,
            epochs=epochs,
            lr=0.05,
            batch_size=8,
            gen=torch.Generator().manual_seed(0),
        )
        assert torch.equal(anchor, tiny_mlp(0).params)  # the anchor itself never moves
        assert model.check_views()  # Adam kept the parameters as views of the flat vector
        return model.params.clone()

    assert torch.equal(run(0.0, 1), run(10.0, 1))
    assert not torch.allclose(run(0.0, 2), run(10.0, 2))


def test_aggregate_does_not_mutate_the_fedavg_mean_tensor() -> None:
    x = torch.randn(8, 3, generator=torch.Generator().manual_seed(7))
    fp = holdout_fedproj(x, distill_lr=0.05, gamma=1.0)
    model = tiny_mlp(0)
    cl = client(0, None)
    srv = server(model, [cl])
    send(fp, cl, Upload(0, model.params, model.buffers, 1), srv)
    fedavg_mean = tiny_mlp(3).params.clone()
    srv.global_params = fedavg_mean
    fp.aggregate(srv)
    assert torch.equal(fedavg_mean, tiny_mlp(3).params)
    assert srv.global_params is not fedavg_mean
    assert srv.global_params.data_ptr() != model.params.data_ptr()  # a clone, not the live θ


# -- uploads, ensemble, broadcast ---------------------------------------------------------------
def test_z_ens_is_mean_of_uploaded_logits_and_is_broadcast() -> None:
    fp, model, x, _, _ = two_client_round(gamma=0.0, epochs=1)
    expected = []
    for seed in (1, 2):
        client_model = tiny_mlp(seed)
        client_model.params.mul_(4)
        with torch.no_grad():
            expected.append(client_model.module(x))
    assert fp.z_ens is not None
    assert torch.allclose(fp.z_ens, (expected[0] + expected[1]) / 2, atol=1e-6)
    srv = server(model, [])
    assert fp.broadcast(srv) == {"fedproj.z_ens": fp.z_ens}
    # next round: one participant only → Z_ens is its logits (the sum was reset)
    cl = client(0, None)
    model.load(tiny_mlp(4).params)
    upload = Upload(0, model.params, model.buffers, 10)
    model.module.train()
    send(fp, cl, upload, srv)
    logits = upload.extras["fedproj.logits"]
    assert logits.shape == (16, 2)
    assert model.module.training  # eval only while labelling the public set
    with torch.no_grad():
        assert torch.allclose(logits, tiny_mlp(4).module(x))
    srv.global_params = model.params.clone()
    fp.aggregate(srv)
    assert torch.allclose(fp.z_ens, logits)


# -- public data --------------------------------------------------------------------------------
def test_auto_uses_fashion_mnist_for_28x28_streams(tmp_path: Path) -> None:
    # Fashion-MNIST's test split only, as the shared copy has (random pixels: the format is
    # what matters here)
    write_tiny_mnist(tmp_path, gz=True, n_train=0, n_test=120, dataset="FashionMNIST")
    root = str(tmp_path)
    fp = FedProj({"public_size": 50})
    fp.setup(env(input_shape=(1, 28, 28), data_root=root))
    assert fp.opts.public == "fashion-mnist"
    assert fp.holdout_per_task(60_000) == 0
    assert fp.public_x is not None
    assert fp.public_x.shape == (50, 1, 28, 28) and fp.public_x.dtype == torch.float32
    assert float(fp.public_x.min()) >= 0.0 and float(fp.public_x.max()) <= 1.0
    same = FedProj({"public_size": 50})
    same.setup(env(input_shape=(1, 28, 28), data_root=root))
    other = FedProj({"public_size": 50})
    other.setup(env(input_shape=(1, 28, 28), data_root=root, seed=1))
    assert torch.equal(fp.public_x, same.public_x)  # seeded subset
    assert not torch.equal(fp.public_x, other.public_x)
    everything = FedProj({"public": "fashion-mnist", "public_size": 20000})
    everything.setup(env(input_shape=(1, 28, 28), data_root=root))
    assert everything.public_x is not None and everything.public_x.shape[0] == 120


def test_auto_uses_holdout_for_other_shapes() -> None:
    fp = FedProj({"public_size": 7})
    assert fp.holdout_per_task(100) == 0  # unresolved before setup
    fp.setup(env(input_shape=(1, 8, 8)))
    assert fp.opts.public == "holdout"
    assert fp.holdout_per_task(100) == 7
    assert fp.public_x is None
    assert FedProj({"public": "holdout", "public_size": 9}).holdout_per_task(100) == 9
    assert FedProj({"public": "fashion-mnist"}).holdout_per_task(100) == 0
    auto = FedProj({"public": "holdout"})
    assert auto.holdout_per_task(1437) == 143  # 10 % by default
    assert auto.holdout_per_task(60_000) == 1000  # at most 1000


def test_fashion_mnist_refusals() -> None:
    with pytest.raises(UserError, match=r"--data-root.*public=holdout"):
        FedProj({"public": "fashion-mnist"}).setup(env(input_shape=(1, 28, 28)))
    with pytest.raises(UserError, match="public=holdout"):
        FedProj({"public": "fashion-mnist"}).setup(env(input_shape=(3, 32, 32), data_root="."))
    with pytest.raises(UserError, match="one of auto, fashion-mnist, holdout"):
        FedProj.options[0].convert("fedproj", "cifar10")


def test_fashion_mnist_refused_when_files_are_missing(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="--data-root"):
        FedProj({"public": "fashion-mnist"}).setup(
            env(input_shape=(1, 28, 28), data_root=str(tmp_path))
        )


def test_holdout_memory_grows_per_task_and_z_ens_covers_only_its_prefix() -> None:
    model = linear_model()
    cl = client(0, None)
    srv = server(model, [cl])
    fp = FedProj({"public": "holdout", "public_size": 4})
    fp.setup(env(input_shape=(3,)))
    first, second = torch.randn(4, 3), torch.randn(4, 3)
    fp.on_task_start(srv, 0, first)
    upload = Upload(0, model.params, model.buffers, 1)
    send(fp, cl, upload, srv)
    assert upload.extras["fedproj.logits"].shape == (4, 2)
    fp.aggregate(srv)
    fp.on_task_start(srv, 1, second)
    assert fp.public_x is not None and torch.equal(fp.public_x, torch.cat([first, second]))
    # the memory batch draws only among the examples Z_ens covers (the first 4)
    project(fp, cl, model)
    inputs = inputs_for(fp, cl, local_round(model, srv, fp.broadcast(srv)))
    assert inputs is not None and inputs["received"].shape[0] == 4
    drawn = memory_batch(cl, inputs["received"].shape[0], 32, fp.seed, fp.device)
    assert drawn.sort().values.tolist() == [0, 1, 2, 3]
    upload = Upload(0, model.params, model.buffers, 1)
    send(fp, cl, upload, srv)
    assert upload.extras["fedproj.logits"].shape == (8, 2)  # the whole current public set


# -- through the engine -------------------------------------------------------------------------
def test_runs_in_the_engine_and_counts_its_payloads() -> None:
    fedproj = FedProj({"public_size": 20})
    fed = digits_federation(
        Strategy(FedAvg(), [fedproj]),
        train_size=400,
        test_size=100,
        buffer_batch_size=8,
        buffer_size=10,
    )
    out = fed.run()
    assert out.status == "finished"
    assert fedproj.opts.public == "holdout"
    assert fedproj.public_x is not None and fedproj.public_x.shape[0] == 40
    row = 10 * 4  # one float32 logit row of 10 classes
    # uploads: 4 clients × (2 rounds × 20 rows + 2 rounds × 40 rows)
    assert out.comm_by_payload["up:fedproj.logits"] == 4 * (2 * 20 + 2 * 40) * row
    # broadcasts from round 2 on: Z_ens of rounds 1, 2 (20 rows) and 3 (40 rows)
    assert out.comm_by_payload["down:fedproj.z_ens"] == 4 * (20 + 20 + 40) * row
