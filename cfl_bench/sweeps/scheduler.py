"""The loop that keeps ``jobs`` run children busy and records how each one ended.

Why the sweep (not the child) writes the failed summary: a child that crashed, segfaulted or
was killed for memory cannot write anything, so the parent turns "exited without a finished
summary" into ``summary.json`` with status "failed", the exit code and the tail of the child's
log — under the point's lock, so it never races another sweep that took the point over.
A failing or diverging run never stops the sweep; Ctrl-C does: running children are killed,
their points are marked interrupted and resume from their last checkpoint next time. A point
another sweep took over is waited for at the end, so no point stays "busy" once both end.
"""

from __future__ import annotations

import contextlib
import signal
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cfl_bench.sweeps import ledger, worker
from cfl_bench.sweeps.grid import GridPoint
from cfl_bench.sweeps.launcher import Backend

TERMINAL = ("finished", "diverged", "failed", "busy")


@dataclass
class PointState:
    """One grid point as this sweep sees it: where it runs and how it ended."""

    point: GridPoint
    out: Path
    status: str = "pending"  # pending | running | finished | diverged | failed | busy | interrupted
    skipped: bool = False  # done before this sweep started (or by another sweep meanwhile)
    returncode: int | None = None
    threads: int | None = None
    wall_time_s: float | None = None
    final_acc: float | None = None
    message: str = ""
    damage: str = ""  # the run found in its folder is damaged: why, and what is done
    started: float | None = field(default=None, repr=False)

    @property
    def run_dir(self) -> Path:
        return self.out / self.point.name

    @property
    def log_path(self) -> Path:
        return self.out / ledger.BOOKKEEPING / f"{self.point.name}.log"

    @property
    def yaml_path(self) -> Path:
        return self.out / ledger.BOOKKEEPING / f"{self.point.name}.yaml"

    @property
    def lock_path(self) -> Path:
        return self.out / ledger.BOOKKEEPING / f"{self.point.name}.lock"

    def absorb(self, summary: dict[str, Any]) -> None:
        """Status and headline numbers from a summary.json."""
        self.status = str(summary.get("status"))
        acc = summary.get("Acc_T")
        self.final_acc = float(acc) if isinstance(acc, (int, float)) else None
        wall = summary.get("wall_time_s")
        self.wall_time_s = float(wall) if isinstance(wall, (int, float)) else self.wall_time_s
        self.message = str(summary.get("message") or "")

    def record(self) -> dict[str, Any]:
        """This point's entry in sweep.json."""
        return {
            "index": self.point.index,
            "name": self.point.name,
            "dir": self.point.name,
            "request_hash": self.point.request_hash,
            "varying": self.point.varying,
            "request": self.point.request,
            "status": self.status,
            "skipped": self.skipped,
            "returncode": self.returncode,
            "threads": self.threads,
            "wall_time_s": self.wall_time_s,
            "Acc_T": self.final_acc,
            "message": self.message,
        }


def run_points(
    states: list[PointState],
    jobs: int,
    backend: Backend,
    on_change: Callable[[PointState], None],
) -> None:
    """Run every pending point, at most ``jobs`` at a time, in grid order."""
    queue = deque(s for s in states if s.status == "pending")
    running: dict[Any, PointState] = {}  # by the backend's handle
    try:
        while queue or running:
            while queue and len(running) < jobs:
                state = queue.popleft()
                running[start(state, jobs, backend)] = state
                on_change(state)
            for handle in backend.wait(list(running), timeout=1.0):
                state = running.pop(handle)
                settle(state, backend.exit_code(handle))
                on_change(state)
        wait_for_busy(states, on_change)
    except BaseException:
        for handle, state in running.items():
            backend.kill(handle)
            state.status = "interrupted"
            where = backend.describe(handle)
            ledger.append_log(state.out, "interrupted", state.point.name, **where)
            on_change(state)
        raise


def run_job(state: PointState, threads: int) -> worker.RunJob:
    """What a child needs to run ``state``'s point with ``threads`` torch threads (also what
    a Slurm array task reads from its jobs file, ``sweep.slurm``)."""
    point = state.point
    return worker.RunJob(
        name=point.name,
        run_dir=state.run_dir,
        lock_path=state.lock_path,
        log_path=state.log_path,
        request=point.request,
        request_hash=point.request_hash,
        threads=threads,
    )


def start(state: PointState, jobs: int, backend: Backend) -> Any:
    point = state.point
    state.threads = backend.threads(jobs, point.request.get("threads"))
    job = run_job(state, state.threads)
    state.started = time.monotonic()
    handle = backend.start(job)
    state.status = "running"
    ledger.append_log(
        state.out, "start", point.name, **backend.describe(handle), threads=state.threads
    )
    return handle


def settle(state: PointState, code: int | None) -> None:
    """Turn a child's exit into the point's status (and, if it failed, its summary.json)."""
    state.returncode = code
    state.wall_time_s = time.monotonic() - (state.started or time.monotonic())
    name = state.point.name
    # The run's own summary is written last and wins over the exit code: a run that finished
    # and then crashed in interpreter teardown is finished, not failed.
    if ledger.is_done(state.run_dir, state.point.request_hash):
        state.absorb(ledger.read_summary(state.run_dir) or {})
        state.skipped = code == worker.EXIT_ALREADY_DONE  # done by another sweep
        event = "skip" if state.skipped else "finish"
        ledger.append_log(state.out, event, name, status=state.status, rc=code)
        return
    record_failure(state, code)


def record_failure(state: PointState, code: int | None) -> None:
    """summary.json with status "failed", written under the point's lock and the run
    directory's (:func:`ledger.write_failed_summary`: never among a user's files)."""
    reason = ledger.tail(state.log_path) or "the run exited without a summary"
    if code is not None and code < 0:
        with contextlib.suppress(ValueError):
            reason += f"\n(killed by {signal.Signals(-code).name})"
    state.status, state.message = "failed", reason
    lock = worker.try_lock(state.lock_path)
    if lock is None:  # another sweep took the point over the moment our child let go
        state.status = "busy"
        ledger.append_log(state.out, "busy", state.point.name, rc=code)
        return
    with lock:
        summary = ledger.failed_summary(
            state.point.request, state.point.request_hash, state.point.name, code, reason
        )
        summary["wall_time_s"] = state.wall_time_s
        ledger.write_failed_summary(state.run_dir, summary)
    ledger.append_log(state.out, "fail", state.point.name, rc=code)


def wait_for_busy(states: list[PointState], on_change: Callable[[PointState], None]) -> None:
    """Points another sweep took over: wait for its run to end, then take its outcome."""
    for state in states:
        if state.status != "busy":
            continue
        lock = worker.try_lock(state.lock_path, wait=True)
        assert lock is not None
        with lock:
            summary = ledger.read_summary(state.run_dir)
        if ledger.is_done(state.run_dir, state.point.request_hash):
            state.absorb(summary or {})
            state.skipped = True
            ledger.append_log(state.out, "skip", state.point.name, status=state.status)
        else:
            state.status = "failed"
            state.message = str((summary or {}).get("message") or "failed in another sweep")
        on_change(state)
