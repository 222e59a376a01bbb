"""Every bad input of the command line, one case each: exit code 2, exactly one line on
stderr naming the problem, no traceback, and nothing left on disk that was not there before.

The cases run through the real entry point ``cfl_bench.cli.main`` in this process (Click's
usage errors included), from inside ``tmp_path`` so that a default output folder would show
up in the before/after listing.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from cfl_bench.cli import main

TINY = ["--tasks", "2", "--rounds-per-task", "1", "--threads", "1"]
IS_ROOT = os.geteuid() == 0


def listing(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def run_main(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    with pytest.raises(SystemExit) as stop:
        main(argv)
    captured = capsys.readouterr()
    return int(stop.value.code or 0), captured.err


def yaml_file(text: str | bytes) -> Callable[[Path], list[str]]:
    def setup(root: Path) -> list[str]:
        path = root / "c.yaml"
        if isinstance(text, bytes):
            path.write_bytes(text)
        else:
            path.write_text(text, encoding="utf-8")
        return ["run", "--config", str(path), *TINY]

    return setup


def argv(*args: str) -> Callable[[Path], list[str]]:
    return lambda root: [arg.replace("{root}", str(root)) for arg in args]


def file_then(*args: str) -> Callable[[Path], list[str]]:
    """A regular file at {root}/f, then the command."""

    def setup(root: Path) -> list[str]:
        (root / "f").write_text("x")
        return argv(*args)(root)

    return setup


def damaged_run(config_text: str) -> Callable[[Path], list[str]]:
    def setup(root: Path) -> list[str]:
        (root / "run").mkdir()
        (root / "run" / "config.json").write_text(config_text)
        return ["clients", str(root / "run")]

    return setup


def mnist_with_a_directory(root: Path) -> list[str]:
    raw = root / "data" / "MNIST" / "raw"
    (raw / "train-images-idx3-ubyte.gz").mkdir(parents=True)
    return ["run", "--stream", "rot-mnist", "--data-root", str(root / "data"), *TINY]


CASES: dict[str, tuple[Callable[[Path], list[str]], str]] = {
    # -- item 2: one typed configuration ------------------------------------------------------
    "yaml overwrite 'no'": (yaml_file('overwrite: "no"\n'), "--overwrite must be true or false"),
    "yaml eval_every_round 'no'": (
        yaml_file('eval_every_round: "no"\n'),
        "--eval-every-round must be true or false",
    ),
    "yaml stream 7": (yaml_file("stream: 7\n"), "--stream must be a non-empty text, got 7"),
    "yaml strategy list": (yaml_file("strategy: [der, fedgp]\n"), "--strategy must be a non"),
    "yaml out 5": (yaml_file("out: 5\n"), "--out must be a non-empty text, got 5"),
    "yaml lr .inf": (yaml_file("lr: .inf\n"), "--lr must be a finite number in (0, 1000]"),
    "yaml lr text": (yaml_file('lr: "0.1"\n'), "--lr must be a finite number"),
    "yaml clients 2.5": (yaml_file("clients: 2.5\n"), "--clients must be an integer"),
    "yaml clients true": (yaml_file("clients: true\n"), "--clients must be an integer"),
    "yaml duplicate key": (yaml_file("seed: 1\nseed: 2\n"), "gives key 'seed' twice"),
    "yaml two spellings": (
        yaml_file("rounds-per-task: 1\nrounds_per_task: 2\n"),
        "gives 'rounds_per_task' twice",
    ),
    "yaml not utf-8": (yaml_file("seed: 1 # caf\xe9\n".encode("latin-1")), "is not UTF-8 text"),
    "yaml binary": (yaml_file(b"\x00\x01\x02seed"), "is a binary file"),
    "yaml python tag": (yaml_file("seed: !!python/object:os.system x\n"), "uses a YAML tag"),
    "yaml a list": (yaml_file("- seed\n"), "must be a mapping"),
    "yaml is a directory": (
        lambda root: (root / "d.yaml").mkdir() or ["run", "--config", str(root / "d.yaml")],
        "is a directory, not a file",
    ),
    "lr inf": (argv("run", "--lr", "inf", *TINY), "--lr must be a finite number in (0, 1000]"),
    "lr 1e308": (argv("run", "--lr", "1e308", *TINY), "--lr must be a finite number in"),
    "weight decay nan": (argv("run", "--weight-decay", "nan"), "--weight-decay must be a finite"),
    "fedprox mu inf": (
        argv("run", "--strategy", "fedprox:mu=inf", *TINY),
        "option fedprox:mu must be a finite number ≥ 0",
    ),
    "der alpha twice": (
        argv("run", "--strategy", "der:alpha=1,alpha=2", *TINY),
        "option 'alpha' of component 'der' is given twice",
    ),
    "der double colon": (argv("run", "--strategy", "der::", *TINY), "more than one ':'"),
    "partition key twice": (
        argv("run", "--partition", "dirichlet:alpha=1,alpha=2", *TINY),
        "is given twice",
    ),
    "option given twice": (argv("run", "--lr", "0.1", "--lr", "0.2"), "--lr is given twice"),
    "arabic-indic seed": (argv("run", "--seed", "\u0663"), "--seed must be an integer"),
    "empty out": (argv("run", "--out", "", *TINY), "--out must be a non-empty text"),
    "threads 100000": (argv("run", "--threads", "100000"), "--threads must be an integer in"),
    "equal_comm odd rounds": (
        argv("run", "--strategy", "fedgp:equal_comm=true", "--rounds-per-task", "3"),
        "needs an even --rounds-per-task",
    ),
    # -- Click's usage errors ------------------------------------------------------------------
    "unknown option": (argv("run", "--bogus"), "no such option --bogus"),
    "close option": (argv("run", "--lrr", "1"), "(did you mean --lr?)"),
    "missing value": (argv("run", "--clients"), "requires an argument"),
    "not an integer": (argv("run", "--clients", "abc"), "--clients must be an integer"),
    "unknown command": (argv("nosuch"), "No such command 'nosuch'"),
    "extra argument": (argv("run", "extra"), "unexpected extra argument"),
    # -- item 3: files and folders --------------------------------------------------------------
    "out below a file": (
        file_then("run", "--out", "{root}/f/sub/run", *TINY),
        "which is a file",
    ),
    "out is a file": (file_then("run", "--out", "{root}/f", *TINY), "is a file"),
    "out name too long": (
        argv("run", "--out", "{root}/" + "n" * 300, *TINY),
        "longer than the 255 a file system allows",
    ),
    "out under /proc": (argv("run", "--out", "/proc/cfl-bench-run", *TINY), "cannot be created"),
    "buffer cannot fit": (
        argv(
            "run",
            "--strategy",
            "der",
            "--buffer-size",
            "1000000",
            "--clients",
            "1000",
            "--partition",
            "iid",
            *TINY,
        ),
        "the replay buffers need",
    ),
    "data file is a directory": (mnist_with_a_directory, "is a directory, not a file"),
    "data root is a file": (
        file_then("run", "--stream", "rot-mnist", "--data-root", "{root}/f", *TINY),
        "is a file, not a folder",
    ),
    "offline download": (
        argv("run", "--stream", "rot-mnist", "--data-root", "{root}/data", "--download"),
        "no network connection",
    ),
    "text stream too many tasks": (
        lambda root: (
            (root / "data").mkdir()
            or ["run", "--stream", "seq-agnews", "--tasks", "3", "--data-root", str(root / "data")]
        ),
        "--tasks 3 is too many",
    ),
    "clients: empty config": (damaged_run(""), "is damaged: config.json is empty"),
    "clients: list config": (damaged_run("[1, 2]"), "config.json holds a list, not a JSON"),
    "clients: ragged table": (
        damaged_run('{"client_class_counts": {"1": [[1, 2], [3]]}}'),
        "no valid client × class table",
    ),
    "clients: task 0": (
        damaged_run('{"client_class_counts": {"1": [[1, 2]]}}'),
        "the run has no task 1",
    ),
    # -- sweeps ---------------------------------------------------------------------------------
    "sweep non-finite grid value": (
        argv("sweep", "--out", "{root}/s", "--set", "lr=0.1,inf", *TINY),
        "--lr must be a finite number in (0, 1000], got 'inf'",
    ),
    "sweep empty set value": (
        argv("sweep", "--out", "{root}/s", "--set", "seed=0,,1"),
        "has an empty value",
    ),
    "sweep overwrite": (argv("sweep", "--out", "{root}/s", "--overwrite"), "cannot be a sweep"),
    "sweep out twice": (argv("sweep", "--out", "{root}/a", "--out", "{root}/b"), "given twice"),
    "sweep file out 5": (
        lambda root: (
            (root / "s.yaml").write_text("out: 5\ngrid: {seed: [0]}\n")
            and ["sweep", "--config", str(root / "s.yaml")]
        ),
        "must be a folder path",
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_input_is_one_line_exit_2_and_leaves_nothing(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    setup, fragment = CASES[name]
    monkeypatch.chdir(tmp_path)
    args = setup(tmp_path)
    if name == "clients: task 0":
        args += ["--task", "1"]
        (tmp_path / "run" / "config.json").write_text('{"client_class_counts": {"2": [[1]]}}')
    before = listing(tmp_path)
    code, err = run_main(args, capsys)
    lines = err.strip().splitlines()
    assert code == 2, err
    assert "Traceback" not in err
    assert len(lines) == 1, err
    assert fragment in lines[0], err
    assert listing(tmp_path) == before


# -- cases that need root (mounts) ----------------------------------------------------------
@contextlib.contextmanager
def mounted(*args: str) -> Iterator[None]:
    target = args[-1]
    result = subprocess.run(["mount", *args], capture_output=True, text=True)
    if result.returncode != 0:
        pytest.skip(f"cannot mount here: {result.stderr.strip()}")
    try:
        yield
    finally:
        subprocess.run(["umount", target], check=False)


@pytest.mark.skipif(not IS_ROOT, reason="mounting a tmpfs needs root")
def test_a_full_disk_is_refused_before_anything_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    disk = tmp_path / "full"
    disk.mkdir()
    with mounted("-t", "tmpfs", "-o", "size=64k", "tmpfs", str(disk)):
        code, err = run_main(["run", "--out", str(disk / "r"), *TINY], capsys)
        assert code == 2 and len(err.strip().splitlines()) == 1, err
        assert "MB free but the run needs about" in err
        assert list(disk.iterdir()) == []


@pytest.mark.skipif(not IS_ROOT, reason="a read-only bind mount needs root")
def test_a_read_only_out_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source, target = tmp_path / "src", tmp_path / "ro"
    source.mkdir()
    target.mkdir()
    with mounted("--bind", "-o", "ro", str(source), str(target)):
        code, err = run_main(["run", "--out", str(target / "r"), *TINY], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "is not writable" in err or "read-only" in err
    assert list(source.iterdir()) == []


def test_an_out_another_run_is_using_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "r"
    out.mkdir()
    fd = os.open(out, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        code, err = run_main(["run", "--out", str(out), *TINY], capsys)
    finally:
        os.close(fd)
    assert code == 2 and "another cfl-bench process is running" in err
    assert list(out.iterdir()) == []


def test_a_disk_that_fills_during_the_run_gives_one_line_and_stays_resumable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from cfl_bench.core.records import RecordLog

    calls = {"n": 0}
    real = RecordLog.append

    def append_until_full(self: RecordLog, records: list, costs: list) -> None:  # type: ignore[type-arg]
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(self, records, costs)

    monkeypatch.setattr(RecordLog, "append", append_until_full)
    out = tmp_path / "r"
    args = ["run", "--out", str(out), "--checkpoint-every", "1", *TINY]
    code, err = run_main(args, capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "the disk is full" in err and "rerun the same command to resume" in err
    monkeypatch.setattr(RecordLog, "append", real)
    code, err = run_main(args, capsys)
    assert code == 0, err
    assert (out / "summary.json").exists()
