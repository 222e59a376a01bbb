"""What ``cfl-bench reproduce`` refuses before it writes or runs anything.

Why a module of its own: the table and the figure routes share every check, and each check
must come before the first byte is written (the ``.reproduce/`` sweep files, a report
folder) or the first point starts, because a refusal afterwards leaves a half-written folder
or costs an hour of runs that fail point by point.

* **Output folders.** A report or run folder that is a file, cannot be created (a read-only
  working folder), or is a cfl-bench run directory or lies inside one is refused in one
  line, as ``sweep``, ``pilot`` and ``leaderboard`` refuse it: only ``cfl-bench run`` writes
  into a run directory (its files are that run's record).
* **A second copy of a cell and seed.** A sweep names a point by every option it was given,
  so rerunning part of a table with another ``--executor``, ``--device`` or ``--data-root``
  into the same folder would start a second run of a cell and seed that is already
  finished; :func:`cfl_bench.reproduce.collect.refuse_duplicates` would then refuse the
  report, after the runs. It is refused here, before any point runs, naming the finished run
  and the options that differ.
* **What every point would refuse at its start.** ``cfl-bench run`` refuses ``--device cuda``
  without a GPU, a ``--data-root`` that does not exist and an executor that cannot run the
  strategy or model before it writes anything (``cfl_bench.runner.plan.plan_run``). A sweep meets
  these only inside each point, so the reproduction failed point by point (exit 1, folders
  written). Here ``plan_run`` is called on one point of every distinct configuration still
  to run (the seed changes only the data split), before anything is written.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
from collections.abc import Callable, Iterable, Iterator
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from cfl_bench.core.atomic import path_kind
from cfl_bench.core.errors import UserError
from cfl_bench.core.run_dir import is_run_directory, os_problem
from cfl_bench.reproduce.collect import Collected
from cfl_bench.reproduce.tables import ReproTable
from cfl_bench.runner.config import RunConfig, check_value
from cfl_bench.runner.run_names import SWEEP_OWNED
from cfl_bench.sweeps import ledger
from cfl_bench.sweeps.grid import GridPoint, SweepSpec, expand

# The cells (row, column) a sweep point's request fills.
CellsOf = Callable[[dict[str, Any]], list[tuple[str, str]]]
# Options of a run that do not tell one cell and seed from another run of it.
NOT_COMPARED = frozenset({*SWEEP_OWNED, "threads"})


@contextlib.contextmanager
def file_errors() -> Iterator[None]:
    """Turn an OS error while writing a report, the sweep files or shipped results (a
    read-only working folder even root cannot write, a full disk) into one line; the checks
    above catch what they can foresee, this what only the write itself learns."""
    try:
        yield
    except OSError as exc:
        if exc.errno == errno.EPIPE:
            raise  # the terminal's output closed (`| head`): not a folder's fault
        where = f" '{exc.filename}'" if exc.filename else ""
        raise UserError(
            f"cfl-bench reproduce could not write{where} ({os_problem(exc)}); choose a folder "
            f"you can write to (--out FOLDER) and rerun the same command."
        ) from None


def enclosing_run(path: Path) -> Path | None:
    """The cfl-bench run directory ``path`` is or lies inside, None when none."""
    target = path.absolute()
    for folder in (target, *target.parents):
        if is_run_directory(folder):
            return folder
    return None


def check_folder(path: Path, what: str, option: str | None) -> None:
    """Refuse ``path`` as the folder ``what`` is written to (``option``: the option that
    named it, None for a default folder) when it is not a folder, cannot be created or
    written, or is a run directory or lies inside one."""
    named = f"{option} '{path}'" if option else f"the default folder '{path}' for {what}"
    fix = "choose another folder" if option else "pass --out FOLDER"
    if path.exists() and not path.is_dir():
        raise UserError(f"{named} is {path_kind(path)}, not a folder; {fix}.")
    run = enclosing_run(path)
    if run is not None:
        where = "is" if run == path.absolute() else f"is inside '{run}', which is"
        raise UserError(
            f"{named} {where} a cfl-bench run directory, and {what} would mix into that run's "
            f"files; {fix} outside it."
        )
    _check_writable(path, named, fix)


def _check_writable(path: Path, named: str, fix: str) -> None:
    """The nearest existing folder of ``path`` must let this user create entries in it."""
    ancestor = path
    try:
        while not ancestor.exists():
            if ancestor.is_symlink():
                raise UserError(f"{named} goes through a broken link '{ancestor}'; {fix}.")
            ancestor = ancestor.parent
    except OSError as exc:  # e.g. a name longer than the file system allows
        raise UserError(f"{named} cannot be used ({os_problem(exc)}); {fix}.") from None
    if not ancestor.is_dir():
        raise UserError(f"{named} is below '{ancestor}', which is {path_kind(ancestor)}; {fix}.")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        where = "is" if ancestor == path else f"cannot be created: '{ancestor}' is"
        raise UserError(f"{named} {where} not writable; {fix}.")


def check_compare_report(folder: Path, out: str | None, report_dir: Path) -> None:
    """``--compare RUNS`` writes its report into ``RUNS/reproduction/NAME`` unless ``--out``
    names another folder: a run directory given as RUNS (or a folder inside one) is read,
    never written."""
    run = enclosing_run(folder) if out is None else None
    if run is not None:
        where = "is" if run == folder.absolute() else f"is inside '{run}', which is"
        raise UserError(
            f"--compare '{folder}' {where} a cfl-bench run directory, and the comparison "
            f"report (written into the --compare folder without --out) would mix into that "
            f"run's files; pass --out FOLDER for the report."
        )
    check_folder(report_dir, "the comparison report", "--out" if out else None)


def sweep_points(documents: Iterable[dict[str, Any]], out: Path) -> list[GridPoint]:
    """The points the sweep ``documents`` (``sweep_documents``) run, with the names their
    folders get under ``out``, read the way ``cfl-bench sweep`` reads a sweep file."""
    points: list[GridPoint] = []
    for document in documents:
        axes = {k: [check_value(k, v, "")] for k, v in document["base"].items()}
        axes.update({k: list(v) for k, v in document["grid"].items()})
        points += expand(SweepSpec(out, int(document["jobs"]), axes))
    return points


def pending(points: list[GridPoint], out: Path) -> list[GridPoint]:
    """The points whose folder under ``out`` does not hold their finished run yet."""
    return [p for p in points if not ledger.is_done(out / p.name, p.request_hash)]


def table_cells(table: ReproTable, scale: str) -> CellsOf:
    """The cells of ``table`` a sweep point of ``scale`` fills: its strategy's rows × the
    columns whose options it has."""

    def cells(request: dict[str, Any]) -> list[tuple[str, str]]:
        rows = [r for r in table.rows if table.strategy_at(r, scale) == request["strategy"]]
        columns = [
            c for c in table.columns if all(request.get(k) == v for k, v in c.options.items())
        ]
        return [(r.label, c.label) for r in rows for c in columns]

    return cells


def refuse_second_copies(
    cells_of: CellsOf, out: Path, todo: list[GridPoint], existing: Collected
) -> None:
    """Refuse a point still to run whose cell and seed already has a finished run in another
    folder of ``out`` (``existing``: the folder's runs, collected; ``cells_of``: the cells a
    point's request fills): it would be counted twice. Names that run and the options the
    two differ in."""
    for point in todo:
        seed = int(point.request["seed"])
        for row, column in cells_of(point.request):
            for value in existing.values(row, column):
                if value.seed != seed or value.path == out / point.name:
                    continue
                raise UserError(
                    f"'{value.path}' is a finished run of {row} × {column}, seed {seed}, made "
                    f"with other options ({_differences(value.path, point.request)}); running "
                    f"it again into '{point.name}' would count seed {seed} twice. Rerun with "
                    f"the options it was made with, or give another --out."
                )


def _differences(run: Path, request: dict[str, Any]) -> str:
    """The options the finished run at ``run`` and ``request`` differ in, in words."""
    try:
        made = json.loads((run / "config.json").read_text(encoding="utf-8"))["config"]
    except (OSError, ValueError, KeyError, TypeError):
        return "its config.json cannot be read"
    wanted = {**RunConfig().to_dict(), **request}
    shown = [
        f"{key} {made.get(key)!r} there, {value!r} now"
        for key, value in wanted.items()
        if key not in NOT_COMPARED and key in made and value is not None and made[key] != value
    ]
    return "; ".join(shown[:3]) or "the same options, another folder name"


def preflight(name: str, todo: list[GridPoint]) -> None:
    """Plan one point of every distinct configuration still to run (the seed changes only
    the split), as ``cfl-bench run`` plans its run before writing anything; the first
    refusal is raised with the point's name.

    In a child of the sweep's fork server, as the sweep checks names: the engine and the
    data load there (torch already imported, and the same server then starts the runs),
    and a GPU's context and tensors die with the child instead of staying in this process
    for the whole reproduction."""
    if not todo:
        return
    from cfl_bench.sweeps.launcher import Launcher

    distinct: dict[str, GridPoint] = {}
    for point in todo:
        key = json.dumps({k: v for k, v in point.request.items() if k != "seed"}, default=str)
        distinct.setdefault(key, point)
    context = Launcher().context
    receiver, sender = context.Pipe(duplex=False)
    requests = [(p.name, p.request) for p in distinct.values()]
    process = context.Process(target=plan_points, args=(requests, sender))
    process.start()
    sender.close()
    try:
        answer: tuple[str, str] | None = receiver.recv()
    except EOFError:
        raise UserError(
            f"checking the runs of {name} before starting them failed (the checking process "
            f"ended with exit code {process.exitcode}); see the lines above."
        ) from None
    finally:
        receiver.close()
        process.join()
    if answer is not None:
        raise UserError(f"{name} cannot run {answer[0]}: {answer[1]}")


def plan_points(requests: list[tuple[str, dict[str, Any]]], conn: Connection) -> None:
    """Child entry point: ``plan_run`` each request; sends (name, refusal) of the first
    refused one, or None."""
    from cfl_bench.runner.plan import plan_run
    from cfl_bench.sweeps.worker import die_with_sweep

    die_with_sweep()
    with contextlib.closing(conn):
        for point_name, request in requests:
            try:
                plan_run(RunConfig(**request))
            except UserError as exc:
                conn.send((point_name, str(exc)))
                return
        conn.send(None)
