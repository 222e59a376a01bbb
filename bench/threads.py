"""Local-step time of every model at 1, 2, … usable cores torch threads, under the current load.

    python bench/threads.py [--repeats 5] [--models mlp,resnet18]

Why: torch's default thread count (all cores) made small runs several times slower on a
busy 2-core machine — OpenMP workers spin at every barrier while the cores they wait for are
busy elsewhere, and their denormal arithmetic is not flushed to zero (only the main thread's
is, see ``cfl_bench.runner.run.configure_cpu``). ``cfl_bench.runner.threads.choose_threads``
picks the default from these numbers; this script is how to check the rule on another machine.

What is timed: one local step as the engine runs it — forward, cross-entropy, backward into
the flat gradient, flat SGD step — on a batch of 32, for each model on the input it is used
with (``mlp`` on the 8×8 digits, ``linear`` on a 384-dim sentence embedding, ``mnist-cnn``
on 1×28×28, ``cifar-cnn`` and ``resnet18`` on 3×32×32). Inputs are uniform in [0, 1] (step
time does not depend on the values once denormals are flushed). Every (model, threads)
setting is measured once per pass and passes are interleaved, so a slow phase of a shared
machine hits all settings alike; each number is the best of ``--repeats`` passes. The load
average is printed before and after, because the ratios depend on it.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch.nn import functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cfl_bench.core.flat import FlatModel
from cfl_bench.engine.optim import FlatSGD
from cfl_bench.runner.models import build_model
from cfl_bench.runner.threads import forward_flops, usable_cores

# model → (input shape, classes, steps per timing: resnet18 is ~1 s a step on 2 cores)
MODELS: dict[str, tuple[tuple[int, ...], int, int]] = {
    "mlp": ((1, 8, 8), 10, 200),
    "linear": ((384,), 14, 400),
    "mnist-cnn": ((1, 28, 28), 10, 50),
    "cifar-cnn": ((3, 32, 32), 100, 10),
    "resnet18": ((3, 32, 32), 100, 2),
}
BATCH = 32


def step_timer(name: str) -> tuple[Callable[[int], float], int]:
    """A function timing ``n`` local steps of model ``name``, and its FLOPs per sample."""
    shape, classes, _ = MODELS[name]
    torch.manual_seed(0)
    module = build_model(name, shape, classes)
    flops = forward_flops(module, shape)
    model = FlatModel(module)
    optimizer = FlatSGD(model.params, model.grads, 0.01, 0.0, 0.0)
    x = torch.rand(BATCH, *shape)
    y = torch.randint(0, classes, (BATCH,))

    def run(n: int) -> float:
        started = time.perf_counter()
        for _ in range(n):
            model.zero_grad()
            F.cross_entropy(module(x), y).backward()
            optimizer.step()
        return (time.perf_counter() - started) / n

    return run, flops


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="best of N interleaved passes")
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated names")
    args = parser.parse_args()
    names = [n.strip() for n in args.models.split(",") if n.strip()]
    cores = usable_cores()
    counts = list(range(1, cores + 1))
    torch.set_flush_denormal(True)  # as configure_cpu does for the main thread
    load_before = os.getloadavg()
    print(f"torch {torch.__version__}, {cores} usable cores, load average {fmt(load_before)}")
    timers = {name: step_timer(name) for name in names}
    for run, _ in timers.values():  # first calls set up oneDNN primitives
        for threads in counts:
            torch.set_num_threads(threads)
            run(1)
    best = {(name, threads): float("inf") for name in names for threads in counts}
    for _ in range(args.repeats):
        for name, (run, _) in timers.items():
            for threads in counts:
                torch.set_num_threads(threads)
                best[name, threads] = min(best[name, threads], run(MODELS[name][2]))
    load_after = os.getloadavg()

    header = f"{'model':<11}{'params':>11}{'MFLOP/sample':>14}"
    header += "".join(f"{f'{t} thr ms':>11}" for t in counts)
    header += "".join(f"{f'{t}/1':>7}" for t in counts[1:])
    print(header)
    for name, (_, flops) in timers.items():
        shape, classes, _ = MODELS[name]
        params = sum(p.numel() for p in build_model(name, shape, classes).parameters())
        row = f"{name:<11}{params:>11,}{flops / 1e6:>14.2f}"
        row += "".join(f"{best[name, t] * 1e3:>11.2f}" for t in counts)
        row += "".join(f"{best[name, t] / best[name, 1]:>7.2f}" for t in counts[1:])
        print(row)
    print(
        f"load average after: {fmt(load_after)}. ms = best-of-{args.repeats} time of one "
        f"local step (forward + CE + backward + flat SGD, batch {BATCH}); t/1 = time with t "
        f"threads over time with 1 (below 1: more threads help)."
    )


def fmt(load: tuple[float, float, float]) -> str:
    return " ".join(f"{v:.2f}" for v in load)


if __name__ == "__main__":
    main()
