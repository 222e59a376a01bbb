"""Sweep points as Ray tasks: ``cfl-bench sweep --backend ray [--address ADDR]``.

Why Ray and not code of ours: a benchmark's daily work is many runs, and a Ray cluster
already schedules tasks by the resources they declare, across machines, retries them when
a worker or node is lost, and is what ``ray job submit`` and most university clusters
offer. The sweep stays the same program: it expands the grid, checks every point's names,
prepares its folder and bookkeeping, skips finished points and records every outcome as a
local sweep does (``sweep.scheduler``); only where a point runs changes.

Each point is one Ray task declaring ``--cpus-per-run`` CPUs (its torch threads, also its
``OMP_NUM_THREADS``) and ``--gpus-per-run`` GPUs. The task starts
``python -m cfl_bench.sweep.point`` (``sweep.point``) in the sweep's working directory and
returns its exit code: the point runs through the same ``worker.run_point`` as locally, so
its records are the same, it takes the point's lock on the shared sweep folder, and an
interrupted attempt resumes from its checkpoint. The sweep folder must therefore be on a
file system every node sees at the same path (as on a cluster's shared home or scratch).

Retries: Ray re-runs a task whose worker or node died (``RETRIES`` times); the new attempt
resumes from the point's last checkpoint. A task that fails for good reads as a crashed
run: the sweep writes its failed summary with the tail of its log, as for a local child.
Ctrl-C cancels every running task (``ray.cancel(force=True)`` kills the worker, and the
point's process dies with it: ``worker.die_with_sweep``'s ``PR_SET_PDEATHSIG``).

Without ``--address`` Ray's own rule applies: ``RAY_ADDRESS`` (set by ``ray job submit``)
or, when unset, a Ray instance started on this machine for the sweep.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import warnings
from typing import Any

from cfl_bench.errors import UserError
from cfl_bench.sweep import worker
from cfl_bench.sweep.point import job_from_json, job_json

# How many times Ray re-runs a point whose worker or node was lost.
RETRIES = 3


def require_ray() -> Any:
    """The ``ray`` module, or one line saying how to install it."""
    try:
        import ray
    except ImportError:
        raise UserError(
            "--backend ray needs Ray: pip install 'ray>=2.40' (or pip install "
            "'cfl-bench[flower]', which brings it); or drop --backend ray."
        ) from None
    return ray


#: Seconds to wait for the cluster's address to accept a connection before refusing it.
#: Why: ``ray.init`` keeps retrying an address where nothing listens, with a warning every
#: few seconds (measured: still retrying after 2.5 min for 127.0.0.1:1).
REACH_SECONDS = 5.0


def check_reachable(address: str | None) -> None:
    """Refuse, in one line, a cluster address (``--address`` or ``RAY_ADDRESS``) of the
    form ``[scheme://]HOST:PORT`` where nothing accepts a TCP connection. Other forms
    (``auto``, ``local``, none: a Ray instance on this machine) are left to Ray."""
    target = address or os.environ.get("RAY_ADDRESS") or ""
    host, sep, port = target.split("://", 1)[-1].rstrip("/").rpartition(":")
    if not sep or not host or not port.isdigit():
        return
    where = "--address" if address else "RAY_ADDRESS"
    if not 0 < int(port) < 65536:
        raise UserError(f"{where} {target} has no valid port (1-65535); fix {where}.")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=REACH_SECONDS):
            pass
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise UserError(
            f"no Ray cluster answers at {target} ({where}: {reason}); start it "
            f"(ray start --head) or fix {where}."
        ) from None


def point_env(threads: int) -> dict[str, str]:
    """The point process's environment: this one without ``RAY_ADDRESS`` (a run that starts
    Ray itself, a Flower simulation, must not join the sweep's cluster) and with its
    thread count for OpenMP and MKL."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    return env


def run_point_process(job_text: str, cwd: str) -> int:
    """The body of a point's Ray task: the point in its own interpreter; its exit code."""
    job = job_from_json(job_text)
    command = [sys.executable, "-m", "cfl_bench.sweep.point", job_text]
    return subprocess.run(command, cwd=cwd, env=point_env(job.threads), check=False).returncode


def check_placeable(ray: Any, cpus: int, gpus: float, local: bool) -> None:
    """A point's task needs one node with ``cpus`` CPUs and ``gpus`` GPUs; Ray keeps a task
    that no node can hold pending for ever (measured: a sweep with --cpus-per-run 64 on a
    2-core machine waited silently). The Ray instance a sweep starts on this machine cannot
    grow: refuse there; a cluster may add nodes (an autoscaler): say so and go on."""
    sizes = [node["Resources"] for node in ray.nodes() if node.get("Alive")]
    if any(r.get("CPU", 0) >= cpus and r.get("GPU", 0) >= gpus for r in sizes):
        return
    largest = max(sizes, key=lambda r: (r.get("CPU", 0), r.get("GPU", 0)), default={})
    have = f"{largest.get('CPU', 0):g} CPUs and {largest.get('GPU', 0):g} GPUs"
    want = f"--cpus-per-run {cpus} and --gpus-per-run {gpus:g}"
    if local:
        ray.shutdown()
        raise UserError(
            f"this machine's Ray has {have}, too few for a point's {want}; lower them, or "
            "give --address of a cluster with a node that large."
        )
    print(
        f"note: no node of the Ray cluster has room for a point's {want} now (the largest "
        f"has {have}); the points wait until such a node joins (Ctrl-C stops the sweep).",
        file=sys.stderr,
        flush=True,
    )


class RayBackend:
    """The sweep's ``Backend`` on a Ray cluster (``sweep.launcher.Backend``)."""

    def __init__(self, address: str | None, cpus_per_run: int, gpus_per_run: float) -> None:
        self.ray = require_ray()
        self.cpus = cpus_per_run
        try:
            with warnings.catch_warnings():  # Ray 2.5x's tip about a future default
                warnings.simplefilter("ignore", FutureWarning)
                self.ray.init(address=address, logging_level="ERROR", log_to_driver=False)
        except ConnectionError as exc:
            raise UserError(
                f"could not reach the Ray cluster at {address or 'RAY_ADDRESS'}: {exc}; "
                "start it (ray start --head) or fix --address."
            ) from None
        local = address is None and not os.environ.get("RAY_ADDRESS")
        check_placeable(self.ray, cpus_per_run, gpus_per_run, local)
        task = self.ray.remote(run_point_process)
        self.task = task.options(num_cpus=cpus_per_run, num_gpus=gpus_per_run, max_retries=RETRIES)
        self.cwd = os.getcwd()

    def threads(self, jobs: int, requested: int | None) -> int:
        """The grid's ``threads`` if it sets one, else the CPUs each task holds."""
        return requested if requested is not None else self.cpus

    def start(self, job: worker.RunJob) -> Any:
        return self.task.remote(job_json(job), self.cwd)

    def wait(self, handles: list[Any], timeout: float) -> list[Any]:
        ready, _ = self.ray.wait(handles, num_returns=len(handles), timeout=timeout)
        return list(ready)

    def exit_code(self, handle: Any) -> int | None:
        try:
            return int(self.ray.get(handle))
        except self.ray.exceptions.RayError:  # lost for good after the retries
            return None

    def kill(self, handle: Any) -> None:
        self.ray.cancel(handle, force=True)

    def describe(self, handle: Any) -> dict[str, Any]:
        return {"ray_task": handle.task_id().hex()[:16]}

    def close(self) -> None:
        """Disconnect from the cluster (and stop a Ray instance the sweep started)."""
        self.ray.shutdown()
