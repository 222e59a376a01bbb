"""``cfl_bench.run`` and ``cfl_bench.sweep``: the command line's runs from Python, with the
results as DataFrames, and the command line's refusals as exceptions."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

import cfl_bench
from cfl_bench.core.errors import UserError
from cfl_bench.core.metrics import RECORD_COLUMNS

TINY = {
    "tasks": 2,
    "rounds_per_task": 1,
    "clients": 2,
    "train_size": 120,
    "test_size": 60,
    "buffer_size": 20,
    "threads": 1,
}

SAME_ER = """
from cfl_bench.strategies.er import ER


class SameER(ER):
    '''ER, unchanged.'''
"""


def test_import_cfl_bench_imports_no_torch() -> None:
    import subprocess

    code = "import sys, cfl_bench; assert 'torch' not in sys.modules; print(cfl_bench.run)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_run_returns_the_run_folder_summary_and_records(tmp_path: Path) -> None:
    out = tmp_path / "r"
    outcome = cfl_bench.run("rot-digits", "er", out=out, progress=False, **TINY)
    assert outcome.path == out and outcome.status == "finished"
    assert outcome.summary == json.loads((out / "summary.json").read_text(encoding="utf-8"))
    records = outcome.records
    assert tuple(records.columns) == RECORD_COLUMNS  # the file's own columns, as written
    assert records["round"].max() == 2  # two tasks of one round each
    assert outcome.config["strategy"]["name"] == "er"


def test_a_bad_option_raises_the_command_lines_message(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="unknown option 'rounds'; see `cfl-bench run --help`"):
        cfl_bench.run(rounds=3, out=tmp_path / "r")
    with pytest.raises(UserError, match="unknown strategy component 'fedgpp'"):
        cfl_bench.run(strategy="fedgpp", out=tmp_path / "r")
    assert not (tmp_path / "r").exists()


def test_a_sweep_with_a_method_outside_the_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The points run in their own processes, started from this folder: the method is found
    # there as from the command line.
    (tmp_path / "my_methods.py").write_text(textwrap.dedent(SAME_ER), encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        grid = cfl_bench.sweep(
            "runs", strategy=["er", "my_methods.SameER"], seed=[0, 1], jobs=2, **TINY
        )
    finally:
        sys.modules.pop("my_methods", None)
    assert grid.exit_code == 0
    points = grid.points
    assert sorted(points["strategy"]) == ["er", "er", "my_methods.SameER", "my_methods.SameER"]
    assert set(points["status"]) == {"finished"}
    records = grid.records
    assert list(records.columns[:4]) == ["name", "status", "seed", "strategy"]  # sweep.json order
    by = records.groupby(["strategy", "seed"])["value"].apply(list)
    for seed in (0, 1):  # the unchanged subclass gives ER's records exactly
        assert by[("er", seed)] == by[("my_methods.SameER", seed)]
    board = grid.leaderboard
    assert board is not None and sorted(board["strategy"]) == ["er", "my_methods.SameER"]


def test_a_bad_grid_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="sweep option 'seed' has no values"):
        cfl_bench.sweep(tmp_path / "s", seed=[])
    with pytest.raises(UserError, match="unknown option 'sed'"):
        cfl_bench.sweep(tmp_path / "s", sed=[0, 1])
    assert not (tmp_path / "s").exists()
