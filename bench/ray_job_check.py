"""``cfl-bench sweep --backend ray`` under ``ray job submit``, ``ray job stop`` and a lost
node, on a loopback cluster: what CI cannot run (its job server is Ray's dashboard, from
``pip install 'ray[default]'``, which the test environment does not install).

    pip install 'ray[default]==<the installed ray>'   # a scratch venv: it moves packaging
    python -m bench.ray_job_check

Three checks, each a sweep submitted with ``ray job submit --address http://HEAD:PORT --
python -m cfl_bench sweep --backend ray ...`` (the driver finds the cluster through the
``RAY_ADDRESS`` that Ray sets for a job) and compared, file by file, with the same grid run
as a local ``--jobs 2`` sweep:

1. ``submit``: 6 short points; then a second submit, which must skip all 6;
2. ``stop``: 2 points of 160 rounds; ``ray job stop`` once both wrote checkpoints; nothing
   may write into the sweep afterwards; a new submit resumes both;
3. ``lost node``: 2 points of 300 rounds; once both wrote checkpoints, the second node's
   ``ray start``, raylet, agents, workers and the point's process are SIGKILLed (a machine
   gone); Ray must re-run the point on the head and it must resume.

Prints one line per check with its verdict and seconds; exits 1 if any failed.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from bench.ray_cluster import free_port, loopback_cluster, ray_env

REPO = Path(__file__).resolve().parents[1]
#: What ``ray[default]`` adds for the dashboard and its job server (plain ``ray`` may have
#: aiohttp through another package, and then the head fails to start its dashboard).
DASHBOARD_MODULES = ("aiohttp", "aiohttp_cors", "opencensus", "prometheus_client")
BASE = ["--stream", "rot-digits", "--model", "mlp", "--tasks", "2", "--no-leaderboard"]
SHORT = [*BASE, "--strategy", "fedavg", "--strategy", "der", "--rounds-per-task", "2"]
SHORT += ["--seed", "0", "--seed", "1", "--seed", "2"]


def long_grid(rounds_per_task: int) -> list[str]:
    """2 FedAvg points (seeds 0, 1) that checkpoint every round."""
    return [*BASE, "--strategy", "fedavg", "--rounds-per-task", str(rounds_per_task),
            "--checkpoint-every", "1", "--seed", "0", "--seed", "1"]  # fmt: skip


def sweep_argv(out: Path, grid: list[str], *extra: str) -> list[str]:
    return [sys.executable, "-m", "cfl_bench", "sweep", "--out", str(out), *grid, *extra]


def job(dashboard: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``ray job ARGS --address DASHBOARD``."""
    command = [sys.executable, "-m", "ray.scripts.scripts", "job", *args]
    command[5:5] = ["--address", dashboard]
    return subprocess.run(command, env=ray_env(), capture_output=True, text=True, check=False)


def submit(dashboard: str, out: Path, grid: list[str], wait: bool = True) -> str:
    """Submit the sweep as a Ray job; its output (``wait``) or its submission id."""
    entry = " ".join(sweep_argv(out, grid, "--backend", "ray"))
    args = ["submit", *([] if wait else ["--no-wait"]), "--", "bash", "-c"]
    done = job(dashboard, *args, f"cd {REPO} && {entry}")
    if done.returncode != 0:
        raise RuntimeError(f"ray job submit failed: {done.stdout[-2000:]}{done.stderr[-2000:]}")
    if wait:
        return done.stdout
    found = re.search(r"raysubmit_[A-Za-z0-9]+", done.stdout + done.stderr)
    if found is None:
        raise RuntimeError(f"no job id in ray job submit's output: {done.stdout[-2000:]}")
    return found.group(0)


def local_sweep(out: Path, grid: list[str]) -> None:
    done = subprocess.run(sweep_argv(out, grid, "--jobs", "2"), env=ray_env(), cwd=REPO,
                          capture_output=True, text=True, check=False)  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"the local sweep failed: {done.stdout[-2000:]}")


def records(out: Path) -> dict[str, bytes]:
    """Each run's records.csv by its folder name (the same names in both sweeps)."""
    return {p.parent.name: p.read_bytes() for p in sorted(out.glob("*/records.csv"))}


def same_as_local(out: Path, grid: list[str], scratch: Path) -> bool:
    local = scratch / f"local-{out.name}"
    local_sweep(local, grid)
    return records(out) == records(local) and len(records(local)) > 0


def wait_for_checkpoints(out: Path, count: int, seconds: float = 120.0) -> None:
    deadline = time.monotonic() + seconds
    while len(list(out.glob("*/checkpoint.pt"))) < count:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{out}: fewer than {count} checkpoints after {seconds:.0f} s")
        time.sleep(0.5)


def wait_for_job(dashboard: str, job_id: str, seconds: float = 600.0) -> str:
    """The job's final status (SUCCEEDED, FAILED, STOPPED), from Ray's job SDK."""
    from ray.job_submission import JobStatus, JobSubmissionClient

    client = JobSubmissionClient(dashboard)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        status = client.get_job_status(job_id)
        if status in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED):
            return str(status.value)
        time.sleep(1.0)
    raise RuntimeError(f"job {job_id} still running after {seconds:.0f} s")


def writes(out: Path) -> dict[Path, int]:
    return {f: f.stat().st_mtime_ns for f in out.rglob("*") if f.is_file()}


def check_submit(dashboard: str, scratch: Path) -> bool:
    out = scratch / "submit"
    submit(dashboard, out, SHORT)
    again = submit(dashboard, out, SHORT)
    return "6 skipped as already done" in again and same_as_local(out, SHORT, scratch)


def check_stop(dashboard: str, scratch: Path) -> bool:
    out, grid = scratch / "stop", long_grid(80)
    job_id = submit(dashboard, out, grid, wait=False)
    wait_for_checkpoints(out, 2)
    job(dashboard, "stop", job_id)
    stopped = wait_for_job(dashboard, job_id) == "STOPPED"
    before = writes(out)
    time.sleep(3.0)
    quiet = writes(out) == before
    submit(dashboard, out, grid)
    return stopped and quiet and same_as_local(out, grid, scratch)


def kill_node(node: subprocess.Popen[bytes]) -> int:
    """SIGKILL a node's ``ray start`` and everything under it; how many processes."""
    victims = [psutil.Process(node.pid), *psutil.Process(node.pid).children(recursive=True)]
    for proc in victims:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.send_signal(signal.SIGKILL)
    node.wait()
    return len(victims)


def check_lost_node(dashboard: str, nodes: list[subprocess.Popen[bytes]], scratch: Path) -> bool:
    out, grid = scratch / "lost", long_grid(150)
    job_id = submit(dashboard, out, grid, wait=False)
    wait_for_checkpoints(out, 2)
    killed = kill_node(nodes[1])
    print(f"  lost node: SIGKILLed {killed} processes of the second node", flush=True)
    return wait_for_job(dashboard, job_id) == "SUCCEEDED" and same_as_local(out, grid, scratch)


def main() -> int:
    if any(importlib.util.find_spec(m) is None for m in DASHBOARD_MODULES):
        print("ray job submit needs Ray's job server: pip install 'ray[default]' (the same "
              "version as ray) in a scratch venv, then rerun.", file=sys.stderr)  # fmt: skip
        return 2
    scratch = Path(tempfile.mkdtemp(prefix="ray-job-check-"))
    port = free_port()
    dashboard = f"http://127.0.0.1:{port}"
    nodes: list[subprocess.Popen[bytes]] = []
    verdicts = []
    with loopback_cluster([1, 1], dashboard_port=port, nodes=nodes):
        for name, check in (
            ("submit, then resubmit skips", lambda: check_submit(dashboard, scratch)),
            ("ray job stop, then resubmit resumes", lambda: check_stop(dashboard, scratch)),
            ("a lost node: retried, resumed", lambda: check_lost_node(dashboard, nodes, scratch)),
        ):
            started = time.perf_counter()
            ok = check()
            verdicts.append(ok)
            verdict = "records identical to --jobs 2" if ok else "FAILED"
            print(f"{name}: {verdict} ({time.perf_counter() - started:.1f} s)", flush=True)
    print(json.dumps({"scratch": str(scratch), "all_ok": all(verdicts)}))
    return 0 if all(verdicts) else 1


if __name__ == "__main__":
    raise SystemExit(main())
