"""Local-step CPU time of every convolutional model, contiguous (NCHW) against channels-last.

    python -m bench.memory_format [--repeats 5] [--models mnist-cnn,cifar-cnn]
    ATEN_CPU_CAPABILITY=avx2 python -m bench.memory_format      # as on an AVX2 machine

Why: ``--channels-last``'s default turns channels-last on for the
convolutional models whose CPU step it makes cheaper (``CHANNELS_LAST_ON_CPU`` in
``cfl_bench.runner.model_catalogue``). This script is the measurement behind that table:
rerun it on another CPU (or torch) to check it.

What is timed: one local step as the engine takes it — forward, cross-entropy, backward into
the flat gradient, flat SGD step — with one torch thread (the single-core protocol of
``bench.official_speed``; ``--threads`` for more), at the batch each model is trained with
in the shipped protocols, on the input it is used with. Both memory formats of one model
are timed in the same pass,
passes interleaved, and each number is the best of ``--repeats`` passes (CPU seconds of this
process, ``time.process_time``), so a slow phase of a shared machine hits both alike. The
ratio is channels-last / contiguous: below 1, channels-last is cheaper.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable

import torch
from torch.nn import functional as F

from cfl_bench.core.flat import FlatModel
from cfl_bench.engine.optim import FlatSGD
from cfl_bench.runner.model_catalogue import CHANNELS_LAST_ON_CPU
from cfl_bench.runner.models import build_model, use_channels_last

# model → (input shape, outputs, batch, steps per timing)
MODELS: dict[str, tuple[tuple[int, ...], int, int, int]] = {
    "mnist-cnn": ((1, 28, 28), 10, 32, 100),
    "fedavg-cnn": ((3, 32, 32), 10, 50, 10),
    "cifar-cnn": ((3, 32, 32), 10, 32, 20),
    "resnet8": ((3, 32, 32), 100, 64, 10),
    "resnet18": ((3, 32, 32), 10, 32, 2),
    "centernet": ((3, 192, 320), 3, 8, 2),
}

Timer = Callable[[int], float]


def step_timer(name: str, channels_last: bool) -> Timer:
    """A function returning the CPU seconds of one local step of ``name`` (mean of ``n``)."""
    shape, outputs, batch, _ = MODELS[name]
    torch.manual_seed(0)
    module = build_model(name, shape, outputs)
    if channels_last:
        use_channels_last(module, name)
    model = FlatModel(module)
    optimizer = FlatSGD(model.params, model.grads, 0.01, 0.0, 0.0)
    x = torch.rand(batch, *shape)
    with torch.no_grad():
        target = torch.rand_like(module(x))

    def loss(out: torch.Tensor) -> torch.Tensor:
        if out.dim() == 2:  # class logits
            return F.cross_entropy(out, target.argmax(dim=1))
        return F.mse_loss(out, target)  # a detector's dense maps: the same backward work

    def run(n: int) -> float:
        started = time.process_time()
        for _ in range(n):
            model.zero_grad()
            loss(module(x)).backward()
            optimizer.step()
        return (time.process_time() - started) / n

    return run


def measure(names: list[str], repeats: int) -> dict[tuple[str, bool], float]:
    """Best-of-``repeats`` seconds per step for each (model, channels-last)."""
    timers = {(n, cl): step_timer(n, cl) for n in names for cl in (False, True)}
    for timer in timers.values():  # first calls create oneDNN's primitives
        timer(1)
    best = dict.fromkeys(timers, float("inf"))
    for _ in range(repeats):
        for (name, cl), timer in timers.items():
            best[name, cl] = min(best[name, cl], timer(MODELS[name][3]))
    return best


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="best of N interleaved passes")
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated names")
    parser.add_argument("--threads", type=int, default=1, help="torch threads [1]")
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.models.split(",") if n.strip()]
    unknown = sorted(set(names) - set(MODELS))
    if unknown:
        parser.error(f"no timing set up for {', '.join(unknown)}; choose from {', '.join(MODELS)}")
    torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)  # as configure_cpu does
    capability = torch.backends.cpu.get_cpu_capability()
    print(f"torch {torch.__version__}, CPU capability {capability}, {args.threads} thread(s), load "
          f"{' '.join(f'{v:.2f}' for v in os.getloadavg())}")  # fmt: skip
    best = measure(names, args.repeats)
    print("| model | batch | contiguous ms | channels-last ms | ratio | auto |")
    print("|---|---:|---:|---:|---:|---|")
    for name in names:
        plain, last = best[name, False] * 1e3, best[name, True] * 1e3
        auto = "channels-last" if name in CHANNELS_LAST_ON_CPU else "contiguous"
        cells = (name, MODELS[name][2], f"{plain:.2f}", f"{last:.2f}", f"{last / plain:.2f}", auto)
        print("| " + " | ".join(map(str, cells)) + " |")


if __name__ == "__main__":
    main()
