"""A Flower *deployment*: a real ``flower-superlink`` and, per client, ``cfl-bench flower
node`` (a ``flower-supernode`` and its long-lived worker) on loopback, the app written by
``cfl-bench flower app`` and started with ``flwr run APP deploy``. The records must equal the
sequential executor's byte for byte, and every process the tests started (with its
children) must be gone afterwards.

One deployment (two nodes) serves every run of this module one after another, as nodes of a
real deployment serve run after run: SCAFFOLD with ``--diagnostics`` (FedAvg's aggregation
plus control variates in the client's state and in both directions, and the clients'
instrumentation in the replies; one run where FedAvg and SCAFFOLD took two, ~20 s of CI),
FedAvg + FedProj (public holdouts, an ensemble broadcast and a logits upload; marked slow,
its simulation runs in CI) and DER + FedGP (a ``query.request`` phase after
each round, DER's buffer kept by the worker) with two faults in one run: one node's worker
killed during round 1 (its supervisor restarts it, the node answers "stale", the server
sends the client's state again and the run goes on), then the ServerApp killed during
round 2 and the run resumed by running the app again, to the same records. The launcher
(``flower.launch.deployment``, ``run_deployed``) is shared with bench/flower_overhead.py.
"""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

pytest.importorskip("flwr")

from cfl_bench.cli import main as cli_main
from cfl_bench.flower.launch import deployment, listed_runs, run_deployed
from cfl_bench.flower.reaper import running
from tests.synthetic_data import write_tiny_cifar10

RUN_OPTIONS = [
    "--stream", "rot-digits", "--strategy", "fedavg", "--model", "mlp", "--clients", "2",
    "--tasks", "1", "--rounds-per-task", "2", "--threads", "1", "--device", "cpu",
]  # fmt: skip


def cli(args: list[str]) -> int:
    """``cfl-bench ARGS``'s exit code."""
    with pytest.raises(SystemExit) as exc:
        cli_main(args)
    return int(exc.value.code or 0)


def options(**changed: str) -> list[str]:
    """RUN_OPTIONS with some values replaced (a repeated option would be refused)."""
    out = list(RUN_OPTIONS)
    for name, value in changed.items():
        out[out.index(f"--{name.replace('_', '-')}") + 1] = value
    return out


class Deployment:
    """The module's deployment: its environment, its folder, the PIDs it started."""

    def __init__(self, env: dict[str, str], home: Path) -> None:
        self.env, self.home = env, home

    def run_equals_sequential(self, run_options: list[str], work: Path) -> None:
        """Write the app, run it here, compare its records with a sequential run's."""
        app_dir, run_dir, seq_dir = work / "app", work / "run", work / "seq"
        app_args = ["flower", "app", "--app-dir", str(app_dir), "--out", str(run_dir)]
        assert cli([*app_args, *run_options]) == 0
        assert (app_dir / "pyproject.toml").exists() and not run_dir.exists()
        statuses = run_deployed(app_dir, self.env)
        assert statuses == ["finished:completed"], (statuses, self.log("superlink"))
        assert cli(["run", "--out", str(seq_dir), *run_options]) == 0
        assert (run_dir / "records.csv").read_bytes() == (seq_dir / "records.csv").read_bytes()

    def log(self, name: str) -> str:
        return (self.home / "logs" / f"{name}.log").read_text(errors="replace")[-4000:]


@pytest.fixture(scope="module")
def deployed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    home = tmp_path_factory.mktemp("deploy") / "home"
    seen: set[int] = set()
    with deployment(home, 2, seen) as env:
        yield Deployment(env, home)
    assert seen and not [pid for pid in seen if running(pid)]  # every process we started


@pytest.mark.parametrize(
    ("strategy", "extra"),
    [
        # with the learning rate on a per-task cosine: round 2's rate is the schedule's
        # (computed by each node's worker from the carried configuration), not --lr
        (
            "scaffold",
            [
                "--diagnostics",
                "--eval-every-round",
                "--lr-schedule",
                "task-cosine",
                "--lr-end",
                "0.001",
            ],
        ),
        # Slow (CI's 30-minute budget): FedProj's holdouts, ensemble broadcast and logits
        # upload cross Flower in tests/test_flower.py's simulation with the same records
        # check; the deployment's own transport is exercised by the other runs here.
        pytest.param("fedavg+fedproj", [], marks=pytest.mark.slow),
    ],
    ids=["scaffold --diagnostics --lr-schedule", "fedavg+fedproj"],
)
def test_deployment_records_equal_the_sequential_executor(
    deployed: Deployment, strategy: str, extra: list[str], tmp_path: Path
) -> None:
    """SCAFFOLD (FedAvg's aggregation with control variates) with ``--diagnostics``: the
    clients' class accuracy and weight divergence come back in the reply's instrumentation
    and land in the same records (a run without ``--diagnostics`` has none: checked here
    for FedProj and in the DER + FedGP run below). Its per-task cosine schedule changes
    round 2's rate, so records that ignored it on the nodes would differ."""
    deployed.run_equals_sequential([*options(strategy=strategy), *extra], tmp_path)
    recorded = (tmp_path / "run" / "records.csv").read_text()
    assert ("weight_divergence" in recorded) == ("--diagnostics" in extra)


@pytest.mark.parametrize(
    "extra",
    [
        ["--task-order", "per-client:seed=0"],
        ["--arrivals", "glfc:initial=1,new=1,receive=0.5,per_round=2"],
    ],
    ids=["per-client task orders", "clients joining over time"],
)
def test_who_trains_which_task_follows_the_servers_plan(
    deployed: Deployment, extra: list[str], tmp_path: Path
) -> None:
    """ER (a reservoir buffer in the client's state), 2 tasks of 2 rounds. Per-client
    orders: each node loads the stream task its client trains at this step (sent as the
    message's client task). Arrivals: client 1 joins at task 2 and client 0 keeps its task-1
    data, from the run's planned splits (the receivers' parts)."""
    run_options = [*options(strategy="er", tasks="2"), *extra]
    deployed.run_equals_sequential(run_options, tmp_path)


def test_a_shuffled_class_order_reaches_the_nodes(deployed: Deployment, tmp_path: Path) -> None:
    """``--class-order`` relabels the stream, which each node rebuilds from the carried
    configuration: the deployed records equal the sequential run's, and a run in the natural
    order gives other records, so nodes that trained the natural order would fail this.
    seq-cifar10 on a miniature CIFAR-10 (5 × 40 training images), 2 tasks of 1 round."""
    root = tmp_path / "cifar"
    write_tiny_cifar10(root, n=40, n_test=20)
    stream = options(stream="seq-cifar10", tasks="2", rounds_per_task="1")
    shuffled = [*stream, "--data-root", str(root), "--class-order", "numpy:seed=2023"]
    deployed.run_equals_sequential(shuffled, tmp_path)
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["stream"]["class_order"] == [8, 2, 5, 0, 3, 4, 1, 9, 6, 7]
    natural = tmp_path / "natural"
    assert cli(["run", "--out", str(natural), *stream, "--data-root", str(root)]) == 0
    records = (tmp_path / "run" / "records.csv").read_bytes()
    assert (natural / "records.csv").read_bytes() != records


def node_worker(home: Path, partition: int) -> psutil.Process:
    """The worker process of node ``partition`` (a child of its ``cfl-bench flower node``)."""
    sock = str(home / "sockets" / f"{partition}.sock")
    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info["cmdline"] or []
        if "cfl_bench.flower.node_worker" in cmd and sock in cmd:
            return proc
    raise AssertionError(f"no worker for node {partition}")


def kill_after_first_reply(home: Path, done: threading.Event) -> None:
    """SIGKILL node 0's worker once its node has sent a reply of the current run."""
    log = home / "logs" / "node0.log"
    start = log.read_text(errors="replace").count("Sending: train message")
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if log.read_text(errors="replace").count("Sending: train message") > start:
            node_worker(home, 0).send_signal(signal.SIGKILL)
            done.set()
            return
        time.sleep(0.05)


def serverapp_processes(home: Path) -> list[psutil.Process]:
    """The deployment's ``flwr-serverapp`` processes (its SuperLink starts one per run)."""
    mine = str(home / "flwr")
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            cmd = " ".join(proc.info["cmdline"] or [])
            if "flwr-serverapp" in cmd and proc.environ().get("FLWR_HOME") == mine:
                found.append(proc)
        except (psutil.Error, OSError):
            continue
    return found


def kill_serverapp_after_replies(
    home: Path, env: dict[str, str], replies: int, done: threading.Event
) -> None:
    """SIGKILL the running ServerApp once node 0 has sent ``replies`` more train replies,
    then tell the SuperLink to stop the run (``flwr stop``), as an operator would: else
    ``flwr run`` waits for the SuperLink to notice the lost ServerApp (a minute and more)."""
    log = home / "logs" / "node0.log"
    start = log.read_text(errors="replace").count("Sending: train message")
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if log.read_text(errors="replace").count("Sending: train message") >= start + replies:
            for proc in serverapp_processes(home):
                proc.send_signal(signal.SIGKILL)
            for run, status in listed_runs(env).items():
                if status.startswith("running"):
                    subprocess.run(["flwr", "stop", run, "deploy"], env=env, capture_output=True)
            done.set()
            return
        time.sleep(0.05)


def test_a_killed_worker_and_an_interrupted_run_end_in_the_same_records(
    deployed: Deployment, tmp_path: Path
) -> None:
    """DER + FedGP over 3 rounds with two faults in the one run (one deployed run and one
    sequential reference for both, where two tests took two each: ~40 s of CI).

    Node 0's worker is killed after its first train reply: the node's next message (FedGP's
    request) finds a new worker holding no state, answers stale, the server sends the
    client's state again and the run goes on (its supervisor restarted the worker). The
    ServerApp is then killed during round 2; running the same app again resumes from the last
    checkpoint. The nodes' workers still hold states of the killed run, which the new run's
    server does not know: it sends its mirrors (from the checkpoint) with the first
    messages, and the records equal the sequential run's."""
    run_options = options(strategy="der+fedgp", rounds_per_task="3")
    app_dir, run_dir, seq_dir = tmp_path / "app", tmp_path / "run", tmp_path / "seq"
    app_args = ["flower", "app", "--app-dir", str(app_dir), "--out", str(run_dir)]
    assert cli([*app_args, *run_options]) == 0
    assert (app_dir / "pyproject.toml").exists() and not run_dir.exists()
    worker_before = node_worker(deployed.home, 0).pid
    worker_killed, server_killed = threading.Event(), threading.Event()
    killers = [
        threading.Thread(target=kill_after_first_reply, args=(deployed.home, worker_killed)),
        threading.Thread(
            target=kill_serverapp_after_replies,
            args=(deployed.home, deployed.env, 2, server_killed),
        ),
    ]
    for killer in killers:
        killer.start()
    first = run_deployed(app_dir, deployed.env)
    for killer in killers:
        killer.join()
    assert worker_killed.is_set() and server_killed.is_set()
    assert first != ["finished:completed"], first
    assert "worker exited with code -9; restarting it" in deployed.log("node0")
    assert node_worker(deployed.home, 0).pid != worker_before
    assert (run_dir / "checkpoint.pt").exists() and not (run_dir / "summary.json").exists()
    assert run_deployed(app_dir, deployed.env) == ["finished:completed"]
    assert cli(["run", "--out", str(seq_dir), *run_options]) == 0
    assert (run_dir / "records.csv").read_bytes() == (seq_dir / "records.csv").read_bytes()
    assert "weight_divergence" not in (run_dir / "records.csv").read_text()  # no --diagnostics


def test_flower_app_refuses_what_flower_does_not_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    joint = options(strategy="joint")
    assert cli(["flower", "app", "--app-dir", str(tmp_path / "a"), *joint]) == 2
    assert "joint" in capsys.readouterr().err and not (tmp_path / "a").exists()
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "x").write_text("")
    assert cli(["flower", "app", "--app-dir", str(tmp_path / "b"), *RUN_OPTIONS]) == 2
    assert "not empty" in capsys.readouterr().err
    vectorized = [*RUN_OPTIONS, "--executor", "vectorized"]
    assert cli(["flower", "app", "--app-dir", str(tmp_path / "c"), *vectorized]) == 2
    assert "not with --executor vectorized; drop --executor" in capsys.readouterr().err
    assert not (tmp_path / "c").exists()


def test_flower_app_carries_the_whole_configuration(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The app's run config holds the run's JSON (SuperNodes may be on other machines) with
    an absolute --out and the flower executor; the file path key stays empty."""
    import tomllib

    monkeypatch.chdir(tmp_path)
    assert cli(["flower", "app", "--app-dir", "app", "--out", "rel", *RUN_OPTIONS]) == 0
    toml = tomllib.loads((tmp_path / "app" / "pyproject.toml").read_text())
    config = toml["tool"]["flwr"]["app"]["config"]
    assert config["cfl-config"] == ""
    run = json.loads(config["cfl-config-json"])
    assert run["out"] == str(tmp_path / "rel") and run["executor"] == "flower"
    assert run["clients"] == 2 and run["stream"] == "rot-digits"
