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
  seed twice would shrink the standard deviation for nothing.

Only ``finished`` runs enter means (see :mod:`leaderboard.aggregate`).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cfl_bench.errors import UserError

if TYPE_CHECKING:
    import pandas as pd

CONFIG = "config.json"
SUMMARY = "summary.json"

#: Statuses a ``summary.json`` may carry.
SUMMARY_STATUSES: tuple[str, ...] = ("finished", "diverged", "failed")
#: Every status a loaded run can have.
STATUSES: tuple[str, ...] = (*SUMMARY_STATUSES, "incomplete", "duplicate")

#: Leaderboard metric name → ``summary.json`` key. The plain names are the headline
#: accuracy of the stream's own scenario (class-IL or domain-IL); ``*_task_il`` exist only for
#: class-IL streams (same run, logits masked to the task's classes).
SUMMARY_METRICS: dict[str, str] = {
    "Acc_T": "Acc_T",
    "Fgt_T": "Fgt_T",
    "Fgt_T_clipped": "Fgt_T_clipped",
    "BWT": "BWT",
    "FWT": "FWT",
    "MD_T": "MD_T",
    "Acc_T_task_il": "acc_task_il_T",
    "Fgt_T_task_il": "fgt_acc_task_il_T",
    "Fgt_T_clipped_task_il": "fgt_clipped_acc_task_il_T",
    "BWT_task_il": "bwt_acc_task_il",
    "FWT_task_il": "fwt_acc_task_il",
    "bytes_up": "bytes_up_total",
    "bytes_down": "bytes_down_total",
    "wall_time_s": "wall_time_s",
}

#: Every per-run metric, in leaderboard column order (``bytes_total`` = up + down).
METRICS: tuple[str, ...] = (
    "Acc_T",
    "Fgt_T",
    "Fgt_T_clipped",
    "BWT",
    "FWT",
    "Acc_T_task_il",
    "Fgt_T_task_il",
    "Fgt_T_clipped_task_il",
    "BWT_task_il",
    "FWT_task_il",
    "MD_T",
    "bytes_total",
    "bytes_up",
    "bytes_down",
    "wall_time_s",
)

#: Per-task curves (lists) and matrices (lists of lists) kept for the plots.
CURVES: dict[str, str] = {
    "acc_t": "acc_t",
    "fgt_t": "fgt_acc_t",
    "md_t": "md_t",
    "acc_task_il_t": "acc_task_il_t",
    "fgt_task_il_t": "fgt_acc_task_il_t",
}
MATRICES: dict[str, str] = {"acc_matrix": "acc_matrix", "acc_task_il_matrix": "acc_task_il_matrix"}

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


def find_run_dirs(arguments: Sequence[str | Path]) -> list[tuple[Path, str]]:
    """Every run directory under the arguments, as (real path, path to show), sorted.

    The shown path is the argument as typed joined with the path below it, so the report
    does not depend on where the checkout lives. A directory reached twice (an argument and
    its parent both given) is kept once. Hidden folders (``.git``, ``.cache``) are skipped.
    """
    if not arguments:
        raise UserError("no RUN_DIRS given; pass run directories or folders that hold them.")
    found: dict[Path, str] = {}
    for argument in arguments:
        root = Path(argument)
        if not root.is_dir():
            raise UserError(
                f"'{argument}' is not a directory; pass run directories or folders holding them."
            )
        for here, dirs, files in os.walk(root):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            if CONFIG in files or SUMMARY in files:
                real = Path(here).resolve()
                shown = Path(here).as_posix()
                found.setdefault(real, shown)
    if not found:
        shown_args = ", ".join(f"'{a}'" for a in arguments)
        raise UserError(
            f"no run directories (folders with config.json or summary.json) under {shown_args}; "
            f"pass the --out folders of `cfl-bench run` or a folder holding them."
        )
    return sorted(((real, shown) for real, shown in found.items()), key=lambda p: p[1])


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object from ``path``, or a UserError naming the file and the fix."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise UserError(
            f"cannot read {path} ({exc.strerror}); check its permissions or remove the run."
        ) from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UserError(
            f"{path} is not valid JSON ({exc}); delete that run directory or re-run the run."
        ) from None
    if not isinstance(data, dict):
        raise UserError(
            f"{path} must hold a JSON object; it was not written by cfl-bench, remove it."
        )
    return data


def _number(value: object, key: str, path: Path) -> float:
    """A metric as float (None → NaN); a non-number means a foreign or damaged file."""
    if value is None:
        return math.nan
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UserError(
            f"{path}: '{key}' must be a number or null, not {value!r}; "
            f"re-run that run or remove its directory."
        )
    return float(value)


def _curve(value: object, key: str, path: Path) -> list[float] | None:
    """A per-task list (None entries → NaN), or None when the summary does not have it."""
    if value is None:
        return None
    if not isinstance(value, list):
        raise UserError(
            f"{path}: '{key}' must be a list of numbers; re-run that run or remove its directory."
        )
    return [_number(v, key, path) for v in value]


def _matrix(value: object, key: str, path: Path) -> list[list[float]] | None:
    """A square T×T matrix (None entries → NaN), or None when absent."""
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(row, list) for row in value):
        raise UserError(
            f"{path}: '{key}' must be a list of rows; re-run that run or remove its directory."
        )
    rows = [[_number(v, key, path) for v in row] for row in value]
    if any(len(row) != len(rows) for row in rows):
        raise UserError(
            f"{path}: '{key}' must be a square matrix; re-run that run or remove its directory."
        )
    return rows


def _text(value: object) -> str | None:
    return None if value is None else str(value)


def _seed(value: object, path: Path) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise UserError(
            f"{path}: 'seed' must be an integer, not {value!r}; remove that run directory."
        )
    return value


def load_run(real: Path, shown: str) -> dict[str, Any]:
    """One run directory → one row (a dict with the keys of :data:`RUN_COLUMNS`)."""
    config = read_json(real / CONFIG) if (real / CONFIG).is_file() else {}
    summary_path = real / SUMMARY
    summary = read_json(summary_path) if summary_path.is_file() else None
    options = config.get("config") if isinstance(config.get("config"), dict) else {}
    stream_info = config.get("stream") if isinstance(config.get("stream"), dict) else {}
    strategy_info = config.get("strategy")
    strategy_name = strategy_info.get("name") if isinstance(strategy_info, dict) else None
    protocol = config.get("protocol") if isinstance(config.get("protocol"), dict) else {}
    source = summary or {}
    row: dict[str, Any] = {
        "path": shown,
        "message": "",
        "stream": _text(source.get("stream") or options.get("stream")),
        "scenario": _text(stream_info.get("scenario")),
        "strategy": _text(source.get("strategy") or strategy_name or options.get("strategy")),
        "seed": _seed(source.get("seed", options.get("seed")), summary_path),
        "protocol_hash": _text(source.get("protocol_hash") or config.get("protocol_hash")),
        "config_hash": _text(source.get("config_hash") or config.get("config_hash")),
        "protocol": protocol,
        "packages": config.get("packages") if isinstance(config.get("packages"), dict) else {},
        "git_commit": _text(config.get("git_commit")),
        "environment": (
            config.get("environment") if isinstance(config.get("environment"), dict) else {}
        ),
    }
    if summary is None:
        row["status"] = "incomplete"
        row["message"] = INCOMPLETE_MESSAGE
    else:
        status = summary.get("status")
        if status not in SUMMARY_STATUSES:
            raise UserError(
                f"{summary_path}: status {status!r} is not one of {', '.join(SUMMARY_STATUSES)}; "
                f"it was not written by cfl-bench, remove that run directory."
            )
        row["status"] = status
        row["message"] = str(summary.get("message") or "")
        config_hash = config.get("config_hash")
        if config_hash and summary.get("config_hash") and summary["config_hash"] != config_hash:
            row["status"] = "incomplete"
            row["message"] = (
                f"summary.json belongs to config hash {summary['config_hash']}, "
                f"config.json to {config_hash}: the directory was reused; re-run it"
            )
    num_tasks = source.get("num_tasks", protocol.get("tasks"))
    row["num_tasks"] = None if num_tasks is None else int(_number(num_tasks, "num_tasks", real))
    for name, key in SUMMARY_METRICS.items():
        row[name] = _number(source.get(key), key, summary_path)
    row["bytes_total"] = row["bytes_up"] + row["bytes_down"]
    for name, key in CURVES.items():
        row[name] = _curve(source.get(key), key, summary_path)
    for name, key in MATRICES.items():
        row[name] = _matrix(source.get(key), key, summary_path)
    if row["scenario"] is None and row["protocol_hash"] is not None:
        row["scenario"] = "class-il" if not math.isnan(row["Acc_T_task_il"]) else None
    return row


def mark_duplicates(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mark every later run of an already-seen (protocol hash, strategy, seed) ``duplicate``.

    The first directory in path order wins, but a finished run beats an unfinished one, so a
    crashed attempt next to its successful re-run never hides the result.
    """
    rows = list(rows)
    rank = {"finished": 0, "diverged": 1, "failed": 2, "incomplete": 3}
    keep: dict[tuple[object, object, object], int] = {}
    for index, row in enumerate(rows):
        key = (row["protocol_hash"], row["strategy"], row["seed"])
        if None in key:
            continue
        best = keep.get(key)
        if best is None or rank[row["status"]] < rank[rows[best]["status"]]:
            keep[key] = index
    for index, row in enumerate(rows):
        key = (row["protocol_hash"], row["strategy"], row["seed"])
        if None in key or keep[key] == index:
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
    import pandas as pd

    rows = [load_run(real, shown) for real, shown in find_run_dirs(arguments)]
    frame = pd.DataFrame(mark_duplicates(rows), columns=list(RUN_COLUMNS))
    frame["seed"] = frame["seed"].astype("Int64")
    frame["num_tasks"] = frame["num_tasks"].astype("Int64")
    return frame
