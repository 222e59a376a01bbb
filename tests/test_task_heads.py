"""``--heads per-task``: a stream's tasks on disjoint heads (task-IL), for every method.

The labels and heads of a domain-IL and a class-IL stream, the per-task-head loss and
accuracy against values worked out by hand, the refusals, and a short run's protocol."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from cfl_bench.core.errors import UserError
from cfl_bench.runner.config import make_config
from cfl_bench.runner.run import execute
from cfl_bench.streams.registry import build_stream
from cfl_bench.streams.task_heads import PerTaskHeads, TaskHeadsStream, with_heads
from tests.synthetic_data import write_tiny_cifar10


def digits(name: str = "perm-digits", tasks: int = 3) -> TaskHeadsStream:
    stream = build_stream(
        name, num_tasks=tasks, seed=0, device=torch.device("cpu"), data_root=None, download=False
    )
    wrapped = with_heads(stream, "per-task")
    assert isinstance(wrapped, TaskHeadsStream)
    return wrapped


def test_a_domain_il_stream_moves_task_t_to_labels_10t_and_on() -> None:
    stream = digits()
    inner = stream.inner
    assert (stream.scenario, stream.num_classes, stream.offset) == ("task-il", 30, 10)
    assert stream.heads[2] == tuple(range(20, 30))
    assert torch.equal(stream.task_train(1).train_y, inner.task_train(1).train_y + 10)
    test = stream.task_test(2)
    assert torch.equal(test.test_y, inner.task_test(2).test_y + 20)
    assert test.classes == tuple(range(20, 30))
    assert torch.equal(test.test_x, inner.task_test(2).test_x)  # the inputs are the stream's
    assert torch.equal(stream.train_labels(0), inner.train_labels(0))
    assert int(stream.task(1).test_y.min()) >= 10 and int(stream.task(1).test_y.max()) < 20
    described = stream.describe()
    assert described["heads"] == "per-task" and described["num_classes"] == 30
    assert with_heads(inner, "shared") is inner


def test_a_class_il_stream_keeps_its_labels_and_its_class_sets_are_the_heads(
    tmp_path: Path,
) -> None:
    write_tiny_cifar10(tmp_path, n=20)
    inner = build_stream(
        "seq-cifar10",
        num_tasks=5,
        seed=0,
        device=torch.device("cpu"),
        data_root=str(tmp_path),
        download=False,
    )
    stream = with_heads(inner, "per-task")
    assert isinstance(stream, TaskHeadsStream)
    assert (stream.num_classes, stream.offset) == (10, 0)
    assert stream.heads == ((0, 1), (2, 3), (4, 5), (6, 7), (8, 9))
    assert torch.equal(stream.task_train(3).train_y, inner.task_train(3).train_y)


HEADS = PerTaskHeads(heads=((0, 1), (2, 3)), num_classes=4)
# Row 0 (task 0, label 1) sees logits 1, 2 only: CE = log(1 + e^−1) = 0.313262;
# row 1 (task 1, label 2) sees 0, 1 only: CE = log(1 + e^1) = 1.313262.
OUTPUTS = torch.tensor([[1.0, 2.0, 5.0, 5.0], [9.0, 9.0, 0.0, 1.0]])
TARGETS = torch.tensor([1, 2])


def test_each_example_trains_on_its_own_task_head_only() -> None:
    row0, row1 = math.log(1 + math.exp(-1)), math.log(1 + math.exp(1))
    assert float(HEADS.loss(OUTPUTS, TARGETS)) == pytest.approx((row0 + row1) / 2, rel=1e-6)
    masked = HEADS.masked_loss(OUTPUTS, TARGETS, torch.tensor([1.0, 0.0]))
    assert float(masked) == pytest.approx(row0, rel=1e-6)
    outputs = OUTPUTS.clone().requires_grad_(True)
    HEADS.loss(outputs, TARGETS).backward()
    assert outputs.grad is not None
    assert not outputs.grad[0, 2:].any() and not outputs.grad[1, :2].any()  # other heads


def test_accuracy_is_the_argmax_over_the_task_head() -> None:
    # task 1's head (2, 3): row [9, 9, 0, 1] predicts 3; row [0, 0, 4, 1] predicts 2.
    outputs = torch.tensor([[9.0, 9.0, 0.0, 1.0], [0.0, 0.0, 4.0, 1.0]])
    scores = HEADS.score(outputs, torch.tensor([2, 2]), (2, 3))
    assert HEADS.metrics == ("acc",) and float(scores["acc"]) == pytest.approx(50.0)


def test_streams_without_fixed_classification_tasks_are_refused() -> None:
    inner = digits().inner
    inner.per_round = True  # what a CARLA frame stream declares
    with pytest.raises(UserError) as caught:
        with_heads(inner, "per-task")
    assert str(caught.value) == (
        "--heads per-task needs a classification stream with tasks of fixed data; stream "
        "'perm-digits' is not one, so drop --heads per-task."
    )


def test_a_run_records_the_task_il_protocol(tmp_path: Path) -> None:
    values = {
        "stream": "perm-digits",
        "tasks": 2,
        "rounds_per_task": 1,
        "clients": 2,
        "epochs": 1,
        "threads": 1,
        "strategy": "fedavg",
        "out": str(tmp_path / "run"),
    }
    execute(make_config({**values, "heads": "per-task"}))
    execute(make_config({**values, "out": str(tmp_path / "shared")}))
    per_task = (tmp_path / "run" / "config.json").read_text()
    shared = (tmp_path / "shared" / "config.json").read_text()
    assert '"heads": "per-task"' in per_task and '"scenario": "task-il"' in per_task
    assert '"heads": "per-task"' not in shared  # the default leaves the protocol as it was


def test_an_unknown_heads_value_is_refused_in_one_line() -> None:
    with pytest.raises(UserError) as caught:
        make_config({"heads": "bogus"})
    assert str(caught.value) == "--heads must be one of shared, per-task, got 'bogus' (text)."
