"""Find run directories and load each into one flat row (a pandas DataFrame of runs).

Why a separate loading step: every later stage (means, plots, checks) must see exactly the
same runs with exactly the same status, and a malformed file must stop everything with one
line naming the file and the fix (DESIGN.md §7) instead of turning into a NaN that quietly
drops out of a mean.

A *run directory* is any folder holding ``config.json`` or ``summary.json``. RUN_DIRS
arguments may be run directories themselves or folders holding them at any depth. Status:

* ``finished`` / ``diverged`` / ``failed`` — read from ``summary.json`` (written last by
  ``cfl-bench run``; a sweep writes ``failed`` with a ``message`` for runs that crashed);
* ``incomplete`` — ``config.json`` without ``summary.json`` (still running or killed), or a
  ``summary.json`` whose config hash is not the one of the directory's ``config.json``;
* ``duplicate`` — a second directory with the same (protocol hash, strategy, seed) as an
  earlier one in path order; it is reported and kept out of the means, because counting one
  seed twice would shrink the standard deviation for nothing;
* ``damaged`` — a ``config.json`` or ``summary.json`` that cfl-bench cannot have written:
  unreadable, empty, not UTF-8, not JSON, not a JSON object, nested absurdly deep, a folder
  instead of a file, ``NaN`` / ``Infinity`` anywhere (cfl-bench writes ``null`` for a
  missing number, so such a token means the file was edited or corrupted), a metric of the
  wrong type or outside its possible range (an accuracy of 150 %), a ``num_tasks`` that is
  not a positive integer, curves or matrices whose size does not match ``num_tasks``, an
  unknown ``status``. The message names the file and the problem.

Why damaged runs are listed rather than refused: one corrupted directory among hundreds
must not take the whole board down, and it must not be averaged either (its numbers are
exactly what cannot be trusted). So it is treated like a failed run: listed with its reason,
counted per leaderboard row (``n_damaged``) when the intact parts of its files say which row
it belongs to, and never in a mean. A damaged run never takes part in duplicate detection,
since its identity may come from the damaged file.

Only ``finished`` runs enter means (see :mod:`leaderboard.aggregate`).

Forgetting (``Fgt_T``, ``Fgt_T_clipped``, their task-IL versions and the Fgt_t curves) is
re-derived from the accuracy matrices stored in ``summary.json`` with
:func:`cfl_bench.metrics.forgetting`, not copied. Why: summaries written before the
forgetting fix let ``a[i-1][i]`` (task i evaluated *before* it was trained, kept for FWT)
into the max, and a sweep never rewrites a finished run, so their stored values would stay
wrong forever. The matrices are stored at full precision, so for a current summary the
re-derived value is bit-identical to the stored one; a run without a matrix keeps its
stored value.
"""

from __future__ import annotations

import json
import math
import os
import stat
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cfl_bench import metric_registry as registry
from cfl_bench.errors import UserError
from cfl_bench.run_dir import os_problem
from cfl_bench.text_values import utf8_text

if TYPE_CHECKING:
    import pandas as pd

CONFIG = "config.json"
SUMMARY = "summary.json"

#: Statuses a ``summary.json`` may carry.
SUMMARY_STATUSES: tuple[str, ...] = ("finished", "diverged", "failed")
#: The status of a run whose files cfl-bench cannot have written (see the module docstring).
DAMAGED = "damaged"
#: Every status a loaded run can have.
STATUSES: tuple[str, ...] = (*SUMMARY_STATUSES, "incomplete", "duplicate", DAMAGED)
#: Statuses counted per leaderboard row (``n_<status>``) and never averaged.
COUNTED_STATUSES: tuple[str, ...] = ("diverged", "failed", "incomplete", DAMAGED)

#: Leaderboard metric name → ``summary.json`` key, from the registry
#: (:mod:`cfl_bench.metric_registry`). The plain names are the headline accuracy of the
#: stream's own scenario (class-IL or domain-IL); ``*_task_il`` exist only for class-IL
#: streams (same run, logits masked to the task's classes).
SUMMARY_METRICS: dict[str, str] = {
    s.column: s.key for s in registry.board_columns() if s.column and not s.parts
}
#: Leaderboard columns summed from other columns per run (``bytes_total`` = up + down).
SUMMED_METRICS: dict[str, tuple[str, ...]] = {
    s.column: tuple(registry.metric(p).column or p for p in s.parts)
    for s in registry.board_columns()
    if s.column and s.parts
}

#: Every per-run metric, in leaderboard column order.
METRICS: tuple[str, ...] = tuple(s.column for s in registry.board_columns() if s.column)

#: Per-task curves (lists) and matrices (lists of lists) kept for the plots.
CURVES: dict[str, str] = registry.leaderboard_curves()
MATRICES: dict[str, str] = registry.leaderboard_matrices()
#: Summary computations that forgetting values are re-derived with → include_current.
_REDERIVED: dict[str, bool] = {
    "final_forgetting": False,
    "final_forgetting_clipped": True,
    "forgetting_curve": False,
}
#: Forgetting values re-derived from a stored matrix: name → (matrix, include_current).
#: Names ending in ``_t`` are whole curves, the others their final-task value.
FORGETTING_FROM_MATRIX: dict[str, tuple[str, bool]] = {
    s.column: (
        next(m for m, key in MATRICES.items() if registry.metric(key).source == s.source),
        _REDERIVED[s.compute],
    )
    for s in registry.METRICS
    if s.column and s.compute in _REDERIVED
}

#: Columns of the runs frame, in order.
RUN_COLUMNS: tuple[str, ...] = (
    "path",
    "status",
    "message",
    "stream",
    "scenario",
    "strategy",
    "seed",
    "protocol_hash",
    "config_hash",
    "num_tasks",
    *METRICS,
    *CURVES,
    *MATRICES,
    "protocol",
    "packages",
    "git_commit",
    "environment",
)

INCOMPLETE_MESSAGE = "no summary.json: the run is still running or was stopped before its end"
#: The fix named after every damage reason.
DAMAGED_FIX = "re-run that run or remove its directory"

#: Larger run records are refused unread: cfl-bench's are kilobytes (a summary holds T×T
#: matrices), and reading gigabytes of a stray file would only exhaust memory.
MAX_RECORD_BYTES = 256 * 2**20
#: cfl-bench's records nest a handful of levels; far deeper JSON is foreign, and walking it
#: later (printing, hashing, rendering) could exhaust Python's recursion limit.
MAX_RECORD_DEPTH = 32
#: Largest seed / task count: both become 64-bit integer columns.
MAX_INT = 2**63 - 1

#: Possible ranges of summary values (accuracies are %, differences of two accuracies lie
#: within ±100), from the registry. The generic bound ±1e100 is far beyond anything a run
#: records, and keeps the mean and std (sums of squares) of the finished seeds clear of float
#: overflow.
PERCENT: tuple[float, float] = registry.PERCENT
DIFFERENCE: tuple[float, float] = registry.DIFFERENCE
ANY_NUMBER: tuple[float, float] = (-1e100, 1e100)
AMOUNT: tuple[float, float] = registry.AMOUNT
RANGES: dict[str, tuple[float, float]] = {
    s.key: s.range for s in registry.METRICS if s.range is not None and s.origin != "leaderboard"
}
#: Slack at the ends of a range, for float rounding in a legitimately computed value.
RANGE_SLACK = 1e-9


class DamagedRunError(Exception):
    """A run record cfl-bench cannot have written; ``str()`` is the reason (no fix)."""


def find_run_dirs(arguments: Sequence[str | Path]) -> list[tuple[Path, str]]:
    """Every run directory under the arguments, as (real path, path to show), sorted.

    The shown path is the argument as typed joined with the path below it, so the report
    does not depend on where the checkout lives. A directory reached twice (an argument and
    its parent both given) is kept once. Hidden folders (``.git``, ``.cache``) are skipped.
    A ``config.json`` or ``summary.json`` that is a folder (or anything but a file) still
    marks a run directory: that run is then listed as damaged instead of vanishing. A
    folder that cannot be listed stops everything, because the runs in it would silently be
    missing from the board.
    """
    if not arguments:
        raise UserError("no RUN_DIRS given; pass run directories or folders that hold them.")
    found: dict[Path, str] = {}
    for argument in arguments:
        root = _run_dirs_argument(argument)
        for here, dirs, files in os.walk(root, onerror=_unlistable):
            if {CONFIG, SUMMARY} & ({*files} | {*dirs}):
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


def _refuse_constant(token: str) -> None:
    """``json.loads`` hook for NaN / Infinity / -Infinity, which cfl-bench never writes."""
    raise DamagedRunError(f"holds {token}, which cfl-bench never writes (a missing number is null)")


def _finite_float(text: str) -> float:
    """``json.loads`` hook for numbers with a fraction or exponent: ``1e400`` would silently
    become infinity."""
    value = float(text)
    if not math.isfinite(value):
        shown = text if len(text) <= 24 else text[:21] + "..."
        raise DamagedRunError(f"holds the number {shown}, too large for a float")
    return value


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``json.loads`` hook: a key given twice would silently keep only its last value."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise DamagedRunError(f"has the key {_short(key)} twice")
        out[key] = value
    return out


def _depth(value: object) -> int:
    """Nesting depth of parsed JSON (0 for a scalar), without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict):
            children: Iterable[object] = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        deepest = max(deepest, level)
        stack.extend((child, level + 1) for child in children)
    return deepest


def _short(text: str, limit: int = 40) -> str:
    return repr(text if len(text) <= limit else text[: limit - 3] + "...")


def _shown(value: object) -> str:
    """A JSON value in a few words, for a damage reason (never the whole value)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        text = repr(value)
        return text if len(text) <= 24 else text[:21] + "..."
    if isinstance(value, str):
        return f"the text {_short(value)}"
    if isinstance(value, list):
        return "a list"
    return "a JSON object"


def read_record(path: Path) -> dict[str, Any]:
    """The JSON object in run record ``path``, or :class:`DamagedRunError` with the reason.

    Refused: anything but a regular file, a file too large to be a record, an empty or
    unreadable one, bytes that are not UTF-8, text that is not JSON, NaN / Infinity or an
    overflowing number, a key given twice, JSON nested deeper than cfl-bench ever writes
    and a top level that is not an object.
    """
    name = path.name
    try:
        info = path.stat()
        if stat.S_ISDIR(info.st_mode):
            raise DamagedRunError(f"{name} is a directory, not a file")
        if not stat.S_ISREG(info.st_mode):
            raise DamagedRunError(f"{name} is not a regular file")
        if info.st_size > MAX_RECORD_BYTES:
            raise DamagedRunError(f"{name} has {info.st_size} bytes, far more than any run record")
        raw = path.read_bytes()
    except OSError as exc:
        if path.is_symlink() and not path.exists():
            raise DamagedRunError(f"{name} is a broken link") from None
        raise DamagedRunError(f"{name} cannot be read ({os_problem(exc)})") from None
    if not raw.strip():
        raise DamagedRunError(f"{name} is empty")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DamagedRunError(f"{name} is not UTF-8 text (byte {exc.start})") from None
    try:
        data = json.loads(
            text,
            parse_constant=_refuse_constant,
            parse_float=_finite_float,
            object_pairs_hook=_unique_keys,
        )
    except DamagedRunError as exc:
        raise DamagedRunError(f"{name} {exc}") from None
    except RecursionError:
        raise DamagedRunError(f"{name} is nested far deeper than any run record") from None
    except ValueError as exc:  # JSONDecodeError, or an integer of more than 4300 digits
        raise DamagedRunError(f"{name} is not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise DamagedRunError(f"{name} holds {_shown(data)}, not a JSON object")
    if _depth(data) > MAX_RECORD_DEPTH:
        raise DamagedRunError(f"{name} is nested far deeper than any run record")
    return data


def _in_range(value: float, key: str, where: str) -> float:
    low, high = RANGES.get(key, ANY_NUMBER)
    if not low - RANGE_SLACK <= value <= high + RANGE_SLACK:
        raise DamagedRunError(
            f"{where}: '{key}' is {value!r}, outside its possible range [{low:g}, {high:g}]"
        )
    return value


def _number(value: object, key: str, where: str) -> float:
    """A metric as float (None → NaN); a non-number, or a number outside the metric's
    possible range, means a foreign or damaged file."""
    if value is None:
        return math.nan
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise DamagedRunError(f"{where}: '{key}' must be a number or null, not {_shown(value)}")
    try:
        number = float(value)
    except OverflowError:  # an integer beyond the float range
        number = math.inf
    return _in_range(number, key, where)


def _curve(value: object, key: str, where: str, tasks: int | None) -> list[float] | None:
    """A per-task list of length ``tasks`` (None entries → NaN), or None when absent."""
    if value is None:
        return None
    if not isinstance(value, list):
        raise DamagedRunError(f"{where}: '{key}' must be a list of numbers, not {_shown(value)}")
    if tasks is not None and len(value) != tasks:
        raise DamagedRunError(f"{where}: '{key}' has {len(value)} entries for {tasks} tasks")
    return [_number(v, key, where) for v in value]


def _matrix(value: object, key: str, where: str, tasks: int | None) -> list[list[float]] | None:
    """A T×T matrix, T = ``tasks`` when known (None entries → NaN), or None when absent."""
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(row, list) for row in value):
        raise DamagedRunError(f"{where}: '{key}' must be a list of rows, not {_shown(value)}")
    if not value:
        raise DamagedRunError(f"{where}: '{key}' has no rows")
    size = len(value) if tasks is None else tasks
    if len(value) != size or any(len(row) != size for row in value):
        widths = "/".join(str(n) for n in sorted({len(row) for row in value}))
        raise DamagedRunError(
            f"{where}: '{key}' has {len(value)} rows of {widths} entries, not the "
            f"{size}×{size} matrix of {size} tasks"
        )
    return [[_number(v, key, where) for v in row] for row in value]


def _text(record: dict[str, Any], key: str, where: str) -> str | None:
    """A text field (identity keys: stream, strategy, hashes); anything else is damage."""
    value = record.get(key)
    if value is None or isinstance(value, str):
        return value
    raise DamagedRunError(f"{where}: '{key}' must be text, not {_shown(value)}")


def _object(record: dict[str, Any], key: str, where: str) -> dict[str, Any]:
    """A JSON-object field ({} when absent)."""
    value = record.get(key)
    if value is None:
        return {}
    if isinstance(value, dict):
        return value
    raise DamagedRunError(f"{where}: '{key}' must be a JSON object, not {_shown(value)}")


def _integer(value: object, key: str, where: str, low: int) -> int | None:
    """An integer in [low, 2^63 − 1] (None stays None): seeds and task counts end up in
    64-bit columns, and ``2.7`` tasks must not silently become 2."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= MAX_INT:
        kind = "a positive integer" if low == 1 else "an integer ≥ 0"
        raise DamagedRunError(f"{where}: '{key}' must be {kind}, not {_shown(value)}")
    return value


def _first_text(*candidates: tuple[dict[str, Any], str, str]) -> str | None:
    """The first non-empty text among (record, key, file name) candidates, each checked."""
    for record, key, where in candidates:
        value = _text(record, key, where)
        if value:
            return value
    return None


def _identity(config: dict[str, Any], summary: dict[str, Any] | None) -> dict[str, Any]:
    """The fields naming a run (which leaderboard row it belongs to) and its provenance,
    from summary.json first and config.json second, each type-checked."""
    source = summary or {}
    options = _object(config, "config", CONFIG)
    stream_info = _object(config, "stream", CONFIG)
    strategy_info = config.get("strategy")
    if isinstance(strategy_info, dict):
        strategy_candidates = [(strategy_info, "name", CONFIG)]
    elif strategy_info is None:
        strategy_candidates = []
    else:
        raise DamagedRunError(
            f"{CONFIG}: 'strategy' must be a JSON object, not {_shown(strategy_info)}"
        )
    seed = source["seed"] if "seed" in source else options.get("seed")
    seed_file = SUMMARY if "seed" in source else CONFIG
    return {
        "stream": _first_text((source, "stream", SUMMARY), (options, "stream", CONFIG)),
        "scenario": _text(stream_info, "scenario", CONFIG),
        "strategy": _first_text(
            (source, "strategy", SUMMARY),
            *strategy_candidates,
            (options, "strategy", CONFIG),
        ),
        "seed": _integer(seed, "seed", seed_file, low=0),
        "protocol_hash": _first_text(
            (source, "protocol_hash", SUMMARY), (config, "protocol_hash", CONFIG)
        ),
        "config_hash": _first_text(
            (source, "config_hash", SUMMARY), (config, "config_hash", CONFIG)
        ),
        "protocol": _object(config, "protocol", CONFIG),
        "packages": _object(config, "packages", CONFIG),
        "git_commit": _text(config, "git_commit", CONFIG),
        "environment": _object(config, "environment", CONFIG),
    }


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


def _blank_row(shown: str) -> dict[str, Any]:
    """A row with every column empty: NaN metrics, no curves, no identity."""
    row: dict[str, Any] = {column: None for column in RUN_COLUMNS}
    row.update({"path": shown, "message": "", "protocol": {}, "packages": {}, "environment": {}})
    row.update({metric: math.nan for metric in METRICS})
    return row


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

    Never raises for what is in the directory: a record that cfl-bench cannot have written
    makes the row ``damaged`` (see the module docstring), with every problem found in
    config.json and summary.json named in its message.
    """
    records: dict[str, dict[str, Any]] = {}
    problems: list[str] = []
    for name in (CONFIG, SUMMARY):
        path = real / name
        if not os.path.lexists(path):
            continue
        try:
            records[name] = read_record(path)
        except DamagedRunError as exc:
            problems.append(str(exc))
    config, summary = records.get(CONFIG, {}), records.get(SUMMARY)
    if not problems:
        try:
            return parse_run(shown, config, summary)
        except DamagedRunError as exc:
            problems.append(str(exc))
    return damaged_row(shown, problems, config, summary)


def parse_run(shown: str, config: dict[str, Any], summary: dict[str, Any] | None) -> dict[str, Any]:
    """The row of a run from its parsed records; :class:`DamagedRunError` for a value cfl-bench
    cannot have written."""
    row = _blank_row(shown)
    row.update(_identity(config, summary))
    source = summary or {}
    if summary is None:
        row["status"] = "incomplete"
        row["message"] = INCOMPLETE_MESSAGE
    else:
        status = summary.get("status")
        if not isinstance(status, str) or status not in SUMMARY_STATUSES:
            shown = "missing" if "status" not in summary else _shown(status)
            raise DamagedRunError(
                f"{SUMMARY}: 'status' is {shown}, not one of {', '.join(SUMMARY_STATUSES)}"
            )
        row["status"] = status
        row["message"] = str(summary.get("message") or "")
        config_hash = config.get("config_hash")
        if config_hash and row["config_hash"] and row["config_hash"] != config_hash:
            row["status"] = "incomplete"
            row["message"] = (
                f"summary.json belongs to config hash {row['config_hash']}, "
                f"config.json to {config_hash}: the directory was reused; re-run it"
            )
    if "num_tasks" in source:
        tasks = _integer(source["num_tasks"], "num_tasks", SUMMARY, low=1)
    else:
        tasks = _integer(row["protocol"].get("tasks"), "tasks", f"{CONFIG} protocol", low=1)
    row["num_tasks"] = tasks
    for name, key in SUMMARY_METRICS.items():
        row[name] = _number(source.get(key), key, SUMMARY)
    for name, parts in SUMMED_METRICS.items():
        row[name] = _summed(row, parts)
    for name, key in CURVES.items():
        row[name] = _curve(source.get(key), key, SUMMARY, tasks)
    for name, key in MATRICES.items():
        row[name] = _matrix(source.get(key), key, SUMMARY, tasks)
    rederive_forgetting(row)
    if row["scenario"] is None and row["protocol_hash"] is not None:
        marker = registry.metric(registry.TASK_IL_MARKER).column
        row["scenario"] = "class-il" if not math.isnan(row[marker]) else None
    return row


def _summed(row: dict[str, Any], parts: Sequence[str]) -> float:
    """``row[a] + row[b] + ...`` in order (NaN when any part is unknown)."""
    total = row[parts[0]]
    for part in parts[1:]:
        total = total + row[part]
    return total


def rederive_forgetting(row: dict[str, Any]) -> None:
    """Overwrite the forgetting values of ``row`` with those of its stored matrices (see the
    module docstring for why); values whose matrix is absent or empty are left alone."""
    import numpy as np

    from cfl_bench.metrics import forgetting

    for name, (matrix_name, include_current) in FORGETTING_FROM_MATRIX.items():
        matrix = row[matrix_name]
        if not matrix:
            continue
        curve = forgetting(np.array(matrix, dtype=float), include_current=include_current)
        if name.endswith("_t"):
            row[name] = [float(v) for v in curve]
        else:
            row[name] = float(curve[-1])


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
    """All run directories under ``arguments`` as a DataFrame with :data:`RUN_COLUMNS`,
    sorted by shown path (so every later step sees the runs in one fixed order)."""
    return load_found(find_run_dirs(arguments))


def load_found(found: Sequence[tuple[Path, str]]) -> pd.DataFrame:
    """The runs frame of the (real path, shown path) pairs of :func:`find_run_dirs` (kept
    apart so a caller can check other paths against the run directories first)."""
    import pandas as pd

    rows = [load_run(real, shown) for real, shown in found]
    frame = pd.DataFrame(mark_duplicates(rows), columns=list(RUN_COLUMNS))
    frame["seed"] = frame["seed"].astype("Int64")
    frame["num_tasks"] = frame["num_tasks"].astype("Int64")
    return frame
