"""The default number of torch CPU threads of a run, chosen from measurements.

Why not torch's default (one thread per core): every op of a multi-threaded local step ends
at an OpenMP barrier, and on a shared machine the cores the other threads need are often
busy, so the step waits for them to be scheduled again (torch's worker threads also keep
denormal floats; only the main thread flushes them, see ``cfl_bench.runner.plan.configure_cpu``).
Measured with ``bench/threads.py`` on 2 cores (README, Performance), a local step with 2
threads instead of 1 took:

* under load (1-minute load average 1.4–2.5): 2.2–2.9× as long for the small models
  (``mlp``, ``linear``, ``mnist-cnn``), 2.4× for ``cifar-cnn``, 1.5× for ``resnet18``;
* on a quiet machine (load below 1): the same for ``mlp`` and ``linear`` (0.03 and
  0.01 MFLOP a sample: too little work to split), 0.70× for ``mnist-cnn`` (1 MFLOP),
  0.61× for ``cifar-cnn`` (21 MFLOP), 0.58× for ``resnet18`` (1.1 GFLOP); real engine runs
  agreed (rot-mnist 0.70×, seq-cifar10 with cifar-cnn 0.59×, rot-digits 1.01×).

So more threads gain at most ~1.7× on free cores and lose up to ~3× on busy ones. The rule
(``choose_threads``): an explicit ``--threads`` always wins; otherwise 1 thread for a model
below ``SMALL_FLOPS`` forward FLOPs a sample (nothing to gain), else the *free* usable cores:
usable cores minus the 1-minute load average, rounded, at least 1 — so a busy machine gets
1 thread, two idle cores get 2. The thread count is outside the protocol hash (records are
byte-identical only for the same count), so a resumed run keeps its checkpoint's count
(``cfl_bench.runner.round_keeper``) and a sweep sets its own (usable cores / jobs).
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass

import torch

# Forward FLOPs a sample below which a model always gets one thread (between the measured
# mlp, 0.03 MFLOP, no gain from a second thread, and mnist-cnn, 1 MFLOP, 0.70× the time).
SMALL_FLOPS = 0.25e6


@dataclass(frozen=True)
class ThreadsChoice:
    """How many torch threads a run uses and why (recorded in config.json)."""

    threads: int
    reason: str
    cores: int
    load: float

    def record(self) -> dict[str, object]:
        return {
            "threads": self.threads,
            "reason": self.reason,
            "cores": self.cores,
            "load": round(self.load, 2),
        }


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask, not the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def current_load() -> float:
    """The 1-minute load average (0 where the platform has none)."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return 0.0


def choose_threads(
    requested: int | None, flops_per_sample: float | None, cores: int, load: float
) -> ThreadsChoice:
    """The run's thread count: ``requested`` if given, else the measured rule (module doc).

    Pure, so the rule is testable on hand-picked inputs. ``flops_per_sample`` None (unknown
    model) is treated as small: one thread is never several times slower than the best.
    """
    cores = max(1, cores)
    if requested is not None:
        return ThreadsChoice(requested, "--threads given", cores, load)
    if flops_per_sample is None or flops_per_sample < SMALL_FLOPS:
        size = "size unknown" if flops_per_sample is None else mflops(flops_per_sample)
        return ThreadsChoice(
            1,
            f"small model ({size} a sample, below {mflops(SMALL_FLOPS)}): more threads cannot help",
            cores,
            load,
        )
    free = max(1, min(cores, round(cores - load)))
    if free == 1 and cores > 1:
        reason = f"busy machine: load {load:.2f} on {cores} usable cores leaves 1 free"
    else:
        reason = f"{mflops(flops_per_sample)} a sample; {free} of {cores} usable cores free"
    return ThreadsChoice(free, reason, cores, load)


def mflops(flops: float) -> str:
    return f"{flops / 1e6:.3g} MFLOP"


def forward_flops(model: torch.nn.Module, input_shape: tuple[int, ...]) -> int:
    """FLOPs of one forward pass of one sample, counted by torch's FLOP counter.

    Counted on a deep copy in eval mode, under a forked RNG and without gradients, so the
    run's model (parameters, BatchNorm statistics) and random streams are left untouched.
    """
    from torch.utils.flop_counter import FlopCounterMode

    device = next(model.parameters()).device
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        probe = copy.deepcopy(model).eval()
        counter = FlopCounterMode(display=False)
        with counter:
            probe(torch.zeros(1, *input_shape, device=device))
    return int(counter.get_total_flops())
