"""What a new user reads at 80 columns: help texts, listings, the sweep's live line."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

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
    assert "--download needs a folder to fetch stream 'seq-cifar10'" in line
    assert "add --data-root DIR" in line
    assert "add --download" not in line  # not sent round in a circle
    assert "Traceback" not in result.stderr
