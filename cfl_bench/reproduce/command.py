"""``cfl-bench reproduce``: list the reproducible tables, run one, or report on runs.

* ``reproduce list`` — every table with its cells, runs and cost at each scale.
* ``reproduce NAME --scale S --data-root D [--jobs N] [--device cuda]`` — the table's runs
  as sweeps (one per distinct column option set; finished runs are skipped, interrupted ones
  resume), then the report in ``<out>/reproduction/``. ``--row``, ``--column`` and
  ``--seed`` run part of the table (the report still lists every cell).
* ``reproduce NAME --shipped`` — the report of the results shipped in the repository.
* ``reproduce NAME --compare RUNS`` — your runs judged against the paper, beside ours.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.table import Table

from cfl_bench.core.atomic import atomic_write_json, atomic_write_text
from cfl_bench.core.errors import UserError
from cfl_bench.reproduce import provenance, safety, shipping
from cfl_bench.reproduce.collect import Collected, collect
from cfl_bench.reproduce.figure_command import figure_cost_text, reproduce_figure
from cfl_bench.reproduce.figures import figure_names, find_figure, load_all_figures
from cfl_bench.reproduce.outcome import build
from cfl_bench.reproduce.report import print_terminal, write
from cfl_bench.reproduce.selection import chosen, with_seeds
from cfl_bench.reproduce.tables import SCALES, ReproTable, find_table, load_all

REPORT_FOLDER = "reproduction"


def reproductions_root() -> Path:
    """The repository's ``reproductions/`` folder (tables, targets, shipped results)."""
    return Path(__file__).resolve().parents[2] / "reproductions"


def list_tables(console: Console, root: Path) -> None:
    """``reproduce list``: every table, and per scale its runs and cost."""
    table = Table(title="Reproducible tables (cfl-bench reproduce NAME --scale SCALE)")
    for name in ("table", "scale", "runs", "cost"):
        table.add_column(name, overflow="fold")
    entries: list[tuple[str, Any, Any]] = []
    for repro in load_all(root):
        cells = len(repro.rows) * len(repro.columns)
        about = f"{repro.name}\n{repro.paper} · {repro.table} · {cells} cells"
        if repro.runs_name != repro.name:
            about += f"\n(the runs of {repro.runs_name})"
        entries.append((about, repro, provenance.cost_text))
    for figure in load_all_figures(root):
        claims = len(figure.claims.drops) * (1 + len(figure.claims.holds))
        about = f"{figure.name}\n{figure.paper} · {figure.figure} · {claims} claims (a figure)"
        entries.append((about, figure, figure_cost_text))
    for about, item, cost in entries:
        for index, scale in enumerate(SCALES):
            seeds = len(item.scales[scale].seeds)
            plural = "seed" if seeds == 1 else "seeds"
            table.add_row(
                about if index == 0 else "",
                scale,
                f"{item.runs(scale)} ({seeds} {plural})",
                cost(item, scale, root),
                end_section=index == len(SCALES) - 1,
            )
    console.print(table)
    console.print(
        "Costs are measured where results are shipped (reproductions/results/<name>/<scale>/"
        "provenance.json) and otherwise estimated from them by the local steps.",
        highlight=False,
    )


def sweep_documents(
    repro: ReproTable, scale: str, out: Path, options: dict[str, Any], jobs: int
) -> list[dict[str, Any]]:
    """One sweep per column option set: base = protocol + scale + ``options`` (data root,
    device, executor), grid = seeds × the column's options × strategies, seeds slowest so
    that an early stop leaves whole seeds."""
    documents = []
    for group in repro.column_groups():
        grid: dict[str, Any] = {"seed": list(repro.scales[scale].seeds)}
        grid.update({key: [value] for key, value in group.items()})
        grid["strategy"] = [repro.strategy_at(row, scale) for row in repro.rows]
        documents.append(
            {
                "out": str(out),
                "jobs": jobs,
                "base": {**repro.base_options(scale), **options},
                "grid": grid,
            }
        )
    return documents


def run_table(documents: list[dict[str, Any]], out: Path, console: Console) -> int:
    """Run (or resume) every sweep of the table (``sweep_documents``); the worst exit code."""
    from cfl_bench.sweeps.command import sweep

    code = 0
    for index, document in enumerate(documents):
        path = out / ".reproduce" / f"sweep-{_group_tag(document['grid'])}.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, yaml.safe_dump(document, sort_keys=False))
        started = time.monotonic()
        code = max(code, sweep(str(path), [], console=console, leaderboard=False))
        console.print(f"sweep {index + 1}: {time.monotonic() - started:.0f} s", highlight=False)
    return code


def _group_tag(grid: dict[str, Any]) -> str:
    """8 hex digits naming a sweep by its column options (not its place in the table), so
    running one column of a table never overwrites another column's sweep file."""
    options = {k: v for k, v in grid.items() if k not in ("seed", "strategy")}
    text = json.dumps(options, sort_keys=True, default=str)
    return hashlib.blake2b(text.encode("utf-8"), digest_size=4).hexdigest()


def report_runs(
    repro: ReproTable,
    folder: Path,
    scale: str | None,
    report_dir: Path,
    source: str,
    console: Console,
    root: Path,
    compare_shipped: bool,
) -> Path:
    """Judge the runs under ``folder`` and write the report; returns the HTML path."""
    collected = collect(repro, folder, scale)
    scale = scale or _only_scale(collected, folder)
    reference: Collected | None = None
    shipped_folder = shipping.shipped_folder(root, repro.runs_name, scale)
    if compare_shipped and shipped_folder.is_dir():
        reference = collect(repro, shipped_folder, scale)
    facts = provenance.describe(collected, folder)
    rep = build(repro, collected, scale, source, reference, facts)
    paths = write(rep, report_dir)
    print_terminal(rep, console)
    console.print(f"report: {paths['html']} (and report.csv, report.md)", highlight=False)
    return paths["html"]


def _only_scale(collected: Collected, folder: Path) -> str:
    scales = collected.scales()
    if len(scales) != 1:
        found = ", ".join(scales) if scales else "none"
        raise UserError(
            f"the runs in '{folder}' are at scales: {found}; name one with --scale "
            f"({', '.join(SCALES)})."
        )
    return scales[0]


@dataclass(frozen=True)
class Request:
    """What ``cfl-bench reproduce NAME …`` asks for (the command line's options)."""

    name: str
    scale: str | None = None
    data_root: str | None = None
    jobs: int = 1
    device: str | None = None
    executor: str | None = None
    out: str | None = None
    compare: str | None = None
    shipped: bool = False
    ship: bool = False
    # Run only these rows / columns (labels) / seeds of the scale; empty: all of them.
    rows: tuple[str, ...] = ()
    columns: tuple[str, ...] = ()
    seeds: tuple[int, ...] = ()

    def selects(self) -> bool:
        return bool(self.rows or self.columns or self.seeds)

    def run_only_flags(self) -> list[str]:
        """The options given that only act on runs this command starts (or ships): they have
        no effect with --compare or --shipped, which start none."""
        given = (
            ("--data-root", self.data_root),
            ("--device", self.device),
            ("--executor", self.executor),
            ("--jobs", self.jobs != 1),
            ("--ship", self.ship),
        )
        return [flag for flag, value in given if value]

    def run_options(self) -> dict[str, Any]:
        """The options every run gets from the command line: where data is, what runs it."""
        given = (
            ("data_root", self.data_root),
            ("device", self.device),
            ("executor", self.executor),
        )
        return {key: value for key, value in given if value}


def checkout_commit() -> str | None:
    """The commit of the checkout this cfl-bench runs from (``-dirty`` with uncommitted
    changes): what the runs it starts will record."""
    from cfl_bench.runner.provenance import git_commit

    return git_commit()


def reproduce(
    request: Request,
    console: Console | None = None,
    root: Path | None = None,
    commit: Callable[[], str | None] = checkout_commit,
) -> int:
    """The ``reproduce`` command; returns the exit code. ``commit`` tells the checkout's
    commit (a test passes a clean or a dirty one); only ``--ship`` asks for it."""
    console = console or Console()
    root = root or reproductions_root()
    if not root.is_dir():
        raise UserError(
            f"no '{root}' folder: `cfl-bench reproduce` reads its tables from a clone of the "
            "cfl-bench repository; install it from a clone (pip install -e .)."
        )
    if request.name == "list":
        list_tables(console, root)
        return 0
    scale = request.scale
    if scale is not None and scale not in SCALES:
        raise UserError(f"--scale {scale} is not one of {', '.join(SCALES)}.")
    if request.compare and request.shipped:
        raise UserError("give at most one of --compare and --shipped.")
    if request.selects() and (request.compare or request.shipped):
        raise UserError(
            "--row, --column and --seed choose which runs to start; leave them out with "
            "--compare or --shipped (the report always shows every cell)."
        )
    unused = request.run_only_flags() if (request.compare or request.shipped) else []
    if unused:
        raise UserError(
            f"{', '.join(unused)} only act{'s' if len(unused) == 1 else ''} on the runs "
            f"reproduce starts, and "
            f"{'--compare' if request.compare else '--shipped'} starts none; leave "
            f"{'it' if len(unused) == 1 else 'them'} out."
        )
    if request.ship:  # before any run: its records would name a commit lacking its code
        shipping.require_committed(commit())
    with safety.file_errors():
        return _dispatch(request, console, root)


def _dispatch(request: Request, console: Console, root: Path) -> int:
    """A table's or a figure's run, report, comparison or shipping, as ``request`` asks."""
    scale = request.scale
    figure = find_figure(request.name, root)
    if figure is not None:
        return reproduce_figure(figure, request, console, root)
    repro = find_table(request.name, root, extra=figure_names(root))
    if request.shipped:
        return _report_shipped(repro, scale or "cpu", request.out, console, root)
    if request.compare:
        folder = _existing_folder(request.compare, "--compare")
        report_dir = Path(request.out) if request.out else folder / REPORT_FOLDER / repro.name
        safety.check_compare_report(folder, request.out, report_dir)
        report_runs(repro, folder, scale, report_dir, f"your runs in {folder}", console, root, True)
        return 0
    return _run_and_report(repro, request, console, root)


def _existing_folder(text: str, option: str) -> Path:
    folder = Path(text)
    if not folder.is_dir():
        raise UserError(f"{option} '{text}' is not a folder; give the folder of your runs.")
    return folder


def _report_shipped(
    repro: ReproTable, scale: str, out: str | None, console: Console, root: Path
) -> int:
    folder = shipping.shipped_folder(root, repro.runs_name, scale)
    if not folder.is_dir():
        have = shipping.shipped_scales(root, repro.runs_name)
        raise UserError(
            f"no shipped results of {repro.name} at scale {scale}; shipped scales: "
            f"{', '.join(have) or 'none'} (run it: cfl-bench reproduce {repro.name} --scale "
            f"{scale} --data-root DATA)."
        )
    report_dir = Path(out) if out else Path("runs") / "reproduce" / repro.name / f"shipped-{scale}"
    safety.check_folder(report_dir, "the report", "--out" if out else None)
    report_runs(
        repro,
        folder,
        scale,
        report_dir,
        f"the shipped results ({folder.name} in reproductions/results/{repro.runs_name})",
        console,
        root,
        False,
    )
    return 0


def _run_and_report(repro: ReproTable, request: Request, console: Console, root: Path) -> int:
    scale = request.scale
    if scale is None:
        raise UserError(
            f"name a scale: --scale {'|'.join(SCALES)} (see `cfl-bench reproduce list`)."
        )
    if request.ship and repro.runs_name != repro.name:  # before any run, not after
        raise UserError(f"{repro.name} reads the runs of {repro.runs_name}; ship that table.")
    folder = Path(request.out or Path("runs") / "reproduce" / repro.runs_name / scale)
    safety.check_folder(
        folder, "the reproduction's runs and report", "--out" if request.out else None
    )
    selection = select(repro, scale, request)
    documents = sweep_documents(selection, scale, folder, request.run_options(), request.jobs)
    check_before_running(repro, selection, scale, folder, documents)
    if request.ship and folder.is_dir():  # a finished run it would only skip, then ship
        _check_committed(repro, selection, scale, folder)
    code = run_table(documents, folder, console)
    report_dir = folder / REPORT_FOLDER / repro.name
    report_runs(repro, folder, scale, report_dir, f"the runs in {folder}", console, root, True)
    atomic_write_json(
        report_dir / "provenance.json", provenance.describe(collect(repro, folder, scale), folder)
    )
    if request.ship:
        if code:
            raise UserError("some runs did not finish; rerun the same command before --ship.")
        _check_committed(repro, selection, scale, folder)
        target = shipping.ship(repro, folder, scale, root, selection)
        console.print(f"shipped {target}", highlight=False)
    return code


def _check_committed(repro: ReproTable, selection: ReproTable, scale: str, folder: Path) -> None:
    """Refuse shipping a run of the selection made in a dirty tree (``shipping``)."""
    runs = shipping.selected(collect(repro, folder, scale), selection, scale).runs()
    shipping.committed_runs(runs)


def check_before_running(
    repro: ReproTable,
    selection: ReproTable,
    scale: str,
    folder: Path,
    documents: list[dict[str, Any]],
) -> None:
    """Everything refused before a byte is written or a point runs
    (:mod:`cfl_bench.reproduce.safety`): two runs of one cell and seed in the folder, a
    point that would become a second one, and what ``cfl-bench run`` would refuse."""
    todo = safety.pending(safety.sweep_points(documents, folder), folder)
    if folder.is_dir():
        existing = collect(repro, folder, scale)  # refuses two runs of one cell and seed
        safety.refuse_second_copies(safety.table_cells(selection, scale), folder, todo, existing)
    safety.preflight(repro.name, todo)


def select(repro: ReproTable, scale: str, request: Request) -> ReproTable:
    """The table cut to the rows, columns and seeds the request names, for running part of
    a table (a GPU's 15 minutes, one column at a time); the report still judges every cell,
    so what was not run shows as missing."""
    return replace(
        repro,
        rows=chosen(repro.rows, request.rows, "--row", repro.name),
        columns=chosen(repro.columns, request.columns, "--column", repro.name),
        scales=with_seeds(repro.scales, scale, request.seeds, repro.name),
    )
