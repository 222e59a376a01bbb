"""Does ``torch.compile`` of the vectorized executor's client step help? Measured, not assumed.

    python -m bench.compile_step --data-root ../shared/data [--repeats 3] [--clients 10,100]
        [--learners fedavg,der]

Protocol: as ``bench.executors`` (rot-mnist, the MLP, the first ``--train-size`` training
images of one task in label shards among K clients, batch 32, one epoch, every client per
round, CPU, one thread, ``--buffer-offer every_step``), vectorized executor only. Two
variants of the same run: the plain vmapped ``grad_and_value`` of the client loss, and the
same run with ``--compile`` (``ClientGradients.compile``: ``torch.compile``, inductor, default
mode). The compiled variant
runs one round first so compilation (and any recompilation for the last chunk's shapes)
is not timed; both variants then time the second round's ``executor.train``.

What is printed per row: samples/s of each variant, their ratio (compiled / plain), the
compile-and-first-round seconds, and whether the two runs' final global parameters are
equal to float rounding (max relative difference): a compiled step that changed results
would be no help at all. Best of ``--repeats``, variants alternating first.
"""

from __future__ import annotations

import argparse
from typing import Any

import torch

from bench.executors import Timed
from cfl_bench.engine.vectorized import VectorizedExecutor
from cfl_bench.runner.config import make_config
from cfl_bench.runner.run import plan_run


def one_run(args: argparse.Namespace, learner: str, clients: int, compiled: bool) -> dict[str, Any]:
    """Samples/s of round 2, seconds of round 1 and the final parameters of one run."""
    cfg = make_config(
        {
            "stream": "rot-mnist", "strategy": learner, "model": "mlp",
            "data_root": args.data_root, "train_size": args.train_size, "test_size": 200,
            "tasks": 1, "rounds_per_task": 2, "epochs": 1, "clients": clients,
            "executor": "vectorized", "threads": 1, "device": "cpu", "seed": 0,
            "probe_size": 50, "out": "/tmp/bench_compile", "buffer_offer": "every_step",
            "compile": compiled,
        }
    )  # fmt: skip
    plan = plan_run(cfg)
    fed = plan.federation()
    executor = fed.executor
    assert isinstance(executor, VectorizedExecutor)
    timed = Timed(executor, plan.schedule.steps.epochs)
    fed.executor = timed  # type: ignore[assignment]
    fed.run()
    (_, first_seconds), (samples, seconds) = timed.rounds[0], timed.rounds[-1]
    params = fed.global_state[0].clone()
    return {"rate": samples / seconds, "first": first_seconds, "params": params}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-root", default="../shared/data")
    parser.add_argument("--train-size", type=int, default=6000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--clients", default="10,100")
    parser.add_argument("--learners", default="fedavg,der")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = [(lr, int(k)) for lr in args.learners.split(",") for k in args.clients.split(",")]
    best: dict[tuple[str, int, bool], dict[str, Any]] = {}
    for repeat in range(args.repeats):
        for learner, k in rows:
            for compiled in (False, True) if repeat % 2 == 0 else (True, False):
                got = one_run(args, learner, k, compiled)
                old = best.get((learner, k, compiled))
                if old is None or got["rate"] > old["rate"]:
                    best[(learner, k, compiled)] = got
    print(f"{'learner':>8} {'K':>5} {'plain/s':>9} {'compiled/s':>10} {'ratio':>6} "
          f"{'plain rd1 s':>11} {'compiled rd1 s':>14} {'max rel diff':>12}")  # fmt: skip
    for learner, k in rows:
        plain, comp = best[(learner, k, False)], best[(learner, k, True)]
        diff = (plain["params"] - comp["params"]).abs().max() / plain["params"].abs().max()
        print(
            f"{learner:>8} {k:>5} {plain['rate']:>9.0f} {comp['rate']:>10.0f} "
            f"{comp['rate'] / plain['rate']:>6.2f} {plain['first']:>11.2f} "
            f"{comp['first']:>14.2f} {float(diff):>12.2e}"
        )


if __name__ == "__main__":
    main()
