"""Seq-CIFAR class-IL streams on the real shared subsets: task contents, normalisation,
augmentation, refusals, and one CLI run that reports class-IL and task-IL accuracy."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from cfl_bench.errors import UserError
from streams.class_il import CIFAR10_MEAN, CIFAR10_STD
from streams.registry import STREAMS, build_stream
from tests.test_cli import in_process

CPU = torch.device("cpu")


def test_seq_cifar10_tasks_hold_two_classes_in_natural_order(shared_data: Path) -> None:
    stream = build_stream(
        "seq-cifar10", num_tasks=5, seed=0, device=CPU, data_root=str(shared_data), download=False
    )
    assert stream.scenario == "class-il" and stream.augments
    for t in range(5):
        task = stream.task(t)
        assert task.classes == (2 * t, 2 * t + 1)
        assert set(task.train_y.unique().tolist()) == set(task.classes)
        assert task.train_y.shape[0] == 3000 and task.test_y.shape[0] == 1000  # subset sizes
        assert torch.equal(stream.train_labels(t), task.train_y)
    x = stream.task(0).train_x
    # normalised with the dataset statistics: per-channel means near 0, stds near 1
    assert x.mean(dim=(0, 2, 3)).abs().max() < 0.3
    assert (x.std(dim=(0, 2, 3)) - 1).abs().max() < 0.3
    black = ((0 - torch.tensor(CIFAR10_MEAN)) / torch.tensor(CIFAR10_STD)).tolist()
    aug = stream.augment(x[:64], torch.Generator().manual_seed(0))
    padded = aug[:, :, 0, :].permute(1, 0, 2).reshape(3, -1)  # top rows: padding when shifted
    for c in range(3):
        assert bool((padded[c] == torch.tensor(black[c])).any())


def test_seq_cifar100_first_tasks_and_refusals(shared_data: Path) -> None:
    stream = build_stream(
        "seq-cifar100", num_tasks=3, seed=0, device=CPU, data_root=str(shared_data), download=False
    )
    assert stream.task(2).classes == tuple(range(20, 30))
    assert stream.task(2).train_y.shape[0] == 2000  # 200 per class in the subset
    with pytest.raises(UserError, match="use --tasks 10 or fewer"):
        build_stream(
            "seq-cifar100",
            num_tasks=11,
            seed=0,
            device=CPU,
            data_root=str(shared_data),
            download=False,
        )
    with pytest.raises(UserError, match="--data-root"):
        build_stream("seq-cifar10", num_tasks=5, seed=0, device=CPU, data_root=None, download=False)
    assert STREAMS["seq-cifar10"].default_partition == "dirichlet"


def test_cli_run_reports_class_il_and_task_il(tmp_path: Path, shared_data: Path) -> None:
    out = tmp_path / "run"
    code, output = in_process(
        "run",
        *("--stream", "seq-cifar10", "--data-root", str(shared_data), "--model", "cifar-cnn"),
        *("--strategy", "der+fedgp", "--tasks", "2", "--rounds-per-task", "1", "--epochs", "1"),
        *("--clients", "4", "--train-size", "2000", "--test-size", "400", "--threads", "1"),
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
