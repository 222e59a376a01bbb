"""Replacing a run (``--overwrite``, ``--restart``): nothing lost, nothing half-replaced.

The old run stays byte-identical (every file, nothing added) when the replacement fails at
any point — a refused input found late, an exception from the cost probe, Ctrl-C, SIGKILL —
and a replacement that finishes leaves none of the old run's files behind (``model.pt``,
``report.html``). See the module docstring of ``cfl_bench.core.run_dir`` for the design.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cfl_bench.core.errors import UserError
from cfl_bench.core.run_dir import ASIDE, MOVED, STAGING, RunDirectory
from cfl_bench.runner import cost
from cfl_bench.runner.config import make_config
from cfl_bench.runner.round_keeper import RunInterruptedError
from cfl_bench.runner.run import execute
from tests.test_resume import KILLER

BASE: dict[str, Any] = {
    "stream": "rot-digits",
    "strategy": "fedavg",
    "tasks": 2,
    "rounds_per_task": 2,
    "clients": 3,
    "epochs": 1,
    "train_size": 300,
    "test_size": 100,
    "probe_size": 50,
    "threads": 1,
}
# The kill -9 stand-in is test_resume's: SIGKILL from inside the round-end callback.


def snapshot(folder: Path) -> dict[str, bytes | None]:
    """Every entry below ``folder`` (hidden ones included): file bytes, None for folders."""
    out: dict[str, bytes | None] = {}
    for here, dirs, files in os.walk(folder):
        for name in dirs:
            out[os.path.relpath(os.path.join(here, name), folder)] = None
        for name in files:
            path = Path(here) / name
            out[os.path.relpath(path, folder)] = path.read_bytes()
    return out


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished run with the two files a replacement does not write: model.pt (the old
    run saved its model) and report.html (a report written into it)."""
    out = tmp_path_factory.mktemp("finished") / "run"
    execute(make_config({**BASE, "out": str(out), "save_model": True}))
    (out / "report.html").write_text("<html>the old run's report</html>\n")
    assert (out / "model.pt").is_file()
    return out


@pytest.fixture
def old_run(finished: Path, tmp_path: Path) -> tuple[Path, dict[str, bytes | None]]:
    """A private copy of the finished run and its snapshot."""
    out = tmp_path / "run"
    subprocess.run(["cp", "-a", str(finished), str(out)], check=True)
    return out, snapshot(out)


def replacement(out: Path, **extra: Any) -> dict[str, Any]:
    """Another configuration (seed 1) into the same --out, with --overwrite."""
    return {**BASE, "out": str(out), "seed": 1, "overwrite": True, **extra}


def test_a_huge_batch_size_leaves_the_old_run_byte_identical(
    old_run: tuple[Path, dict[str, bytes | None]],
) -> None:
    """The issue's case: the cost probe's allocation fails after validation (or an earlier
    bound check refuses the batch size); the finished run must survive either way."""
    out, before = old_run
    result = subprocess.run(
        [sys.executable, "-m", "cfl_bench.cli", "run", "--stream", "rot-digits", "--tasks", "2",
         "--rounds-per-task", "2", "--clients", "3", "--train-size", "300", "--test-size",
         "100", "--threads", "1", "--seed", "1", "--batch-size", "100000000", "--overwrite",
         "--out", str(out)],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert result.returncode != 0, result.stdout
    assert snapshot(out) == before


def test_a_failing_cost_probe_leaves_the_old_run_byte_identical(
    old_run: tuple[Path, dict[str, bytes | None]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failure injected after every check and the directory claim: the cost probe (the
    first thing the run does) raises. Before the fix this emptied the old run."""
    out, before = old_run

    def failing_probe(*_args: object) -> dict[str, object]:
        raise RuntimeError("DefaultCPUAllocator: not enough memory")

    monkeypatch.setattr(cost, "announce", failing_probe)
    with pytest.raises(RuntimeError, match="not enough memory"):
        execute(make_config(replacement(out)))
    assert snapshot(out) == before


def test_a_user_error_in_the_middle_of_the_run_leaves_the_old_run(
    old_run: tuple[Path, dict[str, bytes | None]],
) -> None:
    """A refusal raised while rounds are already being written (after config.json and the
    first records of the replacement exist) still leaves the old run as it was."""
    out, before = old_run

    def refuse(report: object) -> None:
        raise UserError("the stream's data went away")

    with pytest.raises(UserError, match="went away"):
        execute(make_config(replacement(out, checkpoint_every=0)), refuse)
    assert snapshot(out) == before


def test_a_finished_replacement_leaves_nothing_of_the_old_run(
    old_run: tuple[Path, dict[str, bytes | None]],
) -> None:
    out, _ = old_run
    execute(make_config(replacement(out)))
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "costs.csv", "records.csv",
                                                     "summary.json"]  # fmt: skip
    assert json.loads((out / "summary.json").read_text())["seed"] == 1
    assert json.loads((out / "config.json").read_text())["config"]["seed"] == 1


def test_ctrl_c_before_a_checkpoint_restores_the_old_run(
    old_run: tuple[Path, dict[str, bytes | None]],
) -> None:
    out, before = old_run

    def interrupt(report: object) -> None:
        raise KeyboardInterrupt

    with pytest.raises(RunInterruptedError):
        execute(make_config(replacement(out, checkpoint_every=0)), interrupt)
    assert snapshot(out) == before


def test_ctrl_c_after_a_checkpoint_keeps_the_old_run_and_the_rerun_resumes(
    old_run: tuple[Path, dict[str, bytes | None]], tmp_path: Path
) -> None:
    """The replacement keeps its checkpoint (hidden in the staging folder), the old run
    stays in place, and rerunning the same command resumes and then replaces it."""
    out, before = old_run
    values = replacement(out, checkpoint_every=1)

    def interrupt(report: Any) -> None:
        if report.round_index == 3:
            raise KeyboardInterrupt

    with pytest.raises(RunInterruptedError, match="rerun the same command to resume"):
        execute(make_config(values), interrupt)
    visible = {k: v for k, v in snapshot(out).items() if not k.startswith(STAGING)}
    assert visible == before
    notes: list[str] = []
    execute(make_config(values), notify=notes.append)
    assert any(n.startswith("resuming after round 3") for n in notes), notes
    whole = tmp_path / "whole"
    execute(make_config({**values, "out": str(whole), "overwrite": False}))
    assert (out / "records.csv").read_bytes() == (whole / "records.csv").read_bytes()
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in whole.iterdir())


def test_kill_9_during_the_replacement_leaves_the_old_run_in_place(
    old_run: tuple[Path, dict[str, bytes | None]],
) -> None:
    out, before = old_run
    values = replacement(out, checkpoint_every=1)
    result = subprocess.run(
        [sys.executable, "-c", KILLER, json.dumps(values), "2"],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert result.returncode == -signal.SIGKILL, result.stderr
    visible = {k: v for k, v in snapshot(out).items() if not k.startswith(STAGING)}
    assert visible == before  # what leaderboard and report read is the old run
    notes: list[str] = []
    execute(make_config(values), notify=notes.append)
    assert any(n.startswith("resuming after round 2") for n in notes), notes
    assert json.loads((out / "summary.json").read_text())["seed"] == 1
    assert not (out / STAGING).exists() and not (out / "model.pt").exists()


def test_a_refused_rerun_without_overwrite_touches_nothing(
    old_run: tuple[Path, dict[str, bytes | None]],
) -> None:
    out, before = old_run
    with pytest.raises(UserError, match="already holds a finished run; pass --overwrite"):
        execute(make_config({**BASE, "out": str(out), "seed": 1}))
    assert snapshot(out) == before


# -- the swap itself: a crash inside it is completed by the next claim ------------------------
def fake_run(folder: Path, config_hash: str, content: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"config_hash": config_hash}))
    (folder / "records.csv").write_text(content)
    (folder / "summary.json").write_text(json.dumps({"status": "finished"}))


@pytest.mark.parametrize("moved_before_crash", [0, 2, 4, 6])
def test_a_swap_stopped_half_way_is_completed_by_the_next_claim(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, moved_before_crash: int
) -> None:
    """os.replace fails after ``moved_before_crash`` renames (a crash inside the swap); the
    next claim finds the half-done swap and completes it: the new run, whole, in --out."""
    out = tmp_path / "run"
    fake_run(out, "old", "old records\n")
    (out / "model.pt").write_bytes(b"old model")
    run_dir = RunDirectory(out)
    assert run_dir.claim("new", overwrite=True, restart=False) is False
    assert run_dir.replacing
    fake_run(run_dir.path, "new", "new records\n")
    real_replace, calls = os.replace, [0]

    def crash_after(src: object, dst: object) -> None:
        if calls[0] == moved_before_crash:
            raise OSError(5, "Input/output error")
        calls[0] += 1
        real_replace(src, dst)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "replace", crash_after)
    with pytest.raises(OSError), run_dir:
        run_dir.commit()
    monkeypatch.setattr(os, "replace", real_replace)
    assert (out / ASIDE).is_dir()  # the half-done swap was left for the next claim
    # The first 4 renames move the old entries aside, the next 3 the new ones up.
    assert (out / ASIDE / MOVED).exists() == (moved_before_crash >= 4)
    with RunDirectory(out) as again, pytest.raises(UserError, match="holds a finished run"):
        again.claim("new", overwrite=False, restart=False)
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "records.csv", "summary.json"]
    assert (out / "records.csv").read_text() == "new records\n"


# -- commands that do not own a run directory never write into one ---------------------------
@pytest.mark.parametrize(
    ("command", "below", "fragment"),
    [
        (["pilot", "boundary", "--rounds", "1"], "", "is a cfl-bench run directory"),
        (["pilot", "boundary", "--rounds", "1"], "pilot", "is inside the cfl-bench run directory"),
        (["sweep", "--seed", "0", "--seed", "1"], "", "is a cfl-bench run directory"),
        (["sweep", "--seed", "0"], "sweeps/a", "is inside the cfl-bench run directory"),
    ],
)
def test_other_commands_refuse_an_out_in_a_run_directory(
    old_run: tuple[Path, dict[str, bytes | None]],
    capsys: pytest.CaptureFixture[str],
    command: list[str],
    below: str,
    fragment: str,
) -> None:
    from cfl_bench.cli import main

    out, before = old_run
    with pytest.raises(SystemExit) as stop:
        main([*command, "--out", str(out / below if below else out)])
    err = capsys.readouterr().err
    assert stop.value.code == 2, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert fragment in " ".join(err.split()), err
    assert snapshot(out) == before
