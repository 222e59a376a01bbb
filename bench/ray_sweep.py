"""Per-point overhead of ``cfl-bench sweep --backend ray`` against ``--jobs`` on one grid.

    python -m bench.ray_sweep [--points 6] [--cpus 1,1] [--train-size 300]

Why: a Ray task per point pays for the task's scheduling and, above all, for a fresh
interpreter that imports torch and the engine (``sweep.point``), where a local sweep forks
each run from a server that imported them once (``sweep.launcher``). This measures what
that costs per point, so a user knows from which run length a cluster pays off.

How: a loopback cluster of real nodes (``bench.ray_cluster``; ``--cpus`` lists each node's
CPUs, default a head and one more node of 1 CPU each) and the same grid of tiny FedAvg runs
on the embedded digits (seeds 0..N-1, each point ~0.3 s of training) run as a local sweep
with ``--jobs`` = the cluster's CPUs and on the cluster with ``--cpus-per-run 1``, each
sweep a child process timed from spawn to exit. The overhead per point is the difference
of the two sweeps' wall times times the CPUs, over the points (what each point costs a CPU
more on the cluster); the median of the runs' own ``wall_time_s`` (summary.json, from the
run's start to its end) shows the runs themselves took the same. The records of every point
are compared too (they must be byte-identical).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.ray_cluster import loopback_cluster, ray_env


def grid(points: int, train_size: int) -> list[str]:
    """``points`` tiny FedAvg runs (one per seed) on the embedded rot-digits stream."""
    seeds = [arg for seed in range(points) for arg in ("--seed", str(seed))]
    return [
        "--stream", "rot-digits", "--strategy", "fedavg", "--model", "mlp", "--tasks", "2",
        "--rounds-per-task", "1", "--train-size", str(train_size), "--test-size", "100",
        "--no-leaderboard", *seeds,
    ]  # fmt: skip


def timed_sweep(out: Path, args: list[str]) -> float:
    """Wall seconds of one ``cfl-bench sweep`` child process (it must exit 0)."""
    command = [sys.executable, "-m", "cfl_bench.cli", "sweep", "--out", str(out), *args]
    started = time.perf_counter()
    done = subprocess.run(command, env=ray_env(), capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"sweep into {out} exited {done.returncode}:\n{done.stdout[-3000:]}")
    return seconds


def point_walls(out: Path) -> list[float]:
    """Every point's run wall time (``wall_time_s`` in ``out/sweep.json``, taken from its
    summary.json)."""
    manifest = json.loads((out / "sweep.json").read_text())
    return [float(p["wall_time_s"]) for p in manifest["points"]]


def same_records(a: Path, b: Path) -> bool:
    names = sorted(p.parent.name for p in a.glob("*/records.csv"))
    return bool(names) and all(
        (a / n / "records.csv").read_bytes() == (b / n / "records.csv").read_bytes() for n in names
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--points", type=int, default=6, help="grid points [default: 6]")
    parser.add_argument("--cpus", default="1,1", help="CPUs of each node [default: 1,1]")
    parser.add_argument("--train-size", type=int, default=300, help="images [default: 300]")
    args = parser.parse_args()
    cpus = [int(c) for c in args.cpus.split(",")]
    points = grid(args.points, args.train_size)
    with tempfile.TemporaryDirectory(prefix="ray-sweep-") as scratch:
        local, remote = Path(scratch) / "local", Path(scratch) / "ray"
        local_s = timed_sweep(local, ["--jobs", str(sum(cpus)), *points])
        started = time.perf_counter()
        with loopback_cluster(cpus) as address:
            cluster_s = time.perf_counter() - started
            ray_s = timed_sweep(
                remote, ["--backend", "ray", "--address", address, "--cpus-per-run", "1", *points]
            )
        local_point = statistics.median(point_walls(local))
        ray_point = statistics.median(point_walls(remote))
        identical = same_records(local, remote)
    print(f"{args.points} points, nodes with {args.cpus} CPUs (cluster start {cluster_s:.1f} s)")
    print(f"{'backend':<10}{'sweep wall s':>14}{'median run s':>14}")
    print(f"{'local':<10}{local_s:>14.1f}{local_point:>14.2f}")
    print(f"{'ray':<10}{ray_s:>14.1f}{ray_point:>14.2f}")
    overhead = (ray_s - local_s) * sum(cpus) / args.points
    print(f"overhead per point: {overhead:.1f} CPU-seconds ((ray - local wall) x CPUs / points)")
    print(f"records identical: {identical}")


if __name__ == "__main__":
    main()
