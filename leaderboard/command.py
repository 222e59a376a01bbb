"""The terminal side of ``cfl-bench leaderboard``: build, print a summary, run the checks.

Why here and not in cfl_bench/cli.py: the CLI module stays a thin list of commands (and
fast to import); this module owns what the leaderboard command prints and its exit code:
0 = written (and every target met), 1 = a ``--check`` target was missed, 2 = bad input
(raised as UserError, which the CLI turns into one line). Every string from the data is
passed to rich as ``Text`` (never as markup), so a strategy called ``[bold]x`` prints as
written.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from cfl_bench.core.errors import UserError

if TYPE_CHECKING:
    import pandas as pd

    from cfl_bench.core.metric_registry import MetricSpec
    from cfl_bench.leaderboard.check import Outcome


def _compact(row: pd.Series, metric: str, spec: str = ".2f", with_std: bool = False) -> str:
    """``85.00±7.07`` (or the mean alone) — narrow enough for an 80-column terminal."""
    mean, std = float(row[f"{metric}_mean"]), float(row[f"{metric}_std"])
    if math.isnan(mean):
        return "–"
    if not with_std:
        return format(mean, spec)
    return f"{mean:{spec}}±{'–' if math.isnan(std) else format(std, spec)}"


def terminal_cell(row: pd.Series, spec: MetricSpec) -> str:
    """One metric of the terminal table: accuracies as mean ± std (what a reader compares
    strategies by), everything else as the mean alone; bytes in B / KB / MB."""
    from cfl_bench.leaderboard.plots import human_bytes

    if spec.unit == "bytes":
        mean = float(row[f"{spec.column}_mean"])
        return "–" if math.isnan(mean) else human_bytes(mean)
    return _compact(row, str(spec.column), spec.fmt, with_std=spec.family == "accuracy")


def significance_legend(rows: pd.DataFrame, metric: str) -> str:
    """The caption line that says what the ``vs best`` column means, naming the test, the
    correction and how many rows it corrected for."""
    from cfl_bench.leaderboard.significance import ALPHA, DIFFERS_MARK, TIED_MARK

    tested = int(rows[f"{metric}_p_vs_best"].notna().sum())
    return (
        f"vs best: {metric} against the best row; {TIED_MARK} tied = statistically "
        f"indistinguishable, {DIFFERS_MARK} = significantly different: two-sided t-test "
        f"paired by seed (Welch's t-test when < 2 seeds are shared), Holm-corrected over the "
        f"{tested} row{'' if tested == 1 else 's'} tested, α = {ALPHA:g}; one seed: no test "
        f"(95% CIs: CSV and HTML)"
    )


def _table_columns(
    table: Table, specs: tuple[MetricSpec, ...], rank: str, target: str, notes: bool
) -> None:
    """The columns of one protocol's table: ``vs best`` right after the ranked metric (the
    mark belongs to that number), the target's rounds and the notes last."""
    table.add_column("strategy", overflow="fold", min_width=10)
    table.add_column("seeds", justify="right")
    for spec in specs:
        table.add_column(spec.narrow_label, justify="right", overflow="fold")
        if spec.column == rank:
            table.add_column("vs best", overflow="fold")
    if target:
        table.add_column(target, justify="right", overflow="fold")
    if notes:  # narrower beside a target column, so the table still fits 80 columns
        table.add_column("notes", overflow="fold", style="yellow", min_width=8 if target else 12)


def _row_cells(
    row: pd.Series,
    specs: tuple[MetricSpec, ...],
    rank: str,
    target: bool,
    note: str,
    notes: bool,
) -> list[Text]:
    """One row's cells, in :func:`_table_columns`' order (all ``Text``: never markup)."""
    from cfl_bench.leaderboard.significance import comparison_mark
    from cfl_bench.leaderboard.targets import target_text

    cells = [Text(str(row["strategy"])), Text(str(row["n_seeds"]))]
    for spec in specs:
        cells.append(Text(terminal_cell(row, spec)))
        if spec.column == rank:
            cells.append(Text(comparison_mark(row, rank)))
    if target:
        cells.append(Text(target_text(row, rounds_only=True)))
    if notes:
        cells.append(Text(note))
    return cells


def summary_tables(
    board: pd.DataFrame, std: str = "sample", target: float | None = None
) -> list[Table]:
    """One table per protocol, one line per strategy, narrow enough for an 80-column
    terminal: the registry's ``terminal`` metrics — Acc_T as mean ± std, Fgt_T and bytes as
    means (BWT, FWT, MD_T, wall time and all deviations are in the CSV and HTML).
    Beside Acc_T, ``vs best`` marks the best row (▲) and the rows indistinguishable from it
    (≈), and the rounds to ``target`` follow when one was given.
    The caption names the std kind (``std``: sample or population), because "±" alone
    does not say whether it is ddof=1 or ddof=0, and the test behind the marks.
    The task-IL and notes columns appear only when some row has them."""
    from cfl_bench.core import metric_registry as registry
    from cfl_bench.leaderboard.aggregate import row_notes, std_kind

    legend = f"mean ± std over the finished seeds, std_kind = {std_kind(std)}; – = one seed"
    marker = registry.metric(registry.TASK_IL_MARKER).column
    rank = str(registry.metric(registry.RANK_BY).column)
    target_label = "" if target is None else f"to {target:g}%"
    tables = []
    for protocol_hash, rows in board.groupby("protocol_hash", sort=False):
        first = rows.iloc[0]
        task_il = bool(rows[f"{marker}_mean"].notna().any())
        shown = registry.metrics_for("class-il" if task_il else None, "terminal")
        specs = registry.display_order(shown)
        notes = [row_notes(row) for _, row in rows.iterrows()]
        lines = [str(first["protocol"]), legend, significance_legend(rows, rank)]
        if target_label:
            lines.append(
                f"{target_label}: rounds until the average accuracy over the tasks seen "
                f"reached {target:g}% (first evaluated round, mean over seeds)"
            )
        table = Table(
            title=Text(f"{first['stream']} · {first['scenario']} · protocol {protocol_hash}"),
            caption=Text("\n".join(lines)),
            box=box.SIMPLE_HEAD,
            caption_justify="left",
        )
        _table_columns(table, specs, rank, target_label, any(notes))
        for (_, row), note in zip(rows.iterrows(), notes, strict=True):
            table.add_row(*_row_cells(row, specs, rank, bool(target_label), note, any(notes)))
        tables.append(table)
    return tables


def problems_table(runs: pd.DataFrame) -> Table | None:
    """Runs that did not finish (None when all did).

    The run directory and the reason share one cell, the reason on its own line below the
    folder: at 80 columns a long folder name folds over several lines (it is never cut with
    "…"), and side by side with the reason the two would interleave line by line."""
    problems = runs[runs["status"] != "finished"]
    if problems.empty:
        return None
    table = Table(title="runs not finished (kept out of the means)", box=box.SIMPLE_HEAD)
    table.add_column("status")
    table.add_column("run directory / why", overflow="fold")
    for _, run in problems.iterrows():
        table.add_row(Text(str(run["status"])), Text(f"{run['path']}\n{run['message']}"))
    return table


def misses_table(outcomes: Sequence[Outcome]) -> Table:
    """The targets that were missed: where (line, row selectors), what was expected
    (target ± tolerance), what was found and why it misses. Cells fold rather than being
    cut, so a narrow terminal still shows every digit."""
    missed = [o for o in outcomes if not o.met]
    notes = any(o.target.note for o in missed)
    table = Table(title="missed targets", box=box.SIMPLE_HEAD)
    for name in ("line", "row", "metric", "expected", "value", "why", *(["note"] if notes else [])):
        table.add_column(name, overflow="fold")
    for o in missed:
        t = o.target
        table.add_row(
            Text(str(t.line)),
            Text(t.describe()),
            Text(t.metric),
            Text(f"{t.target:g} ± {t.tolerance:g}"),
            Text("–" if o.value is None else f"{o.value:.6g}"),
            Text(o.reason),
            *([Text(t.note)] if notes else []),
        )
    return table


def default_out(run_dirs: Sequence[str]) -> str:
    """Where the leaderboard goes without ``--out``: ``<first RUN_DIR>/leaderboard``.

    Why the first argument: it is usually the folder of a sweep or of several runs, and the
    board then sits beside the runs it summarizes (as a sweep's own leaderboard does). A
    run directory itself is refused, as an ``--out`` inside one would be; an argument that
    is no folder gets the sentence ``RUN_DIRS`` problems always get.
    """
    from cfl_bench.leaderboard.runs import CONFIG, SUMMARY, find_run_dirs

    if not run_dirs or not os.path.isdir(run_dirs[0]):
        find_run_dirs(run_dirs[:1])  # refuses: no arguments, or one that is not a folder
    first = Path(run_dirs[0])
    for name in (CONFIG, SUMMARY):
        if os.path.lexists(first / name):
            raise UserError(
                f"'{first}' is a cfl-bench run directory (it holds {name}), and the "
                f"leaderboard would mix into that run's files; pass --out with a folder "
                f"outside the run directories."
            )
    return str(first / "leaderboard")


def leaderboard_command(
    run_dirs: Sequence[str],
    out: str | None,
    check: str | None,
    console: Console | None = None,
    std: str = "sample",
    target: float | None = None,
) -> int:
    """Build the leaderboard, print it, run ``--check``; returns the exit code (0 or 1).

    ``std`` (``--std``) is ``sample`` (ddof=1, default) or ``population`` (ddof=0). It and
    the targets file are checked first, so a bad value or a malformed file is refused
    (exit 2) before any work. ``--check`` compares ``*_std`` targets with the std kind
    chosen here. ``out`` None means :func:`default_out`. ``target`` (``--target``, an
    accuracy in %) adds rounds and bytes to reach it; outside (0, 100] it is refused.
    """
    from cfl_bench.leaderboard.aggregate import std_ddof
    from cfl_bench.leaderboard.build import build_leaderboard
    from cfl_bench.leaderboard.check import check_targets, read_targets
    from cfl_bench.leaderboard.targets import check_target

    console = console or Console()
    std_ddof(std)
    check_target(target)
    targets = read_targets(check) if check is not None else None  # "" is refused there
    where = default_out(run_dirs) if out is None else out
    result = build_leaderboard(run_dirs, where, std, target)
    for table in summary_tables(result.board, std, target):
        console.print(table)
    if target is not None and target <= 1.0:
        console.print(
            Text(f"note: --target {target:g} means {target:g} %; accuracies are percentages")
        )
    if not len(result.board):
        console.print("[yellow]no run could be placed in a leaderboard row[/]")
    problems = problems_table(result.runs)
    if problems is not None:
        console.print(problems)
    console.print(Text(f"leaderboard written to {result.csv_path} and {result.html_path}"))
    if targets is None:
        return 0
    outcomes = check_targets(result.board, targets)
    missed = sum(not o.met for o in outcomes)
    if missed:
        console.print(misses_table(outcomes))
        console.print(
            f"[bold red]check failed:[/] {missed} of {len(outcomes)} targets missed "
            f"({escape(str(check))})",
            highlight=False,
        )
        return 1
    console.print(f"[green]check passed:[/] all {len(outcomes)} targets met", highlight=False)
    return 0
