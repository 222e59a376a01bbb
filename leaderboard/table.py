"""``leaderboard.csv``: the leaderboard as a flat table with a fixed column schema.

Why a fixed schema: targets files and downstream scripts address cells by column name, so
every column of :data:`leaderboard.aggregate.BOARD_COLUMNS` is always present (task-IL
columns are empty for domain-IL streams). Floats are written with Python's shortest
round-trip repr and NaN as an empty cell, rows end in ``\\n``, and nothing depends on the
clock, so the same run records always give the same bytes. The file is written atomically
(temporary file + rename), like every run file.
"""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path
from typing import TYPE_CHECKING

from cfl_bench.core.atomic import atomic_write_text
from cfl_bench.leaderboard.aggregate import BOARD_COLUMNS

if TYPE_CHECKING:
    import pandas as pd

CSV_NAME = "leaderboard.csv"


def _cell(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, float):
        return "" if math.isnan(value) else repr(value)
    return str(value)


def board_csv(board: pd.DataFrame) -> str:
    """The CSV text of a leaderboard frame (columns in :data:`BOARD_COLUMNS` order)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(BOARD_COLUMNS)
    for record in board[list(BOARD_COLUMNS)].itertuples(index=False, name=None):
        writer.writerow([_cell(v.item() if hasattr(v, "item") else v) for v in record])
    return buffer.getvalue()


def write_board_csv(board: pd.DataFrame, out_dir: Path) -> Path:
    """Write ``out_dir/leaderboard.csv`` atomically; returns its path."""
    path = out_dir / CSV_NAME
    atomic_write_text(path, board_csv(board))
    return path
