"""The papers' numbers as data: ``reproductions/targets/<paper>.csv``, loaded and checked.

Why data and not code: a reproduction is judged against the cell the paper printed, digit for
digit, with its ± and its number of seeds. Keeping every cell of the five papers in one CSV
per paper (copied from the printed tables; the source line in the paper's text beside each)
lets a reader audit a target without reading Python, and lets a table definition
(:mod:`cfl_bench.reproduce.tables`) point at cells by name.

Columns: ``paper, table, dataset, setting, method, variant, metric, value, pm, n_seeds,
source_line, notes``. A cell is named by (table, dataset, setting, method, variant, metric),
unique within a paper. ``value`` is the printed text; most are numbers, a few are not
(``Failure``, symbolic costs) and say so in ``notes``. ``pm`` is the printed ± or empty;
``n_seeds`` an integer, ``not stated`` or ``n/a``.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

from cfl_bench.core.errors import UserError

COLUMNS = (
    "paper",
    "table",
    "dataset",
    "setting",
    "method",
    "variant",
    "metric",
    "value",
    "pm",
    "n_seeds",
    "source_line",
    "notes",
)
# Spellings of "the paper gives no number of seeds".
NO_SEED_COUNT = ("not stated", "n/a")


@dataclass(frozen=True)
class CellKey:
    """Which printed cell: the table, its column (dataset + setting) and row (method +
    variant), and the metric the table reports."""

    table: str
    dataset: str
    setting: str
    method: str
    variant: str
    metric: str

    def shown(self) -> str:
        return f"{self.table} · {self.dataset} ({self.setting}) · {self.method} {self.variant}"


@dataclass(frozen=True)
class Target:
    """One printed cell: its number (None when the paper printed text), its ± (None when
    none is printed) and the seeds it averages (None when not stated)."""

    paper: str
    key: CellKey
    text: str
    value: float | None
    pm: float | None
    n_seeds: int | None
    source_line: str
    notes: str


def _number(text: str, what: str, where: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise UserError(
            f"{where}: {what} '{text}' is not a number; fix the targets file."
        ) from None
    if not math.isfinite(value):
        raise UserError(f"{where}: {what} '{text}' is not finite; fix the targets file.")
    return value


def _seed_count(text: str, where: str) -> int | None:
    if text in NO_SEED_COUNT:
        return None
    if not text.isdigit() or int(text) < 1:
        raise UserError(
            f"{where}: n_seeds '{text}' is neither a positive integer nor one of "
            f"{', '.join(NO_SEED_COUNT)}; fix the targets file."
        )
    return int(text)


def parse_target(row: dict[str, str], where: str) -> Target:
    """One CSV row as a :class:`Target`; a non-numeric value must be explained in notes."""
    key = CellKey(*(row[c] for c in ("table", "dataset", "setting", "method", "variant", "metric")))
    text = row["value"]
    try:
        value: float | None = _number(text, "value", where)
    except UserError:
        if not row["notes"]:
            raise UserError(
                f"{where}: value '{text}' is not a number and its notes do not say why; "
                "fix the targets file."
            ) from None
        value = None
    pm = _number(row["pm"], "pm", where) if row["pm"] else None
    if pm is not None and pm < 0:
        raise UserError(f"{where}: pm {pm} is negative; fix the targets file.")
    n_seeds = _seed_count(row["n_seeds"], where)
    return Target(row["paper"], key, text, value, pm, n_seeds, row["source_line"], row["notes"])


def load_targets(path: Path) -> dict[CellKey, Target]:
    """Every cell of one paper's targets file, by key; refuses a file another tool could
    misread (other columns, empty fields that name a cell, a key twice, two papers)."""
    if not path.is_file():
        raise UserError(f"targets file '{path}' does not exist; run from a clone of cfl-bench.")
    with path.open(encoding="utf-8", newline="") as handle:
        reader = csv.DictReader(handle)
        if tuple(reader.fieldnames or ()) != COLUMNS:
            raise UserError(
                f"{path}: the header must be {','.join(COLUMNS)}; fix the targets file."
            )
        rows = list(reader)
    targets: dict[CellKey, Target] = {}
    papers = {row["paper"] for row in rows}
    if len(papers) != 1:
        raise UserError(f"{path}: one paper per targets file, found {len(papers)}.")
    for number, row in enumerate(rows, start=2):
        where = f"{path.name} line {number}"
        if any(value is None for value in row.values()):
            raise UserError(f"{where}: wrong number of fields; fix the targets file.")
        if not all(row[c] for c in ("table", "dataset", "method", "metric", "value")):
            raise UserError(f"{where}: table, dataset, method, metric and value must be given.")
        target = parse_target(row, where)
        if target.key in targets:
            raise UserError(f"{where}: the cell {target.key.shown()} is given twice.")
        targets[target.key] = target
    return targets
