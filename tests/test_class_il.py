"""Seq-CIFAR class-IL streams on files in the CIFAR pickle format (random pixels: the class
split, normalisation, augmentation and refusals do not depend on the contents), and one CLI
run that reports class-IL and task-IL accuracy."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from cfl_bench.core.errors import UserError
from cfl_bench.streams.cifar import load_cifar10
from cfl_bench.streams.class_il import CIFAR10_MEAN, CIFAR10_STD
from cfl_bench.streams.registry import STREAMS, build_stream
from tests.synthetic_data import write_tiny_cifar10, write_tiny_cifar100
from tests.test_cli import in_process

CPU = torch.device("cpu")
# per CIFAR-10 train batch (x 5) and in its test batch; labels cycle over the classes
TEN_TRAIN, TEN_TEST = 200, 50
HUNDRED_TRAIN, HUNDRED_TEST = 300, 100


@pytest.fixture(scope="module")
def cifar_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("cifar-format")
    write_tiny_cifar10(root, n=TEN_TRAIN, n_test=TEN_TEST)
    write_tiny_cifar100(root, n=HUNDRED_TRAIN, n_test=HUNDRED_TEST)
    return root


def test_seq_cifar10_tasks_hold_two_classes_in_natural_order(cifar_root: Path) -> None:
    stream = build_stream(
        "seq-cifar10", num_tasks=5, seed=0, device=CPU, data_root=str(cifar_root), download=False
    )
    assert stream.scenario == "class-il" and stream.augments
    raw = load_cifar10(cifar_root, download=False)
    mean = torch.tensor(CIFAR10_MEAN)[None, :, None, None]
    std = torch.tensor(CIFAR10_STD)[None, :, None, None]
    for t in range(5):
        task = stream.task(t)
        assert task.classes == (2 * t, 2 * t + 1)
        assert set(task.train_y.unique().tolist()) == set(task.classes)
        # 5 batches x 200 images, a tenth per class; the test batch has 5 per class
        assert task.train_y.shape[0] == 2 * 5 * TEN_TRAIN // 10
        assert task.test_y.shape[0] == 2 * TEN_TEST // 10
        assert torch.equal(stream.train_labels(t), task.train_y)
        # the task's images in file order, scaled to [0, 1] and normalised per channel
        rows = ((raw.train_y == 2 * t) | (raw.train_y == 2 * t + 1)).nonzero().flatten()
        assert torch.equal(task.train_y, raw.train_y[rows])
        expected = (raw.train_x[rows].float() / 255 - mean) / std
        assert torch.allclose(task.train_x, expected, atol=1e-6)
    x = stream.task(0).train_x
    black = ((0 - torch.tensor(CIFAR10_MEAN)) / torch.tensor(CIFAR10_STD)).tolist()
    aug = stream.augment(x[:64], torch.Generator().manual_seed(0))
    padded = aug[:, :, 0, :].permute(1, 0, 2).reshape(3, -1)  # top rows: padding when shifted
    for c in range(3):
        assert bool((padded[c] == torch.tensor(black[c])).any())


def test_seq_cifar100_fot_normalises_like_fots_loader_and_never_augments(
    cifar_root: Path,
) -> None:
    """FOT's loader: ToTensor, then Normalize((0.4914, 0.4824, 0.4467), (0.2471, 0.24353,
    0.2616)), no augmentation; the same tasks and rows as seq-cifar100. A black pixel in
    channel 0 is (0 - 0.4914) / 0.2471 = -1.988669, a full one in channel 2 (1 - 0.4467) /
    0.2616 = 2.115061."""
    fot = build_stream(
        "seq-cifar100-fot", num_tasks=3, seed=0, device=CPU, data_root=str(cifar_root),
        download=False,
    )  # fmt: skip
    plain = build_stream(
        "seq-cifar100", num_tasks=3, seed=0, device=CPU, data_root=str(cifar_root), download=False
    )
    assert not fot.augments and fot.describe()["augmentation"] == "none"
    assert STREAMS["seq-cifar100-fot"].default_model == "fot-alexnet"
    for t in range(3):
        assert fot.task(t).classes == plain.task(t).classes
        assert torch.equal(fot.task(t).train_y, plain.task(t).train_y)
    pixels = torch.zeros(1, 3, 1, 1, dtype=torch.uint8)
    pixels[0, 2] = 255
    got = fot.as_model_input(pixels).flatten()
    assert torch.allclose(got[[0, 2]], torch.tensor([-1.988669, 2.115061]), atol=1e-5)
    x = fot.task(0).train_x[:8]
    assert torch.equal(fot.augment(x, torch.Generator().manual_seed(0)), x)


def test_seq_cifar100_first_tasks_and_refusals(cifar_root: Path) -> None:
    stream = build_stream(
        "seq-cifar100", num_tasks=3, seed=0, device=CPU, data_root=str(cifar_root), download=False
    )
    assert stream.task(2).classes == tuple(range(20, 30))
    assert stream.task(2).train_y.shape[0] == 10 * HUNDRED_TRAIN // 100  # 3 per class
    assert stream.task(2).test_y.tolist() == list(range(20, 30))  # 1 per class
    with pytest.raises(UserError, match="use --tasks 10 or fewer"):
        build_stream(
            "seq-cifar100",
            num_tasks=11,
            seed=0,
            device=CPU,
            data_root=str(cifar_root),
            download=False,
        )
    with pytest.raises(UserError, match="--data-root"):
        build_stream("seq-cifar10", num_tasks=5, seed=0, device=CPU, data_root=None, download=False)
    assert STREAMS["seq-cifar10"].default_partition == "dirichlet"


def test_cli_run_reports_class_il_and_task_il(tmp_path: Path, cifar_root: Path) -> None:
    out = tmp_path / "run"
    code, output = in_process(
        "run",
        *("--stream", "seq-cifar10", "--data-root", str(cifar_root), "--model", "cifar-cnn"),
        *("--strategy", "der+fedgp", "--tasks", "2", "--rounds-per-task", "1", "--epochs", "1"),
        *("--clients", "4", "--threads", "1"),
        *("--out", str(out)),
    )
    assert code == 0, output
    assert "class-IL" in output and "task-IL" in output  # both rows of the results table
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "finished"
    assert summary["acc_task_il_T"] is not None and summary["Acc_T"] is not None
    # task-IL only chooses among the task's 2 classes: never below class-IL on the same model
    assert summary["acc_task_il_T"] >= summary["Acc_T"]
    config = json.loads((out / "config.json").read_text())
    assert config["config"]["replay_augment"] is True  # resolved from the stream
    assert config["protocol"]["partition"]["name"] == "dirichlet"
