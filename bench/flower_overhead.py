"""Per-round time of the sequential executor vs a Flower simulation vs a Flower deployment
on the same run.

    python -m bench.flower_overhead --data-root ../shared/data [--repeats 1]
        [--strategies fedavg,der+fedgp] [--clients 10] [--train-size 2000] [--no-deploy]
        [--plain-deploy]

Protocol: rot-mnist, the MLP, ``--clients`` clients all taking part, ``--tasks`` task(s) of
``--rounds-per-task`` rounds on the first ``--train-size`` training images, CPU, seed 0;
one torch thread everywhere (the simulation's run leaves ``--threads`` unset, as
``cfl-bench run --executor flower`` does by default, so its Ray runs one single-threaded
actor per core). Each strategy runs with three executors, ``--repeats`` times, the order of
the executors reversed on every other pass:

- ``sequential``: ``--executor sequential`` in this process;
- ``flower``: ``--executor flower`` (``flwr run``: a local SuperLink in simulation mode,
  Ray, one SuperNode per client, 1 CPU per actor);
- ``deploy`` (skipped with ``--no-deploy``): the app ``cfl-bench flower app`` writes, run
  with ``flwr run APP deploy`` on a real ``flower-superlink`` and ``--clients`` nodes on
  loopback, each ``cfl-bench flower node --partition-id K`` (a ``flower-supernode`` and its
  long-lived worker), started and stopped here (``flower.launch.deployment``, as
  tests/test_flower_deploy.py). Every process it started is checked, by PID, to be gone
  afterwards.
- ``deploy-plain`` (only with ``--plain-deploy``): the same with plain ``flower-supernode``
  processes and Flower's defaults, so that every message starts a ClientApp process that
  imports torch and builds the client side itself (what ``deploy`` was before the workers).

What is measured: ``round_time_s`` of every round, read from each run's costs.csv (the
engine's own clock around a whole round: client updates, requests, aggregation,
evaluation; for ``deploy`` the ServerApp's clock on the SuperLink side). Round 1 is
reported apart because it includes start-up the sequential executor does not pay: under
the simulation Ray, one actor per CPU, each actor's imports and data set-up, and the
``query.identify`` phase; under deployment the identify phase and the workers' first
build of the run's client side (loading the client's shard); every message phase pays a
new ``flwr-clientapp`` process per message (Flower's) and the SuperNodes' polling; round 1
also holds any wait for SuperNodes still connecting when the ServerApp starts. "later"
is the mean of rounds 2.. . Every number is the best of ``--repeats`` passes; ratios are
executor / sequential. The process wall of the best pass is printed too: ``execute`` for
the first two (for ``flower`` it adds the SuperLink and Ray start and stop); for
``deploy`` from writing the app to every process stopped (SuperLink and SuperNodes start,
waiting for the SuperNodes to connect, ``flwr run``, ``flwr ls``, the stop).

The records themselves are identical across the executors (tests/test_flower.py,
tests/test_flower_deploy.py); this script checks that on every pass as well and prints a
warning line if not.
"""

from __future__ import annotations

import argparse
import csv
import shutil
import tempfile
import time
from pathlib import Path

import torch

from cfl_bench.runner.config import RunConfig, make_config
from cfl_bench.runner.run import execute

EXECUTORS = ("sequential", "flower", "deploy", "deploy-plain")


def round_times(run_dir: Path) -> list[float]:
    """``round_time_s`` of each round, in round order, from the run's costs.csv."""
    with (run_dir / "costs.csv").open() as f:
        rows = [r for r in csv.DictReader(f) if r["metric"] == "round_time_s"]
    return [float(r["value"]) for r in sorted(rows, key=lambda r: int(r["round"]))]


def run_config(args: argparse.Namespace, strategy: str, executor: str, out: Path) -> RunConfig:
    """The benchmark's run of ``strategy`` (``deploy`` is the flower executor's config)."""
    return make_config(
        {
            "stream": "rot-mnist", "strategy": strategy, "model": "mlp",
            "data_root": args.data_root, "train_size": args.train_size, "test_size": 200,
            "tasks": args.tasks, "rounds_per_task": args.rounds_per_task, "epochs": 1,
            "clients": args.clients, "device": "cpu", "seed": 0,
            "threads": None if executor == "flower" else 1,  # flower: Ray on every core
            "executor": "flower" if executor.startswith("deploy") else executor,
            "out": str(out), "overwrite": True,
        }
    )  # fmt: skip


def deployed_run(config: RunConfig, scratch: Path, workers: bool = True) -> Path:
    """Run ``config`` on a loopback deployment (SuperLink + one SuperNode per client);
    returns the run directory. Refuses to go on if the run failed or a process is left."""
    from cfl_bench.flower.launch import deployment, run_deployed, write_deploy_app
    from cfl_bench.flower.reaper import running

    app = write_deploy_app(config, scratch / "app")
    seen: set[int] = set()
    with deployment(scratch / "home", config.clients, seen, workers) as env:
        statuses = run_deployed(app, env, timeout_s=1200)
    left = sorted(pid for pid in seen if running(pid))
    if left:
        raise SystemExit(f"the deployment left processes running: {left}")
    if statuses != ["finished:completed"]:
        log = (scratch / "home" / "logs" / "superlink.log").read_text(errors="replace")
        raise SystemExit(f"the deployed run of {config.strategy} ended {statuses}:\n{log[-3000:]}")
    return Path(str(config.out))


def one_run(args: argparse.Namespace, strategy: str, executor: str, scratch: Path):  # type: ignore[no-untyped-def]
    """(round times, process wall seconds, records.csv bytes) of one run."""
    base = scratch / f"{strategy}-{executor}"
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(parents=True)
    cfg = run_config(args, strategy, executor, base / "run")
    started = time.perf_counter()
    if executor.startswith("deploy"):
        path = deployed_run(cfg, base, workers=executor == "deploy")
    else:
        result = execute(cfg)
        if result.summary["status"] != "finished":
            raise SystemExit(f"the {executor} run of {strategy} ended {result.summary['status']}")
        path = result.path
    wall = time.perf_counter() - started
    return round_times(path), wall, (path / "records.csv").read_bytes()


def summarise(times: list[float]) -> tuple[float, float]:
    """(round 1, mean of the later rounds)."""
    later = times[1:]
    return times[0], (sum(later) / len(later) if later else float("nan"))


def measure(args: argparse.Namespace, executors: tuple[str, ...], scratch: Path):  # type: ignore[no-untyped-def]
    """Best (round 1, later, wall) per (strategy, executor) over ``--repeats`` passes."""
    best: dict[tuple[str, str], tuple[float, float, float]] = {}
    for repeat in range(args.repeats):
        for strategy in args.strategies.split(","):
            order = executors if repeat % 2 == 0 else executors[::-1]
            seen: dict[str, bytes] = {}
            for executor in order:
                times, wall, seen[executor] = one_run(args, strategy, executor, scratch)
                first, later = summarise(times)
                old = best.get((strategy, executor), (first, later, wall))
                best[(strategy, executor)] = (
                    min(old[0], first), min(old[1], later), min(old[2], wall)
                )  # fmt: skip
            for executor in executors[1:]:
                if seen[executor] != seen["sequential"]:
                    print(f"warning: {strategy}: records.csv of {executor} differs from sequential")
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-root", default="../shared/data")
    parser.add_argument("--strategies", default="fedavg,der+fedgp")
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--tasks", type=int, default=1)
    parser.add_argument("--rounds-per-task", type=int, default=3)
    parser.add_argument("--train-size", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=1, help="best of N for each number")
    parser.add_argument("--no-deploy", action="store_true", help="skip the deployment runs")
    parser.add_argument(
        "--plain-deploy", action="store_true", help="add the deployment without node workers"
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    executors = EXECUTORS[:2] if args.no_deploy else EXECUTORS[:3]
    if args.plain_deploy:
        executors = (*executors, "deploy-plain")
    scratch = Path(tempfile.mkdtemp(prefix="bench-flower-"))
    try:
        best = measure(args, executors, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(
        f"{'strategy':>10} {'executor':>12} {'rd1 s':>8} {'later s':>8} {'rd1 ratio':>9} "
        f"{'later ratio':>11} {'wall s':>7}"
    )
    for strategy in args.strategies.split(","):
        s1, sl, _ = best[(strategy, "sequential")]
        for executor in executors:
            f1, fl, fw = best[(strategy, executor)]
            print(
                f"{strategy:>10} {executor:>12} {f1:>8.3f} {fl:>8.3f} {f1 / s1:>9.1f} "
                f"{fl / sl:>11.2f} {fw:>7.1f}"
            )


if __name__ == "__main__":
    main()
