"""Per-round time of the sequential executor vs the Flower simulation on the same run.

    python -m bench.flower_overhead --data-root ../shared/data [--repeats 1]
        [--strategies fedavg,der+fedgp] [--clients 10] [--train-size 2000]

Protocol: rot-mnist, the MLP, ``--clients`` clients all taking part, ``--tasks`` task(s) of
``--rounds-per-task`` rounds on the first ``--train-size`` training images, CPU, one
thread, seed 0. Each strategy runs once with ``--executor sequential`` (in this process)
and once with ``--executor flower`` (``flwr run``: a local SuperLink in simulation mode,
Ray, one SuperNode per client, 1 CPU per actor), ``--repeats`` times, the executors
alternating first within each pass.

What is measured: ``round_time_s`` of every round, read from each run's costs.csv (the
engine's own clock around a whole round: client updates, requests, aggregation,
evaluation). Round 1 is reported apart because under Flower it includes the start-up the
sequential executor does not pay (Ray, one actor per CPU, each actor's imports and data
set-up); "later" is the mean of rounds 2.. . Every number is the best of ``--repeats``
passes; ratios are flower / sequential. The process wall (launch to summary) of the best
pass is printed too: for Flower it adds the SuperLink and Ray start and stop.

The records themselves are identical across the two executors (tests/test_flower.py); this
script checks that on every pass as well and says so if not.
"""

from __future__ import annotations

import argparse
import csv
import shutil
import tempfile
import time
from pathlib import Path

import torch

from cfl_bench.config import make_config
from cfl_bench.run import execute

EXECUTORS = ("sequential", "flower")


def round_times(run_dir: Path) -> list[float]:
    """``round_time_s`` of each round, in round order, from the run's costs.csv."""
    with (run_dir / "costs.csv").open() as f:
        rows = [r for r in csv.DictReader(f) if r["metric"] == "round_time_s"]
    return [float(r["value"]) for r in sorted(rows, key=lambda r: int(r["round"]))]


def one_run(args: argparse.Namespace, strategy: str, executor: str, out: Path):  # type: ignore[no-untyped-def]
    """(round times, process wall seconds, records.csv bytes) of one run."""
    cfg = make_config(
        {
            "stream": "rot-mnist", "strategy": strategy, "model": "mlp",
            "data_root": args.data_root, "train_size": args.train_size, "test_size": 200,
            "tasks": args.tasks, "rounds_per_task": args.rounds_per_task, "epochs": 1,
            "clients": args.clients, "executor": executor, "threads": 1, "device": "cpu",
            "seed": 0, "out": str(out), "overwrite": True,
        }
    )  # fmt: skip
    started = time.perf_counter()
    result = execute(cfg)
    wall = time.perf_counter() - started
    if result.summary["status"] != "finished":
        raise SystemExit(f"the {executor} run of {strategy} ended {result.summary['status']}")
    return round_times(result.path), wall, (result.path / "records.csv").read_bytes()


def summarise(times: list[float]) -> tuple[float, float]:
    """(round 1, mean of the later rounds)."""
    later = times[1:]
    return times[0], (sum(later) / len(later) if later else float("nan"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-root", default="../shared/data")
    parser.add_argument("--strategies", default="fedavg,der+fedgp")
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--tasks", type=int, default=1)
    parser.add_argument("--rounds-per-task", type=int, default=3)
    parser.add_argument("--train-size", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=1, help="best of N for each number")
    args = parser.parse_args()
    torch.set_num_threads(1)
    strategies = args.strategies.split(",")
    best: dict[tuple[str, str], tuple[float, float, float]] = {}
    scratch = Path(tempfile.mkdtemp(prefix="bench-flower-"))
    try:
        for repeat in range(args.repeats):
            for strategy in strategies:
                order = EXECUTORS if repeat % 2 == 0 else EXECUTORS[::-1]
                seen: dict[str, bytes] = {}
                for executor in order:
                    out = scratch / f"{strategy}-{executor}"
                    times, wall, seen[executor] = one_run(args, strategy, executor, out)
                    first, later = summarise(times)
                    old = best.get((strategy, executor), (first, later, wall))
                    best[(strategy, executor)] = (
                        min(old[0], first), min(old[1], later), min(old[2], wall)
                    )  # fmt: skip
                if seen["sequential"] != seen["flower"]:
                    print(f"warning: {strategy}: records.csv differs between the executors")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(
        f"{'strategy':>10} {'seq rd1 s':>9} {'seq later s':>11} {'flwr rd1 s':>10} "
        f"{'flwr later s':>12} {'rd1 ratio':>9} {'later ratio':>11} {'seq wall s':>10} "
        f"{'flwr wall s':>11}"
    )
    for strategy in strategies:
        s1, sl, sw = best[(strategy, "sequential")]
        f1, fl, fw = best[(strategy, "flower")]
        print(
            f"{strategy:>10} {s1:>9.3f} {sl:>11.3f} {f1:>10.2f} {fl:>12.3f} {f1 / s1:>9.1f} "
            f"{fl / sl:>11.2f} {sw:>10.1f} {fw:>11.1f}"
        )


if __name__ == "__main__":
    main()
