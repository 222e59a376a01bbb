"""``--executor flower``: the engine's run inside a Flower simulation (``cfl_bench.flower``).

The end-to-end tests start a real simulation (``flwr run``, Ray; ~30-45 s on 2 busy cores)
and compare records.csv byte for byte with the sequential executor's.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest
import torch

from cfl_bench.core.buffer import ReservoirBuffer
from cfl_bench.core.context import Broadcast, ClientState, Upload
from cfl_bench.core.errors import UserError
from cfl_bench.runner.config import RunConfig
from cfl_bench.runner.run import execute, plan_run
from cfl_bench.sweeps import ledger
from tests.sweep_helpers import in_process

pytest.importorskip("flwr")

from cfl_bench.flower import records
from tests import test_flower_safety as safety

CPU = torch.device("cpu")


def small_config(strategy: str, executor: str, out: Path) -> RunConfig:
    return RunConfig(
        stream="rot-digits",
        strategy=strategy,
        model="mlp",
        clients=4,
        tasks=2,
        rounds_per_task=2,
        epochs=1,
        batch_size=32,
        buffer_size=50,
        threads=1,
        device="cpu",
        executor=executor,
        out=str(out),
    )


def flower_processes() -> list[int]:
    """PIDs of processes started by our launcher (its private FLWR_HOME folders)."""
    pids = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if "cfl-flower-" in proc.environ().get("FLWR_HOME", ""):
                pids.append(proc.pid)
        except (psutil.Error, OSError):
            continue
    return pids


def same_records_as_sequential(strategy: str, tmp_path: Path) -> None:
    before = set(flower_processes())
    seq = execute(small_config(strategy, "sequential", tmp_path / "seq"))
    flower = execute(small_config(strategy, "flower", tmp_path / "flower"))
    assert flower.summary["status"] == "finished"
    seq_records = (seq.path / "records.csv").read_bytes()
    assert (flower.path / "records.csv").read_bytes() == seq_records
    assert set(flower_processes()) - before == set()  # SuperLink, SuperExec, Ray: all gone


SMALL = [
    "--stream", "rot-digits", "--model", "mlp", "--clients", "4", "--tasks", "2",
    "--epochs", "1", "--batch-size", "32", "--buffer-size", "50", "--device", "cpu",
]  # fmt: skip
SWEEP_GRID = [
    *SMALL, "--rounds-per-task", "2", "--strategy", "fedavg", "--strategy", "der+fedgp",
    "--jobs", "2", "--no-leaderboard",
]  # fmt: skip


def test_a_sweep_runs_two_simulations_at_once_to_the_sequential_records(tmp_path: Path) -> None:
    """``--executor flower`` inside a sweep: two points at once (``--jobs 2``), each a
    simulation on SuperLink ports of its own with a Ray of one CPU (its share of 2 cores).
    FedAvg, and DER + FedGP (two message phases per round: train, FedGP's g_ref query;
    buffers in node state), give the sequential executor's records byte for byte."""
    before = set(flower_processes())
    flower, seq = tmp_path / "flower", tmp_path / "seq"
    code, output = in_process("sweep", "--out", str(flower), "--executor", "flower", *SWEEP_GRID)
    assert code == 0, output
    assert set(flower_processes()) - before == set()  # SuperLinks, SuperExecs, Rays: all gone
    log = ledger.read_log(flower)
    starts = [r["time"] for r in log if r["event"] == "start"]
    finishes = [r["time"] for r in log if r["event"] == "finish"]
    assert len(starts) == len(finishes) == 2 and max(starts) < min(finishes)  # side by side
    code, output = in_process("sweep", "--out", str(seq), *SWEEP_GRID)
    assert code == 0, output
    by_strategy = {strategy_of(run): run for run in seq.glob("*/records.csv")}
    assert sorted(by_strategy) == ["der+fedgp", "fedavg"]
    for run in flower.glob("*/records.csv"):
        assert run.read_bytes() == by_strategy[strategy_of(run)].read_bytes(), run.parent.name


def strategy_of(records_csv: Path) -> str:
    """The strategy of the run whose records.csv this is (from its config.json)."""
    return str(json.loads((records_csv.parent / "config.json").read_text())["config"]["strategy"])


def test_a_launcher_killed_mid_run_leaves_no_simulation_behind_and_resumes(
    tmp_path: Path,
) -> None:
    """``kill -9`` of ``cfl-bench run --executor flower`` during round 2: the reaper stops
    the detached SuperLink, SuperExec, ServerApp and Ray, so nothing goes on writing into
    the run directory, and removes the simulation's folder. The same command then resumes
    the run from its checkpoint to the sequential executor's records.

    The run directory's lock is checked on the same simulation (one Flower start-up, not
    two: tests/test_flower_safety.py's copy of these checks is marked slow): the launcher
    claims it before Flower starts, so a second run into it is refused at once while Flower
    is still starting; after the kill the lock is free, and nothing in the directory
    changes for 10 s (a surviving ServerApp once wrote summary.json 9 s after its launcher
    died); the sequential reference run fills those seconds. ``--threads 1``: a Ray of one
    CPU starts one actor, not one per core (the start-ups are most of this test's time)."""
    before = set(flower_processes())
    homes = set(Path(tempfile.gettempdir()).glob("cfl-flower-*"))
    out = tmp_path / "run"
    run = [*SMALL, "--strategy", "fedavg", "--rounds-per-task", "8", "--checkpoint-every", "1",
           "--threads", "1"]  # fmt: skip
    command = [sys.executable, "-m", "cfl_bench", "run", *run, "--executor", "flower"]
    command += ["--out", str(out)]
    launcher = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert launcher.stdout is not None
    said = [launcher.stdout.readline()]  # "starting a Flower simulation": claimed by now
    assert said[0].startswith("starting a Flower simulation"), said
    second = safety.cli(["run", *run, "--out", str(out)], tmp_path)
    safety.refused(second, "another cfl-bench process is running in --out")
    for line in launcher.stdout:  # the run's own lines, relayed from the ServerApp
        said.append(line)
        if line.startswith("round 2/"):
            break
    assert launcher.poll() is None, "".join(said)
    assert set(flower_processes()) - before
    launcher.kill()
    launcher.wait()
    killed_at = time.monotonic()

    def left() -> tuple[set[int], set[Path]]:
        folders = set(Path(tempfile.gettempdir()).glob("cfl-flower-*")) - homes
        return set(flower_processes()) - before, folders

    while left() != (set(), set()) and time.monotonic() < killed_at + 60:
        time.sleep(0.1)
    assert left() == (set(), set())
    assert safety.lock_is_free(out)
    written = safety.digest(out)
    assert "config.json" in written and "summary.json" not in written
    touched = {f: f.stat().st_mtime_ns for f in out.rglob("*") if f.is_file()}
    code, output = in_process("run", *run, "--out", str(tmp_path / "seq"))
    assert code == 0, output
    time.sleep(max(0.0, killed_at + 10.0 - time.monotonic()))
    assert safety.digest(out) == written
    assert {f: f.stat().st_mtime_ns for f in out.rglob("*") if f.is_file()} == touched
    # the same command, in this process (the resume is no test of a process; one import of
    # torch fewer): Flower itself starts afresh
    code, output = in_process("run", *run, "--executor", "flower", "--out", str(out))
    assert code == 0, output[-3000:]
    assert "resuming after round" in output, output
    assert (out / "records.csv").read_bytes() == (tmp_path / "seq" / "records.csv").read_bytes()


def test_the_reaper_ends_a_simulation_whose_launcher_died(tmp_path: Path) -> None:
    """``flower.reaper``: when its pipe closes (the launcher is gone, even by SIGKILL) it
    SIGKILLs every process of the simulation's ``FLWR_HOME`` and removes the folder. A
    stand-in process (``sleep``) plays the detached SuperLink and ServerApp here; the real
    ones carry the same environment variable (``flower.launch.environment``)."""
    from cfl_bench.flower.launch import start_reaper

    home = tmp_path / "cfl-flower-x"
    (home / "flwr").mkdir(parents=True)
    env = {**os.environ, "FLWR_HOME": str(home / "flwr")}
    stand_in = subprocess.Popen(["sleep", "60"], env=env, start_new_session=True)
    other = subprocess.Popen(["sleep", "60"])  # not the simulation's: left alone
    reaper = start_reaper(home)
    time.sleep(0.5)
    assert stand_in.poll() is None and home.exists()  # the launcher lives: nothing happens
    assert reaper.stdin is not None
    reaper.stdin.close()  # what the kernel does when the launcher dies
    assert reaper.wait(timeout=30) == 0
    assert stand_in.wait(timeout=5) == -signal.SIGKILL and not home.exists()
    assert other.poll() is None
    other.kill()
    other.wait()


@pytest.mark.slow
def test_fedavg_records_equal_the_sequential_executor(tmp_path: Path) -> None:
    same_records_as_sequential("fedavg", tmp_path)


def a_client() -> ClientState:
    gen = torch.Generator().manual_seed(3)
    buffer = ReservoirBuffer(4, (2,), 3, device=CPU, generator=torch.Generator().manual_seed(5))
    client = ClientState(1, gen, buffer, task=1, tasks_started={0, 1}, model_version=7)
    client.extras = {"scaffold": {"c": torch.tensor([0.1, -2.5e-39, 3.0])}, "x": {"n": 4}}
    buffer.add(torch.randn(3, 2), torch.tensor([0, 1, 2]), torch.randn(3, 3), 1)
    torch.rand(5, generator=gen)  # a generator that has moved
    return client


def test_client_state_round_trips_bit_exactly() -> None:
    client = a_client()
    image = records.state_bytes(client.state_dict())
    fresh = ReservoirBuffer(4, (2,), 3, device=CPU, generator=torch.Generator())
    other = ClientState(1, torch.Generator(), fresh)
    records.load_state(image, other)
    assert torch.equal(other.generator.get_state(), client.generator.get_state())
    assert (other.task, other.tasks_started, other.model_version) == (1, {0, 1}, 7)
    c = other.extras["scaffold"]["c"]
    assert isinstance(c, torch.Tensor) and torch.equal(c, client.extras["scaffold"]["c"])
    assert other.extras["x"] == {"n": 4}
    assert other.buffer is not None and client.buffer is not None
    for name in ("x", "y", "logits", "task"):
        assert torch.equal(getattr(other.buffer, name), getattr(client.buffer, name))
    got = other.buffer.generator.get_state()
    assert torch.equal(got, client.buffer.generator.get_state())
    # keep_version leaves the server's model-version bookkeeping alone
    other.model_version = 2
    records.load_state(image, other, keep_version=True)
    assert other.model_version == 2


def test_broadcast_and_upload_round_trip_bit_exactly() -> None:
    cpu = torch.device("cpu")
    params = torch.tensor([1.0, -0.0, 1e-45, float("inf")])
    buffers = torch.tensor([3.0], dtype=torch.float64)
    gref = torch.randn(4)
    b = Broadcast(params, buffers, 5, {"fedgp.gref": gref}, 9, 1, True, cpu)
    arrays = records.model_record(b.params, b.buffers, b.payloads)
    back = records.broadcast_of(arrays, records.round_record(b, 2, 1), cpu)
    assert torch.equal(back.params.view(torch.int32), params.view(torch.int32))  # -0.0 too
    assert back.buffers.dtype == torch.float64 and torch.equal(back.buffers, buffers)
    assert torch.equal(back.payloads["fedgp.gref"], gref)
    assert (back.version, back.round_index, back.task, back.is_task_end) == (5, 9, 1, True)
    upload = Upload(2, params, buffers, 30, {"scaffold.delta": torch.ones(4)})
    record = records.upload_record(upload)
    # what travels up is exactly the counted bytes: 4·4 + 1·8 + 4·4 = 40
    assert records.record_bytes(record) == upload.nbytes == 40
    again = records.upload_of(record, 2, 30, cpu)
    assert torch.equal(again.extras["scaffold.delta"], torch.ones(4))
    assert again.nbytes == 40


def test_flower_is_refused_without_flwr(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "flwr", None)  # import flwr now raises ImportError
    config = small_config("fedavg", "flower", tmp_path / "run")
    with pytest.raises(UserError, match=r"pip install 'cfl-bench\[flower\]'"):
        plan_run(config)
    assert not (tmp_path / "run").exists()


def test_flower_refuses_what_it_does_not_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = small_config("fedavg", "flower", tmp_path / "run")
    with pytest.raises(UserError, match="joint"):
        plan_run(dataclasses.replace(config, strategy="joint"))


@pytest.mark.parametrize(
    ("changes", "flag"),
    [
        ({"arrivals": "glfc:initial=2,new=2,per_round=2"}, "--arrivals"),
        ({"task_order": "per-client:seed=0"}, "--task-order per-client"),
        ({"async_shift": 1}, "--async-shift"),
    ],
)
def test_flower_refuses_a_public_holdout_off_the_shared_order(
    tmp_path: Path, changes: dict[str, str], flag: str
) -> None:
    """A node starts only its own client's tasks, so a holdout (FedProj's on rot-digits)
    would differ from the server's; without one the same runs plan (the records of the
    first two equal the sequential executor's: tests/test_flower_deploy.py)."""
    config = dataclasses.replace(small_config("fedavg", "flower", tmp_path / "run"), **changes)
    plan_run(config)
    with pytest.raises(UserError, match=f"public holdouts .* under {flag} ") as err:
        plan_run(dataclasses.replace(config, strategy="fedavg+fedproj"))
    assert "\n" not in str(err.value) and not (tmp_path / "run").exists()


@pytest.mark.slow
def test_fedavg_fedproj_records_equal_the_sequential_executor(tmp_path: Path) -> None:
    """The public holdout, the ensemble broadcast and the logits upload travel in messages.
    ~35-65 s, hence slow: the same messages are checked in a deployment in CI
    (tests/test_flower_deploy.py)."""
    same_records_as_sequential("fedavg+fedproj", tmp_path)


def test_simulation_resources_give_each_actor_a_cpu_and_on_cuda_a_gpu_share() -> None:
    from cfl_bench.flower.launch import simulation_settings

    cpu = simulation_settings(10, torch.device("cpu"), cores=16)
    assert cpu == "num-supernodes=10 client-resources-num-cpus=1"
    # --threads 2 (a sweep point's share): Ray gets 2 CPUs, so 2 actors run at once
    two = simulation_settings(10, torch.device("cpu"), cores=16, threads=2)
    assert two == "num-supernodes=10 client-resources-num-cpus=1 init-args-num-cpus=2"
    assert simulation_settings(10, torch.device("cuda"), 16, threads=2).endswith("gpus=0.5")
    # 10 clients on 16 cores: 10 actors at once share the GPU, 0.1 each; 100 clients on
    # 16 cores: 16 at once, 1/16 = 0.0625; 3 clients on 2 cores: 2 at once, 0.5 each.
    assert simulation_settings(10, torch.device("cuda"), cores=16).endswith("num-gpus=0.1")
    assert simulation_settings(100, torch.device("cuda"), cores=16).endswith("gpus=0.0625")
    assert simulation_settings(3, torch.device("cuda"), cores=2).endswith("num-gpus=0.5")
    # 3 actors: 1/3 rounded down to Ray's 1e-4 grain, never over-committing the GPU.
    assert simulation_settings(3, torch.device("cuda"), cores=8).endswith("num-gpus=0.3333")
