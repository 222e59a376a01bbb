"""FedDF: the server's ensemble of the received client models (mean logits on the public set,
computed from the uploads it already has), distillation into the FedAvg mean with a cosine-
annealed Adam and clipping, no extra communication, the public sets and their refusals."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from torch import nn

from cfl_bench.core.context import ServerState, Upload
from cfl_bench.core.errors import UserError
from cfl_bench.core.flat import FlatModel
from cfl_bench.strategies import public_set
from cfl_bench.strategies.compose import Strategy, build_strategy
from cfl_bench.strategies.distillation import clip_grad_norm_, cosine_lr, distill, teacher_log_probs
from cfl_bench.strategies.fedavg import FedAvg
from cfl_bench.strategies.feddf import FedDF
from cfl_bench.streams import public_data
from cfl_bench.streams.augment import normalize
from tests.helpers import digits_federation, env, server
from tests.synthetic_data import write_tiny_cifar100


def holdout_feddf(public_x: torch.Tensor, **values: object) -> FedDF:
    """A FedDF whose public set is ``public_x`` (task 0's holdout slice)."""
    fd = FedDF({"public": "holdout", "public_size": public_x.shape[0], **values})
    fd.setup(env(input_shape=tuple(public_x.shape[1:]), batch_size=4))
    fd.on_task_start(server(FlatModel(nn.Linear(public_x.shape[1], 2)), []), 0, public_x)
    return fd


def receive(fd: FedDF, srv: ServerState, params: torch.Tensor) -> None:
    """One client's upload of ``params`` reaches the server."""
    fd.receive_upload(Upload(0, params, torch.empty(0), 10), srv)


# -- the ensemble teacher -------------------------------------------------------------------------
def test_ensemble_teacher_is_the_mean_of_the_client_models_logits() -> None:
    # Linear 2→2 without bias: f(e_i) is column i of W. Public x = e_1, e_2.
    # Client A: W = [[1, 2], [3, 4]] → f(e_1) = (1, 3), f(e_2) = (2, 4)
    # Client B: W = [[3, 0], [-1, 2]] → f(e_1) = (3, -1), f(e_2) = (0, 2)
    # Z_ens = mean = [[2, 1], [1, 3]]
    fd = holdout_feddf(torch.eye(2))
    model = FlatModel(nn.Linear(2, 2, bias=False))
    before = model.params.clone()
    srv = server(model, [])
    receive(fd, srv, torch.tensor([1.0, 2.0, 3.0, 4.0]))
    receive(fd, srv, torch.tensor([3.0, 0.0, -1.0, 2.0]))
    assert torch.equal(model.params, before)  # labelled in a scratch copy, not the engine's
    z = fd.ensemble()
    assert z is not None and torch.equal(z, torch.tensor([[2.0, 1.0], [1.0, 3.0]]))
    assert fd.ensemble() is None  # the next round's sum starts empty


def tiny_mlp(seed: int) -> FlatModel:
    """Non-linear, so the logit ensemble differs from the logits of the averaged weights."""
    torch.manual_seed(seed)
    return FlatModel(nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 2)))


def kl_by_hand(model: FlatModel, params: torch.Tensor, x: torch.Tensor, z: torch.Tensor) -> float:
    """KL(σ(z) ‖ σ(f(x; params))), batchmean, T = 1."""
    model.load(params)
    with torch.no_grad():
        p = torch.softmax(z, dim=1)
        log_q = torch.log_softmax(model.module(x), dim=1)
        return float((p * (p.log() - log_q)).sum() / x.shape[0])


def test_distillation_moves_the_mean_toward_the_ensemble() -> None:
    x = torch.randn(16, 3, generator=torch.Generator().manual_seed(7))
    fd = holdout_feddf(x, distill_steps=60, distill_lr=0.05)
    model = tiny_mlp(0)
    theta_a, theta_b = 4 * tiny_mlp(1).params, 4 * tiny_mlp(2).params  # saturated tanh
    srv = server(model, [])
    z = torch.zeros(16, 2)
    for theta in (theta_a, theta_b):
        receive(fd, srv, theta)
        model.load(theta)
        with torch.no_grad():
            z += model.module(x) / 2
    theta_avg = (theta_a + theta_b) / 2
    srv.global_params = theta_avg.clone()
    fd.aggregate(srv)
    before = kl_by_hand(model, theta_avg, x, z)
    after = kl_by_hand(model, srv.global_params, x, z)
    assert before > 1e-2
    assert after < 0.5 * before
    assert model.check_views()


# -- the optimiser --------------------------------------------------------------------------------
def test_cosine_schedule_values() -> None:
    lr = 1e-3
    assert cosine_lr(lr, 0, 500) == lr
    assert math.isclose(cosine_lr(lr, 250, 500), 5e-4)  # (1 + cos(π/2))/2 = 1/2
    assert math.isclose(cosine_lr(lr, 100, 500), lr * (1 + 0.8090169943749475) / 2)  # cos(π/5)
    assert abs(cosine_lr(lr, 500, 500)) < 1e-18  # (1 + cos π)/2 = 0


def test_distill_steps_with_the_cosine_rates() -> None:
    """Two full-batch steps with cosine over 2 steps: Adam at lr, then at lr·(1 + cos(π/2))/2
    = lr/2 — the same as stepping Adam by hand with those rates."""
    x = torch.randn(8, 3, generator=torch.Generator().manual_seed(1))
    teacher = teacher_log_probs(torch.randn(8, 2, generator=torch.Generator().manual_seed(2)), 1.0)
    ours = tiny_mlp(0)
    distill(
        ours, x, teacher, temperature=1.0, lr=0.1, batch_size=8,
        gen=torch.Generator().manual_seed(0), steps=2, scale_by_t_squared=False, cosine=True,
    )  # fmt: skip
    ref = tiny_mlp(0)
    optimizer = torch.optim.Adam(ref.module.parameters(), lr=0.1)
    for rate in (0.1, 0.05):
        optimizer.param_groups[0]["lr"] = rate
        ref.zero_grad()
        log_q = torch.log_softmax(ref.module(x), dim=1)
        loss = (teacher.exp() * (teacher - log_q)).sum() / 8
        loss.backward()
        optimizer.step()
    assert torch.allclose(ours.params, ref.params, atol=1e-6)
    constant = tiny_mlp(0)
    distill(
        constant, x, teacher, temperature=1.0, lr=0.1, batch_size=8,
        gen=torch.Generator().manual_seed(0), steps=2, scale_by_t_squared=False,
    )  # fmt: skip
    assert not torch.allclose(constant.params, ref.params, atol=1e-6)


def test_steps_cycle_through_reshuffled_passes() -> None:
    """5 examples, batch 2, 7 steps: passes of 3 batches (2, 2, 1), so 3 passes are begun."""
    from cfl_bench.strategies.distillation import batch_indices

    batches = list(batch_indices(5, 2, torch.Generator().manual_seed(0), steps=7))
    assert [len(b) for b in batches] == [2, 2, 1, 2, 2, 1, 2]
    assert sorted(torch.cat(batches[:3]).tolist()) == [0, 1, 2, 3, 4]


def test_gradient_clipping_by_hand() -> None:
    g = torch.tensor([3.0, 4.0])  # ‖g‖ = 5 → scaled by 1/(5 + 1e-6)
    clip_grad_norm_(g, 1.0)
    assert torch.allclose(g, torch.tensor([0.6, 0.8]), atol=1e-6)
    small = torch.tensor([0.3, 0.4])  # ‖g‖ = 0.5 ≤ 1: unchanged
    clip_grad_norm_(small, 1.0)
    assert torch.equal(small, torch.tensor([0.3, 0.4]))


# -- through the engine ---------------------------------------------------------------------------
def test_runs_on_digits_with_a_holdout_and_sends_nothing_extra() -> None:
    plain = digits_federation("fedavg", train_size=400, test_size=100).run()
    feddf = FedDF({"public": "holdout", "public_size": 20, "distill_steps": 10})
    out = digits_federation(Strategy(FedAvg(), [feddf]), train_size=400, test_size=100).run()
    assert out.status == "finished"
    assert feddf.public_x is not None and feddf.public_x.shape[0] == 40  # 2 tasks × 20
    assert out.comm_by_payload == plain.comm_by_payload  # only the model goes up and down
    assert feddf._logit_sum is None  # every round's ensemble was used and reset


def test_composes_with_fedavg_and_refuses_a_second_aggregator() -> None:
    strategy = build_strategy("fedavg+feddf:distill_steps=7")
    assert [c.name for c in strategy.all] == ["fedavg", "feddf"]
    assert strategy.aggregator is not None and strategy.aggregator.name == "feddf"
    with pytest.raises(UserError, match="overrides aggregation twice"):
        build_strategy("feddf+fedproj")


# -- public data ----------------------------------------------------------------------------------
def test_cifar100_public_set_is_normalised_like_the_stream(tmp_path: Path) -> None:
    write_tiny_cifar100(tmp_path, n=6)
    mean, std = (0.5, 0.4, 0.3), (0.2, 0.25, 0.3)

    def as_model_input(stored: torch.Tensor) -> torch.Tensor:
        return normalize(stored.to(torch.float32).div_(255), mean, std)

    base = env(input_shape=(3, 32, 32), data_root=str(tmp_path))
    fd = FedDF({"public": "cifar100", "public_size": 4})
    fd.setup(type(base)(**{**base.__dict__, "public_inputs": as_model_input}))
    raw = public_data.public_images(tmp_path, "cifar100")
    assert raw is not None and raw.shape == (6, 3, 32, 32) and raw.dtype == torch.uint8
    assert fd.public_x is not None and fd.public_x.shape == (4, 3, 32, 32)
    # each public row is one of the raw images, normalised as the stream does it
    expected = as_model_input(raw)
    assert all(any(torch.equal(row, e) for e in expected) for row in fd.public_x)


def test_public_refusals(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"3×32×32 images.*1×28×28.*feddf:public=holdout"):
        FedDF({"public": "cifar100"}).setup(env(input_shape=(1, 28, 28), data_root="."))
    with pytest.raises(UserError, match=r"cifar-100-python/train.*is missing"):
        FedDF({"public": "cifar100"}).setup(env(input_shape=(3, 32, 32), data_root=str(tmp_path)))
    with pytest.raises(UserError, match="no --data-root was given"):
        FedDF({"public": "cifar100"}).setup(env(input_shape=(3, 32, 32)))
    with pytest.raises(UserError, match="must be one of"):
        FedDF.options[0].convert("feddf", "imagenet")


def test_public_shape_tables_agree() -> None:
    """strategies cannot import streams: the two tables of public sets must stay equal."""
    assert public_set.PUBLIC_SHAPES == public_data.PUBLIC_SHAPES
    assert set(public_set.PUBLIC_CHOICES) == {"auto", "holdout", *public_data.PUBLIC_SHAPES}
