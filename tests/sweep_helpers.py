"""Helpers for the sweep tests: in-process CLI calls, sweep.log queries, comparable summaries."""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from cfl_bench.cli import app
from cfl_bench.sweeps import ledger
from tests.golden_runs import VOLATILE

# Tiny runs on the embedded rot-digits stream: ~0.3 s each once the engine is imported.
TINY = [
    "--tasks",
    "2",
    "--rounds-per-task",
    "1",
    "--train-size",
    "300",
    "--test-size",
    "100",
]
# Fields of summary.json that measure time or memory, never reproducible.
UNREPRODUCIBLE = VOLATILE


def in_process(*args: str) -> tuple[int, str]:
    """``cfl-bench ARGS`` in this process; exit code and combined output."""
    result = CliRunner().invoke(app, list(args))
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.output


def sweep_command(out: Path, *args: str) -> list[str]:
    """The argv of a `cfl-bench sweep` subprocess."""
    return [sys.executable, "-m", "cfl_bench.cli", "sweep", "--out", str(out), *args]


def events(out: Path, kind: str) -> Counter[str]:
    """How many times each point had ``kind`` (start, finish, skip, fail, busy) in sweep.log."""
    return Counter(row["point"] for row in ledger.read_log(out) if row["event"] == kind)


def summaries(out: Path) -> dict[str, dict[str, Any]]:
    """Every run directory's summary.json, by directory name."""
    return {p.parent.name: json.loads(p.read_text()) for p in sorted(out.glob("*/summary.json"))}


def comparable(summary: dict[str, Any]) -> dict[str, Any]:
    """A summary without its timing and memory fields."""
    return {k: v for k, v in summary.items() if k not in UNREPRODUCIBLE}
