"""``cfl-bench sweep --backend ray``: a real Ray cluster of two nodes on loopback.

The cluster is a head of one CPU and a second node of one CPU (``bench.ray_cluster``:
``ray start --block`` children stopped by PID, so no other Ray on the machine is touched).
The same 4-point grid runs as a local sweep (``--jobs 2``) and on the cluster
(``--cpus-per-run 1``: at most two points at once, one per node, so two wait their turn);
every point's records must be byte-identical, and a rerun of the cluster sweep skips every
point. A point whose Ray worker is SIGKILLed mid-run is retried by Ray and resumes from its
checkpoint; Ctrl-C of the driver stops the point and the rerun resumes it. Both of those
tests run the same point, so one uninterrupted run of it (``long_reference``) is the
reference of both.
"""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from bench.ray_cluster import loopback_cluster, ray_env
from cfl_bench.core.errors import UserError
from cfl_bench.sweeps import ledger
from cfl_bench.sweeps.command import Placement
from cfl_bench.sweeps.grid import build_spec, expand
from cfl_bench.sweeps.point import job_from_json, job_json
from cfl_bench.sweeps.ray_backend import SERVING, check_placeable, check_reachable, point_env
from cfl_bench.sweeps.worker import RunJob
from tests.sweep_helpers import TINY, comparable, events, in_process, summaries, sweep_command
from tests.test_late_failures import grpc_server

ray = pytest.importorskip("ray")

GRID = [
    "--stream", "rot-digits", "--strategy", "fedavg", "--model", "mlp",
    *TINY, "--seed", "0", "--seed", "1", "--lr", "0.05", "--lr", "0.1",
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
    print(f"ray sweep of 4 points: {time.monotonic() - started:.1f} s")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    runs = sorted(p.parent.name for p in local.glob("*/records.csv"))
    assert len(runs) == 4
    for name in runs:
        assert (remote / name / "records.csv").read_bytes() == (
            local / name / "records.csv"
        ).read_bytes(), name
    assert sum(events(remote, "start").values()) == 4
    again = subprocess.run(command, env=ray_env(), capture_output=True, text=True, check=False)
    assert again.returncode == 0, again.stdout[-3000:]
    assert sum(events(remote, "skip").values()) == 4
    assert sum(events(remote, "start").values()) == 4  # nothing ran a second time


#: The seed of ``LongPoint``: both tests that interrupt it run the same point, so one
#: uninterrupted run (``long_reference``) serves as the reference of both.
LONG_SEED = 3


class LongPoint:
    """One point of 120 rounds with a checkpoint after each, started as a Ray sweep: once it
    has passed round 5 it runs for seconds more (115 rounds), time enough to interrupt it;
    the test finds its process and signals it within a fraction of a second. (160 rounds
    once cost ~25 s of CI per test; 40 were too few on an idle AVX-512 machine, where the
    last 35 rounds took about a second and the point finished before the Ray task was
    cancelled.)"""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.args = ["--seed", str(LONG_SEED), "--threads", "1", "--checkpoint-every", "1"]
        self.args += ["--tasks", "2", "--rounds-per-task", "60", "--train-size", "300"]
        self.args += ["--test-size", "100"]
        (self.point,) = expand(build_spec(None, self.args, str(out)))
        self.log = out / ledger.BOOKKEEPING / f"{self.point.name}.log"

    def command(self, *backend: str) -> list[str]:
        return sweep_command(self.out, "--backend", "ray", *backend, *self.args)

    def start(self, env: dict[str, str], *backend: str) -> subprocess.Popen[str]:
        """The sweep, once its point has passed round 5 (its checkpoint is on disk)."""
        sweep = subprocess.Popen(
            self.command(*backend),
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            # A background job (CI under nohup … &) inherits SIGINT ignored: restore it.
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        deadline = time.monotonic() + 120
        while "round 5/" not in (self.log.read_text() if self.log.exists() else ""):
            assert sweep.poll() is None and time.monotonic() < deadline, "ended too soon"
            time.sleep(0.01)
        return sweep

    def process(self) -> psutil.Process:
        """The point's ``cfl_bench.sweeps.point`` process."""
        (found,) = [p for p in psutil.process_iter(["cmdline"]) if _runs(p, self.point.name)]
        return found

    def assert_resumed_to_the_uninterrupted_run(self, reference: Path) -> None:
        """The point resumed, and its records and summary are those of ``reference``, the
        sweep folder of the same point run without interruption."""
        assert "resuming after round" in self.log.read_text()
        name = self.point.name
        assert (self.out / name / "records.csv").read_bytes() == (
            reference / name / "records.csv"
        ).read_bytes()
        assert comparable(summaries(self.out)[name]) == comparable(summaries(reference)[name])


@pytest.fixture(scope="module")
def long_reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``LongPoint``'s point run without interruption (in this process, no Ray): the
    sweep folder both interrupted runs must end up equal to."""
    reference = tmp_path_factory.mktemp("long-reference") / "sweep"
    code, text = in_process("sweep", "--out", str(reference), *LongPoint(reference).args)
    assert code == 0, text
    return reference


def test_a_point_whose_ray_worker_is_killed_mid_run_is_retried_and_resumes(
    cluster: str, long_reference: Path, tmp_path: Path
) -> None:
    """A lost worker (here SIGKILLed, as when a node's OOM killer strikes): Ray re-runs the
    task, the point's process died with its worker (``PR_SET_PDEATHSIG``) and released its
    lock, and the retry resumes from the last checkpoint to the uninterrupted records. The
    driver finds the cluster as under ``ray job submit``: ``RAY_ADDRESS``, no ``--address``
    (the job server itself needs Ray's dashboard, which the test environment lacks)."""
    long = LongPoint(tmp_path / "killed")
    sweep = long.start({**ray_env(), "RAY_ADDRESS": cluster})
    runner = long.process()
    ray_worker = runner.parent()
    assert ray_worker is not None
    ray_worker.kill()
    runner.wait(timeout=15)  # gone with its worker, not left writing into the run folder
    output, _ = sweep.communicate(timeout=300)
    assert sweep.returncode == 0, output[-3000:]
    name = long.point.name
    assert events(long.out, "start")[name] == 1 and events(long.out, "finish")[name] == 1
    long.assert_resumed_to_the_uninterrupted_run(long_reference)


def test_ctrl_c_of_a_ray_sweep_stops_its_point_and_the_rerun_resumes(
    cluster: str, long_reference: Path, tmp_path: Path
) -> None:
    """SIGINT to the driver: the running task is cancelled (its worker and the point's
    process die), the sweep ends in its one line with exit code 130, and the rerun resumes
    the point from its checkpoint to the uninterrupted records."""
    long = LongPoint(tmp_path / "stopped")
    sweep = long.start(ray_env(), "--address", cluster)
    runner = long.process()
    assert sweep.poll() is None, "the point ended before it could be interrupted"
    sweep.send_signal(signal.SIGINT)
    output, _ = sweep.communicate(timeout=120)
    assert sweep.returncode == 130, output[-3000:]
    assert "sweep interrupted" in output and "rerun the same sweep command" in output
    runner.wait(timeout=15)
    assert (long.out / long.point.name / "checkpoint.pt").exists()
    again = subprocess.run(
        long.command("--address", cluster),
        env=ray_env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    long.assert_resumed_to_the_uninterrupted_run(long_reference)


def _runs(process: psutil.Process, name: str) -> bool:
    """Whether ``process`` is the ``cfl_bench.sweeps.point`` process of point ``name``."""
    command = " ".join(process.info["cmdline"] or [])
    return "cfl_bench.sweeps.point" in command and name in command


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


def closed_port() -> int:
    """A loopback port where nothing listens (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_an_address_where_no_cluster_answers_is_refused_at_once(tmp_path: Path) -> None:
    """Ray itself retries such an address for minutes; the sweep refuses it in one line
    (exit 2) before it writes anything."""
    out = tmp_path / "sweep"
    started = time.monotonic()
    address = f"127.0.0.1:{closed_port()}"
    code, output = in_process(
        "sweep", "--out", str(out), "--backend", "ray", "--address", address, *TINY
    )
    assert code == 2
    assert f"no Ray cluster answers at {address} (--address: Connection refused)" in output
    assert "Traceback" not in output and len(output.strip().splitlines()) <= 2
    assert time.monotonic() - started < 20 and not out.exists()


def test_ray_address_from_the_environment_is_checked_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{closed_port()}")
    with pytest.raises(UserError, match=r"no Ray cluster answers at .* \(RAY_ADDRESS: "):
        check_reachable(None)
    with pytest.raises(UserError, match=re.escape("--address 10.0.0.1:70000 has no valid port")):
        check_reachable("10.0.0.1:70000")


def test_a_listening_address_and_other_forms_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """A server that answers as a Ray GCS (a listening socket alone is no longer enough:
    tests/test_late_failures.py), a gRPC server for ray://, and the forms Ray resolves."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with grpc_server(SERVING) as port:
        check_reachable(f"127.0.0.1:{port}")
        check_reachable(f"ray://127.0.0.1:{port}")
    for address in (None, "auto", "local"):
        check_reachable(address)  # left to Ray: no connection is tried


class StandInRay:
    """A stand-in for the ``ray`` module's two calls ``check_placeable`` makes (the real
    path, a Ray instance or cluster, is what the other tests of this file start)."""

    def __init__(self, *sizes: dict[str, float]) -> None:
        self.sizes = sizes
        self.shut_down = False

    def nodes(self) -> list[dict[str, object]]:
        dead = {"Alive": False, "Resources": {"CPU": 512.0, "GPU": 8.0}}
        return [dead, *({"Alive": True, "Resources": r} for r in self.sizes)]

    def shutdown(self) -> None:
        self.shut_down = True


def test_a_point_no_node_can_hold_is_refused_on_this_machine_and_noted_on_a_cluster(
    capsys: pytest.CaptureFixture[str],
) -> None:
    fits = StandInRay({"CPU": 2.0}, {"CPU": 8.0, "GPU": 1.0})
    check_placeable(fits, 8, 1.0, local=True)
    check_placeable(fits, 2, 0.0, local=True)
    assert not fits.shut_down and capsys.readouterr().err == ""
    small = StandInRay({"CPU": 2.0}, {"CPU": 4.0, "GPU": 1.0})  # a dead node does not count
    with pytest.raises(UserError, match="this machine's Ray has 4 CPUs and 1 GPUs, too few"):
        check_placeable(small, 8, 0.0, local=True)
    assert small.shut_down
    check_placeable(StandInRay({"CPU": 2.0}), 1, 0.5, local=False)
    assert "the points wait until such a node joins" in capsys.readouterr().err
