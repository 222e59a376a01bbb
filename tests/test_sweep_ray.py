"""``cfl-bench sweep --backend ray``: a real Ray cluster of two nodes on loopback.

The cluster is a head of one CPU and a second node of one CPU (``bench.ray_cluster``:
``ray start --block`` children stopped by PID, so no other Ray on the machine is touched).
The same 6-point grid runs as a local sweep (``--jobs 2``) and on the cluster
(``--cpus-per-run 1``: at most two points at once, one per node); every point's records
must be byte-identical, and a rerun of the cluster sweep skips every point. A point whose
Ray worker is SIGKILLed mid-run is retried by Ray and resumes from its checkpoint.
"""

from __future__ import annotations

import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from bench.ray_cluster import loopback_cluster, ray_env
from cfl_bench.errors import UserError
from cfl_bench.sweep import ledger
from cfl_bench.sweep.command import Placement
from cfl_bench.sweep.grid import build_spec, expand
from cfl_bench.sweep.point import job_from_json, job_json
from cfl_bench.sweep.ray_backend import point_env
from cfl_bench.sweep.worker import RunJob
from tests.sweep_helpers import TINY, comparable, events, in_process, summaries, sweep_command

ray = pytest.importorskip("ray")

GRID = [
    "--stream", "rot-digits", "--strategy", "fedavg", "--model", "mlp",
    *TINY, "--seed", "0", "--seed", "1", "--seed", "2", "--lr", "0.05", "--lr", "0.1",
]  # fmt: skip


def default_cluster_file() -> tuple[float, str] | None:
    """Ray's machine-wide "current cluster" file (``/tmp/ray/ray_current_cluster``): its
    mtime and address, or None when absent."""
    path = Path(tempfile.gettempdir()) / "ray" / "ray_current_cluster"
    return (path.stat().st_mtime, path.read_text()) if path.exists() else None


@pytest.fixture(scope="module")
def cluster() -> Iterator[str]:
    before = default_cluster_file()
    with loopback_cluster([1, 1]) as address:
        yield address
    # A stale file there would make every later ray.init() without an address hang.
    assert default_cluster_file() == before


def test_a_grid_on_two_nodes_equals_the_local_sweep_and_reruns_skip(
    cluster: str, tmp_path: Path
) -> None:
    local, remote = tmp_path / "local", tmp_path / "ray"
    code, output = in_process("sweep", "--out", str(local), "--jobs", "2", *GRID)
    assert code == 0, output
    command = sweep_command(
        remote, "--backend", "ray", "--address", cluster, "--cpus-per-run", "1", *GRID
    )
    started = time.monotonic()
    done = subprocess.run(command, env=ray_env(), capture_output=True, text=True, check=False)
    print(f"ray sweep of 6 points: {time.monotonic() - started:.1f} s")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    runs = sorted(p.parent.name for p in local.glob("*/records.csv"))
    assert len(runs) == 6
    for name in runs:
        assert (remote / name / "records.csv").read_bytes() == (
            local / name / "records.csv"
        ).read_bytes(), name
    assert sum(events(remote, "start").values()) == 6
    again = subprocess.run(command, env=ray_env(), capture_output=True, text=True, check=False)
    assert again.returncode == 0, again.stdout[-3000:]
    assert sum(events(remote, "skip").values()) == 6
    assert sum(events(remote, "start").values()) == 6  # nothing ran a second time


def test_a_point_whose_ray_worker_is_killed_mid_run_is_retried_and_resumes(
    cluster: str, tmp_path: Path
) -> None:
    """A lost worker (here SIGKILLed, as when a node's OOM killer strikes): Ray re-runs the
    task, the point's process died with its worker (``PR_SET_PDEATHSIG``) and released its
    lock, and the retry resumes from the last checkpoint to the uninterrupted records."""
    args = ["--seed", "3", "--threads", "1", "--checkpoint-every", "1", "--tasks", "2"]
    args += ["--rounds-per-task", "30", "--train-size", "300", "--test-size", "100"]
    out = tmp_path / "killed"
    (point,) = expand(build_spec(None, args, str(out)))
    log = out / ledger.BOOKKEEPING / f"{point.name}.log"
    command = sweep_command(out, "--backend", "ray", "--address", cluster, *args)
    sweep = subprocess.Popen(command, env=ray_env(), stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while "round 5/" not in (log.read_text() if log.exists() else ""):
        assert sweep.poll() is None and time.monotonic() < deadline, "the run ended too soon"
        time.sleep(0.01)
    (runner,) = [p for p in psutil.process_iter(["cmdline"]) if _runs(p, point.name)]
    ray_worker = runner.parent()
    assert ray_worker is not None
    ray_worker.kill()
    runner.wait(timeout=15)  # gone with its worker, not left writing into the run folder
    output, _ = sweep.communicate(timeout=300)
    assert sweep.returncode == 0, output[-3000:]
    assert "resuming from round" in log.read_text()
    assert events(out, "start")[point.name] == 1 and events(out, "finish")[point.name] == 1
    reference = tmp_path / "reference"
    code, text = in_process("sweep", "--out", str(reference), *args)
    assert code == 0, text
    assert (out / point.name / "records.csv").read_bytes() == (
        reference / point.name / "records.csv"
    ).read_bytes()
    assert comparable(summaries(out)[point.name]) == comparable(summaries(reference)[point.name])


def _runs(process: psutil.Process, name: str) -> bool:
    """Whether ``process`` is the ``cfl_bench.sweep.point`` process of point ``name``."""
    command = " ".join(process.info["cmdline"] or [])
    return "cfl_bench.sweep.point" in command and name in command


def test_the_job_travels_as_json_with_absolute_paths(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    job = RunJob("p", Path("out/p"), Path("out/.sweep/p.lock"), Path("l.log"), {"a": 1}, "h", 3)
    back = job_from_json(job_json(job))
    assert back.run_dir == tmp_path / "out" / "p" and back.run_dir.is_absolute()
    assert (back.request, back.request_hash, back.threads, back.name) == ({"a": 1}, "h", 3, "p")


def test_the_point_process_gets_its_threads_and_no_ray_address(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    env = point_env(4)
    assert "RAY_ADDRESS" not in env
    assert env["OMP_NUM_THREADS"] == env["MKL_NUM_THREADS"] == "4"


@pytest.mark.parametrize(
    ("placement", "message"),
    [
        (Placement(address="127.0.0.1:1"), "--address applies to --backend ray only"),
        (Placement(cpus_per_run=2), "--cpus-per-run applies to --backend ray or --slurm-script"),
        (Placement("ray", cpus_per_run=0), "--cpus-per-run must be at least 1"),
        (Placement("ray", gpus_per_run=-1.0), "--gpus-per-run must be between 0 and 64"),
        (Placement("slurm"), "unknown --backend 'slurm'"),
    ],
)
def test_refusals(placement: Placement, message: str) -> None:
    with pytest.raises(UserError, match=message):
        placement.check()
