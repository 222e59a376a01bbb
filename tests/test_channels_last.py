"""``--channels-last`` (``models.use_channels_last``): the convolutions see channels-last
inputs, the model computes the same function to float rounding, a run trains the same to
rounding, and the flag is refused where it would do nothing or cannot work."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from cfl_bench.core.errors import UserError
from cfl_bench.runner.config import make_config
from cfl_bench.runner.models import build_model, use_channels_last
from cfl_bench.runner.run import plan_run
from tests.helpers import digits_federation
from tests.test_vectorized import assert_same, one_thread  # noqa: F401 - the fixture


def conv_inputs(model: nn.Module) -> list[torch.Tensor]:
    """Record the input every ``nn.Conv2d`` of ``model`` receives (after the pre-hooks)."""
    seen: list[torch.Tensor] = []
    for module in model.modules():
        if isinstance(module, nn.Conv2d):
            module.register_forward_hook(lambda m, args, out: seen.append(args[0]))
    return seen


@pytest.mark.parametrize("name", ["mnist-cnn", "fedavg-cnn"])
def test_every_conv_gets_a_channels_last_input_and_the_function_is_unchanged(name: str) -> None:
    torch.manual_seed(0)
    plain = build_model(name, (1, 28, 28), 10).eval()
    fast = build_model(name, (1, 28, 28), 10).eval()
    fast.load_state_dict(plain.state_dict())
    use_channels_last(fast, name)
    seen = conv_inputs(fast)
    x = torch.rand(8, 1, 28, 28)
    want, got = plain(x), fast(x)
    assert len(seen) == 2
    # One channel is "contiguous" in both formats; the strides say which one the kernels get.
    assert all(t.stride(1) == 1 for t in seen), [t.stride() for t in seen]
    assert all(t.is_contiguous(memory_format=torch.channels_last) for t in seen)
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-6)
    assert got.is_contiguous()  # logits come back in the usual layout (flatten, linear)


def test_gradients_agree_to_rounding() -> None:
    torch.manual_seed(1)
    plain = build_model("mnist-cnn", (1, 28, 28), 10).eval()
    fast = build_model("mnist-cnn", (1, 28, 28), 10).eval()
    fast.load_state_dict(plain.state_dict())
    use_channels_last(fast, "mnist-cnn")
    x, y = torch.rand(16, 1, 28, 28), torch.randint(0, 10, (16,))
    for model in (plain, fast):
        nn.functional.cross_entropy(model(x), y).backward()
    for p, q in zip(plain.parameters(), fast.parameters(), strict=True):
        assert p.grad is not None and q.grad is not None
        assert q.grad.is_contiguous()  # the flat gradient's views stay valid
        assert torch.allclose(q.grad, p.grad, rtol=1e-4, atol=1e-6)


def test_a_run_trains_the_same_to_rounding() -> None:
    # DER + FedGP on the embedded digits with the FedAvg CNN, sequential: the same run with
    # channels-last convolutions ends within float rounding of the default one.
    def channels_last_cnn(name: str, shape: tuple[int, ...], classes: int) -> nn.Module:
        model = build_model(name, shape, classes)
        use_channels_last(model, name)
        return model

    settings = dict(num_tasks=1, rounds_per_task=2, model="fedavg-cnn", lr=0.01)
    plain = digits_federation("der+fedgp", **settings)
    fast = digits_federation("der+fedgp", module_factory=channels_last_cnn, **settings)
    seen = conv_inputs(fast.model.module)
    gap = assert_same(plain, plain.run(), fast, fast.run())
    assert seen and all(t.stride(1) == 1 for t in seen)
    assert gap > 0  # really another kernel: the rounding differs


def test_a_model_without_convolutions_is_refused() -> None:
    with pytest.raises(UserError, match="model 'mlp' has none; drop --channels-last"):
        use_channels_last(build_model("mlp", (1, 8, 8), 10), "mlp")


def test_refused_with_the_vectorized_executor() -> None:
    config = make_config(
        {
            "strategy": "fedavg",
            "model": "fedavg-cnn",
            "executor": "vectorized",
            "channels_last": True,
            "tasks": 1,
        }
    )
    with pytest.raises(UserError, match="not supported with --executor vectorized"):
        plan_run(config)


def test_the_plan_installs_it() -> None:
    config = make_config(
        {"strategy": "fedavg", "model": "fedavg-cnn", "channels_last": True, "tasks": 1}
    )
    plan = plan_run(config)
    seen = conv_inputs(plan.model)
    plan.model(torch.rand(2, *plan.stream.input_shape))
    assert seen and all(t.stride(1) == 1 for t in seen)
