"""What a new user reads at 80 columns: help texts, listings, the sweep's live line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ENV80 = {**os.environ, "COLUMNS": "80", "OMP_NUM_THREADS": "1"}


def at_80_columns(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cfl_bench.cli", *args],
        capture_output=True,
        text=True,
        env=ENV80,
        timeout=120,
    )


@pytest.mark.parametrize(
    "command",
    [["run"], ["sweep"], ["carla", "demo"], ["carla", "record"], ["pilot", "boundary"],
     ["leaderboard"], ["report"], ["clients"], ["flower", "app"]],
)  # fmt: skip
def test_help_shows_defaults_without_markup_escapes(command: list[str]) -> None:
    result = at_80_columns(*command, "--help")
    assert result.returncode == 0, result.stderr
    assert "[default:" in result.stdout
    assert "\\[" not in result.stdout, result.stdout
    assert max(len(line) for line in result.stdout.splitlines()) <= 80


def test_download_without_data_root_asks_for_the_folder() -> None:
    result = at_80_columns("run", "--stream", "seq-cifar10", "--download")
    assert result.returncode == 2
    line = " ".join(result.stderr.split())
    assert "--download needs a folder to fetch the data of stream 'seq-cifar10' into" in line
    assert "add --data-root DIR" in line
    assert "add --download" not in line  # not sent round in a circle
    assert "Traceback" not in result.stderr


def test_list_strategies_keeps_wrapped_help_under_its_option() -> None:
    result = at_80_columns("list", "strategies")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80
    from cfl_bench.strategies.registry import describe_components

    names = {str(row["name"]) for row in describe_components()}
    # Only a component's own line starts at column 0 (and the closing composition hint).
    for line in lines[:-2]:
        if line and not line[0].isspace():
            assert line.split()[0] in names, line
    assert "…" not in result.stdout


def test_sweep_line_keeps_bar_counts_and_eta_at_80_columns(tmp_path: Path) -> None:
    import io
    import time

    from rich.console import Console

    from cfl_bench.sweeps.display import SweepProgress
    from cfl_bench.sweeps.grid import build_spec, expand
    from cfl_bench.sweeps.scheduler import PointState

    args = ["--strategy", "der+fedgp", "--strategy", "fedavg", "--seed", "0", "--seed", "1"]
    states = [PointState(p, tmp_path) for p in expand(build_spec(None, args, str(tmp_path)))]
    states[0].status, states[0].wall_time_s = "finished", 60.0
    states[1].status, states[1].wall_time_s = "failed", 30.0
    states[2].status, states[2].started = "running", time.monotonic() - 15
    progress = SweepProgress(Console(width=80, force_terminal=True), states, jobs=1)
    progress.refresh()
    sink = Console(width=80, file=io.StringIO(), color_system=None)
    sink.print(progress.progress.make_tasks_table(progress.progress.tasks))
    (line,) = sink.file.getvalue().splitlines()  # type: ignore[attr-defined]
    assert line.startswith("sweep ━") and "2/4" in line and "1 failed" in line
    # 45 s mean: the running point has ~30 s left, the pending one 45 s.
    assert "ETA 0:01:1" in line and "running rot-digits" in line and len(line) <= 80


def test_run_names_its_default_folder_as_the_sweep_names_the_same_run(tmp_path: Path) -> None:
    args = ["--strategy", "der", "--tasks", "2", "--rounds-per-task", "1", "--train-size", "300"]
    args += ["--test-size", "100", "--threads", "1"]
    run = subprocess.run(
        [sys.executable, "-m", "cfl_bench.cli", "run", *args],
        capture_output=True, text=True, env={**ENV80, "PYTHONPATH": str(ROOT)}, cwd=tmp_path,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    from cfl_bench.sweeps.grid import build_spec, expand

    (point,) = expand(build_spec(None, args, str(tmp_path / "runs")))
    assert [p.name for p in (tmp_path / "runs").iterdir()] == [point.name]


def test_leaderboard_folds_long_run_names_at_80_columns(tmp_path: Path) -> None:
    from tests.leaderboard_fixtures import write_run

    name = "a-very-long-run-directory-name_der-fedgp_s1_lr-0.05_buffer-size-200-63ebd06e"
    write_run(tmp_path, "fedavg_s0", seed=0, acc=50.0)
    write_run(tmp_path, name, seed=1, status="failed", message="it failed")
    result = at_80_columns("leaderboard", str(tmp_path), "--out", str(tmp_path / "board"))
    flat = "".join(result.stdout.split())
    assert name in flat, result.stdout  # folded over lines, never cut with "…"
    assert max(len(line) for line in result.stdout.splitlines()) <= 80
