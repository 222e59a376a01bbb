"""``cfl-bench sweep --slurm-script FILE``: the sweep's pending points as a Slurm job array.

Why a script and not a backend: on a Slurm cluster the scheduler, not a process of ours,
decides when and where each point runs, and the sweep process (on a login node) should not
wait for hours holding a terminal. So the sweep does everything up to running: it expands
and checks the grid, checks every point's names and prepares its folder exactly as a run
would (``sweep.command.prepare``), then writes

- ``<out>/slurm/jobs-<hash8>.jsonl``: one pending point per line, the ``RunJob`` as JSON
  with absolute paths (``sweep.point.job_json``); named by its content, so an array still
  running from an earlier script keeps reading its own lines;
- the script: an ``sbatch --array=0-(N-1)[%M]`` job whose task ``i`` runs line ``i`` through
  ``python -m cfl_bench.sweeps.point --jobs-file F --index i``, the same ``worker.run_point``
  as a local or Ray sweep (the point's lock, the skip rule, resume from its checkpoint, its
  log), so the records are the same.

Afterwards the same sweep command without ``--slurm-script`` skips every finished point,
runs what is left on the machine it runs on, and writes sweep.json and the leaderboard. The
sweep folder must be on a file system every node sees at the same path, and every node needs
the same Python environment (the script names this interpreter, ``sys.executable``).
"""

from __future__ import annotations

import hashlib
import os
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from cfl_bench.core.atomic import atomic_write_text
from cfl_bench.core.errors import UserError
from cfl_bench.runner.config import check_path_text
from cfl_bench.runner.run_names import slug
from cfl_bench.sweeps import ledger
from cfl_bench.sweeps.point import job_json
from cfl_bench.sweeps.scheduler import PointState, run_job

# The sweep folder's sub-folder for the jobs files and the array tasks' output.
SLURM_FOLDER = "slurm"
# Characters an ``#SBATCH`` line cannot carry safely in a path: sbatch splits directives on
# whitespace, its quoting is its own, and ``%`` starts a file-name pattern (%A, %a).
DIRECTIVE_UNSAFE = frozenset(" \t\"'\\%")


@dataclass(frozen=True)
class ArrayScript:
    """A written Slurm array: its script, its jobs file and its shape."""

    script: Path
    jobs_file: Path
    count: int
    throttle: int | None
    cpus: int


def check_script_path(text: str) -> None:
    """Refuse a ``--slurm-script`` path that exists, that sits in a missing folder, or that
    cannot be printed on one line; the script is written once, never over another file."""
    try:
        check_path_text(text)
    except ValueError as exc:
        raise UserError(f"--slurm-script {exc}; give a plain file path.") from None
    path = Path(text)
    if path.exists() or path.is_symlink():
        raise UserError(
            f"--slurm-script '{text}' already exists; remove it or give another path (the "
            f"script is never written over an existing file)."
        )
    if not path.parent.is_dir():
        raise UserError(
            f"the folder of --slurm-script '{text}' does not exist; create it or give a path "
            f"in an existing folder."
        )


def check_sweep_folder(out: Path) -> None:
    """Refuse a sweep folder whose absolute path an ``#SBATCH --output`` line cannot hold."""
    folder = str(out.resolve())
    unsafe = sorted(set(folder) & DIRECTIVE_UNSAFE)
    if unsafe:
        shown = ", ".join(repr(ch) for ch in unsafe)
        raise UserError(
            f"the sweep folder '{folder}' contains {shown}, which an #SBATCH --output line "
            f"cannot hold; choose a sweep folder without spaces, quotes, backslashes or '%'."
        )


def jobs_text(states: list[PointState], cpus: int) -> str:
    """One ``job_json`` line per point, in grid order; a point's torch threads are the grid's
    ``threads`` if it sets them, else the CPUs of its array task."""
    lines = []
    for state in states:
        requested = state.point.request.get("threads")
        lines.append(job_json(run_job(state, cpus if requested is None else int(requested))))
    return "\n".join(lines) + "\n"


def write_jobs_file(out: Path, text: str) -> Path:
    """``<out>/slurm/jobs-<hash8>.jsonl`` (temp + rename), named by its content."""
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()[:8]
    path = (out / SLURM_FOLDER / f"jobs-{digest}.jsonl").resolve()
    atomic_write_text(path, text)
    return path


def script_text(out: Path, jobs_file: Path, count: int, throttle: int | None, cpus: int) -> str:
    """The bash script sbatch runs once per array task (its ``#SBATCH`` lines are comments to
    bash, so ``SLURM_ARRAY_TASK_ID=i bash SCRIPT`` runs task ``i`` by hand)."""
    folder = out.resolve()
    array = f"0-{count - 1}" + (f"%{throttle}" if throttle else "")
    command = [sys.executable, "-m", "cfl_bench.sweeps.point", "--jobs-file", str(jobs_file)]
    index = '"${SLURM_ARRAY_TASK_ID:?unset; sbatch --array sets it (by hand: a line, from 0)}"'
    return "\n".join(
        [
            "#!/bin/bash",
            f"#SBATCH --job-name=cfl-sweep-{slug(folder.name, 40)}",
            f"#SBATCH --array={array}",
            f"#SBATCH --cpus-per-task={cpus}",
            f"#SBATCH --output={folder}/{SLURM_FOLDER}/%A_%a.out",
            "# Written by cfl-bench sweep --slurm-script for the sweep folder",
            f"# {folder} ({count} grid point(s)). Task i runs line i (from 0) of the",
            "# jobs file as a local sweep runs a point: its lock, the skip rule, resume",
            "# from its checkpoint, its log in .sweep/<point>.log. The sweep folder must be",
            "# on a file system every node sees at the same path, and every node needs",
            "# this Python environment. Add your site's #SBATCH lines (partition, time,",
            "# account) under those above. Afterwards rerun the sweep command without",
            "# --slurm-script: it skips the finished points and writes the summary.",
            "set -euo pipefail",
            f"cd {shlex.quote(os.getcwd())}",
            f"export OMP_NUM_THREADS={cpus} MKL_NUM_THREADS={cpus}",
            f"exec {shlex.join(command)} --index {index}",
            "",
        ]
    )


def write_script(path: Path, text: str) -> None:
    """``text`` as an executable file at ``path``, complete or not at all, and never over a
    file that appeared since the check (a hard link of a finished temporary file fails if
    ``path`` exists)."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        temporary.write_text(text)
        temporary.chmod(0o755)
        try:
            os.link(temporary, path)
        except FileExistsError:
            raise UserError(
                f"--slurm-script '{path}' appeared while the sweep was prepared; remove it or "
                f"give another path."
            ) from None
    finally:
        temporary.unlink(missing_ok=True)


def write_array(
    out: Path, todo: list[PointState], script: Path, cpus: int, throttle: int | None
) -> ArrayScript:
    """The jobs file and the array script for the pending points ``todo``; sweep.log gets
    one ``slurm`` line per point with its array index."""
    jobs_file = write_jobs_file(out, jobs_text(todo, cpus))
    write_script(script, script_text(out, jobs_file, len(todo), throttle, cpus))
    for index, state in enumerate(todo):
        ledger.append_log(out, "slurm", state.point.name, index=index, jobs=jobs_file.name)
    return ArrayScript(script, jobs_file, len(todo), throttle, cpus)


def submit_line(array: ArrayScript) -> str:
    """The one line that tells the user what was written and what to do next."""
    at_once = f", {array.throttle} at a time" if array.throttle else ""
    return (
        f"wrote {array.script}: a Slurm job array of {array.count} point(s){at_once}, "
        f"{array.cpus} CPU(s) each (jobs in {array.jobs_file}); submit it with "
        f"`sbatch {shlex.quote(str(array.script))}`, and once it has ended rerun this sweep "
        f"command without --slurm-script: it skips the finished points, runs any left here, "
        f"and writes sweep.json and the leaderboard."
    )
