"""Find run directories and load each into one flat row (a pandas DataFrame of runs).

Why a separate loading step: every later stage (means, plots, checks) must see exactly the
same runs with exactly the same status, and a malformed file must stop everything with one
line naming the file and the fix (docs/architecture.md, "Errors and data safety") instead of
turning into a NaN that quietly drops out of a mean.

A *run directory* is any folder holding ``config.json`` or ``summary.json``. RUN_DIRS
arguments may be run directories themselves or folders holding them at any depth. Status:

* ``finished`` / ``diverged`` / ``failed`` — read from ``summary.json`` (written last by
  ``cfl-bench run``; a sweep writes ``failed`` with a ``message`` for runs that crashed);
* ``incomplete`` — ``config.json`` without ``summary.json`` (still running or killed), or a
  ``summary.json`` whose config hash is not the one of the directory's ``config.json``;
* ``duplicate`` — a second directory with the same (protocol hash, strategy, seed) as an
  earlier one in path order; it is reported and kept out of the means, because counting one
  seed twice would shrink the standard deviation for nothing;
* ``damaged`` — a ``config.json``, ``summary.json`` or ``records.csv`` that cfl-bench cannot
  have written (garbage, a NaN where no divergence put it, a finished run's last line cut in
  half, a metric outside its possible range, ...): :mod:`cfl_bench.core.run_reader`, the reader
  that ``report``, sweeps and ``clients`` use too, decides it and gives the reason; the
  message names the file and the problem.

Why damaged runs are listed rather than refused: one corrupted directory among hundreds
must not take the whole board down, and it must not be averaged either (its numbers are
exactly what cannot be trusted). So it is treated like a failed run: listed with its reason
in the table of runs not finished (one line per run, naming it and why), counted per
leaderboard row (``n_damaged``) when the intact parts of its files say which row it belongs
to, and never in a mean. ``cfl-bench report`` refuses the same runs with the same reason. A
damaged run never takes part in duplicate detection, since its identity may come from the
damaged file.

Only ``finished`` runs enter means (see :mod:`leaderboard.aggregate`). Forgetting values are
re-derived from the stored accuracy matrices (see :mod:`cfl_bench.core.run_reader`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cfl_bench.core.errors import UserError
from cfl_bench.core.run_dir import os_problem

# The reader's names, kept importable from here (the leaderboard's modules and tests use
# them): the columns of a run row, and how a record is read and checked.
from cfl_bench.core.run_reader import (  # noqa: F401
    CONFIG,
    CURVES,
    DAMAGED,
    INCOMPLETE_MESSAGE,
    MATRICES,
    METRICS,
    RANGES,
    RUN_COLUMNS,
    RUN_MARKERS,
    SUMMARY,
    SUMMARY_STATUSES,
    DamagedRunError,
    _blank_row,
    _identity,
    parse_run,
    read_record,
    read_run,
)
from cfl_bench.core.text_values import utf8_text

if TYPE_CHECKING:
    import pandas as pd

#: Every status a loaded run can have.
STATUSES: tuple[str, ...] = (*SUMMARY_STATUSES, "incomplete", "duplicate", DAMAGED)
#: Statuses counted per leaderboard row (``n_<status>``) and never averaged.
COUNTED_STATUSES: tuple[str, ...] = ("diverged", "failed", "incomplete", DAMAGED)

#: The fix named after every damage reason.
DAMAGED_FIX = "re-run that run or remove its directory"


def find_run_dirs(arguments: Sequence[str | Path]) -> list[tuple[Path, str]]:
    """Every run directory under the arguments, as (real path, path to show), sorted.

    The shown path is the argument as typed joined with the path below it, so the report
    does not depend on where the checkout lives. A directory reached twice (an argument and
    its parent both given) is kept once. Hidden folders (``.git``, ``.cache``) are skipped.
    A ``config.json`` or ``summary.json`` that is a folder (or anything but a file), or a
    ``.replaced/`` folder of an --overwrite stopped in its swap, still marks a run
    directory (``run_reader.RUN_MARKERS``): that run is then listed as damaged instead of
    vanishing. A
    folder that cannot be listed stops everything, because the runs in it would silently be
    missing from the board.
    """
    if not arguments:
        raise UserError("no RUN_DIRS given; pass run directories or folders that hold them.")
    found: dict[Path, str] = {}
    for argument in arguments:
        root = _run_dirs_argument(argument)
        for here, dirs, files in os.walk(root, onerror=_unlistable):
            if RUN_MARKERS & ({*files} | {*dirs}):
                real = Path(here).resolve()
                shown = utf8_text(Path(here).as_posix())  # a folder name need not be UTF-8
                found.setdefault(real, shown)
            dirs[:] = sorted(
                d for d in dirs if not d.startswith(".") and d not in (CONFIG, SUMMARY)
            )
    if not found:
        shown_args = ", ".join(f"'{a}'" for a in arguments)
        raise UserError(
            f"no run directories (folders with config.json or summary.json) under {shown_args}; "
            f"pass the --out folders of `cfl-bench run` or a folder holding them."
        )
    return sorted(((real, shown) for real, shown in found.items()), key=lambda p: p[1])


def _run_dirs_argument(argument: str | Path) -> Path:
    """One RUN_DIRS argument as a folder to search, or a UserError saying what it is."""
    if str(argument) == "":
        raise UserError(
            "a RUN_DIRS argument is empty; pass run directories or folders holding them."
        )
    root = Path(argument)
    try:
        if root.is_dir():
            return root
        present, link = os.path.lexists(root), root.is_symlink()
    except OSError as exc:  # a name too long, a folder on the way that cannot be entered
        raise UserError(
            f"RUN_DIRS '{argument}' cannot be read ({os_problem(exc)}); pass run directories "
            f"or folders holding them."
        ) from None
    if not present:
        raise UserError(
            f"RUN_DIRS '{argument}' does not exist; pass run directories or folders holding them."
        )
    if link and not root.exists():
        raise UserError(f"RUN_DIRS '{argument}' is a broken link; fix it or leave it out.")
    if root.name in (CONFIG, SUMMARY):
        raise UserError(
            f"RUN_DIRS '{argument}' is a file; pass the run directory that holds it, "
            f"'{root.parent.as_posix()}'."
        )
    raise UserError(
        f"RUN_DIRS '{argument}' is a file, not a folder; pass run directories or folders "
        f"holding them."
    )


def _unlistable(exc: OSError) -> None:
    """``os.walk``'s error hook: a folder that cannot be listed is refused (by default the
    walk would skip it silently, dropping its runs from the board)."""
    where = exc.filename if exc.filename is not None else "a folder"
    raise UserError(
        f"cannot list '{where}' ({os_problem(exc)}); fix its permissions or leave it out of "
        f"RUN_DIRS."
    )


def _lenient_identity(config: dict[str, Any], summary: dict[str, Any] | None) -> dict[str, Any]:
    """What can still be trusted about a damaged run's identity: every field of
    :func:`_identity` that passes its check when read from the intact record(s) alone."""
    out: dict[str, Any] = {}
    for records in ((config, summary), (config, None), ({}, summary)):
        try:
            fields = _identity(*records)
        except DamagedRunError:
            continue
        for key, value in fields.items():
            if value not in (None, {}) and out.get(key) in (None, {}):
                out[key] = value
    return out


def damaged_row(
    shown: str, problems: Sequence[str], config: dict[str, Any], summary: dict[str, Any] | None
) -> dict[str, Any]:
    """The row of a damaged run: status ``damaged``, the reasons and the fix as message, no
    numbers, and whatever identity the intact parts of its records still give."""
    row = _blank_row(shown)
    row.update(_lenient_identity(config, summary))
    row["status"] = DAMAGED
    row["message"] = f"{'; '.join(problems)}; {DAMAGED_FIX}"
    return row


def load_run(real: Path, shown: str) -> dict[str, Any]:
    """One run directory → one row (a dict with the keys of :data:`RUN_COLUMNS`).

    Never raises for what is in the directory: a file that cfl-bench cannot have written
    makes the row ``damaged`` (see the module docstring), with every problem found named in
    its message — the same reading, and so the same verdict, as ``cfl-bench report``'s.
    A run the engine ended also gets its accuracy and bytes by round (``progress``, what
    ``--target`` reads: :mod:`leaderboard.targets`).
    """
    from cfl_bench.leaderboard.targets import PROGRESS, progress_of

    reading = read_run(real, shown)
    if reading.row is None:
        return damaged_row(shown, reading.problems, reading.config, reading.summary)
    row = dict(reading.row)
    row[PROGRESS] = progress_of(reading.records, row["num_tasks"]) if reading.done else None
    return row


def mark_duplicates(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mark every later run of an already-seen (protocol hash, strategy, seed) ``duplicate``.

    The first directory in path order wins, but a finished run beats an unfinished one, so a
    crashed attempt next to its successful re-run never hides the result. Damaged runs are
    left out: their identity may come from the damaged file, and their status must stay in
    view until the directory is repaired or removed.
    """
    rows = list(rows)
    rank = {"finished": 0, "diverged": 1, "failed": 2, "incomplete": 3}
    keep: dict[tuple[object, object, object], int] = {}
    for index, row in enumerate(rows):
        key = (row["protocol_hash"], row["strategy"], row["seed"])
        if None in key or row["status"] == DAMAGED:
            continue
        best = keep.get(key)
        if best is None or rank[row["status"]] < rank[rows[best]["status"]]:
            keep[key] = index
    for index, row in enumerate(rows):
        key = (row["protocol_hash"], row["strategy"], row["seed"])
        if None in key or row["status"] == DAMAGED or keep[key] == index:
            continue
        winner = rows[keep[key]]["path"]
        row["message"] = (
            f"same protocol, strategy and seed as {winner} (was {row['status']}); "
            f"kept out of the means"
        )
        row["status"] = "duplicate"
    return rows


def load_runs(arguments: Sequence[str | Path]) -> pd.DataFrame:
    """All run directories under ``arguments`` as a DataFrame with :data:`RUN_COLUMNS` and
    ``progress``, sorted by shown path (so every later step sees the runs in one fixed order)."""
    return load_found(find_run_dirs(arguments))


def load_found(found: Sequence[tuple[Path, str]]) -> pd.DataFrame:
    """The runs frame of the (real path, shown path) pairs of :func:`find_run_dirs` (kept
    apart so a caller can check other paths against the run directories first)."""
    import pandas as pd

    from cfl_bench.leaderboard.targets import PROGRESS

    rows = [load_run(real, shown) for real, shown in found]
    frame = pd.DataFrame(mark_duplicates(rows), columns=[*RUN_COLUMNS, PROGRESS])
    frame["seed"] = frame["seed"].astype("Int64")
    frame["num_tasks"] = frame["num_tasks"].astype("Int64")
    return frame
