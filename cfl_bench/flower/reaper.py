"""``python -m cfl_bench.flower.reaper HOME``: end a Flower simulation whose launcher died.

Why: ``flwr run ... local`` starts its SuperLink detached (a session of its own), and the
SuperLink starts SuperExec, the ServerApp and Ray, so none of them dies with the process
that launched the run. The launcher stops them by PID when it ends (``flower.launch``),
but a launcher killed with SIGKILL (a sweep killed with ``kill -9``, the OOM killer) runs
no cleanup: the ServerApp would go on writing into the run directory while a resumed run or
another sweep starts on it, and the SuperLink and Ray would hold their ports and cores.

The reaper is started beside the simulation, in a session of its own, with the read end of a
pipe whose write end only the launcher holds; end of file on the pipe means the launcher is
gone, whichever way it ended. Then every process started with the simulation's private
``FLWR_HOME`` is SIGKILLed at once (the ServerApp must stop writing now, not after a grace
period) and the simulation's folder is removed. After a normal end the launcher has already
stopped them, so the reaper finds nothing to do. No torch and no flwr (the standard
library, psutil and the torch-free ``flower.node``): it must start in a fraction of a
second, beside a run that holds the cores.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path

import psutil

from cfl_bench.flower.node import signal_each


def flower_pids(home: Path) -> list[int]:
    """PIDs of the processes started with ``home``'s private ``FLWR_HOME`` (ours alone)."""
    mine = str(home / "flwr")
    pids = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if proc.environ().get("FLWR_HOME") == mine and proc.pid != os.getpid():
                pids.append(proc.pid)
        except (psutil.Error, OSError):
            continue
    return pids


def kill_now(pids: list[int], seconds: float = 10.0) -> None:
    """SIGKILL ``pids`` and wait (at most ``seconds``) until each is gone or a zombie (dead,
    waiting for its parent, which is not the reaper, to collect it)."""
    procs = signal_each(pids, psutil.Process.kill)
    deadline = time.monotonic() + seconds
    while any(running(p.pid) for p in procs) and time.monotonic() < deadline:
        time.sleep(0.05)


def running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie is not)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def reap_after_launcher(home: Path) -> None:
    """Block until standard input ends (the launcher is gone), then end the simulation."""
    while sys.stdin.buffer.read(4096):
        pass
    # Again until a look finds none: a process started while the last look ran (SuperExec
    # launching the ServerApp) was not in it.
    for _ in range(MAX_ROUNDS):
        pids = flower_pids(home)
        if not pids:
            break
        kill_now(pids)
    shutil.rmtree(home, ignore_errors=True)


#: Looks for the simulation's processes at most (each kills what it found).
MAX_ROUNDS = 20


if __name__ == "__main__":
    reap_after_launcher(Path(sys.argv[1]))
