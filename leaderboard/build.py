"""The whole pipeline: run directories → runs frame → leaderboard → CSV + HTML.

Why one function: the CLI, the tests and any script must produce exactly the same files
from the same runs; :func:`build_leaderboard` is that single path. It is a pure function
of the run records (no clock, no environment), and both files are written atomically.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from cfl_bench.errors import UserError

if TYPE_CHECKING:
    import pandas as pd


@dataclass
class Leaderboard:
    """What :func:`build_leaderboard` made: the frames and where the files are."""

    runs: pd.DataFrame
    board: pd.DataFrame
    csv_path: Path
    html_path: Path


def build_leaderboard(run_dirs: Sequence[str | Path], out_dir: str | Path) -> Leaderboard:
    """Load every run under ``run_dirs``, aggregate, write leaderboard.csv + .html in
    ``out_dir`` (created if needed) and return both frames."""
    from leaderboard.aggregate import aggregate
    from leaderboard.html import write_board_html
    from leaderboard.runs import load_runs
    from leaderboard.table import write_board_csv

    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise UserError(f"--out '{out}' is a file; give a directory for the leaderboard files.")
    runs = load_runs(run_dirs)
    board = aggregate(runs)
    out.mkdir(parents=True, exist_ok=True)
    csv_path = write_board_csv(board, out)
    html_path = write_board_html(board, runs, out)
    return Leaderboard(runs=runs, board=board, csv_path=csv_path, html_path=html_path)
