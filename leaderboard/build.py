"""The whole pipeline: run directories → runs frame → leaderboard → CSV + HTML.

Why one function: the CLI, the tests and any script must produce exactly the same files
from the same runs; :func:`build_leaderboard` is that single path. It is a pure function
of the run records (no clock, no environment). Everything that can be refused is refused
before anything is written, and both files are then written together (see
:mod:`leaderboard.output`), so bad input leaves nothing behind.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd


@dataclass
class Leaderboard:
    """What :func:`build_leaderboard` made: the frames and where the files are."""

    runs: pd.DataFrame
    board: pd.DataFrame
    csv_path: Path
    html_path: Path


def build_leaderboard(
    run_dirs: Sequence[str | Path],
    out_dir: str | Path,
    std: str = "sample",
    target: float | None = None,
) -> Leaderboard:
    """Load every run under ``run_dirs``, aggregate, write leaderboard.csv + .html in
    ``out_dir`` (created if needed) and return both frames. ``target`` (``--target``, %):
    rounds and bytes to that average accuracy (:mod:`leaderboard.targets`).

    Order, and why: ``std``, ``target`` and ``--out`` are checked first (cheap, and a typo
    should not wait for thousands of runs to load); then the run directories are found and ``--out``
    is checked against them; both files are rendered in memory and only then written.
    Damaged runs do not stop anything: they are listed (see :mod:`leaderboard.runs`)."""
    from cfl_bench.leaderboard.aggregate import aggregate, std_ddof
    from cfl_bench.leaderboard.html import HTML_NAME, render_html
    from cfl_bench.leaderboard.output import (
        check_board_out,
        refuse_run_directory,
        write_board_files,
    )
    from cfl_bench.leaderboard.runs import find_run_dirs, load_found
    from cfl_bench.leaderboard.table import CSV_NAME, board_csv
    from cfl_bench.leaderboard.targets import check_target

    std_ddof(std)
    check_target(target)
    out = check_board_out(out_dir, (CSV_NAME, HTML_NAME))
    found = find_run_dirs(run_dirs)
    refuse_run_directory(out, found)
    runs = load_found(found)
    board = aggregate(runs, std, target)
    files = {CSV_NAME: board_csv(board), HTML_NAME: render_html(board, runs, std)}
    csv_path, html_path = write_board_files(out, files)
    return Leaderboard(runs=runs, board=board, csv_path=csv_path, html_path=html_path)
