"""How sweep children are started, and with how many torch threads.

Why a fork server: importing the engine (torch, pandas, scikit-learn) takes seconds while a
small run takes a fraction of that, so ``python -m cfl_bench.cli run`` per point would spend
most of a sweep importing. ``multiprocessing``'s fork server is a fresh interpreter (started
by exec, so nothing of the sweep's own state or threads is inherited) that imports the engine
once and forks one child per run: each child is still its own process — its own crash, its
own memory, real parallelism — but starts in milliseconds. The server never runs any torch
computation, so forking it is safe for OpenMP.

The server and its children stay in the sweep's process group (Ctrl-C reaches them all);
each child kills itself the moment the sweep is gone and asks the kernel to SIGKILL it if the
server goes (``worker.die_with_sweep``), and the server exits once the sweep and its children
are gone: killing the sweep with SIGKILL leaves no run behind writing into a run directory.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import sys
from collections.abc import Iterator
from multiprocessing.connection import wait
from multiprocessing.context import ForkServerContext, SpawnContext
from multiprocessing.process import BaseProcess
from typing import Any, Protocol

from cfl_bench.sweeps import worker

PRELOAD = ["cfl_bench.sweeps.worker", "cfl_bench.runner.run"]


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask, not the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def threads_per_run(jobs: int, requested: int | None, cores: int | None = None) -> int:
    """The grid's ``threads`` if it sets one, else the usable cores shared by the parallel
    runs (at least 1): N runs with cores/N threads each keep the machine busy without
    oversubscribing it."""
    if requested is not None:
        return requested
    return max(1, (usable_cores() if cores is None else cores) // jobs)


class Backend(Protocol):
    """Where a sweep's points run: this machine's fork server (``Launcher``) or a Ray
    cluster (``sweep.ray_backend.RayBackend``). A handle stands for one started point."""

    def threads(self, jobs: int, requested: int | None) -> int:
        """The torch threads of one point."""
        ...

    def start(self, job: worker.RunJob) -> Any:
        """Start ``job``; returns its handle."""
        ...

    def wait(self, handles: list[Any], timeout: float) -> list[Any]:
        """The handles of ``handles`` whose points have ended (waiting at most
        ``timeout`` seconds for one)."""
        ...

    def exit_code(self, handle: Any) -> int | None:
        """An ended point's exit code (``worker``'s codes; negative: killed by that
        signal; None: unknown)."""
        ...

    def kill(self, handle: Any) -> None:
        """Stop a running point at once (it resumes from its checkpoint next time)."""
        ...

    def describe(self, handle: Any) -> dict[str, Any]:
        """What sweep.log records of a started point (its pid, or where it runs)."""
        ...

    def close(self) -> None:
        """Release what the backend holds once the sweep's points have ended."""
        ...


@contextlib.contextmanager
def main_script_hidden() -> Iterator[None]:
    """Start children without re-running the caller's script in them.

    ``multiprocessing`` re-imports a script run as ``python script.py`` in every child it
    starts (the reason scripts need ``if __name__ == "__main__":``); a script calling
    ``cfl_bench.sweep(...)`` at its top would then start the sweep again inside each point.
    The children run only cfl-bench's own code (``worker``), so the script's path is hidden
    while a child starts, as a notebook (which has none) always is. Module mains
    (``python -m cfl_bench``) are imported by name as before.
    """
    main = sys.modules.get("__main__")
    path = None if main is None or main.__spec__ is not None else main.__dict__.get("__file__")
    if path is None:
        yield
        return
    del main.__file__  # type: ignore[union-attr]
    try:
        yield
    finally:
        main.__file__ = path  # type: ignore[union-attr]


class Launcher:
    """Starts run children (and the one-off name check) from the preloaded fork server:
    the local ``Backend``."""

    def __init__(self) -> None:
        self.context: ForkServerContext | SpawnContext
        if "forkserver" in multiprocessing.get_all_start_methods():
            self.context = multiprocessing.get_context("forkserver")
            self.context.set_forkserver_preload(PRELOAD)
        else:
            self.context = multiprocessing.get_context("spawn")

    def threads(self, jobs: int, requested: int | None) -> int:
        return threads_per_run(jobs, requested)

    def start(self, job: worker.RunJob) -> BaseProcess:
        process = self.context.Process(
            target=worker.run_point, args=(job,), name=f"cfl-bench sweep {job.name}"
        )
        with main_script_hidden():
            process.start()
        return process

    def wait(self, handles: list[BaseProcess], timeout: float) -> list[BaseProcess]:
        by_sentinel = {p.sentinel: p for p in handles}
        ended = wait(list(by_sentinel), timeout=timeout)
        return [by_sentinel[s] for s in ended if isinstance(s, int)]  # sentinels are ints

    def exit_code(self, handle: BaseProcess) -> int | None:
        handle.join()
        return handle.exitcode

    def kill(self, handle: BaseProcess) -> None:
        handle.kill()
        handle.join()

    def describe(self, handle: BaseProcess) -> dict[str, Any]:
        return {"child": handle.pid}

    def close(self) -> None:
        """Nothing to release: the fork server exits with the sweep."""

    def check_names(self, requests: list[dict[str, Any]]) -> list[str | None]:
        """One error message (or None) per request, from ``worker.check_names``."""
        receiver, sender = self.context.Pipe(duplex=False)
        process = self.context.Process(target=worker.check_names, args=(requests, sender))
        with main_script_hidden():
            process.start()
        sender.close()
        try:
            errors: list[str | None] | None = receiver.recv()
        except EOFError:
            errors = None
        finally:
            receiver.close()
            process.join()
        if errors is None:
            raise RuntimeError(
                f"the sweep's name check died with exit code {process.exitcode}; see above."
            )
        return errors
