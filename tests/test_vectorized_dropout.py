"""Dropout models under the vectorized executor (``engine.vectorized_dropout``): each
client's masks drawn from its own default-generator state in the sequential order, so
parameters, records and buffers equal the sequential executor's (CPU).

Runs as tests/test_vectorized_replay.py (embedded rot-digits, 2 tasks × 2 rounds, 4 clients
with unequal Dirichlet shards, a 20-example buffer, replay batches of 8) with ``DropoutNet``:
mnist-cnn's layout (conv, Dropout2d, pool, fc, F.dropout, fc) at the digits' 1×8×8 size.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from cfl_bench.core.errors import UserError
from cfl_bench.core.flat import FlatModel
from cfl_bench.engine.loop import Federation
from cfl_bench.engine.vectorized import VectorizedExecutor, check_model, check_vectorizable
from cfl_bench.engine.vectorized_dropout import (
    DropoutLayer,
    apply_masks,
    draw_masks,
    probe,
    stack_masks,
)
from cfl_bench.engine.vectorized_grad import ClientGradients
from cfl_bench.runner.models import build_model
from cfl_bench.strategies.compose import build_strategy
from cfl_bench.strategies.replay import ReplayPlan
from tests.helpers import CPU, digits_federation
from tests.test_vectorized import assert_same, one_thread  # noqa: F401 - the fixture
from tests.test_vectorized_replay import REPLAY, assert_same_buffers


class DropoutNet(nn.Module):
    """conv 1→4 k3, Dropout2d(0.5), max-pool 2, ReLU; fc 36→16, ReLU, dropout(0.3); fc."""

    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 4, kernel_size=3)
        self.conv_drop = nn.Dropout2d()
        self.fc1 = nn.Linear(36, 16)
        self.fc2 = nn.Linear(16, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classify(self.representation(x))

    def representation(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(F.max_pool2d(self.conv_drop(self.conv(x)), 2)).flatten(1)
        return F.dropout(F.relu(self.fc1(x)), p=0.3, training=self.training)

    def classify(self, z: torch.Tensor) -> torch.Tensor:
        return self.fc2(z)


def dropout_net(name: str, shape: tuple[int, ...], classes: int) -> nn.Module:
    """``digits_federation``'s model factory (the strategy sees the facts of ``name``)."""
    return DropoutNet(classes)


DT = (torch.float32, CPU)


def run_dropout(strategy: str, **kw: object) -> tuple[Federation, Federation]:
    """Both executors on the replay tests' run with ``DropoutNet``: parameters and records
    equal (``assert_same``), and torch's default generator left in the same state (the
    last piece of client work's); returns the finished federations."""
    feds, states = [], []
    for executor in ("sequential", "vectorized"):
        fed = digits_federation(
            strategy,
            executor=executor,
            module_factory=dropout_net,
            **{**REPLAY, **kw},  # type: ignore[arg-type]
        )
        feds.append((fed, fed.run()))
        states.append(torch.get_rng_state())
    (seq, a), (vec, b) = feds
    assert isinstance(vec.executor, VectorizedExecutor)
    assert_same(seq, a, vec, b)
    assert torch.equal(states[0], states[1])
    return seq, vec


@pytest.mark.parametrize(
    "strategy",
    [
        "fedavg",
        "der",
        "der+fedgp",
        "agem",
        "fedavg+fedntd",
        "derpp",
        "fedavg+moon",
        "fedavg+fedproj:distill_lr=1e-12",
    ],
)
def test_dropout_runs_equal_the_sequential_executor(strategy: str) -> None:
    seq, vec = run_dropout(strategy)
    assert len({c.num_samples for c in vec.clients}) == 4  # unequal shards
    if not strategy.startswith("fedavg"):
        assert_same_buffers(seq, vec)  # stored logits: the outputs with the step's masks


def test_chunked_momentum_and_eval_mode_gref_equal() -> None:
    # Chunks of 3 and 1 (each chunk keeps its clients' generator states), momentum, FedGP's
    # g_ref in eval mode (no masks drawn for the requests).
    run_dropout("der+fedgp:gref_mode=eval", clients_per_chunk=3, momentum=0.9)


def test_without_the_masks_the_runs_differ(monkeypatch: pytest.MonkeyPatch) -> None:
    # The comparison can fail: masks of ones (no dropout) in the vectorized run only.
    def ones(self: DropoutLayer, rows: int, dtype: torch.dtype, device: object) -> torch.Tensor:
        return torch.ones((rows, *self.shape), dtype=dtype)

    monkeypatch.setattr(DropoutLayer, "draw", ones)
    with pytest.raises(AssertionError, match="< 1e-05"):  # the parameter gap
        run_dropout("fedavg", num_tasks=1, rounds_per_task=1)


def test_a_drawn_mask_is_the_sequential_dropouts_noise() -> None:
    # On CPU, F.dropout(x) = x · (bernoulli(1 − p) / (1 − p)) with the noise shaped as x, and
    # F.dropout2d's noise is (N, C, 1, 1): the same draws from the same generator state.
    x = torch.randn(3, 4, 5, 5)
    torch.manual_seed(7)
    expected = F.dropout(F.dropout2d(x, 0.5, True).flatten(1), 0.3, True)
    torch.manual_seed(7)
    feature = DropoutLayer(0.5, (4, 1, 1)).draw(3, torch.float32, torch.device("cpu"))
    plain = DropoutLayer(0.3, (100,)).draw(3, torch.float32, torch.device("cpu"))
    assert set(feature.unique().tolist()) == {0.0, 2.0}  # 1/(1 − 0.5) where kept
    assert torch.equal((x * feature).flatten(1) * plain, expected)
    assert not DropoutLayer(1.0, (2,)).draw(2, torch.float32, torch.device("cpu")).any()


def test_the_probe_records_mnist_cnns_dropout_calls() -> None:
    module = build_model("mnist-cnn", (1, 28, 28), 10)
    before = torch.get_rng_state()
    layers = probe(module, torch.zeros(2, 1, 28, 28))
    # conv2's Dropout2d on (N, 20, 8, 8): a channel mask (20, 1, 1); fc1's F.dropout on
    # (N, 50): an elementwise mask; both p = 0.5. The probe draws nothing.
    assert layers == (DropoutLayer(0.5, (20, 1, 1)), DropoutLayer(0.5, (50,)))
    assert torch.equal(torch.get_rng_state(), before)
    module.eval()
    assert probe(module, torch.zeros(2, 1, 28, 28)) == ()  # called, but no mask drawn
    assert probe(build_model("mlp", (1, 8, 8), 10), torch.zeros(2, 1, 8, 8)) is None


def test_masks_replace_dropout_in_call_order() -> None:
    # Two calls: x = [[1, 2]] · [[2, 0]] = [[2, 0]], then [[2, 0]] · [[0.5, 3]] = [[1, 0]];
    # an eval-mode call (training=False) between them uses no mask.
    x = torch.tensor([[1.0, 2.0]])
    masks = (torch.tensor([[2.0, 0.0]]), torch.tensor([[0.5, 3.0]]))
    with apply_masks(masks):
        y = F.dropout(F.dropout(F.dropout(x, 0.5, True), 0.5, False), p=0.5)
    assert y.tolist() == [[1.0, 0.0]]
    with pytest.raises(RuntimeError, match="fewer dropout calls"), apply_masks(masks):
        F.dropout(x, 0.5, True)
    with pytest.raises(RuntimeError, match="more dropout calls"), apply_masks(masks[:1]):
        F.dropout(F.dropout(x, 0.5, True), 0.5, True)


def test_draw_masks_follows_the_sequential_forwards_and_pads() -> None:
    # Two forwards joined: 2 real rows of 3, then 1 real row of 2. Sequentially the first
    # forward draws its 2 rows, then the second its 1 row; padded rows are 0.
    layer = DropoutLayer(0.5, (4,))
    cpu = torch.device("cpu")
    torch.manual_seed(3)
    first, second = layer.draw(2, torch.float32, cpu), layer.draw(1, torch.float32, cpu)
    torch.manual_seed(3)
    (mask,) = draw_masks([layer], [(2, 3), (1, 2)], torch.float32, cpu)
    assert mask.shape == (5, 4)
    assert torch.equal(mask[:2], first) and torch.equal(mask[3:4], second)
    assert not mask[2].any() and not mask[4].any()


def test_the_vmapped_mnist_cnn_loss_equals_the_sequential_forward() -> None:
    # One client, 3 real rows padded to 5: masks drawn at the seed the sequential forward
    # starts from give its loss and gradient.
    torch.manual_seed(0)
    model = FlatModel(build_model("mnist-cnn", (1, 28, 28), 10))
    grads = ClientGradients(model, False, ReplayPlan())
    x, y = torch.randn(3, 1, 28, 28), torch.tensor([1, 4, 7])
    torch.manual_seed(11)
    model.zero_grad()
    loss = F.cross_entropy(model.module(x), y)
    loss.backward()
    layers = grads.dropout_layers((1, 28, 28))
    assert layers is not None
    torch.manual_seed(11)
    masks = stack_masks(layers, [draw_masks(layers, [(3, 5)], torch.float32, CPU)], 5, *DT)
    padded = torch.cat([x, torch.zeros(2, 1, 28, 28)])[None]
    labels, rows = torch.cat([y, y[:2]])[None], torch.tensor([[1.0, 1, 1, 0, 0]])
    flat, losses, _ = grads.gradients(model.params[None], padded, labels, rows, masks=masks)
    assert losses[0].item() == pytest.approx(loss.item(), rel=1e-6)
    assert torch.allclose(flat[0], model.grads, rtol=1e-5, atol=1e-7)


def test_mnist_cnn_is_accepted_and_alpha_dropout_refused() -> None:
    module = build_model("mnist-cnn", (1, 28, 28), 10)
    check_vectorizable(build_strategy("der+fedgp"), module, "mnist-cnn")
    alpha = nn.Sequential(nn.Linear(2, 2), nn.AlphaDropout(0.2))
    with pytest.raises(UserError, match=r"alpha dropout.*use --executor sequential"):
        check_model(alpha)
    with pytest.raises(UserError, match="'resnet8': it is not one of the models checked"):
        check_model(nn.Linear(2, 2), "resnet8")


def test_dropout_calls_it_cannot_reproduce_are_refused_at_the_probe() -> None:
    class Alpha(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return F.alpha_dropout(x, 0.2, True)

    class DropConnect(nn.Linear):
        def __init__(self) -> None:
            super().__init__(3, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return F.linear(x, F.dropout(self.weight, 0.2, True))  # a (4, 3) weight

    class Unbatched(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return F.dropout2d(x[0], 0.2, True)  # (C, H, W): no batch dimension

    with pytest.raises(UserError, match="alpha dropout"):
        probe(Alpha(), torch.zeros(2, 3))
    with pytest.raises(UserError, match="feature dropout on batched inputs only"):
        probe(Unbatched(), torch.zeros(2, 2, 3, 3))
    with pytest.raises(UserError, match="per-example activations only"):
        probe(DropConnect(), torch.zeros(2, 3))


def test_bf16_dropout_runs_agree_within_the_rounding() -> None:
    # --amp bf16: masks cast to the autocast dtype of their dropout input. Measured 2.4e-3
    # (bf16 vs fp32 of the sequential run itself: 2.8e-3); unmatched masks give 2.8e-2.
    feds = []
    for executor in ("sequential", "vectorized"):
        fed = digits_federation(
            "fedavg",
            executor=executor,
            amp="bf16",
            module_factory=dropout_net,
            **REPLAY,  # type: ignore[arg-type]
        )
        fed.run()
        feds.append(fed.server.global_params)
    gap = float((feds[0] - feds[1]).abs().max() / feds[0].abs().max())
    assert gap < 1e-2
