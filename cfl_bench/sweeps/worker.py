"""What runs inside one sweep child process.

Every grid point runs in its own process, forked from a server that has already imported
the engine (see ``launcher``), so a crash, a segfault or an out-of-memory kill of one run
cannot take the sweep down, ``--jobs N`` is real parallelism, and a child starts in
milliseconds instead of paying torch's import again.

Kill safety, in order, before the child touches the run directory:

1. The child dies with the sweep. Its parent is the fork server, not the sweep, and the
   server outlives the sweep while any child runs (every child holds the server's "alive"
   pipe), so ``PR_SET_PDEATHSIG`` alone would not do: a watchdog thread waits on
   ``multiprocessing.parent_process().sentinel`` — a pipe whose other end only the sweep
   holds — and SIGKILLs its own process the moment the sweep is gone (also at once if the
   sweep died before the child started). ``PR_SET_PDEATHSIG = SIGKILL`` covers the server's
   death as well. So ``kill -9`` of the sweep leaves no run writing into a run directory.
2. An exclusive ``flock`` on ``<out>/.sweep/<name>.lock``, held until the child exits (the
   kernel releases it even on SIGKILL): two sweeps never run the same point at once. A child
   that finds the point locked waits for the other sweep's run to end, then applies the skip
   rule — so when both sweeps end, neither reports the point as busy.
3. Under the lock, the skip rule is checked again (another sweep may have finished the
   point meanwhile → ``EXIT_ALREADY_DONE``); otherwise the run starts, resuming from the
   point's checkpoint when an earlier attempt was interrupted (``cfl-bench run``'s own rule:
   same configuration, a checkpoint, no summary), from scratch otherwise.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import multiprocessing
import os
import signal
import sys
import threading
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import IO, Any

from cfl_bench.core.errors import UserError
from cfl_bench.sweeps import ledger

EXIT_USER_ERROR = 2  # the run refused its input (as `cfl-bench run` exits 2)
EXIT_INTERRUPTED = 130  # Ctrl-C (the sweep stops its children itself)
EXIT_ALREADY_DONE = 76  # another sweep finished the point between our check and our lock
PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class RunJob:
    """Everything a child needs to run one grid point (pickled to the fork server)."""

    name: str
    run_dir: Path
    lock_path: Path
    log_path: Path
    request: dict[str, Any]
    request_hash: str
    threads: int


def die_with_sweep() -> None:
    """SIGKILL this process as soon as the sweep that started it (or the fork server) dies."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    sweep = multiprocessing.parent_process()
    if sweep is None:  # not started by multiprocessing: nothing to watch
        return
    sentinel = sweep.sentinel

    def watch(timeout: float | None = None) -> None:
        if wait([sentinel], timeout):  # ready exactly when the sweep's end of the pipe closed
            os.kill(os.getpid(), signal.SIGKILL)

    watch(timeout=0)  # already gone: stop before touching any file
    threading.Thread(target=watch, name="die-with-sweep", daemon=True).start()


def redirect_output(log_path: Path) -> None:
    """Point fds 1 and 2 at the point's log: the sweep reads its tail if the run fails."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def try_lock(lock_path: Path, wait: bool = False) -> IO[bytes] | None:
    """The point's lock file, exclusively locked; None when another process holds it (with
    ``wait``, block until it lets go instead)."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    handle = open(lock_path, "ab")  # noqa: SIM115 - held open until the process exits
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
    except BlockingIOError:
        handle.close()
        return None
    return handle


def run_point(job: RunJob) -> None:
    """Child entry point: run one grid point into its directory; the exit code says how.

    0: the run finished or diverged (summary.json written by the engine, with the request
    hash); 2: the run refused its input; 1: any other exception (traceback in the log);
    ``EXIT_ALREADY_DONE`` as documented above.
    """
    die_with_sweep()
    redirect_output(job.log_path)
    lock = try_lock(job.lock_path)
    if lock is None:
        print(f"{job.name} is being run by another sweep; waiting for it", flush=True)
        lock = try_lock(job.lock_path, wait=True)
        assert lock is not None
    with contextlib.closing(lock):
        if ledger.is_done(job.run_dir, job.request_hash):
            sys.exit(EXIT_ALREADY_DONE)
        try:
            ledger.check_run_dir(job.run_dir)
            summary = _execute(job)
        except UserError as exc:
            print(f"error: {exc}", file=sys.stderr, flush=True)
            sys.exit(EXIT_USER_ERROR)
        except KeyboardInterrupt as exc:  # Ctrl-C reaches the whole process group
            print(str(exc) or "interrupted", file=sys.stderr, flush=True)
            sys.exit(EXIT_INTERRUPTED)
        print(f"{job.name}: {summary.get('status')} Acc_T={summary.get('Acc_T')}", flush=True)


def _execute(job: RunJob) -> dict[str, object]:
    from cfl_bench.engine.progress import RoundLog
    from cfl_bench.runner.config import RunConfig
    from cfl_bench.runner.run import execute

    # overwrite: a leftover of another request (e.g. a renamed protocol) is replaced; a run
    # of this very configuration resumes from its checkpoint.
    values = {**job.request, "out": str(job.run_dir), "threads": job.threads, "overwrite": True}
    config = RunConfig(**values)
    print(f"running {job.name} with {job.threads} thread(s)", flush=True)
    result = execute(
        config,
        on_round=RoundLog(),  # one line per round in the point's log: tail -f follows it
        annotations={"request_hash": job.request_hash, "sweep_point": job.name},
        notify=lambda text: print(text, flush=True),
    )
    return result.summary


def check_names(requests: list[dict[str, Any]], conn: Connection) -> None:
    """Child entry point: the name-level checks of `cfl-bench run` for every request.

    Strategy grammar, stream, model and partition names are refused before any run starts;
    this needs the engine's registries, which the fork server has already imported (the
    sweep process itself never imports torch). Sends one error message or None per request.
    """
    die_with_sweep()
    with contextlib.closing(conn):
        conn.send([name_error(r) for r in requests])


def name_error(request: dict[str, Any]) -> str | None:
    """The first name-level refusal `cfl-bench run` would give this request, if any."""
    from cfl_bench.runner.models import MODELS
    from cfl_bench.strategies.compose import validate_strategy
    from cfl_bench.streams.catalogue import require_data_root
    from cfl_bench.streams.partition import partitioner_from_spec
    from cfl_bench.streams.registry import stream_info

    try:
        validate_strategy(str(request["strategy"]))
        info = stream_info(str(request["stream"]))
        require_data_root(
            info.name, request.get("data_root") or None, bool(request.get("download"))
        )
        model = request.get("model") or info.default_model
        if model not in MODELS:
            raise UserError(f"unknown model '{model}'; choose one of: {', '.join(sorted(MODELS))}.")
        partitioner_from_spec(str(request.get("partition") or info.default_partition))
    except UserError as exc:
        return str(exc)
    return None
