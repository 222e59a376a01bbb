"""One typed reader of run directories: ``config.json``, ``summary.json``, ``records.csv``.

Why one reader: ``report``, ``leaderboard``, a sweep's skip rule and ``clients`` must agree
on which runs are finished and which are damaged. Before, the leaderboard ranked a run whose
``records.csv`` held garbage, a NaN or a line cut in half as a finished seed while the report
refused it. :func:`read_run` reads a directory into a :class:`RunReading` whose ``status``
is one of

* ``finished`` / ``diverged`` — ``summary.json`` written by the engine at the run's end, and
  every record intact; ``diverged`` runs stop at a non-finite training loss;
* ``failed`` — a ``summary.json`` the sweep wrote for a run that crashed;
* ``unfinished`` — ``config.json`` without ``summary.json`` (still running or killed), or a
  summary of another configuration than the directory's ``config.json``;
* ``damaged`` — a file cfl-bench cannot have written, with a one-line ``reason`` naming the
  file and the problem.

What counts as damage:

* ``config.json`` / ``summary.json`` (:func:`read_record`, :func:`parse_run`): unreadable,
  empty, not UTF-8, not JSON, not a JSON object, nested absurdly deep, a folder instead of a
  file, ``NaN`` / ``Infinity`` anywhere (cfl-bench writes ``null`` for a missing number), a
  key given twice, a metric of the wrong type or outside its possible range (an accuracy of
  150 %), a ``num_tasks`` that is not a positive integer, curves or matrices whose size does
  not match ``num_tasks``, an unknown ``status``.
* ``records.csv`` (:func:`read_records`), when present: not a file, not UTF-8, another
  header, a line that does not parse, task and round columns that are not integers of the
  run, an unknown scope, a value outside its metric's possible range, and any value that is
  not finite — except where divergence put it: the last round of a ``diverged`` run (its
  training loss is what became NaN or infinite). A last line cut in half is damage in a
  ``finished`` or ``diverged`` run (the engine wrote the summary after its last record) and
  is dropped with a note otherwise (a run killed while appending).

* the files of a run the engine ended (``finished`` / ``diverged``) that are missing or
  disagree: no ``config.json`` or no ``records.csv`` beside the summary, or a summary whose
  numbers are not what the records give (:mod:`cfl_bench.core.run_agreement`: an edited Acc_T).
  A run is finished only when its files exist and agree.
* an ``--overwrite`` stopped inside its swap (a ``.replaced/`` folder is left): old and new
  files are mixed until the next run into the folder rolls the swap forward.

A run that is not done (unfinished, failed) may lack ``records.csv``.

Why here and not in ``leaderboard``: the core packages (the sweep, ``clients``) need the
same reader and must not import the leaderboard; the leaderboard imports this module. It
uses pandas and numpy only, never torch, so the sweep process stays light.

Forgetting (``Fgt_T``, ``Fgt_T_clipped``, their task-IL versions and the Fgt_t curves) is
re-derived from the accuracy matrices stored in ``summary.json`` with
:func:`cfl_bench.core.metrics.forgetting`, not copied. Why: summaries written before the
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
import re
import stat
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from cfl_bench.core import metric_registry as registry
from cfl_bench.core.run_agreement import disagreement
from cfl_bench.core.run_dir import ASIDE, os_problem

if TYPE_CHECKING:
    import pandas as pd

CONFIG = "config.json"
SUMMARY = "summary.json"
RECORDS = "records.csv"

#: Statuses a ``summary.json`` may carry.
SUMMARY_STATUSES: tuple[str, ...] = ("finished", "diverged", "failed")
#: The status of a run whose files cfl-bench cannot have written (see the module docstring).
DAMAGED = "damaged"
#: What :func:`read_run` calls a run without ``summary.json`` (the leaderboard's
#: ``incomplete``).
UNFINISHED = "unfinished"
#: Runs the engine itself ended: a sweep skips them, the leaderboard ranks the finished.
DONE: tuple[str, ...] = ("finished", "diverged")

#: Leaderboard metric name → ``summary.json`` key, from the registry
#: (:mod:`cfl_bench.core.metric_registry`). The plain names are the headline accuracy of the
#: stream's own scenario (class-IL or domain-IL); ``*_task_il`` exist only for class-IL
#: streams (same run, logits masked to the task's classes).
SUMMARY_METRICS: dict[str, str] = {
    s.column: s.key for s in registry.board_columns() if s.column and s.origin != "leaderboard"
}
#: Leaderboard columns summed from other columns per run (``bytes_total`` = up + down).
SUMMED_METRICS: dict[str, tuple[str, ...]] = {
    s.column: tuple(registry.metric(p).column or p for p in s.parts)
    for s in registry.board_columns()
    if s.column and s.parts
}
#: Leaderboard columns that are the per-run mean of a curve (``AIA`` = mean of ``acc_t``).
CURVE_MEANS: dict[str, str] = {
    s.column: s.mean_of for s in registry.board_columns() if s.column and s.mean_of
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
#: Summary keys whose stored values no reader uses (re-derived from the matrices), so
#: the agreement check leaves them out (:mod:`cfl_bench.core.run_agreement`).
REDERIVED_KEYS: frozenset[str] = frozenset(
    s.key for s in registry.METRICS if s.compute in _REDERIVED
)
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

#: Names whose presence makes a folder a run directory for every command that searches for
#: runs (leaderboard, reproduce --compare): a damaged run must be listed as damaged, never
#: vanish — one without config.json, or one whose --overwrite stopped in the swap.
RUN_MARKERS: frozenset[str] = frozenset({CONFIG, SUMMARY, ASIDE})
#: The reason of a run whose ``--overwrite`` stopped inside the swap (see :func:`swap_pending`).
SWAP_PENDING = (
    "an --overwrite of this run was stopped while it swapped the new run in (.replaced/ is "
    "left), so old and new files are mixed"
)
INCOMPLETE_MESSAGE = "no summary.json: the run is still running or was stopped before its end"

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


def _blank_row(shown: str) -> dict[str, Any]:
    """A row with every column empty: NaN metrics, no curves, no identity."""
    row: dict[str, Any] = {column: None for column in RUN_COLUMNS}
    row.update({"path": shown, "message": "", "protocol": {}, "packages": {}, "environment": {}})
    row.update({metric: math.nan for metric in METRICS})
    return row


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
    rederive_forgetting(row, _task_orders(source.get("task_orders"), tasks))
    for name, curve in CURVE_MEANS.items():
        row[name] = curve_mean(row[curve])
    if row["scenario"] is None and row["protocol_hash"] is not None:
        marker = registry.metric(registry.TASK_IL_MARKER).column
        assert marker is not None  # the task-IL marker is a leaderboard column
        row["scenario"] = "class-il" if not math.isnan(row[marker]) else None
    return row


def _summed(row: dict[str, Any], parts: Sequence[str]) -> float:
    """``row[a] + row[b] + ...`` in order (NaN when any part is unknown)."""
    total = row[parts[0]]
    for part in parts[1:]:
        total = total + row[part]
    return total


def curve_mean(curve: Sequence[float] | None) -> float:
    """The mean of a per-task curve (average incremental accuracy from Acc_t); NaN when the
    curve is absent or any task's value is (an average over the tasks that happen to have
    a value would be another, usually flattering, number)."""
    if not curve or any(math.isnan(v) for v in curve):
        return math.nan
    return math.fsum(curve) / len(curve)


def _task_orders(value: object, tasks: int | None) -> list[list[int]] | None:
    """summary.json → ``task_orders`` (``--task-order per-client``): each client's order, a
    permutation of the tasks; None when absent (the shared order)."""
    if value is None:
        return None
    permutation = list(range(tasks or 0))
    if (
        not isinstance(value, list)
        or not value
        or any(not isinstance(o, list) or sorted(o) != permutation for o in value)
    ):
        raise DamagedRunError(
            f"{SUMMARY}: 'task_orders' is {_shown(value)}, not a list of permutations of the "
            f"{tasks} tasks"
        )
    return value


def rederive_forgetting(row: dict[str, Any], orders: list[list[int]] | None = None) -> None:
    """Overwrite the forgetting values of ``row`` with those of its stored matrices (see the
    module docstring for why); values whose matrix is absent or empty are left alone. Under
    per-client task orders (``orders``) the value is the mean over clients of each client's
    forgetting on its own tasks, as the summary computes it."""
    import numpy as np

    from cfl_bench.core.metrics import client_matrix, client_mean, forgetting

    for name, (matrix_name, include_current) in FORGETTING_FROM_MATRIX.items():
        matrix = row[matrix_name]
        if not matrix:
            continue
        a = np.array(matrix, dtype=float)
        if orders is None:
            curve = forgetting(a, include_current=include_current)
        else:
            curve = client_mean(
                [forgetting(client_matrix(a, o), include_current=include_current) for o in orders]
            )
        if name.endswith("_t"):
            row[name] = [float(v) for v in curve]
        else:
            row[name] = float(curve[-1])


# --------------------------------------------------------------------------------------------
# records.csv
# --------------------------------------------------------------------------------------------

#: Possible ranges of the recorded metrics (from the metric registry). Metrics not listed (a
#: newer engine's) are shown nowhere, so only their finiteness is checked.
VALUE_RANGES: dict[str, tuple[float, float]] = {r.name: r.range for r in registry.RECORDED}
#: Slack at the ends of a range, for float rounding in a legitimately measured value.
SLACK = 1e-9
_CLIENT = re.compile(r"client_(\d+)")


def read_rows(path: Path | IO[str]) -> pd.DataFrame:
    """A record file as written. Values go through Python's ``float``, which reads a repr
    back exactly; pandas' own fast parser may round in the last digit (pandas < 3)."""
    import pandas as pd

    frame = pd.read_csv(path, converters={"value": float})
    return frame.astype({"value": "float64"})


def _records_text(path: Path) -> str:
    """The raw text of records.csv, or DamagedRunError (not a file, unreadable, not UTF-8)."""
    try:
        if not path.is_file():
            raise DamagedRunError(f"{RECORDS} is not a file")
        raw = path.read_bytes()
    except OSError as exc:
        raise DamagedRunError(f"{RECORDS} cannot be read ({os_problem(exc)})") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DamagedRunError(f"{RECORDS} is not UTF-8 text (byte {exc.start})") from None


def read_records(
    path: Path, *, complete: bool, diverged: bool, num_tasks: int, clients: int | None
) -> tuple[pd.DataFrame, list[str]]:
    """records.csv read exactly and checked (see the module docstring), and notes for the
    user. ``complete``: the engine itself ended the run (finished or diverged) and wrote its
    summary after the last record, so a cut last line is damage; a run that is unfinished
    or failed (a crash, or a kill the sweep recorded) may have been stopped mid-write.
    ``diverged``: non-finite values are where divergence put them in the last round."""
    import io

    from cfl_bench.core.metrics import RECORD_COLUMNS

    text = _records_text(path)
    header = ",".join(RECORD_COLUMNS)
    first = text.split("\n", 1)[0].rstrip("\r")
    if first != header:
        shown = first if len(first) <= 60 else first[:57] + "..."
        raise DamagedRunError(f"{RECORDS} starts with {shown!r}, not the header {header!r}")
    notes: list[str] = []
    if text.count("\n") >= 1 and not text.endswith("\n"):
        if complete:
            raise DamagedRunError(f"{RECORDS} ends in the middle of a line")
        text = text[: text.rindex("\n") + 1]
        notes.append(
            f"The last line of {RECORDS} was cut off (the run was stopped while writing it) "
            f"and is left out: line {text.count(chr(10)) + 1}."
        )
    try:
        frame = read_rows(io.StringIO(text))
    except (ValueError, TypeError, OverflowError) as exc:  # pandas' ParserError included
        reason = str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__
        raise DamagedRunError(f"{RECORDS} cannot be parsed ({reason})") from None
    check_records(frame, num_tasks, clients, diverged=diverged)
    return frame, notes


def check_records(
    frame: pd.DataFrame, num_tasks: int, clients: int | None, *, diverged: bool = False
) -> None:
    """Refuse a records table cfl-bench cannot have written (the first bad line is named)."""
    from pandas.api.types import is_integer_dtype

    from cfl_bench.core.metrics import RECORD_COLUMNS

    if list(frame.columns) != list(RECORD_COLUMNS):
        raise DamagedRunError(f"{RECORDS} has the columns {list(frame.columns)}")
    for column in ("round", "trained_task", "eval_task"):
        if len(frame) and not is_integer_dtype(frame[column]):
            bad = _first_bad(frame[column].map(_whole))
            where = f"{RECORDS} line {bad}" if bad else RECORDS
            raise DamagedRunError(f"{where}: '{column}' is not an integer")
    for column in ("scope", "metric"):
        bad = _first_bad(frame[column].map(lambda v: isinstance(v, str) and v != ""))
        if bad:
            raise DamagedRunError(f"{RECORDS} line {bad}: '{column}' is empty or not text")
    checks = [
        ("round", frame["round"] >= 0, "a round below 0"),
        ("trained_task", frame["trained_task"].between(-1, num_tasks - 1), "no task of the run"),
        ("eval_task", frame["eval_task"].between(-1, num_tasks - 1), "no task of the run"),
    ]
    for column, ok, what in checks:
        bad = _first_bad(ok)
        if bad:
            value = frame[column].iloc[bad - 2]
            raise DamagedRunError(f"{RECORDS} line {bad}: '{column}' {value} is {what}")
    bad = _first_bad(frame["scope"].map(lambda s: _scope_ok(s, clients)))
    if bad:
        scope = str(frame["scope"].iloc[bad - 2])[:40]
        raise DamagedRunError(f"{RECORDS} line {bad}: scope {scope!r} is not a known scope")
    check_values(frame, diverged=diverged)


def check_values(frame: pd.DataFrame, *, diverged: bool) -> None:
    """Every value inside its metric's possible range, and finite: only in the round a
    diverged run stopped at may a value be NaN or infinite (the engine records the
    non-finite training loss that ended the run there)."""
    import numpy as np

    values = frame["value"].to_numpy(dtype=float)
    excused = np.zeros(len(frame), dtype=bool)
    if diverged and len(frame):
        last_round = (frame["round"] == frame["round"].max()).to_numpy()
        excused = last_round & ~np.isfinite(values)
    for metric, (low, high) in VALUE_RANGES.items():
        rows = (frame["metric"] == metric).to_numpy() & ~excused
        outside = np.flatnonzero(rows & ~((low - SLACK <= values) & (values <= high + SLACK)))
        if len(outside):
            line = int(frame.index[outside[0]]) + 2
            raise DamagedRunError(
                f"{RECORDS} line {line}: {metric} {float(values[outside[0]])!r} is outside its "
                f"possible range [{low:g}, {high:g}]"
            )
    infinite = np.flatnonzero(~excused & ~np.isfinite(values))
    if len(infinite):
        line = int(frame.index[infinite[0]]) + 2
        metric = str(frame["metric"].iloc[infinite[0]])[:40]
        raise DamagedRunError(
            f"{RECORDS} line {line}: {metric} {float(values[infinite[0]])!r} is not a finite "
            f"number, which only the last round of a diverged run may hold"
        )


def _whole(value: object) -> bool:
    """An integer as pandas parses it (a float column holds 1.0 for "1" beside a "1.5")."""
    if isinstance(value, bool):
        return False
    if isinstance(value, float):
        return value.is_integer()
    return isinstance(value, int) or type(value).__name__.startswith("int")


def _first_bad(ok: pd.Series) -> int:
    """The file line (header = line 1) of the first False in ``ok``; 0 when all are True."""
    bad = ok.index[~ok.astype(bool).to_numpy()]
    return int(bad[0]) + 2 if len(bad) else 0


def _scope_ok(scope: object, clients: int | None) -> bool:
    if scope == "global":
        return True
    match = _CLIENT.fullmatch(str(scope))
    return match is not None and (clients is None or int(match.group(1)) < clients)


# --------------------------------------------------------------------------------------------
# A whole run directory
# --------------------------------------------------------------------------------------------


@dataclass
class RunReading:
    """A run directory as read and checked by :func:`read_run`.

    ``status``: finished, diverged, failed, unfinished or damaged; ``reason``: one line
    saying why a run is not finished (the damage, the failure, the missing summary), empty
    for a finished run. ``row``: the run's identity and summary numbers
    (:func:`parse_run`), None when damaged. ``records``: records.csv read exactly, None when
    the directory has none (or it was not asked for).
    """

    path: Path
    status: str
    reason: str
    config: dict[str, Any]
    summary: dict[str, Any] | None
    row: dict[str, Any] | None = None
    records: pd.DataFrame | None = None
    notes: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def done(self) -> bool:
        """Ended by the engine (finished or diverged) with every file intact."""
        return self.status in DONE


def read_run(folder: Path, shown: str | None = None, *, records: bool = True) -> RunReading:
    """Read and check the run directory ``folder`` (see the module docstring).

    Never raises for what is in the directory: whatever cfl-bench cannot have written makes
    the reading ``damaged``, every problem of config.json and summary.json in ``problems``
    (records.csv is only checked when they are intact). ``shown``: the path as the user
    gave it (the row's ``path``). ``records=False`` skips records.csv of a run that is not
    done; a done run's records are always read, since its summary is checked against them.
    """
    parsed: dict[str, dict[str, Any]] = {}
    problems: list[str] = []
    for name in (CONFIG, SUMMARY):
        path = folder / name
        if not os.path.lexists(path):
            continue
        try:
            parsed[name] = read_record(path)
        except DamagedRunError as exc:
            problems.append(str(exc))
    reading = RunReading(folder, DAMAGED, "", parsed.get(CONFIG, {}), parsed.get(SUMMARY))
    if swap_pending(folder):
        return _damaged(reading, [SWAP_PENDING])
    if problems:
        return _damaged(reading, problems)
    try:
        row = parse_run(shown or folder.as_posix(), reading.config, reading.summary)
    except DamagedRunError as exc:
        return _damaged(reading, [str(exc)])
    reading.row = row
    reading.status = UNFINISHED if row["status"] == "incomplete" else str(row["status"])
    reading.reason = str(row["message"] or "")
    try:
        if reading.done:
            _check_done(folder, reading)
        elif records and os.path.lexists(folder / RECORDS):
            reading.records, reading.notes = _run_records(folder, reading)
    except DamagedRunError as exc:
        return _damaged(reading, [str(exc)])
    return reading


def swap_pending(folder: Path) -> bool:
    """Whether an ``--overwrite`` was stopped inside its swap (``cfl_bench.core.run_dir``): the
    folder then mixes old and new entries until the next run into it rolls the swap forward."""
    aside = folder / ASIDE
    return aside.is_dir() and not aside.is_symlink()


def _check_done(folder: Path, reading: RunReading) -> None:
    """A run the engine ended is finished only when its files exist and agree: config.json
    and records.csv present, records.csv intact, and summary.json holding exactly what the
    records give (:mod:`cfl_bench.core.run_agreement`). Records are always read here, because
    a summary is only as good as the records behind it."""
    for name in (CONFIG, RECORDS):
        if not os.path.lexists(folder / name):
            raise DamagedRunError(f"{name} is missing, so the summary cannot be checked")
    reading.records, reading.notes = _run_records(folder, reading)
    num_tasks = (reading.row or {}).get("num_tasks") or stream_task_count(reading.config)
    problem = disagreement(reading.summary or {}, reading.records, num_tasks, REDERIVED_KEYS)
    if problem is not None:
        raise DamagedRunError(problem)


def _damaged(reading: RunReading, problems: list[str]) -> RunReading:
    reading.status, reading.problems = DAMAGED, problems
    reading.reason = "; ".join(problems)
    reading.row, reading.records = None, None
    return reading


def _run_records(folder: Path, reading: RunReading) -> tuple[pd.DataFrame, list[str]]:
    """records.csv of an intact reading, checked against its task and client counts."""
    row = reading.row or {}
    num_tasks = row.get("num_tasks") or stream_task_count(reading.config)
    protocol = row.get("protocol") or {}
    clients = protocol.get("clients") if type(protocol.get("clients")) is int else None
    return read_records(
        folder / RECORDS,
        complete=reading.status in DONE,
        diverged=reading.status == "diverged",
        num_tasks=num_tasks,
        clients=clients,
    )


def stream_task_count(config: dict[str, Any]) -> int:
    """The task count config.json's stream description gives (runs that did not record it
    in their identity); DamagedRunError when it is missing or not a positive integer."""
    stream = config.get("stream")
    tasks = stream.get("num_tasks") if isinstance(stream, dict) else None
    if type(tasks) is not int or tasks < 1:
        raise DamagedRunError(f"{CONFIG} does not say how many tasks the run has")
    return tasks
