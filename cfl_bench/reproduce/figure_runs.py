"""Which finished runs of a folder are which rows of a figure, and their windows.

A run belongs to a row when its strategy is the row's at the run's scale and its options are
the figure's protocol at that scale (every option the protocol or a scale sets is compared,
as for tables: :mod:`cfl_bench.reproduce.collect`). From its ``records.csv`` the run gives its
curve (the figure's metric on ``eval_task``, one value per round) and three headlines over
the scale's window of k rounds: *before* (the k rounds ending at the shift, i.e. the first
task's last round), *end* (the last k rounds) and *fall* = before − end. Runs that fit no
row, or lack a round of a window, are listed with the reason, never averaged in.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from cfl_bench.core.run_reader import RunReading, read_run
from cfl_bench.reproduce.collect import (
    Collected,
    RunValue,
    _consistency_notes,
    refuse_duplicates,
    run_folders,
)
from cfl_bench.reproduce.figures import HEADLINES, ReproFigure
from cfl_bench.reproduce.tables import Row


@dataclass(frozen=True)
class Windows:
    """A run's curve and its headlines; ``shift`` is the first task's last round."""

    curve: pd.Series
    shift: int
    before: float
    end: float

    @property
    def fall(self) -> float:
        return self.before - self.end


@dataclass
class FigureRuns:
    """The counted runs: headlines as a :class:`Collected` (cells keyed (row, headline),
    so provenance and shipping read them like a table's), and each run's curve."""

    collected: Collected = field(default_factory=Collected)
    curves: dict[str, dict[int, pd.Series]] = field(default_factory=dict)
    shift: int | None = None


def windows_of(reading: RunReading, metric: str, eval_task: int, k: int) -> Windows | str:
    """The run's windows, or why it has none."""
    clock = reading.config.get("task_clock", {})
    ends = list(clock.get("eval_rounds", []))
    total = int(clock.get("total_rounds", 0))
    if len(ends) != 2 or reading.records is None:
        return "not a two-task run with records"
    records = reading.records
    chosen = records[
        (records["eval_task"] == eval_task)
        & (records["scope"] == "global")
        & (records["metric"] == metric)
        & (records["round"] >= 1)
    ]
    curve = chosen.astype({"round": int}).groupby("round")["value"].last().astype(float)
    shift = int(ends[0])
    wanted = [*range(shift - k + 1, shift + 1), *range(total - k + 1, total + 1)]
    lacking = [r for r in wanted if r not in curve.index]
    if lacking:
        return f"no {metric} of eval task {eval_task} at round {lacking[0]} (eval_every_round?)"
    before = float(curve.loc[shift - k + 1 : shift].mean())
    end = float(curve.loc[total - k + 1 : total].mean())
    return Windows(curve, shift, before, end)


def scale_of(figure: ReproFigure, options: dict[str, Any]) -> str | None:
    keys = figure.compared_keys()
    for name in figure.scales:
        expected = figure.base_options(name)
        if all(options.get(k) == expected.get(k) for k in keys):
            return name
    return None


def _row_of(figure: ReproFigure, strategy: str, scale: str) -> Row | None:
    rows = [r for r in figure.rows if figure.canonical_at(r, scale) == strategy]
    return rows[0] if rows else None


def collect_figure(figure: ReproFigure, folder: Path, scale: str | None = None) -> FigureRuns:
    """Sort the finished runs under ``folder`` into the figure's rows (with ``scale``, only
    the runs at that scale)."""
    found = FigureRuns()
    for run in run_folders(folder):
        shown = run.relative_to(folder).as_posix() if run != folder else run.name
        reading = read_run(run, shown, records=True)
        why = _count(figure, reading, run, scale, found)
        if why:
            found.collected.notes.append(f"{shown}: not counted ({why})")
    refuse_duplicates(found.collected, folder)  # one run per row and seed, as for tables
    found.collected.notes += _consistency_notes(found.collected)
    return found


def _count(
    figure: ReproFigure, reading: RunReading, run: Path, scale: str | None, found: FigureRuns
) -> str:
    """Add the run to ``found``; returns why it was not counted ('' when it was)."""
    if not reading.done or reading.row is None:
        return f"{reading.status}: {reading.reason}"
    run_scale = scale_of(figure, reading.config.get("config", {}))
    if run_scale is None:
        return "its options are the figure's protocol at none of its scales"
    if scale is not None and run_scale != scale:
        return f"a run at scale {run_scale}"
    row = _row_of(figure, str(reading.row["strategy"]), run_scale)
    if row is None:
        return f"strategy {reading.row['strategy']} is no row of {figure.name} at {run_scale}"
    windows = windows_of(reading, figure.metric, figure.eval_task, figure.window(run_scale))
    if isinstance(windows, str):
        return windows
    seed = int(reading.row["seed"])
    wall = float((reading.summary or {}).get("wall_time_s") or 0.0)
    for headline, value in zip(HEADLINES, (windows.before, windows.end, windows.fall), strict=True):
        found.collected.cells.setdefault((row.label, headline), []).append(
            RunValue(seed, value, run, str(reading.row["protocol_hash"]), wall, run_scale)
        )
    found.curves.setdefault(row.label, {})[seed] = windows.curve
    found.shift = windows.shift
    return ""
