"""Which finished runs of a folder are which cells of a table, at which scale.

A run belongs to cell (row, column) when its strategy's canonical name is the row's, and
its options are the column's options plus the table's protocol at one of the table's
scales (every option the protocol or any scale sets is compared, so a run at 5 rounds per
task is never counted as a 20-round run). Runs of the folder that match no cell are
listed with the reason, never silently averaged in. Seeds of one cell must share one
protocol hash (same data); anything else is reported.

**Other methods.** A run whose strategy is no row of the table but whose options are a
column's at one of its scales — your own method, or a built-in one the paper did not run —
is kept apart (``Collected.others``, by strategy and column): ``reproduce --compare`` shows
it beside the table, on the table's protocol, and never judges it against the paper.

**One run per cell and seed.** Two finished runs of the same cell and seed (a rerun with
another ``--executor``, ``--device`` or ``--data-root`` lands in a second folder, since a
sweep names a point by every option it was given) are refused, naming both folders, rather
than counted: averaged, they gave n = 2 with a standard deviation of 0, a mean and a spread
the table never measured. Refusing is the only choice that is never silently wrong: keeping
"the newer" or "the sequential one" would pick a result by a rule the reader cannot see.
``cfl-bench reproduce`` refuses before running a point that would make such a second copy
(:mod:`cfl_bench.reproduce.safety`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cfl_bench.core.errors import UserError
from cfl_bench.core.run_reader import RUN_MARKERS, RunReading, read_run
from cfl_bench.reproduce.tables import Column, ReproTable, Row

SKIPPED_FOLDERS = frozenset({".sweep", ".replacement", "leaderboard", "reproduction"})


@dataclass(frozen=True)
class RunValue:
    seed: int
    value: float
    path: Path
    protocol_hash: str
    wall_time_s: float
    scale: str


@dataclass
class Collected:
    """The runs of a folder, sorted into cells, and what did not fit."""

    cells: dict[tuple[str, str], list[RunValue]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    # Runs of strategies that are no row, by (strategy, column): see "Other methods".
    others: dict[tuple[str, str], list[RunValue]] = field(default_factory=dict)

    def every_cell(self) -> list[tuple[tuple[str, str], list[RunValue]]]:
        """The table's cells, then the other methods' (each sorted)."""
        return sorted(self.cells.items()) + sorted(self.others.items())

    def values(self, row: str, column: str) -> list[RunValue]:
        return self.cells.get((row, column), [])

    def scales(self) -> list[str]:
        return sorted({v.scale for _, values in self.every_cell() for v in values})

    def runs(self) -> list[RunValue]:
        """Every counted run once (a run read by two columns through two metrics once)."""
        seen: dict[Path, RunValue] = {}
        for _, values in self.every_cell():
            for value in values:
                seen.setdefault(value.path, value)
        return list(seen.values())


def run_folders(folder: Path) -> Iterator[Path]:
    """Every run directory under ``folder`` (one with a config.json, or another of
    ``run_reader.RUN_MARKERS``, so that a damaged run is noted, not missed), sorted."""
    for current, subfolders, files in os.walk(folder):
        marked = RUN_MARKERS & {*files, *subfolders}
        subfolders[:] = sorted(s for s in subfolders if s not in SKIPPED_FOLDERS)
        if marked:
            yield Path(current)
            subfolders[:] = []


def scale_of(table: ReproTable, options: dict[str, Any], column: Column) -> str | None:
    """The scale whose options the run's options are, for this column (None: none)."""
    keys = table.compared_keys() | set(column.options)
    for name in table.scales:
        expected = {**table.base_options(name), **column.options}
        unequal = [k for k in keys if options.get(k) != expected.get(k)]
        if not unequal:
            return name
        if all(expected.get(k) is None for k in unequal):
            defaults = resolved(expected)
            if all(options.get(k) == defaults.get(k) for k in unequal):
                return name
    return None


def resolved(expected: dict[str, Any]) -> dict[str, Any]:
    """``expected`` with the options a run fills from its stream when they are not given
    (``runner.plan.resolve_defaults``: model, tasks, partition, …), as the run's config.json
    records them. Why: a key one scale sets (the smoke scale's partition) is compared at
    every scale, and a scale that leaves it to the default must match the default the run
    chose (``class-subsets`` under ``--arrivals``), not None."""
    from cfl_bench.runner.config import make_config
    from cfl_bench.runner.plan import resolve_defaults

    return resolve_defaults(make_config(expected)).to_dict()


def _place(
    table: ReproTable, options: dict[str, Any], strategy: str
) -> tuple[list[tuple[Row, Column]], str | None, str]:
    """The cells a run fills, its scale, or why it fills none. The rows are matched at the
    run's scale, whose strategy options may be a row's reduced ones."""
    places, scale = [], None
    for column in table.columns:
        found = scale_of(table, options, column)
        if found is None:
            continue
        rows = [r for r in table.rows if table.canonical_at(r, found) == strategy]
        if rows:
            scale = found
            places += [(row, column) for row in rows]
    if places:
        return places, scale, ""
    if _is_no_row(table, strategy):
        return [], None, f"strategy {strategy} is no row of {table.name}"
    return [], None, "its options and strategy are no cell of the table at any of its scales"


def _is_no_row(table: ReproTable, strategy: str) -> bool:
    return not any(table.canonical_at(r, s) == strategy for r in table.rows for s in table.scales)


def _other_place(table: ReproTable, options: dict[str, Any]) -> tuple[str | None, list[Column]]:
    """The scale and the columns whose protocol a run of another method follows (the
    first scale that has any)."""
    for name in table.scales:
        columns = [c for c in table.columns if scale_of(table, options, c) == name]
        if columns:
            return name, columns
    return None, []


def collect(table: ReproTable, folder: Path, scale: str | None = None) -> Collected:
    """Sort the finished runs under ``folder`` into the table's cells (with ``scale``, only
    the runs at that scale; the others are listed as not counted)."""
    collected = Collected()
    for run in run_folders(folder):
        shown = _shown(run, folder)
        # Always with its records: a run whose records.csv is damaged is not finished, even
        # when the column reads only its summary (the summary must be what the records give).
        reading = read_run(run, shown, records=True)
        if not reading.done or reading.row is None:
            collected.notes.append(f"{shown}: not counted ({reading.status}: {reading.reason})")
            continue
        row = reading.row
        options = reading.config.get("config", {})
        strategy = str(row["strategy"])
        places, found_scale, why = _place(table, options, strategy)
        keys: list[tuple[str, Column]] = [(r.label, c) for r, c in places]
        target = collected.cells
        if not places and _is_no_row(table, strategy):
            found_scale, columns = _other_place(table, options)
            keys, target = [(strategy, c) for c in columns], collected.others
        if not keys or found_scale is None:
            collected.notes.append(f"{shown}: not counted ({why})")
            continue
        if scale is not None and found_scale != scale:
            collected.notes.append(f"{shown}: not counted (a run at scale {found_scale})")
            continue
        for label, column in keys:
            value, missing = column_value(column, reading)
            if value is None or value != value:
                collected.notes.append(f"{shown}: not counted (no {missing})")
                continue
            target.setdefault((label, column.label), []).append(
                RunValue(
                    seed=int(row["seed"]),
                    value=float(value),
                    path=run,
                    protocol_hash=str(row["protocol_hash"]),
                    wall_time_s=float(reading.summary.get("wall_time_s") or 0.0)
                    if reading.summary
                    else 0.0,
                    scale=found_scale,
                )
            )
    refuse_duplicates(collected, folder)
    collected.notes += _consistency_notes(collected)
    return collected


def refuse_duplicates(collected: Collected, folder: Path) -> None:
    """Refuse two finished runs of one cell and seed, naming both (see the module
    docstring): a seed counted twice would fake the cell's n and spread."""
    for (row, column), values in collected.every_cell():
        first: dict[int, Path] = {}
        for value in values:
            other = first.setdefault(value.seed, value.path)
            if other == value.path:
                continue
            a, b = (_shown(p, folder) for p in sorted((other, value.path)))
            raise UserError(
                f"'{a}' and '{b}' are both finished runs of {row} × {column}, seed "
                f"{value.seed}, and one run per cell and seed is counted (a rerun with another "
                f"--executor, --device or --data-root writes a second folder); move one of "
                f"them out of '{folder}'."
            )


def _shown(run: Path, folder: Path) -> str:
    return run.relative_to(folder).as_posix() if run != folder else run.name


def column_value(column: Column, reading: RunReading) -> tuple[float | None, str]:
    """The run's value for ``column`` (None when it has none) and what is missing then."""
    assert reading.row is not None
    if column.round_fraction is None:
        name = column.metric.removeprefix("-")
        value = reading.row.get(name)
        if value is None or name == column.metric:
            return value, column.metric
        return -float(value), column.metric
    return accuracy_at_round(reading, column.round_fraction)


def accuracy_at_round(reading: RunReading, fraction: float) -> tuple[float | None, str]:
    """The global accuracy recorded after round round(fraction x total rounds) of a static
    run evaluated every round (``--eval-every-round``), e.g. IFA's "Gen. 3" of 10
    generations is fraction 0.3. Continual runs have several tasks' accuracies per round,
    and no one of them is "the" accuracy at a round: they are refused (value None)."""
    total = int(reading.config.get("task_clock", {}).get("total_rounds", 0))
    target = max(1, round(fraction * total))
    missing = f"global accuracy at round {target} of {total} in records.csv"
    records = reading.records
    if records is None or (reading.summary or {}).get("num_tasks") != 1:
        return None, f"{missing} (a static run evaluated every round)"
    chosen = records[
        (records["round"] == target) & (records["scope"] == "global") & (records["metric"] == "acc")
    ]
    if len(chosen) != 1:
        return None, missing
    return float(chosen["value"].iloc[0]), missing


def _consistency_notes(collected: Collected) -> list[str]:
    """Cells whose seeds are at two scales or read different data (a repeated seed is
    refused by :func:`refuse_duplicates`)."""
    notes = []
    for (row, column), values in collected.every_cell():
        scales = {v.scale for v in values}
        hashes = {v.protocol_hash for v in values}
        if len(scales) > 1:
            notes.append(f"{row} × {column}: runs at scales {', '.join(sorted(scales))}")
        if len(hashes) > 1:
            notes.append(f"{row} × {column}: seeds of {len(hashes)} protocols (different data)")
    return notes
