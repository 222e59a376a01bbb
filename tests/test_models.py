"""Model zoo: architectures, parameter counts, input checks and BatchNorm aggregation."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from cfl_bench.core.errors import UserError
from cfl_bench.core.flat import FlatModel
from cfl_bench.engine.aggregation import RunningAverage
from cfl_bench.runner.models import build_model


def test_cifar_resnet18_is_the_fedgp_architecture() -> None:
    model = build_model("resnet18", (3, 32, 32), 10)
    flat = FlatModel(model)
    assert flat.num_params == 11_173_962  # the standard CIFAR ResNet-18 count
    stem = model.conv1  # type: ignore[union-attr]
    assert isinstance(stem, nn.Conv2d) and stem.kernel_size == (3, 3) and stem.stride == (1, 1)
    assert not any(isinstance(m, nn.MaxPool2d) for m in model.modules())
    bns = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    assert len(bns) == 20 and flat.buffers.numel() == 2 * sum(b.num_features for b in bns)
    model.eval()
    with torch.inference_mode():
        assert model(torch.zeros(2, 3, 32, 32)).shape == (2, 10)


def test_small_cifar_cnn_shape_and_size() -> None:
    model = build_model("cifar-cnn", (3, 32, 32), 100)
    assert FlatModel(
        model
    ).num_params == 3 * 32 * 9 + 32 * 64 * 9 + 64 * 128 * 9 + 128 * 100 + 100 + 2 * (32 + 64 + 128)
    assert model(torch.zeros(4, 3, 32, 32)).shape == (4, 100)


@pytest.mark.parametrize("name", ["cifar-cnn", "resnet18"])
def test_cifar_models_refuse_other_input_sizes(name: str) -> None:
    with pytest.raises(UserError, match="needs C×32×32 inputs"):
        build_model(name, (1, 28, 28), 10)


def test_batchnorm_statistics_are_averaged_like_weights() -> None:
    torch.manual_seed(0)
    model = FlatModel(build_model("cifar-cnn", (3, 32, 32), 10))
    start_p, start_b = model.params.clone(), model.buffers.clone()
    average = RunningAverage(model.params, model.buffers)
    seen = []
    for shift, weight in ((0.0, 1.0), (3.0, 3.0)):
        model.load(start_p, start_b)
        model.module.train()
        with torch.no_grad():
            model.module(torch.randn(8, 3, 32, 32) + shift)  # moves the running statistics
        seen.append(model.buffers.clone())
        average.add(model.params, model.buffers, weight)
    result = average.result()
    assert result is not None
    _, buffers = result
    assert torch.allclose(buffers, (seen[0] + 3 * seen[1]) / 4)
    assert not torch.equal(seen[0], start_b)  # the statistics did move
