"""``--classes-per-task N`` on the class-incremental CIFAR streams, on the shared CIFAR-100
subset (200 train and 50 test images per class, interleaved by class, so the first 2,000
train and 1,000 test images hold 20 and 10 of every class)."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest
import torch

from cfl_bench.core.errors import UserError
from cfl_bench.reproduce.command import reproductions_root
from cfl_bench.reproduce.provenance import local_steps
from cfl_bench.reproduce.tables import load_table
from cfl_bench.runner.config import RunConfig, canonical_hash
from cfl_bench.runner.plan import resolve_defaults
from cfl_bench.runner.run_names import point_request
from cfl_bench.streams.catalogue import STREAMS
from cfl_bench.streams.cifar import layout
from cfl_bench.streams.registry import build_stream
from cfl_bench.sweeps.grid import build_spec, expand
from leaderboard.protocol import describe_protocol
from tests.cli_helpers import main_here, tree_digest

CPU = torch.device("cpu")
TRAIN, TEST = 2000, 1000  # 20 and 10 images of each of the 100 classes


def cifar100(root: Path, tasks: int, per_task: int | None) -> object:
    return build_stream(
        "seq-cifar100", num_tasks=tasks, seed=0, device=CPU, data_root=str(root),
        download=False, train_size=TRAIN, test_size=TEST, classes_per_task=per_task,
    )  # fmt: skip


def test_twenty_classes_per_task_make_five_tasks_of_consecutive_classes(
    shared_data: Path,
) -> None:
    assert resolve_defaults(RunConfig(stream="seq-cifar100", classes_per_task=20)).tasks == 5
    stream = cifar100(shared_data, 5, 20)
    assert (stream.num_tasks, stream.num_classes) == (5, 100)  # one head over all 100
    assert stream.describe()["classes_per_task"] == 20
    task = stream.task(1)
    assert task.classes == tuple(range(20, 40))
    assert set(task.train_y.tolist()) == set(range(20, 40))
    assert set(task.test_y.tolist()) == set(range(20, 40))
    assert (task.train_y.numel(), task.test_y.numel()) == (20 * 20, 20 * 10)


def test_without_the_option_the_stream_keeps_ten_tasks_of_ten(shared_data: Path) -> None:
    assert resolve_defaults(RunConfig(stream="seq-cifar100")).tasks == 10
    assert resolve_defaults(RunConfig(stream="seq-cifar10")).tasks == 5
    stream = cifar100(shared_data, 10, None)
    assert stream.classes_per_task == 10 and stream.task(1).classes == tuple(range(10, 20))


@pytest.mark.parametrize(
    ("stream", "per_task", "tasks"),
    # ⌊100 / 5⌋, ⌊100 / 30⌋ (classes 90..99 are left out), ⌊10 / 3⌋, ⌊100 / 100⌋
    [("seq-cifar100", 5, 20), ("seq-cifar100", 30, 3), ("seq-cifar10", 3, 3),
     ("seq-cifar100-fot", 100, 1)],
)  # fmt: skip
def test_the_task_count_follows_the_classes_per_task(
    stream: str, per_task: int, tasks: int
) -> None:
    config = resolve_defaults(RunConfig(stream=stream, classes_per_task=per_task))
    assert config.tasks == tasks
    # --tasks still wins: the first K tasks of N classes
    assert resolve_defaults(RunConfig(stream=stream, tasks=1, classes_per_task=per_task)).tasks == 1


def test_the_first_three_tasks_of_five_classes_hold_classes_0_to_14(shared_data: Path) -> None:
    stream = cifar100(shared_data, 3, 5)
    assert [stream.task(t).classes for t in range(3)] == [
        (0, 1, 2, 3, 4),
        (5, 6, 7, 8, 9),
        (10, 11, 12, 13, 14),
    ]
    held = set().union(*(set(stream.task(t).train_y.tolist()) for t in range(3)))
    assert held == set(range(15))


def test_the_catalogue_counts_the_classes_the_loaders_read() -> None:
    splitting = {name for name, info in STREAMS.items() if info.splits_classes}
    assert splitting == {"seq-cifar10", "seq-cifar100", "seq-cifar100-fot"}
    for name in splitting:
        assert STREAMS[name].num_classes == layout(STREAMS[name].base).num_classes


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--stream", "rot-digits", "--classes-per-task", "5"],
            "--classes-per-task applies to the class-incremental streams seq-cifar10, "
            "seq-cifar100, seq-cifar100-fot; stream 'rot-digits' does not take it, drop "
            "--classes-per-task",
        ),
        (
            ["--stream", "seq-cifar100", "--classes-per-task", "0"],
            "--classes-per-task must be an integer in [1, 1000], got 0.",
        ),
        (
            ["--stream", "seq-cifar100", "--classes-per-task", "101"],
            "stream 'seq-cifar100' has 100 classes, so --classes-per-task 101 is out of range; "
            "use 1 to 100",
        ),
        (
            ["--stream", "seq-cifar100", "--classes-per-task", "30", "--tasks", "4"],
            "stream 'seq-cifar100' has 3 tasks of 30 classes with --classes-per-task 30, so "
            "--tasks 4 is too many; use --tasks 3 or fewer or a smaller --classes-per-task",
        ),
    ],
)
def test_refusals_are_one_line_with_exit_2_and_write_nothing(
    args: list[str],
    message: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Refused from the options alone, before any data folder is asked for (--tasks too
    many for the classes: by the builder, before it reads a file; an empty folder does)."""
    data = ["--data-root", str(tmp_path)] if "--tasks" in args else []
    run = ["run", *args, *data, "--out", str(tmp_path / "r")]
    result = main_here(run, tmp_path, monkeypatch, capsys, wide=True)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert message in lines[0]
    assert tree_digest(tmp_path) == {}


def test_the_protocol_names_the_option_only_when_it_is_set() -> None:
    plain = RunConfig(stream="seq-cifar100", tasks=10).protocol()
    assert "classes_per_task" not in plain
    # the hash of this protocol before the option existed (commit 05b1a84)
    assert canonical_hash(plain) == "4d141452b1c3"
    split = RunConfig(stream="seq-cifar100", tasks=5, classes_per_task=20).protocol()
    assert split["classes_per_task"] == 20
    assert canonical_hash(split) != canonical_hash({**plain, "tasks": 5})
    assert describe_protocol(split).startswith("seq-cifar100 · 5 tasks × 20 classes · ")
    # A run's folder name (its request's hash) is unchanged too: the shipped reproductions
    # and existing sweeps find their runs by it (the value before the option existed).
    assert canonical_hash(point_request(RunConfig(stream="seq-cifar100", tasks=10))) == (
        "611129b6c3ff"
    )
    assert "classes_per_task" in point_request(
        RunConfig(stream="seq-cifar100", classes_per_task=20)
    )


def test_a_sweep_sets_it_and_fills_in_the_task_count(tmp_path: Path) -> None:
    args = ["--stream", "seq-cifar100", "--set", "classes_per_task=20,50"]
    points = expand(build_spec(None, args, str(tmp_path)))
    assert [p.request["classes_per_task"] for p in points] == [20, 50]
    # without --tasks, 20 classes per task is 5 tasks: tasks=5 is then the same run
    same = [*args[:3], "classes_per_task=20", "--set", "tasks=none,5"]
    with pytest.raises(UserError, match="are the same run once defaults are filled in"):
        expand(build_spec(None, same, str(tmp_path)))
    elsewhere = ["--stream", "rot-digits", "--set", "classes_per_task=2"]
    with pytest.raises(UserError, match=r"grid point 1 .*: --classes-per-task applies to"):
        expand(build_spec(None, elsewhere, str(tmp_path)))


def test_a_reproduction_table_may_set_it_and_its_cost_counts_its_tasks(tmp_path: Path) -> None:
    """GLFC's table with its protocol's ``tasks: 10`` replaced by ``classes_per_task: 20``:
    the table loads, and the cpu scale's local work halves (5 tasks of 20 classes)."""
    shipped = reproductions_root()
    root = tmp_path / "reproductions"
    shutil.copytree(shipped / "targets", root / "targets")
    (root / "tables").mkdir()
    name = "glfc-table1-cifar100.yaml"
    text = (shipped / "tables" / name).read_text(encoding="utf-8")
    assert text.count("\n  tasks: 10\n") == 1
    edited = root / "tables" / name
    edited.write_text(text.replace("\n  tasks: 10\n", "\n  classes_per_task: 20\n"), "utf-8")
    table = load_table(edited, root)
    assert table.base_options("cpu")["classes_per_task"] == 20
    original = load_table(shipped / "tables" / name, shipped)
    assert local_steps(table, "cpu") == local_steps(original, "cpu") / 2


def test_one_run_trains_two_tasks_of_twenty_classes(
    shared_data: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = tmp_path / "run"
    args = [
        "run", "--stream", "seq-cifar100", "--classes-per-task", "20", "--tasks", "2",
        "--model", "mlp", "--strategy", "fedavg", "--rounds-per-task", "1", "--epochs", "1",
        "--clients", "2", "--partition", "iid", "--train-size", str(TRAIN), "--test-size",
        str(TEST), "--batch-size", "50", "--threads", "1", "--data-root", str(shared_data),
        "--out", str(out),
    ]  # fmt: skip
    result = main_here(args, tmp_path, monkeypatch, capsys)
    assert result.returncode == 0, result.stderr
    config = json.loads((out / "config.json").read_text())
    assert config["protocol"]["classes_per_task"] == 20 and config["protocol"]["tasks"] == 2
    assert config["stream"]["classes_per_task"] == 20
    # the two clients' examples per class: all 20 of each of the task's 20 classes
    for task, low in (("1", 0), ("2", 20)):
        per_class = [
            sum(counts) for counts in zip(*config["client_class_counts"][task], strict=True)
        ]
        assert per_class == [0] * low + [20] * 20 + [0] * (80 - low)
    with (out / "records.csv").open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert {row["trained_task"] for row in rows} == {"-1", "0", "1"}
    assert {row["eval_task"] for row in rows} == {"-1", "0", "1"}
