"""One run directory → everything ``cfl-bench report`` shows, read and checked.

Why a loader of its own (and not :func:`leaderboard.runs.load_run`): the leaderboard needs
one row per run and lists a damaged run instead of stopping, because one bad directory
among hundreds must not take the board down. A report is about *one* run: there is nothing
else to show, so every problem is refused with one sentence naming the file and the fix
(exit 2, nothing written). Both read the directory with the same reader,
:func:`cfl_bench.core.run_reader.read_run` (JSON records and ``records.csv``), so the runs the
report refuses are exactly those the leaderboard lists as damaged, for the same reason.

Why everything comes from ``records.csv``: it is the run's measurement log, appended as
rounds finish, so an unfinished run (still running, killed, or stopped by a crash) has
records up to its last round but no ``summary.json``. Its report shows what exists. The
per-task numbers are recomputed with :func:`cfl_bench.core.metrics.summarize`, the very function
that writes ``summary.json``, so a finished run's page shows the summary's numbers; if
they disagree anyway (a summary edited, or written by other code), the page says so.
Only task ends that were reached count: an accuracy measured during a task that has not
ended (``--eval-every-round``) is not that task's end-of-task evaluation, and using it
would put a number in the accuracy matrix that the finished run would never hold.

``records.csv`` is read and checked by the reader (:mod:`cfl_bench.core.run_reader`: exact
floats, the header, integer task and round columns, known scopes, values finite and in the
possible range of their metric, NaN only where a divergence put it, a cut last line dropped
with a note for an unfinished or failed run and refused in a finished or diverged one).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cfl_bench.core import metric_registry as registry
from cfl_bench.core.errors import UserError
from cfl_bench.core.run_dir import os_problem
from cfl_bench.core.run_reader import (  # noqa: F401 (VALUE_RANGES: importable from here too)
    CONFIG,
    DAMAGED,
    RECORDS,
    SUMMARY,
    VALUE_RANGES,
    read_run,
    stream_task_count,
)

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

#: The fix named after every problem with a run's files.
DAMAGED_FIX = "re-run that run or pass another run directory"
#: Metrics that the accuracy matrices and memory drift are built from (task ends only).
TASK_END_METRICS: tuple[str, ...] = tuple(r.name for r in registry.RECORDED if r.task_end)


@dataclass
class RunData:
    """A checked run directory: its records, the numbers derived from them, and the
    identity, configuration and provenance from its JSON files."""

    path: str
    status: str
    message: str
    identity: dict[str, Any]
    config: dict[str, Any]
    summary: dict[str, Any] | None
    records: pd.DataFrame
    num_tasks: int
    eval_rounds: list[int]
    total_rounds: int | None
    rounds_done: int
    tasks_done: int
    metrics: dict[str, Any]
    class_tables: list[tuple[int, list[list[int]]]] | None
    offsets: list[int]
    notes: list[str] = field(default_factory=list)


def _refuse(run_dir: str, problem: str) -> UserError:
    return UserError(f"run directory '{run_dir}' is damaged: {problem}; {DAMAGED_FIX}.")


def check_run_dir(run_dir: str) -> Path:
    """RUN_DIR as a folder holding ``config.json``, or a UserError saying what it is."""
    from cfl_bench.leaderboard.runs import find_run_dirs

    if run_dir == "":
        raise UserError("RUN_DIR is empty; pass a run directory written by `cfl-bench run`.")
    folder = Path(run_dir)
    try:
        is_dir, present = folder.is_dir(), os.path.lexists(folder)
        has_config = os.path.lexists(folder / CONFIG)
    except OSError as exc:
        raise UserError(
            f"RUN_DIR '{run_dir}' cannot be read ({os_problem(exc)}); pass a run directory "
            f"written by `cfl-bench run`."
        ) from None
    if not present:
        raise UserError(
            f"RUN_DIR '{run_dir}' does not exist; pass a run directory written by "
            f"`cfl-bench run` (it holds config.json and records.csv)."
        )
    if not is_dir:
        if folder.name in (CONFIG, SUMMARY, RECORDS):
            raise UserError(
                f"RUN_DIR '{run_dir}' is a file; pass the run directory that holds it, "
                f"'{folder.parent.as_posix()}'."
            )
        raise UserError(f"RUN_DIR '{run_dir}' is a file; pass a run directory.")
    if has_config or os.path.lexists(folder / SUMMARY):
        return folder  # read_run says what is wrong with a summary without a config.json
    try:
        below = [shown for _, shown in find_run_dirs([folder])]
    except UserError:
        below = []
    if below:
        raise UserError(
            f"RUN_DIR '{run_dir}' is not a run directory but holds {len(below)} below it; "
            f"pass one of them (e.g. '{below[0]}'), or use `cfl-bench leaderboard` for all."
        )
    raise UserError(
        f"RUN_DIR '{run_dir}' holds no config.json; pass a run directory written by "
        f"`cfl-bench run`."
    )


def _int_list(value: object) -> list[int] | None:
    if isinstance(value, list) and all(type(v) is int for v in value):
        return list(value)
    return None


def task_clock(
    run_dir: str, config: dict[str, Any], num_tasks: int
) -> tuple[list[int], int | None, list[int]]:
    """(round at which each task ends, total rounds, per-client offsets) from config.json's
    ``task_clock``, else from the protocol's rounds per task (synchronous runs)."""
    clock = config.get("task_clock")
    if clock is not None:
        ends = _int_list(clock.get("eval_rounds")) if isinstance(clock, dict) else None
        total = clock.get("total_rounds") if isinstance(clock, dict) else None
        offsets = _int_list(clock.get("offsets") or []) if isinstance(clock, dict) else None
        if (
            ends is None
            or len(ends) != num_tasks
            or ends != sorted(set(ends))
            or (ends and ends[0] < 1)
            or type(total) is not int
            or (ends and total < ends[-1])
            or offsets is None
        ):
            raise _refuse(run_dir, "config.json: 'task_clock' is not a valid task clock")
        return ends, total, offsets
    protocol = config.get("protocol") or {}
    rounds = protocol.get("rounds_per_task") if isinstance(protocol, dict) else None
    if type(rounds) is int and rounds >= 1:
        ends = [rounds * (t + 1) for t in range(num_tasks)]
        return ends, ends[-1] if ends else None, []
    return [], None, []


def class_tables(run_dir: str, config: dict[str, Any]) -> list[tuple[int, list[list[int]]]] | None:
    """The per-task client × class sample counts (1-based task, K × C table), None when the
    run did not record them; a malformed table is refused."""
    tables = config.get("client_class_counts")
    if tables is None:
        return None
    problem = _refuse(run_dir, "config.json: 'client_class_counts' is not a table per task")
    if not isinstance(tables, dict):
        raise problem
    out = []
    for key, table in tables.items():
        if not (isinstance(key, str) and key.isdigit() and int(key) >= 1 and _count_table(table)):
            raise problem
        out.append((int(key), table))
    return sorted(out)


def _count_table(table: object) -> bool:
    """A non-empty K × C list of lists of non-negative ints with equal row lengths."""
    if not isinstance(table, list) or not table:
        return False
    if not all(isinstance(row, list) for row in table) or len({len(r) for r in table}) != 1:
        return False
    return bool(table[0]) and all(type(v) is int and v >= 0 for row in table for v in row)


def task_end_records(records: pd.DataFrame, ends: list[int], rounds_done: int) -> pd.DataFrame:
    """The records without task-end metrics of tasks that have not ended yet (see the module
    docstring); a finished run loses nothing."""
    if not ends:
        return records
    pending = [t for t, end in enumerate(ends) if end > rounds_done]
    if not pending:
        return records
    drop = records["metric"].isin(TASK_END_METRICS) & records["trained_task"].isin(pending)
    return records[~drop]


def not_scored_reason(summary: dict[str, Any] | None, config: dict[str, Any]) -> str:
    """Why the run's global model is not what its method is scored by: what summary.json
    says, else (an unfinished run) what config.json says; empty when it is."""
    stated = (summary if summary is not None else config).get("global_not_scored")
    return stated if isinstance(stated, str) else ""


def load_run_data(run_dir: str) -> RunData:
    """Read and check everything a report shows about the run in ``run_dir``: the run
    directory as :func:`cfl_bench.core.run_reader.read_run` reads it (a damaged one is refused
    with its reason), then the numbers derived from its records."""
    from cfl_bench.core.metrics import summarize

    folder = check_run_dir(run_dir)
    reading = read_run(folder, run_dir)
    if reading.status == DAMAGED or reading.row is None:
        raise _refuse(run_dir, reading.reason)
    if reading.records is None:
        raise UserError(
            f"run directory '{run_dir}' has no records.csv, so there is nothing to report; "
            f"{DAMAGED_FIX}."
        )
    identity, config, summary = reading.row, reading.config, reading.summary
    records, notes = reading.records, list(reading.notes)
    num_tasks = identity["num_tasks"] or stream_task_count(config)  # checked by read_run
    ends, total, offsets = task_clock(run_dir, config, num_tasks)
    rounds_done = int(records["round"].max()) if len(records) else 0
    if total is not None and rounds_done > total:
        raise _refuse(run_dir, f"records.csv has round {rounds_done} of a {total}-round run")
    tasks_done = sum(1 for end in ends if end <= rounds_done) if ends else 0
    not_scored = not_scored_reason(summary, config)
    try:
        metrics = summarize(task_end_records(records, ends, rounds_done), num_tasks, not_scored)
    except ValueError as exc:
        raise _refuse(run_dir, f"records.csv does not fit the run ({exc})") from None
    return RunData(
        path=run_dir,
        status=reading.status,
        message=reading.reason,
        identity=identity,
        config=config,
        summary=summary,
        records=records,
        num_tasks=num_tasks,
        eval_rounds=ends,
        total_rounds=total,
        rounds_done=rounds_done,
        tasks_done=tasks_done,
        metrics=metrics,
        class_tables=class_tables(run_dir, config),
        offsets=offsets,
        notes=notes,
    )


# --------------------------------------------------------------------------------------------
# Series derived from the records (what the report's per-round and per-client figures draw)
# --------------------------------------------------------------------------------------------


def per_round(records: pd.DataFrame, metric: str, how: str = "last") -> pd.Series:
    """One global value per round (round → value), sorted by round: the last row of a
    round (``how="last"``) or, for byte counters, the sum (as ``summarize`` counts them)."""
    rows = records[(records["metric"] == metric) & (records["scope"] == "global")]
    grouped = rows.groupby("round")["value"]
    return grouped.sum() if how == "sum" else grouped.last()


def client_index(scope: str) -> int:
    """``client_7`` → 7."""
    return int(scope.split("_", 1)[1])


def client_values_at_task_ends(records: pd.DataFrame) -> dict[int, dict[int, float]]:
    """0-based task → {client → accuracy of its local model at that task's end}, from the
    ``client_acc`` rows (the last round of each task per client)."""
    rows = records[records["metric"] == "client_acc"]
    rows = rows[rows["scope"].str.startswith("client_") & (rows["trained_task"] >= 0)]
    out: dict[int, dict[int, float]] = {}
    for (task, scope), group in rows.groupby(["trained_task", "scope"], sort=True):
        last = group[group["round"] == group["round"].max()]
        out.setdefault(int(task), {})[client_index(str(scope))] = float(last["value"].iloc[-1])
    return {t: dict(sorted(v.items())) for t, v in sorted(out.items())}


def buffer_drift_matrix(records: pd.DataFrame) -> tuple[list[int], list[int], np.ndarray] | None:
    """(rounds, clients, values[client, round]) of the per-client buffer drift, NaN where a
    client has no value in a round; None when the run recorded none."""
    import numpy as np

    rows = records[
        (records["metric"] == "buffer_drift") & records["scope"].str.startswith("client_")
    ]
    if rows.empty:
        return None
    rows = rows.drop_duplicates(subset=["round", "scope"], keep="last")
    rounds = sorted(int(r) for r in rows["round"].unique())
    clients = sorted({client_index(str(s)) for s in rows["scope"]})
    values = np.full((len(clients), len(rounds)), np.nan)
    where_round = {r: i for i, r in enumerate(rounds)}
    where_client = {k: i for i, k in enumerate(clients)}
    for scope, round_, value in zip(rows["scope"], rows["round"], rows["value"], strict=True):
        values[where_client[client_index(str(scope))], where_round[int(round_)]] = float(value)
    return rounds, clients, values
