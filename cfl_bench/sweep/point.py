"""``python -m cfl_bench.sweep.point JOB``: one grid point in a fresh interpreter.

Why: on a Ray cluster (``sweep.ray_backend``) a point runs as a Ray task on whichever node
has the CPUs, and the task starts this module as a subprocess. The point then runs exactly
as in a local sweep (``worker.run_point``: the point's lock, the skip rule, resume from its
checkpoint, the log, the exit codes) in a process of its own: its crash, its memory, its
torch threads, and no Ray of its own (a Flower simulation inside the run starts its own Ray
instead of joining the sweep's cluster, because ``RAY_ADDRESS`` is removed from its
environment). ``JOB`` is the ``RunJob`` as JSON (``job_json``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from cfl_bench.sweep.worker import RunJob, run_point

PATH_FIELDS = ("run_dir", "lock_path", "log_path")


def job_json(job: RunJob) -> str:
    """``job`` as JSON text, its paths absolute (a task may run in another folder)."""
    fields = {
        "name": job.name,
        "request": job.request,
        "request_hash": job.request_hash,
        "threads": job.threads,
    }
    fields.update({name: str(Path(getattr(job, name)).resolve()) for name in PATH_FIELDS})
    return json.dumps(fields, sort_keys=True)


def job_from_json(text: str) -> RunJob:
    """The ``RunJob`` of ``job_json``'s text."""
    fields = json.loads(text)
    for name in PATH_FIELDS:
        fields[name] = Path(fields[name])
    return RunJob(**fields)


def main(argv: list[str]) -> None:
    if len(argv) != 1:
        raise SystemExit("usage: python -m cfl_bench.sweep.point JOB_JSON")
    run_point(job_from_json(argv[0]))


if __name__ == "__main__":
    main(sys.argv[1:])
