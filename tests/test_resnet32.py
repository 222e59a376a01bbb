"""ResNet-32 (``--model resnet32``) as PyCIL's ``convs/cifar_resnet.py`` builds it in TARGET's
code base: its size from the official layer list, its option-A shortcut on a hand tensor,
its initialisation, its 64 features, the vectorized executor's refusal and one federated
iCaRL run on it through the CLI (the learner that reads its features).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from cfl_bench.core.errors import UserError
from cfl_bench.core.flat import FlatModel
from cfl_bench.engine.vectorized import check_vectorizable
from cfl_bench.runner.models import build_model
from cfl_bench.runner.resnet import CifarResNet32, ZeroPadShortcut
from cfl_bench.strategies.compose import build_strategy
from tests.synthetic_data import write_tiny_cifar10
from tests.test_cli import in_process


def test_the_parameter_count_is_the_official_layer_list_s() -> None:
    """The official ``resnet32()`` (depth 32: n = 5 blocks per stage), by hand:

    - stem: conv 3→16 3×3 (432) + BN 16 (32) = 464
    - stage 1: 5 × [2 conv 16→16 (2 × 2,304) + 2 BN (64)] = 5 × 4,672 = 23,360
    - stage 2: [conv 16→32 (4,608) + conv 32→32 (9,216) + 2 BN (128)] = 13,952, then
      4 × [2 × 9,216 + 128] = 74,240; 88,192 in all
    - stage 3: [conv 32→64 (18,432) + conv 64→64 (36,864) + 2 BN (256)] = 55,552, then
      4 × [2 × 36,864 + 256] = 295,936; 351,488 in all
    - shortcuts: option A (``DownsampleA``: stride-2 subsampling + zero channels), 0

    Backbone 464 + 23,360 + 88,192 + 351,488 = 463,504. The official module also holds an
    unused ``Linear(64, 10)`` (650; PyCIL counts 464,154 for it) that this model leaves out;
    the classifier is 64·C + C.
    """

    def count(classes: int) -> int:
        return sum(p.numel() for p in build_model("resnet32", (3, 32, 32), classes).parameters())

    assert count(100) == 463_504 + 6_500 == 470_004
    assert count(10) == 463_504 + 650 == 464_154


def test_the_layers_are_the_official_ones() -> None:
    model = CifarResNet32(100)
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    norms = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    assert len(convs) == 31 and all(c.kernel_size == (3, 3) and c.bias is None for c in convs)
    assert len(norms) == 31
    assert all(n.momentum == 0.1 and n.eps == 1e-5 and n.affine for n in norms)
    assert [len(s) for s in (model.stage_1, model.stage_2, model.stage_3)] == [5, 5, 5]
    shortcuts = [type(b.shortcut).__name__ for s in (model.stage_2, model.stage_3) for b in s]
    assert (
        shortcuts == ["ZeroPadShortcut"] + ["Identity"] * 4 + ["ZeroPadShortcut"] + ["Identity"] * 4
    )
    assert model.fc.in_features == 64 and model.fc.out_features == 100
    # running mean + variance of 16 + 5·2·(16 + 32 + 64) = 1,136 channels: averaged like weights
    assert FlatModel(model).buffers.numel() == 2 * 1_136


def test_the_option_a_shortcut_subsamples_and_pads_with_zeros() -> None:
    x = torch.arange(32.0).reshape(1, 2, 4, 4)
    out = ZeroPadShortcut()(x)
    kept = [[[0.0, 2], [8, 10]], [[16, 18], [24, 26]]]  # rows and columns 0 and 2
    zeros = [[[0.0, 0], [0, 0]]] * 2
    assert torch.equal(out, torch.tensor([kept + zeros]).reshape(1, 4, 2, 2))


def test_the_initialisation_is_the_official_one() -> None:
    torch.manual_seed(0)
    model = CifarResNet32(100)
    wide = model.stage_3[1].conv_a.weight  # 64·64·9 = 36,864 draws of N(0, 2 / (9·64))
    assert wide.mean().item() == pytest.approx(0.0, abs=0.002)
    assert wide.std().item() == pytest.approx((2 / 576) ** 0.5, rel=0.02)  # 0.0589
    stem = model.conv_1_3x3.weight  # fan-out 9·16: std 0.118 (torch's default: 0.11 uniform)
    assert stem.std().item() == pytest.approx((2 / 144) ** 0.5, rel=0.15)
    bound = (3 / 64) ** 0.5  # Kaiming-uniform, linear gain, fan-in 64: U(±0.2165)
    assert model.fc.weight.abs().max().item() <= bound
    assert model.fc.weight.abs().max().item() > 0.98 * bound
    assert model.fc.weight.std().item() == pytest.approx(bound / 3**0.5, rel=0.05)
    assert torch.equal(model.fc.bias, torch.zeros(100))
    for norm in (m for m in model.modules() if isinstance(m, nn.BatchNorm2d)):
        assert torch.equal(norm.weight, torch.ones_like(norm.weight))
        assert torch.equal(norm.bias, torch.zeros_like(norm.bias))


def test_the_features_are_64_pooled_channels_and_the_logits_read_them() -> None:
    model = build_model("resnet32", (3, 32, 32), 10).eval()
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    z = model.representation(x)
    assert z.shape == (2, 64) and bool((z >= 0).all())  # the mean of ReLU outputs
    assert torch.equal(model(x), model.classify(z))
    with pytest.raises(UserError, match="model 'resnet32' needs C×32×32 inputs"):
        build_model("resnet32", (1, 28, 28), 10)


def test_the_vectorized_executor_refuses_its_batch_norm_in_one_line() -> None:
    module = build_model("resnet32", (3, 32, 32), 10)
    with pytest.raises(UserError, match="cannot train model 'resnet32': its BatchNorm") as caught:
        check_vectorizable(build_strategy("fedavg"), module, "resnet32")
    assert "use --executor sequential" in str(caught.value) and "\n" not in str(caught.value)


def test_federated_icarl_runs_on_it_and_sends_its_64_features(tmp_path: Path) -> None:
    root = tmp_path / "cifar"
    write_tiny_cifar10(root, n=20, n_test=10)
    out = tmp_path / "run"
    code, output = in_process(
        "run",
        *("--stream", "seq-cifar10", "--data-root", str(root), "--model", "resnet32"),
        *("--strategy", "icarl:memory=10,selection=herding,classifier=nme"),
        *("--tasks", "2", "--rounds-per-task", "1", "--epochs", "1", "--clients", "2"),
        *("--threads", "1", "--out", str(out)),
    )
    assert code == 0, output
    summary = json.loads((out / "summary.json").read_text())
    # 2 task ends × 2 clients × 10 classes × (64 features + 1 count) × 4 bytes
    assert summary["bytes_by_payload"]["up:icarl.class_sums"] == 2 * 2 * 10 * 65 * 4
