"""FOT on convolutional layers, as the official CIFAR trainer does them: a conv layer's input
unfolded into patch rows (checked against patches cut out by hand), its weight projected as
(out × C·k·k), old-task conv outputs unchanged by a projected update, the Gaussian sketches'
widths and bytes, the code's AlexNet, and the refusals."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from torch import nn

from cfl_bench.core.errors import UserError
from cfl_bench.core.flat import FlatModel
from cfl_bench.runner.models import build_model
from cfl_bench.strategies.base import ModelFacts
from cfl_bench.strategies.fot import (
    FOT,
    expand_basis,
    layer_inputs,
    layer_slots,
    project_update,
    residual_sketch,
    scaled_svds,
    sketch_widths,
    unfolded,
)
from tests.helpers import digits_federation, env
from tests.test_cli import in_process
from tests.test_resume import assert_resumes_after_crash, uninterrupted


def patches_by_hand(
    x: torch.Tensor, k: int, stride: int = 1, padding: int = 0
) -> list[list[float]]:
    """Every (example, output position)'s patch as a row, channel-major then kernel row then
    kernel column, cut out of the zero-padded image with plain loops."""
    n, c, h, w = x.shape
    padded = torch.zeros(n, c, h + 2 * padding, w + 2 * padding)
    padded[:, :, padding : padding + h, padding : padding + w] = x
    out_h = (h + 2 * padding - k) // stride + 1
    out_w = (w + 2 * padding - k) // stride + 1
    rows = []
    for e in range(n):
        for i in range(out_h):
            for j in range(out_w):
                row = []
                for ch in range(c):
                    for a in range(k):
                        for b in range(k):
                            row.append(float(padded[e, ch, i * stride + a, j * stride + b]))
                rows.append(row)
    return rows


def test_a_conv_input_unfolds_into_the_patches_its_weight_multiplies() -> None:
    x = torch.arange(18, dtype=torch.float32).view(1, 2, 3, 3)  # channel 0: 0…8, 1: 9…17
    conv = nn.Conv2d(2, 1, 2, bias=False)
    rows = unfolded(conv, x)
    # the top-left patch: channel 0's [0, 1, 3, 4], then channel 1's [9, 10, 12, 13]
    assert rows[0].tolist() == [0.0, 1.0, 3.0, 4.0, 9.0, 10.0, 12.0, 13.0]
    assert rows[3].tolist() == [4.0, 5.0, 7.0, 8.0, 13.0, 14.0, 16.0, 17.0]
    assert rows.tolist() == patches_by_hand(x, 2)
    g = torch.Generator().manual_seed(0)
    y = torch.randn(2, 3, 5, 5, generator=g)
    strided = nn.Conv2d(3, 4, 3, stride=2, padding=1, bias=False)
    assert torch.allclose(unfolded(strided, y), torch.tensor(patches_by_hand(y, 3, 2, 1)))
    # conv(y) at every position is the patch row times the weight read as (out, C·k·k)
    with torch.no_grad():
        out = strided(y).permute(0, 2, 3, 1).reshape(-1, 4)
        assert torch.allclose(unfolded(strided, y) @ strided.weight.view(4, -1).T, out, atol=1e-5)


def tiny_conv_net() -> nn.Sequential:
    """conv 1→3 k2 (8×8 → 7×7), ReLU, dropout, max-pool (→ 3×3), fc 27 → 10."""
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(1, 3, 2),
        nn.ReLU(),
        nn.Dropout(0.5),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(27, 10),
    )


def test_a_conv_models_slots_and_recorded_inputs() -> None:
    net = tiny_conv_net()
    model = FlatModel(net)
    slots = layer_slots(model)
    assert [(s.name, s.out_features, s.in_features, s.conv) for s in slots] == [
        ("0.weight", 3, 4, ((2, 2), (1, 1), (0, 0), (1, 1))),
        ("5.weight", 10, 27, None),
    ]
    x = torch.randn(5, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    net.eval()
    conv_in, fc_in = layer_inputs(net, x, batch_size=2)
    assert conv_in.shape == (4, 5 * 49) and torch.equal(conv_in.T, unfolded(net[0], x))
    # the fc layer records what it reads (after the max-pool), not the dropout's input
    with torch.no_grad():
        assert torch.allclose(fc_in, net[:5](x).T)


def test_a_projected_conv_update_leaves_old_task_conv_outputs_unchanged() -> None:
    net = tiny_conv_net()
    model = FlatModel(net)
    g = torch.Generator().manual_seed(2)
    # images whose 2×2 patches lie in a 2-d subspace: a ramp along the rows plus a constant
    ramp = torch.arange(8.0).view(1, 1, 8, 1).expand(1, 1, 8, 8)
    coefficients = torch.randn(12, 2, generator=g)
    x = coefficients[:, :1, None, None] * ramp + coefficients[:, 1:, None, None]
    net.eval()
    acts = layer_inputs(net, x, batch_size=4)
    basis = expand_basis(None, acts[0], 1.0, 0.9999)
    assert basis is not None and basis.shape == (4, 2)
    other = torch.randn(3, 1, 8, 8, generator=g)
    conv = net[0]
    old = model.params.clone()
    with torch.no_grad():
        before, elsewhere = conv(x), conv(other)
    mean = old + torch.randn(old.shape, generator=g)
    bias = next(s for s in model.slices if s.name == "0.bias")
    mean[bias.start : bias.start + bias.numel] = old[bias.start : bias.start + bias.numel]
    theta = project_update(old, mean, layer_slots(model)[:1], [basis])
    # the projection written densely on the weight read as (3 × 4), in float64
    w_old, w_mean = old[:12].double().view(3, 4), mean[:12].double().view(3, 4)
    u = basis.double()
    want = w_old + (w_mean - w_old) @ (torch.eye(4, dtype=torch.float64) - u @ u.T)
    assert torch.allclose(theta[:12].double().view(3, 4), want, atol=1e-6)
    model.params.copy_(theta)
    with torch.no_grad():
        after, moved = conv(x), conv(other)
    assert torch.allclose(after, before, atol=1e-4)
    assert not torch.allclose(moved, elsewhere, atol=1e-2)


def test_the_cifar_trainers_gaussian_sketch_is_wider_for_linear_layers() -> None:
    slots = layer_slots(FlatModel(tiny_conv_net()))
    assert sketch_widths(slots, "gaussian") == [4, 5 * 27]
    assert sketch_widths(slots, "uniform") == [4, 27]
    acts = torch.tensor([[1.0, 0.0, 2.0], [0.0, 3.0, 1.0]])
    sketch, ratio = residual_sketch(acts, None, torch.Generator().manual_seed(7), "gaussian", 10)
    mix = torch.randn((3, 10), generator=torch.Generator().manual_seed(7))
    assert ratio == 1.0 and sketch.shape == (2, 10)
    assert torch.allclose(sketch, acts @ mix, atol=1e-6)


def test_auto_follows_the_code_trainer_of_the_models_kind() -> None:
    conv_slots = layer_slots(FlatModel(tiny_conv_net()))
    linear_slots = [s for s in conv_slots if s.conv is None]
    fot = FOT()
    assert fot.recipe(conv_slots) == (False, "gaussian")  # cifar_trainer: eval, N(0, 1)
    assert fot.recipe(linear_slots) == (True, "uniform")  # mnist_trainer: train, U[-1, 1]
    assert FOT({"act_mode": "train", "sketch": "uniform"}).recipe(conv_slots) == (True, "uniform")


def test_the_official_alexnet() -> None:
    net = build_model("fot-alexnet", (3, 32, 32), 100)
    # model/alexnet.py, no biases: 3·64·16 + 64·128·9 + 128·256·4 + 1024·2048 + 2048² + 2048·100
    assert sum(p.numel() for p in net.parameters()) == 6_704_128
    assert all(not isinstance(m, nn.BatchNorm2d) for m in net.modules())
    assert [m.p for m in net.modules() if isinstance(m, nn.Dropout)] == [0.2, 0.5]
    slots = layer_slots(FlatModel(net))
    assert [s.in_features for s in slots] == [3 * 16, 64 * 9, 128 * 4, 1024, 2048, 2048]
    assert net(torch.zeros(2, 3, 32, 32)).shape == (2, 100)


def test_the_task_end_svds_are_priced_by_a_scaled_copy() -> None:
    """The cost estimate's units: one 768 × 3,840 sketch scales by 384 / 768 to 384 × 1,920,
    whose SVD work d·w·min(d, w) is 1/8 of the real one's; matrices already small are the
    unit themselves; the AlexNet's five sketches (its per-task heads free) scale by
    384 / 2,048, every side exactly, so the units are 1 / 0.1875³."""
    units, unit = scaled_svds([(768, 3840)])
    assert units == pytest.approx(8.0) and unit() is None
    assert scaled_svds([(10, 10), (20, 30)])[0] == 1.0
    fot = FOT()
    facts = dataclasses.replace(
        env("seq-cifar100-fot", "task-il", 100, 10), model=ModelFacts(name="fot-alexnet")
    )
    fot.setup(facts)
    work = fot.extra_work()
    assert work.task_end_forward and work.task_end_server is not None
    ((units, _),) = work.task_end_server(build_model("fot-alexnet", (3, 32, 32), 100))
    assert units == pytest.approx(0.1875**-3)


# The tiny conv net on 8×8 digits under the CIFAR trainer's recipe: conv (d = 4, 4 wide),
# fc (d = 27, 135 wide), + r per layer and n; the model: 3·4 + 3 + 27·10 + 10 floats.
CONV_SKETCH_BYTES = (4 * 4 + 27 * 135 + 3) * 4
CONV_MODEL_BYTES = (12 + 3 + 270 + 10) * 4


def test_a_conv_task_end_uploads_the_sketches_and_keeps_its_bytes() -> None:
    federation = digits_federation(
        "fot",
        model="fot-alexnet",
        module_factory=lambda _name, _shape, _classes: tiny_conv_net(),
        weighting="uniform",
    )
    result = federation.run()
    up = [r[5] for r in result.records if r[4] == "bytes_up"]
    clients = 4
    extra = (0, CONV_SKETCH_BYTES, 0, CONV_SKETCH_BYTES)
    assert up == [clients * (CONV_MODEL_BYTES + e) for e in extra]
    down = [r[5] for r in result.records if r[4] == "bytes_down"]
    assert down[:3] == [clients * CONV_MODEL_BYTES] * 3 and down[3] > down[2]


def test_a_model_with_normalisation_layers_is_refused(tmp_path: Path) -> None:
    fot = FOT()
    facts = env(stream="rot-digits")
    with pytest.raises(UserError, match="fot projects Linear and Conv2d layers only"):
        fot.setup(type(facts)(**{**facts.__dict__, "model": ModelFacts(name="cifar-cnn")}))
    out = tmp_path / "run"
    code, output = in_process(
        *("run", "--stream", "rot-digits", "--tasks", "2", "--rounds-per-task", "1"),
        *("--strategy", "fot", "--model", "cifar-cnn", "--out", str(out)),
    )
    assert code == 2
    assert output.strip().splitlines() == [
        "error: fot projects Linear and Conv2d layers only and model 'cifar-cnn' has other "
        "weighted layers; use --model fot-mlp, fot-alexnet, mlp, linear, mnist-cnn, "
        "fedavg-cnn."
    ]
    assert "Traceback" not in output and not out.exists()


def test_the_alexnet_refuses_inputs_too_small_for_its_three_pools(tmp_path: Path) -> None:
    out = tmp_path / "run"
    code, output = in_process(
        *("run", "--stream", "rot-digits", "--tasks", "2", "--rounds-per-task", "1"),
        *("--strategy", "fot", "--model", "fot-alexnet", "--out", str(out)),
    )
    assert code == 2
    assert output.strip().splitlines() == [
        "error: model 'fot-alexnet' needs square C×H×W inputs of at least 19×19 (its three "
        "conv + max-pool stages) but the stream gives 1×8×8; use a 32×32 stream such as "
        "seq-cifar100, or --model fot-mlp."
    ]
    assert "Traceback" not in output and not out.exists()


def test_a_conv_run_resumes_identically(tmp_path: Path) -> None:
    """fedavg-cnn (two convs, Linear layers; Gaussian sketches, eval-mode activations): a
    run crashed after round 3 (bases of the first task end kept, the second task end's
    sketches still to come) resumes to the uninterrupted run's records."""
    extra = {"model": "fedavg-cnn", "stream": "perm-digits"}
    whole = uninterrupted(tmp_path, "fot", **extra)
    assert_resumes_after_crash(tmp_path / "crashed", "fot", whole, **extra)
