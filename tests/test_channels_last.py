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


# --- the default: on where it was measured cheaper ------------------------------------------


@pytest.mark.parametrize(
    ("values", "device", "expected"),
    [
        ({"model": "mnist-cnn"}, "cpu", True),
        ({"model": "cifar-cnn"}, "cpu", True),
        ({"model": "resnet8"}, "cpu", True),
        ({"model": "resnet18"}, "cpu", False),  # measured even: 0.95x AVX2, 1.04x AVX-512
        ({"model": "centernet"}, "cpu", False),  # 6-8 % only, and its mAP is too chaotic
        ({"model": "mlp"}, "cpu", False),  # no convolutions
        ({"model": "mnist-cnn"}, "cuda", False),  # not measured on GPUs: the user's choice
        ({"model": "mnist-cnn", "executor": "vectorized"}, "cpu", False),  # vmap cannot
        ({"model": "mnist-cnn", "channels_last": False}, "cpu", False),
        ({"model": "resnet18", "channels_last": True}, "cpu", True),
        ({"model": "resnet18", "channels_last": True}, "cuda", True),
    ],
)
def test_the_default_resolves_where_it_was_measured_cheaper(
    values: dict[str, object], device: str, expected: bool
) -> None:
    from cfl_bench.runner.plan import resolve_channels_last

    config = make_config({"strategy": "fedavg", **values})
    assert config.channels_last == values.get("channels_last")  # None: the default
    resolved = resolve_channels_last(config, torch.device(device), str(config.model))
    assert resolved.channels_last is expected


def test_a_default_run_records_what_it_resolved_and_keeps_its_identity() -> None:
    # config.json's configuration says which memory format ran; the configuration hash and
    # the sweep point's name are those of a run that names it (it changes only rounding).
    from cfl_bench.runner.run_names import point_request

    base = {"strategy": "fedavg", "model": "fedavg-cnn", "tasks": 1}
    plans = {v: plan_run(make_config({**base, "channels_last": v})) for v in (None, True, False)}
    assert plans[None].resolved["config"]["channels_last"] is True
    assert plans[None].config.channels_last is True
    assert len({p.config_hash for p in plans.values()}) == 1
    assert "channels_last" not in point_request(make_config(base))
    seen = conv_inputs(plans[None].model)
    plans[None].model(torch.rand(2, *plans[None].stream.input_shape))
    assert seen and all(t.stride(1) == 1 for t in seen)


def test_the_vectorized_default_is_contiguous_and_not_refused() -> None:
    config = make_config(
        {"strategy": "fedavg", "model": "fedavg-cnn", "executor": "vectorized", "tasks": 1}
    )
    assert plan_run(config).config.channels_last is False
