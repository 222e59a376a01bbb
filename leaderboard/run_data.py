"""One run directory → everything ``cfl-bench report`` shows, read and checked.

Why a loader of its own (and not :func:`leaderboard.runs.load_run`): the leaderboard needs
one row per run and lists a damaged run instead of stopping, because one bad directory
among hundreds must not take the board down. A report is about *one* run: there is nothing
else to show, so every problem is refused with one sentence naming the file and the fix
(exit 2, nothing written). The JSON records still go through the leaderboard's checks
(:func:`leaderboard.runs.read_record` and :func:`leaderboard.runs.parse_run`: NaN tokens,
duplicate keys, wrong types and ranges), so both commands accept exactly the same files.

Why everything comes from ``records.csv``: it is the run's measurement log, appended as
rounds finish, so an unfinished run (still running, killed, or stopped by a crash) has
records up to its last round but no ``summary.json``. Its report shows what exists. The
per-task numbers are recomputed with :func:`cfl_bench.metrics.summarize`, the very function
that writes ``summary.json``, so a finished run's page shows the summary's numbers; if
they disagree anyway (a summary edited, or written by other code), the page says so.
Only task ends that were reached count: an accuracy measured during a task that has not
ended (``--eval-every-round``) is not that task's end-of-task evaluation, and using it
would put a number in the accuracy matrix that the finished run would never hold.

``records.csv`` is read with :func:`cfl_bench.records.read_rows` (exact floats) and every
row is checked: the header, integer task and round columns, known scopes, and values in the
possible range of their metric (an accuracy of 150 % or a negative byte count cannot have
been measured). A training loss may be infinite or NaN: that is how a run diverges. A last
line cut in half (a run killed while appending) is dropped for an unfinished or failed run
(the sweep records a killed run as failed), with a note; in a finished or diverged run,
whose summary the engine wrote after its last record, it means the file was damaged.
"""

from __future__ import annotations

import math
import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cfl_bench import metric_registry as registry
from cfl_bench.errors import UserError
from cfl_bench.run_dir import os_problem
from leaderboard.runs import CONFIG, SUMMARY, DamagedRunError, parse_run, read_record

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

RECORDS = "records.csv"
#: What a report calls a run without ``summary.json`` (the leaderboard's ``incomplete``).
UNFINISHED = "unfinished"
#: The fix named after every problem with a run's files.
DAMAGED_FIX = "re-run that run or pass another run directory"
#: Possible ranges of the recorded metrics (from the metric registry); non-finite values are
#: refused for all of them. Metrics not listed (a newer engine's) are shown nowhere and so
#: not checked.
VALUE_RANGES: dict[str, tuple[float, float]] = {r.name: r.range for r in registry.RECORDED}
#: Slack at the ends of a range, for float rounding in a legitimately measured value.
SLACK = 1e-9
#: Metrics that the accuracy matrices and memory drift are built from (task ends only).
TASK_END_METRICS: tuple[str, ...] = tuple(r.name for r in registry.RECORDED if r.task_end)
#: Summary keys compared with the values recomputed from records.csv.
CROSS_CHECKED: tuple[str, ...] = tuple(s.key for s in registry.view("cross_check"))
_CLIENT = re.compile(r"client_(\d+)")


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
    from leaderboard.runs import find_run_dirs

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
    if has_config:
        return folder
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


def _read_json(run_dir: str, folder: Path, name: str) -> dict[str, Any] | None:
    path = folder / name
    if not os.path.lexists(path):
        return None
    try:
        return read_record(path)
    except DamagedRunError as exc:
        raise _refuse(run_dir, str(exc)) from None


def _records_text(run_dir: str, path: Path) -> str:
    """The raw text of records.csv, or a UserError (missing, not a file, not UTF-8)."""
    if not os.path.lexists(path):
        raise UserError(
            f"run directory '{run_dir}' has no records.csv, so there is nothing to report; "
            f"{DAMAGED_FIX}."
        )
    try:
        if not path.is_file():
            raise _refuse(run_dir, "records.csv is not a file")
        raw = path.read_bytes()
    except OSError as exc:
        raise _refuse(run_dir, f"records.csv cannot be read ({os_problem(exc)})") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _refuse(run_dir, f"records.csv is not UTF-8 text (byte {exc.start})") from None


def read_records(
    run_dir: str, folder: Path, complete: bool, num_tasks: int, clients: int | None
) -> tuple[pd.DataFrame, list[str]]:
    """records.csv read exactly and checked (see the module docstring), and notes for the
    page. ``complete``: the engine itself ended the run (finished or diverged) and wrote its
    summary after the last record, so a cut last line is damage; a run that is unfinished
    or failed (a crash, or a kill the sweep recorded) may have been stopped mid-write."""
    from cfl_bench.metrics import RECORD_COLUMNS
    from cfl_bench.records import read_rows

    path = folder / RECORDS
    text = _records_text(run_dir, path)
    header = ",".join(RECORD_COLUMNS)
    first = text.split("\n", 1)[0].rstrip("\r")
    if first != header:
        shown = first if len(first) <= 60 else first[:57] + "..."
        raise _refuse(run_dir, f"records.csv starts with {shown!r}, not the header {header!r}")
    notes: list[str] = []
    source = path
    cut = text.count("\n") >= 1 and not text.endswith("\n")
    with tempfile.TemporaryDirectory(prefix="cfl-bench-report-") as scratch:
        if cut:
            if complete:
                raise _refuse(run_dir, "records.csv ends in the middle of a line")
            kept = text[: text.rindex("\n") + 1]
            notes.append(
                f"The last line of records.csv was cut off (the run was stopped while "
                f"writing it) and is left out: line {kept.count(chr(10)) + 1}."
            )
            source = Path(scratch) / RECORDS
            source.write_text(kept, encoding="utf-8")
        try:
            frame = read_rows(source)
        except (ValueError, TypeError, OverflowError) as exc:  # pandas' ParserError included
            reason = str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__
            raise _refuse(run_dir, f"records.csv cannot be parsed ({reason})") from None
    check_records(run_dir, frame, num_tasks, clients)
    return frame, notes


def check_records(run_dir: str, frame: pd.DataFrame, num_tasks: int, clients: int | None) -> None:
    """Refuse a records table cfl-bench cannot have written (the first bad line is named)."""
    from pandas.api.types import is_integer_dtype

    from cfl_bench.metrics import RECORD_COLUMNS

    if list(frame.columns) != list(RECORD_COLUMNS):
        raise _refuse(run_dir, f"records.csv has the columns {list(frame.columns)}")
    for column in ("round", "trained_task", "eval_task"):
        if len(frame) and not is_integer_dtype(frame[column]):
            bad = _first_bad(frame[column].map(_whole))
            where = f"records.csv line {bad}" if bad else "records.csv"
            raise _refuse(run_dir, f"{where}: '{column}' is not an integer")
    for column in ("scope", "metric"):
        bad = _first_bad(frame[column].map(lambda v: isinstance(v, str) and v != ""))
        if bad:
            raise _refuse(run_dir, f"records.csv line {bad}: '{column}' is empty or not text")
    checks = [
        ("round", frame["round"] >= 0, "a round below 0"),
        ("trained_task", frame["trained_task"].between(-1, num_tasks - 1), "no task of the run"),
        ("eval_task", frame["eval_task"].between(-1, num_tasks - 1), "no task of the run"),
    ]
    for column, ok, what in checks:
        bad = _first_bad(ok)
        if bad:
            value = frame[column].iloc[bad - 2]
            raise _refuse(run_dir, f"records.csv line {bad}: '{column}' {value} is {what}")
    bad = _first_bad(frame["scope"].map(lambda s: _scope_ok(s, clients)))
    if bad:
        scope = str(frame["scope"].iloc[bad - 2])[:40]
        raise _refuse(run_dir, f"records.csv line {bad}: scope {scope!r} is not a known scope")
    for metric, (low, high) in VALUE_RANGES.items():
        values = frame.loc[frame["metric"] == metric, "value"]
        inside = values.map(lambda v, lo=low, hi=high: lo - SLACK <= v <= hi + SLACK)
        outside = values[~inside.astype(bool)]
        if len(outside):
            line = int(outside.index[0]) + 2
            raise _refuse(
                run_dir,
                f"records.csv line {line}: {metric} {float(outside.iloc[0])!r} is outside its "
                f"possible range [{low:g}, {high:g}]",
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


def _disagreements(summary: dict[str, Any], metrics: dict[str, Any]) -> list[str]:
    """Summary keys whose value differs from the one recomputed from records.csv."""
    out = []
    for key in CROSS_CHECKED:
        stored, computed = summary.get(key), metrics.get(key)
        if isinstance(stored, (int, float)) and isinstance(computed, (int, float)):
            if not math.isclose(stored, computed, rel_tol=1e-9, abs_tol=1e-9):
                out.append(f"{key} ({stored!r} in summary.json, {computed!r} from records.csv)")
        elif (stored is None) != (computed is None):
            out.append(f"{key} ({stored!r} in summary.json, {computed!r} from records.csv)")
    return out


def _stream_task_count(run_dir: str, config: dict[str, Any]) -> int:
    """The task count config.json's stream description gives (runs that did not record it
    in their identity); a refusal when it is missing or not a positive integer."""
    stream = config.get("stream")
    tasks = stream.get("num_tasks") if isinstance(stream, dict) else None
    if type(tasks) is not int or tasks < 1:
        raise _refuse(run_dir, "config.json does not say how many tasks the run has")
    return tasks


def load_run_data(run_dir: str) -> RunData:
    """Read and check everything a report shows about the run in ``run_dir``."""
    from cfl_bench.metrics import summarize

    folder = check_run_dir(run_dir)
    config = _read_json(run_dir, folder, CONFIG) or {}
    summary = _read_json(run_dir, folder, SUMMARY)
    try:
        identity = parse_run(run_dir, config, summary)
    except DamagedRunError as exc:
        raise _refuse(run_dir, str(exc)) from None
    num_tasks = identity["num_tasks"]
    if num_tasks is None:
        num_tasks = _stream_task_count(run_dir, config)
    status = identity["status"]
    message = str(identity["message"] or "")
    if status == "incomplete":
        status = UNFINISHED
    protocol = identity["protocol"] or {}
    clients = protocol.get("clients") if type(protocol.get("clients")) is int else None
    complete = status in ("finished", "diverged")
    records, notes = read_records(run_dir, folder, complete, num_tasks, clients)
    ends, total, offsets = task_clock(run_dir, config, num_tasks)
    rounds_done = int(records["round"].max()) if len(records) else 0
    if total is not None and rounds_done > total:
        raise _refuse(run_dir, f"records.csv has round {rounds_done} of a {total}-round run")
    tasks_done = sum(1 for end in ends if end <= rounds_done) if ends else 0
    try:
        metrics = summarize(task_end_records(records, ends, rounds_done), num_tasks)
    except ValueError as exc:
        raise _refuse(run_dir, f"records.csv does not fit the run ({exc})") from None
    if status == "finished" and summary is not None:
        differ = _disagreements(summary, metrics)
        if differ:
            notes.append(
                "summary.json disagrees with records.csv on "
                + "; ".join(differ)
                + ". The page shows the values recomputed from records.csv."
            )
    return RunData(
        path=run_dir,
        status=status,
        message=message,
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
