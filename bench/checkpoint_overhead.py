"""Checkpoint overhead: the same run with checkpoints at every round and without any.

Measured in one process, interleaved, best of ``--repeats`` (the project's rule for
timings on a shared machine): run time with ``--checkpoint-every 1`` (the worst case; the
default policy writes at most this often) against ``--checkpoint-every 0``, plus the size of
one checkpoint and the time spent writing them as reported by the run itself.

    python bench/checkpoint_overhead.py --data-root ../shared/data            # rot-mnist slice
    python bench/checkpoint_overhead.py --train-size 60000 --tasks 5 --rounds 5   # full protocol
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

from cfl_bench.runner.config import make_config
from cfl_bench.runner.run import execute


def one_run(options: dict[str, Any], out: Path, every: int) -> dict[str, Any]:
    result = execute(make_config({**options, "out": str(out), "checkpoint_every": every}))
    summary = result.summary
    records = (out / "records.csv").read_bytes()
    return {
        "wall": float(summary["wall_time_s"]),  # type: ignore[arg-type]
        "checkpoint": summary["checkpoint"],
        "records": records,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data-root", default="../shared/data")
    parser.add_argument("--strategy", default="der+fedgp")
    parser.add_argument("--tasks", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--train-size", type=int, default=12000)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    options = {
        "stream": "rot-mnist",
        "strategy": args.strategy,
        "data_root": args.data_root,
        "tasks": args.tasks,
        "rounds_per_task": args.rounds,
        "clients": 10,
        "train_size": args.train_size,
        "threads": args.threads,
        "seed": 0,
    }
    walls: dict[int, list[float]] = {1: [], 0: []}
    stats: dict[str, Any] = {}
    records: dict[int, bytes] = {}
    with tempfile.TemporaryDirectory() as scratch:
        for repeat in range(args.repeats):
            for every in (1, 0):
                out = Path(scratch) / f"r{repeat}-{every}"
                got = one_run(options, out, every)
                walls[every].append(got["wall"])
                records[every] = got["records"]
                if every == 1:
                    stats = got["checkpoint"]
    best_with, best_without = min(walls[1]), min(walls[0])
    report = {
        "protocol": options,
        "wall_s_with_checkpoints_every_round": walls[1],
        "wall_s_without": walls[0],
        "best_ratio_with_over_without": best_with / best_without,
        "checkpoints_written": stats.get("written"),
        "checkpoint_bytes": stats.get("bytes"),
        "checkpoint_seconds_total": stats.get("seconds"),
        "records_identical": records[1] == records[0],
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
