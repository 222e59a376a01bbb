"""Local-training throughput and peak memory of the sequential vs the vectorized executor.

    python -m bench.executors --data-root ../shared/data [--repeats 3]
        [--learners fedavg,der,der+fedgp] [--sizes 10:1,100:1,100:0.1,1000:1,1000:0.1]
        [--amp off|bf16|fp16] [--device cpu|cuda]
        [--model mlp|mnist-cnn]

Protocol: rot-mnist, the MLP by default (``--model mnist-cnn``: the stream's default MNIST
CNN, whose dropout masks the vectorized executor draws per client), the first
``--train-size`` training images of one task split in label shards among K clients, batch
32, 1 local epoch, CPU, one thread. Every learner of ``--learners`` at every K:participation
of ``--sizes`` (the issue's grid: K = 10, 100, 1000 with every client or a tenth per round;
K = 1000's data set-up alone takes most of a minute per run). Replay learners use buffer 200
per client and replay batches of 32 (the defaults) with ``--buffer-offer every_step``, so
the measured second round replays and inserts at every step. A "learner" may be a
composition: ``der+fedgp`` (the FedGP paper's protocol) adds FedGP's batched projection at
every step of the second round, against the reference gradient that the clients computed
after the first.

What is measured: samples/s = examples trained in one round / seconds inside
``executor.train`` of that round (the second of two rounds, so one-time set-up such as
functorch's first ``vmap`` is not counted), and the peak RSS growth of the run over the
RSS it had once its data and model were set up (``ru_maxrss``; each measurement runs in
its own process, forked after torch is imported, so the high-water mark is its own), also
divided by the clients trained per round ("per client": what a GPU chunk would need per
client is measured by the executor itself on CUDA, see ``engine.vectorized_memory``).
``--amp`` is passed to both executors' runs (``engine.amp``: bf16/fp16 autocast of the
local forwards; fp16 needs ``--device cuda``), so the table can be measured in mixed
precision. Every number is the best of ``--repeats`` passes, the two executors alternating first
within each pass; ratios are vectorized / sequential, measured in this one process.
"""

from __future__ import annotations

import argparse
import multiprocessing
import resource
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from cfl_bench.engine.client_update import ClientJob
from cfl_bench.engine.executor import Executor, ResultSink
from cfl_bench.runner.config import AMP_MODES, make_config
from cfl_bench.runner.run import plan_run

EXECUTORS = ("sequential", "vectorized")


class Timed:
    """An executor wrapper counting each round's trained examples and train seconds."""

    def __init__(self, inner: Executor, epochs: int) -> None:
        self.inner, self.epochs = inner, epochs
        self.rounds: list[tuple[int, float]] = []

    def train(self, jobs: Sequence[ClientJob], sink: ResultSink) -> None:
        started = time.perf_counter()
        self.inner.train(jobs, sink)
        if torch.cuda.is_initialized():  # the kernels queued by the round have run
            torch.cuda.synchronize()
        seconds = time.perf_counter() - started
        self.rounds.append((sum(j.client.num_samples for j in jobs) * self.epochs, seconds))

    def answer(self, *args: object) -> None:
        self.inner.answer(*args)  # type: ignore[arg-type]

    def end_tasks(self, *args: object) -> None:
        self.inner.end_tasks(*args)  # type: ignore[arg-type]


def rss_bytes() -> int:
    """The current resident set size of this process."""
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * resource.getpagesize()


Row = tuple[str, int, float]  # (learner, K, participation)


def measure(args: argparse.Namespace, row: Row, executor: str):  # type: ignore[no-untyped-def]
    """(samples/s of the last round, peak memory growth in bytes) of one run, in this
    process: RSS on the CPU, memory allocated by torch on CUDA."""
    torch.set_num_threads(1)
    learner, clients, participation = row
    cfg = make_config(
        {
            "stream": "rot-mnist", "strategy": learner, "model": args.model,
            "data_root": args.data_root, "train_size": args.train_size, "test_size": 200,
            "tasks": 1, "rounds_per_task": 2, "epochs": 1, "clients": clients,
            "participation": participation, "executor": executor, "threads": 1,
            "device": args.device, "seed": 0, "amp": args.amp, "probe_size": 50,
            "out": "/tmp/bench_executors",
            "clients_per_chunk": args.clients_per_chunk if executor == "vectorized" else None,
            "buffer_offer": "every_step",
        }
    )  # fmt: skip
    plan = plan_run(cfg)
    fed = plan.federation()
    timed = Timed(fed.executor, plan.schedule.steps.epochs)
    fed.executor = timed  # type: ignore[assignment]
    if args.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
        start = torch.cuda.memory_allocated()
    else:
        start = rss_bytes()
    fed.run()
    samples, seconds = timed.rounds[-1]
    if args.device == "cuda":
        peak = torch.cuda.max_memory_allocated()
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return samples / seconds, max(peak - start, 0)


def _child(args: argparse.Namespace, row: Row, executor: str, queue) -> None:  # type: ignore[no-untyped-def]
    queue.put(measure(args, row, executor))


def forked(args: argparse.Namespace, row: Row, executor: str) -> tuple[float, int]:
    """``measure`` in a forked child, so its peak memory is its own."""
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    process = ctx.Process(target=_child, args=(args, row, executor, queue))
    process.start()
    process.join()  # (the result is two numbers: the queue cannot fill up)
    if process.exitcode != 0:
        raise SystemExit(f"the {executor} measurement of {row[0]} at K = {row[1]} failed")
    return queue.get(timeout=10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-root", default="../shared/data")
    parser.add_argument("--train-size", type=int, default=6000)
    parser.add_argument("--repeats", type=int, default=3, help="best of N for each number")
    parser.add_argument("--clients-per-chunk", type=int, default=None)
    parser.add_argument("--amp", default="off", choices=AMP_MODES, help="the runs' --amp")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--model", default="mlp", choices=("mlp", "mnist-cnn"))
    parser.add_argument(
        "--learners",
        default="fedavg,der,der+fedgp",
        help="comma-separated learners (or compositions) to measure",
    )
    parser.add_argument(
        "--sizes",
        default="10:1,100:1,100:0.1,1000:1,1000:0.1",
        help="comma-separated K:participation pairs",
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    sizes = [(int(k), float(p)) for k, p in (pair.split(":") for pair in args.sizes.split(","))]
    rows: list[Row] = [(lr, k, p) for lr in args.learners.split(",") for k, p in sizes]
    best: dict[tuple[Row, str], tuple[float, int]] = {}
    for repeat in range(args.repeats):
        for row in rows:
            order = EXECUTORS if repeat % 2 == 0 else EXECUTORS[::-1]
            for executor in order:
                rate, peak = forked(args, row, executor)
                old = best.get((row, executor), (0.0, peak))
                best[(row, executor)] = (max(old[0], rate), min(old[1], peak))
    print(
        f"{'learner':>10} {'K':>5} {'part.':>5} {'clients/rd':>10} {'seq samples/s':>14} "
        f"{'vec samples/s':>14} {'ratio':>6} {'seq peak MiB':>12} {'vec peak MiB':>12} "
        f"{'vec KiB/client':>14}"
    )
    for row in rows:
        (seq, seq_peak), (vec, vec_peak) = best[(row, "sequential")], best[(row, "vectorized")]
        per_round = max(1, round(row[1] * row[2]))
        print(
            f"{row[0]:>10} {row[1]:>5} {row[2]:>5} {per_round:>10} {seq:>14.0f} {vec:>14.0f} "
            f"{vec / seq:>6.2f} {seq_peak / 2**20:>12.1f} {vec_peak / 2**20:>12.1f} "
            f"{vec_peak / 2**10 / per_round:>14.0f}"
        )


if __name__ == "__main__":
    main()
