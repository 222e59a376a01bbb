"""``python -m cfl_bench.sweeps.point JOB``: one grid point in a fresh interpreter.

Why: on a Ray cluster (``sweep.ray_backend``) a point runs as a Ray task on whichever node
has the CPUs, and the task starts this module as a subprocess. The point then runs exactly
as in a local sweep (``worker.run_point``: the point's lock, the skip rule, resume from its
checkpoint, the log, the exit codes) in a process of its own: its crash, its memory, its
torch threads, and no Ray of its own (a Flower simulation inside the run starts its own Ray
instead of joining the sweep's cluster, because ``RAY_ADDRESS`` is removed from its
environment). ``JOB`` is the ``RunJob`` as JSON (``job_json``).

``python -m cfl_bench.sweeps.point --jobs-file FILE --index I`` runs line ``I`` (from 0) of a
file of such lines instead: a Slurm array task (``sweep.slurm``) knows only its index, and a
whole grid's JSON would not fit on one command line of an ``#SBATCH`` script. SIGTERM (a
batch scheduler's stop, Slurm's time limit or ``scancel``) ends the point like Ctrl-C: exit
130, and its last checkpoint is kept for the next attempt.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from cfl_bench.runner.interrupts import stop_on_sigterm
from cfl_bench.sweeps.worker import RunJob, run_point

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


def job_at(jobs_file: Path, index: int) -> RunJob:
    """The ``RunJob`` of line ``index`` (from 0) of a file of ``job_json`` lines."""
    try:
        lines = jobs_file.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise SystemExit(f"cannot read the jobs file {jobs_file}: {exc.strerror or exc}") from None
    if not 0 <= index < len(lines):
        raise SystemExit(
            f"--index {index} is not a line of {jobs_file}: it holds {len(lines)} job(s), "
            f"indices 0 to {len(lines) - 1}."
        )
    return job_from_json(lines[index])


def parse_job(argv: list[str]) -> RunJob:
    """The job of ``JOB_JSON`` or of ``--jobs-file FILE --index I``."""
    parser = argparse.ArgumentParser(
        prog="python -m cfl_bench.sweeps.point",
        description="Run one sweep point (a RunJob) as a local sweep would.",
    )
    parser.add_argument("job", nargs="?", help="the RunJob as JSON (sweep.point.job_json)")
    parser.add_argument("--jobs-file", type=Path, help="a file of RunJob JSON lines")
    parser.add_argument("--index", type=int, help="the line of --jobs-file to run, from 0")
    args = parser.parse_args(argv)
    from_file = args.jobs_file is not None and args.index is not None
    if (args.job is None) == (not from_file) or (args.jobs_file is None) != (args.index is None):
        parser.error("give JOB_JSON, or --jobs-file FILE --index I")
    return job_from_json(args.job) if args.job is not None else job_at(args.jobs_file, args.index)


def main(argv: list[str]) -> None:
    job = parse_job(argv)
    with stop_on_sigterm():
        run_point(job)


if __name__ == "__main__":
    main(sys.argv[1:])
