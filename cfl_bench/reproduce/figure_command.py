"""``cfl-bench reproduce NAME`` for a figure (:mod:`cfl_bench.reproduce.figures`).

The same verbs as a table's (run a scale, ``--shipped``, ``--compare``, ``--ship``, ``--row``
and ``--seed`` to run part of it) through one sweep: seeds × rows at the scale's options.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from rich.console import Console

from cfl_bench.core.atomic import atomic_write_json, atomic_write_text
from cfl_bench.core.errors import UserError
from cfl_bench.reproduce import provenance, safety, shipping
from cfl_bench.reproduce.figure_report import build_figure, print_terminal, write
from cfl_bench.reproduce.figure_runs import FigureRuns, collect_figure
from cfl_bench.reproduce.figures import HEADLINES, ReproFigure
from cfl_bench.reproduce.selection import chosen, with_seeds
from cfl_bench.reproduce.tables import SCALES

if TYPE_CHECKING:
    from cfl_bench.reproduce.command import Request

REPORT_FOLDER = "reproduction"


def sweep_document(
    figure: ReproFigure, scale: str, out: Path, options: dict[str, Any], jobs: int
) -> dict[str, Any]:
    """Seeds (slowest, so an early stop leaves whole seeds) × the rows' strategies."""
    grid = {
        "seed": list(figure.scales[scale].seeds),
        "strategy": [figure.strategy_at(row, scale) for row in figure.rows],
    }
    return {
        "out": str(out),
        "jobs": jobs,
        "base": {**figure.base_options(scale), **options},
        "grid": grid,
    }


def select_figure(figure: ReproFigure, scale: str, request: Request) -> ReproFigure:
    """The figure cut to the rows and seeds the request names (a figure has no columns)."""
    if request.columns:
        raise UserError(f"{figure.name} is a figure and has no columns; leave out --column.")
    return replace(
        figure,
        rows=chosen(figure.rows, request.rows, "--row", figure.name),
        scales=with_seeds(figure.scales, scale, request.seeds, figure.name),
    )


def report_figure(
    figure: ReproFigure,
    folder: Path,
    scale: str,
    report_dir: Path,
    source: str,
    console: Console,
    reference: FigureRuns | None = None,
) -> Path:
    """Judge the runs under ``folder`` and write the report; returns the HTML path."""
    runs = collect_figure(figure, folder, scale)
    facts = provenance.describe(runs.collected, folder)
    rep = build_figure(figure, runs, scale, source, reference, facts)
    paths = write(rep, report_dir)
    print_terminal(rep, console)
    console.print(f"report: {paths['html']} (and report.csv, report.md)", highlight=False)
    return paths["html"]


def reproduce_figure(figure: ReproFigure, request: Request, console: Console, root: Path) -> int:
    """Run, report on, compare or ship ``figure`` as ``request`` asks; the exit code."""
    scale = request.scale or ("cpu" if request.shipped or request.compare else None)
    if scale is None:
        raise UserError(f"name a scale: --scale {'|'.join(SCALES)}.")
    shipped_folder = shipping.shipped_folder(root, figure.name, scale)
    if request.shipped:
        if not shipped_folder.is_dir():
            raise UserError(
                f"no shipped results of {figure.name} at scale {scale}; shipped scales: "
                f"{', '.join(shipping.shipped_scales(root, figure.name)) or 'none'}."
            )
        out = Path(request.out or Path("runs") / "reproduce" / figure.name / f"shipped-{scale}")
        safety.check_folder(out, "the report", "--out" if request.out else None)
        source = f"the shipped results ({scale} in reproductions/results/{figure.name})"
        report_figure(figure, shipped_folder, scale, out, source, console)
        return 0
    reference = collect_figure(figure, shipped_folder, scale) if shipped_folder.is_dir() else None
    if request.compare:
        folder = Path(request.compare)
        if not folder.is_dir():
            raise UserError(f"--compare '{request.compare}' is not a folder; give your runs'.")
        out = Path(request.out) if request.out else folder / REPORT_FOLDER / figure.name
        safety.check_compare_report(folder, request.out, out)
        report_figure(figure, folder, scale, out, f"your runs in {folder}", console, reference)
        return 0
    return _run(figure, scale, request, console, root, reference)


def _run(
    figure: ReproFigure,
    scale: str,
    request: Request,
    console: Console,
    root: Path,
    reference: FigureRuns | None,
) -> int:
    from cfl_bench.sweeps.command import sweep

    folder = Path(request.out or Path("runs") / "reproduce" / figure.name / scale)
    safety.check_folder(folder, "the reproduction's runs and report", _named(request))
    selection = select_figure(figure, scale, request)
    document = sweep_document(selection, scale, folder, request.run_options(), request.jobs)
    todo = safety.pending(safety.sweep_points([document], folder), folder)
    if folder.is_dir():  # refuses two runs of one row and seed already there, or to come
        existing = collect_figure(figure, folder, scale).collected
        safety.refuse_second_copies(figure_cells(selection, scale), folder, todo, existing)
    safety.preflight(figure.name, todo)
    path = folder / ".reproduce" / "sweep.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, yaml.safe_dump(document, sort_keys=False))
    started = time.monotonic()
    code = sweep(str(path), [], console=console, leaderboard=False)
    console.print(f"sweep: {time.monotonic() - started:.0f} s", highlight=False)
    report_dir = folder / REPORT_FOLDER / figure.name
    source = f"the runs in {folder}"
    report_figure(figure, folder, scale, report_dir, source, console, reference)
    runs = collect_figure(figure, folder, scale)
    atomic_write_json(report_dir / "provenance.json", provenance.describe(runs.collected, folder))
    if request.ship:
        if code:
            raise UserError("some runs did not finish; rerun the same command before --ship.")
        target = ship_figure(figure, selection, runs, folder, scale, root)
        console.print(f"shipped {target}", highlight=False)
    return code


def ship_figure(
    figure: ReproFigure,
    selection: ReproFigure,
    runs: FigureRuns,
    folder: Path,
    scale: str,
    root: Path,
) -> Path:
    """Merge the runs of the selected rows and seeds into the shipped results, keeping every
    other shipped run (:mod:`cfl_bench.reproduce.shipping`)."""
    rows = {row.label for row in selection.rows}
    seeds = set(selection.scales[scale].seeds)
    mine = shipping.only(runs.collected, lambda cell, seed: cell[0] in rows and seed in seeds)
    shipping.committed_runs(mine.runs())
    target = shipping.shipped_folder(root, figure.name, scale)
    shipped = collect_figure(figure, target, scale).collected if target.is_dir() else None
    return shipping.ship_collected(
        figure.name, mine, folder, scale, root, figure.runs(scale), shipped
    )


def figure_cells(figure: ReproFigure, scale: str) -> safety.CellsOf:
    """The cells (row, headline) a sweep point of ``scale`` fills."""

    def cells(request: dict[str, Any]) -> list[tuple[str, str]]:
        rows = [r for r in figure.rows if figure.strategy_at(r, scale) == request["strategy"]]
        return [(r.label, headline) for r in rows for headline in HEADLINES]

    return cells


def _named(request: Request) -> str | None:
    return "--out" if request.out else None


def _work(figure: ReproFigure, scale: str) -> float:
    """Relative training work of a scale: runs × rounds × clients."""
    options = figure.base_options(scale)
    rounds = int(options["rounds_per_task"]) * 2 + int(options.get("lead_rounds", 0))
    return figure.runs(scale) * rounds * int(options.get("clients", 1))


def figure_cost_text(figure: ReproFigure, scale: str, root: Path) -> str:
    """Measured where shipped or in the figure file (``measured_s``), else estimated from a
    shipped scale by the work ratio."""
    own = provenance.table_measured(
        figure.scales, scale, provenance.shipped_provenance(root, figure.name, scale)
    )
    if own:
        return own
    for other in (scale, *(s for s in SCALES if s != scale)):
        facts = provenance.shipped_provenance(root, figure.name, other)
        if not facts or not facts.get("elapsed_s"):
            continue
        seconds = facts["elapsed_s"] * _work(figure, scale) / _work(figure, other)
        if other == scale:
            return f"{provenance._hours(seconds)} measured (jobs {facts.get('jobs')})"
        return f"~{provenance._hours(seconds)} estimated from {other}"
    return "not measured"
