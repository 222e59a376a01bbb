"""Static FL streams (one task, all classes), FedNTD's class shards, Cutout, the papers' models."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from cfl_bench.cli import app
from cfl_bench.core.errors import UserError
from cfl_bench.runner.models import build_model
from cfl_bench.streams.augment import cutout
from cfl_bench.streams.cinic import CLASSES, load_cinic10
from cfl_bench.streams.partition import ClassShardPartitioner, partitioner_from_spec
from cfl_bench.streams.registry import build_stream

CPU = torch.device("cpu")


# -- class shards -----------------------------------------------------------------------------
def test_class_shards_hold_one_class_each_and_cover_everything() -> None:
    labels = torch.arange(10).repeat_interleave(103)  # 103 per class: shards of 25 or 26
    parts = ClassShardPartitioner(2).split(labels, 20, task=0, seed=3)
    assert len(parts) == 20
    everything = torch.cat(parts)
    assert everything.numel() == labels.numel() and everything.unique().numel() == labels.numel()
    for part in parts:
        assert torch.equal(part, torch.sort(part).values)
        assert 1 <= labels[part].unique().numel() <= 2  # two shards, possibly of one class
        assert part.numel() in range(50, 53)
    # Every class is cut into K·s/C = 4 shards: 4 owners (or fewer when one client got two).
    owners = [sum(int((labels[p] == c).any()) for p in parts) for c in range(10)]
    assert all(2 <= n <= 4 for n in owners) and sum(owners) >= 36


def test_class_shards_are_seeded_and_ignore_the_task() -> None:
    labels = torch.arange(10).repeat(60)
    p = ClassShardPartitioner(2)
    first = p.split(labels, 10, task=0, seed=5)
    assert all(map(torch.equal, first, p.split(labels, 10, task=3, seed=5)))
    assert not all(map(torch.equal, first, p.split(labels, 10, task=0, seed=6)))


def test_class_shards_one_shard_per_client_gives_one_class() -> None:
    labels = torch.arange(5).repeat_interleave(8)
    parts = ClassShardPartitioner(1).split(labels, 10, task=0, seed=0)
    assert [labels[p].unique().numel() for p in parts] == [1] * 10
    assert sorted(p.numel() for p in parts) == [4] * 10  # 8 per class, 2 shards of 4


def test_class_shards_refusals() -> None:
    labels = torch.arange(10).repeat(10)
    with pytest.raises(UserError, match=r"\(7 x 2 = 14\) must be a multiple of the 10 classes"):
        ClassShardPartitioner(2).split(labels, 7, task=0, seed=0)
    with pytest.raises(UserError, match="class 0 has 10 training samples"):
        ClassShardPartitioner(4).split(labels, 30, task=0, seed=0)
    with pytest.raises(UserError, match="did you mean 'class-shards'"):
        partitioner_from_spec("sharding")
    assert partitioner_from_spec("class-shards:shards_per_client=3").shards_per_client == 3  # type: ignore[attr-defined]


# -- Cutout -----------------------------------------------------------------------------------
def test_cutout_zeroes_a_clipped_square_per_sample() -> None:
    x = torch.ones(200, 3, 8, 8)
    out = cutout(x, torch.Generator().manual_seed(0), 4)
    holes = (out == 0).all(dim=1)  # the same pixels in every channel
    assert torch.equal((out == 0).any(dim=1), holes)
    sizes = holes.sum(dim=(1, 2))
    # A 4×4 square clipped at the border: 2..4 rows × 2..4 columns.
    assert set(sizes.tolist()) <= {4, 6, 8, 9, 12, 16} and (sizes == 16).any()
    for mask in holes[:20]:
        rows, cols = mask.any(1).nonzero().flatten(), mask.any(0).nonzero().flatten()
        assert mask.sum() == rows.numel() * cols.numel()  # a rectangle
        assert torch.equal(rows, torch.arange(int(rows[0]), int(rows[-1]) + 1))
    again = cutout(x, torch.Generator().manual_seed(0), 4)
    assert torch.equal(out, again)


# -- models -----------------------------------------------------------------------------------
def test_the_papers_models_have_their_published_sizes() -> None:
    def count(name: str, shape: tuple[int, ...]) -> int:
        return sum(p.numel() for p in build_model(name, shape, 10).parameters())

    # FedAvg CNN: 3·32·25+32 + 32·64·25+64 + 4096·512+512 + 512·10+10.
    assert count("fedavg-cnn", (3, 32, 32)) == 2432 + 51264 + 2097664 + 5130 == 2_156_490
    assert count("fedavg-cnn", (1, 28, 28)) == 832 + 51264 + 3136 * 512 + 512 + 5130
    assert count("resnet8", (3, 32, 32)) == 78_042
    with pytest.raises(UserError, match="model 'resnet8' needs C×32×32 inputs"):
        build_model("resnet8", (1, 28, 28), 10)


# -- static streams ---------------------------------------------------------------------------
def test_static_cifar10_is_one_task_with_every_class(shared_data: Path) -> None:
    stream = build_stream(
        "cifar10", num_tasks=1, seed=0, device=CPU, data_root=str(shared_data),
        download=False, train_size=2000, test_size=500, cutout=16,
    )  # fmt: skip
    assert stream.scenario == "static" and stream.num_tasks == 1 and stream.num_classes == 10
    test = stream.task_test(0)
    assert test.classes == tuple(range(10)) and test.test_y.shape == (500,)
    assert stream.train_labels(0).shape == (2000,)
    assert stream.describe()["augmentation"] == (
        "random crop (padding 4) + horizontal flip + cutout 16x16 after normalisation"
    )
    assert not stream.objective.task_il
    x = stream.as_model_input(stream.task_train(0).train_x[:64])
    out = stream.augment(x, torch.Generator().manual_seed(1))
    assert ((out == 0).all(dim=1).sum(dim=(1, 2)) >= 64).all()  # every image has a hole


def test_static_mnist_is_not_cropped(shared_data: Path) -> None:
    stream = build_stream(
        "mnist", num_tasks=1, seed=0, device=CPU, data_root=str(shared_data),
        download=False, train_size=500, test_size=100,
    )  # fmt: skip
    assert stream.input_shape == (1, 28, 28) and not stream.augments
    assert stream.describe()["augmentation"] == "none"
    x = stream.as_model_input(stream.task_train(0).train_x[:4])
    assert abs(float(x.mean()) - (0.1307 - 0.1307) / 0.3081) < 0.6  # normalised


def test_static_streams_refuse_more_tasks_and_cutout_elsewhere(shared_data: Path) -> None:
    with pytest.raises(UserError, match=r"is static .* --tasks must be 1, got 2"):
        build_stream("cifar10", num_tasks=2, seed=0, device=CPU, data_root=str(shared_data),
                     download=False)  # fmt: skip
    with pytest.raises(UserError, match=r"--cutout applies to the image streams .* drop --cutout"):
        build_stream("rot-digits", num_tasks=1, seed=0, device=CPU, data_root=None,
                     download=False, cutout=8)  # fmt: skip
    with pytest.raises(UserError, match="needs Fashion-MNIST's train split"):
        build_stream("fmnist", num_tasks=1, seed=0, device=CPU, data_root=str(shared_data),
                     download=False)  # fmt: skip


def _write_cinic(root: Path, cifar: Path, per_class: int) -> None:
    """A small CINIC-10 folder from real CIFAR-10 test images, written as PNG files."""
    from PIL import Image

    from cfl_bench.streams.cifar import load_cifar10

    images = load_cifar10(cifar, download=False)
    for split, offset in (("train", 0), ("valid", per_class), ("test", 2 * per_class)):
        for label, name in enumerate(CLASSES):
            folder = root / "CINIC-10" / split / name
            folder.mkdir(parents=True)
            rows = torch.nonzero(images.test_y == label).flatten()[offset : offset + per_class]
            for i, row in enumerate(rows.tolist()):
                pixels = images.test_x[row].permute(1, 2, 0).numpy()
                Image.fromarray(pixels).save(folder / f"cifar10-{i:04d}.png")


def test_cinic10_reads_its_layout(tmp_path: Path, shared_data: Path) -> None:
    _write_cinic(tmp_path, shared_data, per_class=6)
    splits = load_cinic10(tmp_path)
    assert splits.train_x.shape == (60, 3, 32, 32) and splits.test_x.shape == (60, 3, 32, 32)
    assert splits.train_y.tolist() == [c for c in range(10) for _ in range(6)]
    from cfl_bench.streams.cifar import load_cifar10

    cifar = load_cifar10(shared_data, download=False)
    first_cat = torch.nonzero(cifar.test_y == 3).flatten()[0]
    assert torch.equal(splits.train_x[18], cifar.test_x[first_cat])  # PNG round trip exact
    stream = build_stream("cinic10", num_tasks=1, seed=0, device=CPU, data_root=str(tmp_path),
                          download=False)  # fmt: skip
    assert stream.scenario == "static" and stream.describe()["base"] == "cinic10"


def test_cinic10_refuses_a_broken_layout(tmp_path: Path, shared_data: Path) -> None:
    with pytest.raises(UserError, match=r"CINIC-10 split folder .*train is missing"):
        load_cinic10(tmp_path)
    _write_cinic(tmp_path, shared_data, per_class=1)
    from PIL import Image

    small = tmp_path / "CINIC-10" / "train" / "cat" / "small.png"
    Image.fromarray(np.zeros((16, 16, 3), np.uint8)).save(small)
    with pytest.raises(UserError, match=r"small.png is 16x16 pixels, not 32x32"):
        load_cinic10(tmp_path)
    small.unlink()
    (tmp_path / "CINIC-10" / "test" / "dog" / "cifar10-0000.png").write_bytes(b"not a png")
    with pytest.raises(UserError, match=r"cifar10-0000.png cannot be read"):
        load_cinic10(tmp_path)
    (tmp_path / "CINIC-10" / "train" / "frog").rename(tmp_path / "CINIC-10" / "train" / "toad")
    with pytest.raises(UserError, match="must hold exactly the class folders"):
        load_cinic10(tmp_path)


def test_static_run_end_to_end_with_100_clients(tmp_path: Path, shared_data: Path) -> None:
    """K = 100 with 10 % participation, per-round evaluation: the curve has one point per
    round and the final-round accuracy is the reported one (never the best round's)."""
    out = tmp_path / "run"
    args = [
        "run", "--stream", "mnist", "--data-root", str(shared_data), "--clients", "100",
        "--participation", "0.1", "--rounds-per-task", "4", "--epochs", "1",
        "--train-size", "6000", "--test-size", "500", "--model", "mlp", "--lr", "0.05",
        "--eval-every-round", "--threads", "1", "--out", str(out),
    ]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    records = pd.read_csv(out / "records.csv")
    acc = records[(records.metric == "acc") & (records.scope == "global")]
    assert acc["round"].tolist() == [0, 1, 2, 3, 4] and set(acc.eval_task) == {0}
    summary = json.loads((out / "summary.json").read_text())
    assert summary["acc_T"] == pytest.approx(float(acc.value.iloc[-1]), abs=1e-6)
    # Clients of two classes learn slowly, but the curve climbs (8 % → 27.6 % measured).
    assert acc.value.iloc[-1] > acc.value.iloc[0] + 10
    config = json.loads((out / "config.json").read_text())
    assert config["protocol"]["partition"]["name"] == "class-shards"
    assert config["stream"]["scenario"] == "static"
