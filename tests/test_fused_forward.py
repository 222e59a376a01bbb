"""The CPU fast path's joined forward (``engine.fused_forward``): a step's batch and replay
draws forwarded as one give each part what its own forward gives — the same dropout masks
from the same generator draws, outputs bit for bit, gradients to rounding — and the plan
joins them only for models that never mix examples, on CPU, without --amp."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from cfl_bench.engine.fused_forward import FusedForward, separate_forwards
from cfl_bench.runner.config import make_config
from cfl_bench.runner.model_catalogue import MODEL_DESCRIPTIONS, PER_EXAMPLE_MODELS
from cfl_bench.runner.models import build_model, use_channels_last
from cfl_bench.runner.plan import fuses_forwards
from tests.helpers import digits_federation
from tests.test_vectorized import assert_same, one_thread  # noqa: F401 - the fixture

CPU = torch.device("cpu")


class TinyDropoutCNN(nn.Module):
    """A conv net on 1×8×8 digits with both kinds of dropout (feature, then elementwise),
    as the FedGP MNIST CNN has them."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 6, 3)
        self.drop2d = nn.Dropout2d(0.3)
        self.fc1 = nn.Linear(6 * 3 * 3, 20)
        self.fc2 = nn.Linear(20, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(F.max_pool2d(self.drop2d(self.conv(x)), 2)).flatten(1)
        return self.fc2(F.dropout(F.relu(self.fc1(x)), p=0.4, training=self.training))


def parts_of(rows: tuple[int, ...], shape: tuple[int, ...]) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(7)
    return [torch.rand((r, *shape), generator=generator) for r in rows]


def both_ways(
    module: nn.Module, parts: list[torch.Tensor]
) -> tuple[list[torch.Tensor], list[torch.Tensor], bool]:
    """Each part's outputs from separate forwards and from the joined one, from the same
    generator state; whether the generator ends in the same state."""
    torch.manual_seed(11)
    separate = separate_forwards(module, parts)
    after_separate = torch.get_rng_state()
    torch.manual_seed(11)
    joined = FusedForward(module)(parts)
    return separate, joined, torch.equal(after_separate, torch.get_rng_state())


@pytest.mark.parametrize("channels_last", [False, True])
def test_the_mnist_cnn_parts_equal_their_own_forwards_with_the_same_dropout_draws(
    channels_last: bool,
) -> None:
    torch.manual_seed(0)
    module = build_model("mnist-cnn", (1, 28, 28), 10).train()
    if channels_last:
        use_channels_last(module, "mnist-cnn")
    parts = parts_of((32, 32, 5), (1, 28, 28))  # DER++: the batch and two replay draws
    separate, joined, same_state = both_ways(module, parts)
    assert same_state  # the same number and order of draws
    for want, got in zip(separate, joined, strict=True):
        assert got.shape == want.shape
        # The same masks; the kernels may sum a row in another order for another row count
        # (a mask drawn otherwise would move outputs by their own size, not by 1e-7).
        assert torch.allclose(got, want, rtol=1e-5, atol=1e-6)


def test_its_gradients_agree_to_rounding() -> None:
    torch.manual_seed(0)
    module = build_model("mnist-cnn", (1, 28, 28), 10).train()
    parts = parts_of((32, 32), (1, 28, 28))
    y = torch.randint(0, 10, (32,))
    grads = []
    for forward in (lambda p: separate_forwards(module, p), FusedForward(module)):
        torch.manual_seed(3)
        out, replay = forward(parts)
        loss = F.cross_entropy(out, y) + F.mse_loss(replay, torch.zeros_like(replay))
        grads.append(torch.autograd.grad(loss, list(module.parameters())))
    for want, got in zip(*grads, strict=True):
        assert torch.allclose(got, want, rtol=1e-4, atol=1e-6)


def test_a_test_model_with_both_dropout_kinds_draws_as_its_separate_forwards() -> None:
    torch.manual_seed(0)
    module = TinyDropoutCNN().train()
    separate, joined, same_state = both_ways(module, parts_of((4, 9), (1, 8, 8)))
    assert same_state
    pairs = zip(separate, joined, strict=True)
    assert all(torch.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in pairs)
    # Had the joined forward drawn one mask for all rows, the second part would differ.
    torch.manual_seed(11)
    whole = module(torch.cat(parts_of((4, 9), (1, 8, 8))))
    assert not torch.allclose(whole[4:], separate[1], rtol=1e-2, atol=1e-3)


def test_eval_mode_and_a_single_part_are_plain_forwards() -> None:
    module = TinyDropoutCNN().eval()
    parts = parts_of((3, 2), (1, 8, 8))
    assert all(
        torch.equal(a, b)
        for a, b in zip(FusedForward(module)(parts), [module(p) for p in parts], strict=True)
    )
    module.train()
    torch.manual_seed(1)
    (one,) = FusedForward(module)(parts[:1])
    torch.manual_seed(1)
    assert torch.equal(one, module(parts[0]))


class DropsAWeight(nn.Module):
    """Dropout on a parameter (DropConnect-like): not per example, so not joinable."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(10, 64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.flatten(1) @ F.dropout(self.weight, 0.5, self.training).t()


def test_a_model_whose_dropout_is_not_per_example_goes_part_by_part() -> None:
    module = DropsAWeight().train()
    parts = parts_of((3, 4), (1, 8, 8))
    fused = FusedForward(module)
    separate, joined, same_state = both_ways(module, parts)
    assert same_state and all(torch.equal(a, b) for a, b in zip(separate, joined, strict=True))
    fused(parts)
    assert fused.probed and not fused.usable


def test_a_replay_run_with_joined_forwards_equals_the_separate_one_to_rounding(
    one_thread: None,  # noqa: F811 - the fixture
) -> None:
    # DER++ (a batch and two replay draws per step) on the digits with a dropout CNN: the
    # joined run ends within float rounding of the separate one. With other masks it would
    # not: the runs would differ as two seeds do.
    def cnn(name: str, shape: tuple[int, ...], classes: int) -> nn.Module:
        return TinyDropoutCNN(classes)

    settings = dict(num_tasks=2, rounds_per_task=1, lr=0.05, module_factory=cnn)
    plain = digits_federation("derpp", **settings)
    fast = digits_federation("derpp", fused_forwards=True, **settings)
    assert fast.executor.trainer.backend.fused is not None  # type: ignore[attr-defined]
    gap = assert_same(plain, plain.run(), fast, fast.run())
    assert gap > 0  # really joined: the gradient's sums ran in another order


def models_with_batch_norm() -> set[str]:
    shapes = {"centernet": (3, 64, 64), "mnist-cnn": (1, 28, 28)}
    found = set()
    for name in MODEL_DESCRIPTIONS:
        shape = shapes.get(name, (3, 32, 32))
        module = build_model(name, shape, 10)
        if any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in module.modules()):
            found.add(name)
    return found


def test_only_models_without_batch_norm_are_listed_as_per_example() -> None:
    with_bn = models_with_batch_norm()
    assert with_bn == {"cifar-cnn", "resnet18", "resnet32", "resnet8"}
    assert set(MODEL_DESCRIPTIONS) - with_bn == PER_EXAMPLE_MODELS


@pytest.mark.parametrize(
    ("values", "device", "fused"),
    [
        ({"model": "mnist-cnn"}, "cpu", True),
        ({"model": "mlp"}, "cpu", True),
        ({"model": "cifar-cnn"}, "cpu", False),  # BatchNorm mixes the rows in training
        ({"model": "mnist-cnn", "amp": "bf16"}, "cpu", False),
        ({"model": "mnist-cnn"}, "cuda", False),  # CUDA's dropout draws in another order
    ],
)
def test_the_plan_joins_forwards_only_where_they_stay_the_same(
    values: dict[str, object], device: str, fused: bool
) -> None:
    config = make_config({"strategy": "der", **values})
    assert fuses_forwards(config, torch.device(device)) is fused
