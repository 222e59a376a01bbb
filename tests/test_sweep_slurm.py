"""``cfl-bench sweep --slurm-script FILE``: the pending points as a Slurm job array.

What is tested: the written script (array range, throttle, CPUs, output folder, threads),
its jobs file (only the pending points, in grid order), and its body run here by bash once
per array index with ``SLURM_ARRAY_TASK_ID`` set, as sbatch would (the ``#SBATCH`` lines
are comments to bash); then the plain sweep skips every point and its records are
byte-identical to a plain ``--jobs 1`` sweep of the same grid. What is not: ``sbatch``
itself, other nodes, a shared file system (there is no Slurm on the test machines).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from cfl_bench.sweeps.grid import build_spec, expand
from cfl_bench.sweeps.point import job_json, parse_job
from cfl_bench.sweeps.worker import RunJob
from tests.sweep_helpers import TINY, events, in_process

BASE = ["--stream", "rot-digits", "--strategy", "fedavg", "--model", "mlp", *TINY]
BASE += ["--threads", "1"]
GRID = [*BASE, "--seed", "0", "--seed", "1", "--seed", "2"]


def directives(script: Path) -> dict[str, str]:
    """The script's ``#SBATCH --key=value`` lines, by key."""
    found = re.findall(r"^#SBATCH --([a-z-]+)=(.*)$", script.read_text(), re.MULTILINE)
    return dict(found)


def run_array_task(script: Path, index: int) -> subprocess.Popen[str]:
    """What sbatch starts for array task ``index``: the script's body under bash."""
    env = {**os.environ, "SLURM_ARRAY_TASK_ID": str(index)}
    return subprocess.Popen(
        ["bash", str(script)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def test_the_array_runs_the_pending_points_and_the_rerun_skips_them(tmp_path: Path) -> None:
    plain, swept, script = tmp_path / "plain", tmp_path / "slurm", tmp_path / "run.sbatch"
    names = [p.name for p in expand(build_spec(None, GRID, str(swept)))]
    code, output = in_process("sweep", "--out", str(plain), "--jobs", "1", *GRID)
    assert code == 0, output
    # seed 0 is done before the script is written: it is not in the array
    code, output = in_process("sweep", "--out", str(swept), "--no-leaderboard", *BASE)
    assert code == 0, output

    code, output = in_process(
        "sweep", "--out", str(swept), "--slurm-script", str(script), "--jobs", "2",
        "--cpus-per-run", "1", *GRID,
    )  # fmt: skip
    assert code == 0, output
    said = "".join(output.split())  # the console folds a long path anywhere
    assert f"sbatch{script}" in said and "without--slurm-script" in said
    assert os.access(script, os.X_OK)
    assert directives(script) == {
        "job-name": "cfl-sweep-slurm",
        "array": "0-1%2",
        "cpus-per-task": "1",
        "output": f"{swept.resolve()}/slurm/%A_%a.out",
    }
    assert "export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1" in script.read_text()
    [jobs_file] = (swept / "slurm").glob("jobs-*.jsonl")
    jobs = [json.loads(line) for line in jobs_file.read_text().splitlines()]
    assert [(job["name"], job["threads"]) for job in jobs] == [(names[1], 1), (names[2], 1)]
    assert not (swept / names[1]).exists()  # written, not run

    tasks = [run_array_task(script, index) for index in range(2)]
    for task in tasks:
        log, _ = task.communicate(timeout=300)
        assert task.returncode == 0, log

    code, output = in_process("sweep", "--out", str(swept), *GRID)
    assert code == 0, output
    assert events(swept, "start") == {names[0]: 1}  # the array's points ran outside it
    assert set(events(swept, "skip")) == set(names)
    manifest = json.loads((swept / "sweep.json").read_text())
    assert [(p["status"], p["skipped"]) for p in manifest["points"]] == [("finished", True)] * 3
    assert (swept / "leaderboard" / "leaderboard.csv").is_file()
    for name in names:
        assert (swept / name / "records.csv").read_bytes() == (
            plain / name / "records.csv"
        ).read_bytes(), name

    again = tmp_path / "again.sbatch"
    code, output = in_process("sweep", "--out", str(swept), "--slurm-script", str(again), *GRID)
    assert code == 0 and "nothing to submit" in output, output
    assert not again.exists()


@pytest.mark.parametrize(
    ("folder", "args", "fragment"),
    [
        ("sweep", ["--slurm-script", "{tmp}/taken.sbatch"], "already exists; remove it or give"),
        ("sweep", ["--slurm-script", "{tmp}/no/run.sbatch"], "of --slurm-script '{tmp}/no/run."),
        ("sweep", ["--slurm-script", "{tmp}/s", "--backend", "ray"], "cannot be combined with"),
        ("sweep", ["--cpus-per-run", "2"], "--cpus-per-run applies to --backend ray or --slurm"),
        ("sweep", ["--slurm-script", "{tmp}/s", "--cpus-per-run", "0"], "must be at least 1"),
        ("sweep", ["--slurm-script", "{tmp}/s", "--gpus-per-run", "1"], "applies to --backend ray"),
        ("a b", ["--slurm-script", "{tmp}/s"], "contains ' ', which an #SBATCH --output line"),
    ],
)
def test_refusals_exit_2_and_write_nothing(
    tmp_path: Path, folder: str, args: list[str], fragment: str
) -> None:
    (tmp_path / "taken.sbatch").write_text("mine\n")
    out = tmp_path / folder
    given = [arg.replace("{tmp}", str(tmp_path)) for arg in args]
    code, output = in_process("sweep", "--out", str(out), *given, *BASE, "--seed", "0")
    assert code == 2, output
    assert fragment.replace("{tmp}", str(tmp_path)) in " ".join(output.split())
    assert "Traceback" not in output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken.sbatch"]
    assert (tmp_path / "taken.sbatch").read_text() == "mine\n"


def test_a_point_is_read_from_its_json_or_from_a_line_of_a_jobs_file(tmp_path: Path) -> None:
    jobs = [
        RunJob(f"p{i}", tmp_path / f"p{i}", tmp_path / "lock", tmp_path / "log", {}, "h", 1)
        for i in range(2)
    ]
    jobs_file = tmp_path / "jobs.jsonl"
    jobs_file.write_text("".join(job_json(job) + "\n" for job in jobs))
    assert parse_job([job_json(jobs[0])]) == jobs[0]
    assert parse_job(["--jobs-file", str(jobs_file), "--index", "1"]) == jobs[1]
    with pytest.raises(SystemExit, match=r"--index 2 is not a line of .* holds 2 job"):
        parse_job(["--jobs-file", str(jobs_file), "--index", "2"])
    for wrong in ([], [job_json(jobs[0]), "--index", "0"], ["--jobs-file", str(jobs_file)]):
        with pytest.raises(SystemExit) as stopped:
            parse_job(wrong)
        assert stopped.value.code == 2
