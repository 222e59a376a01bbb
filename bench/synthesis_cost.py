"""What TARGET's server-side synthesis costs per task on CPU (strategies.synthesis).

    OMP_NUM_THREADS=1 python bench/synthesis_cost.py [--threads 1] [--classes 100]

Why: issue 43 says the server's synthesis dominates TARGET / LANDER / MFCL and asks for its
cost per task in the cost estimate. This times, for ResNet-32 on 32×32×3 at the code's
synthesis batch (256), one synthesis round of the code's 10 generator steps without the
adversarial term (the code's rounds before ``warmup``), one with it (rounds from ``warmup``
on: the student's forward too) and 10 KD steps (batch 256), then prints the implied seconds
per task for two schedules:

- *code*: what ``methods/target.py`` runs (its line 21 fixes the CIFAR-100 constants):
  10 rounds × 10 steps, warm-up 20, so no adversarial round and no KD step;
- *other branch*: its unreachable non-CIFAR constants, the schedule the field's notes quote
  (200 rounds × 50 steps, warm-up 20, 400 KD steps per round from round 21 on).

Per-step times are scaled from the measured 10-step rounds. The machine's other load counts.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import torch

from cfl_bench.runner.models import build_model
from cfl_bench.strategies.synthesis import SynthesisOptions, Synthesizer

TIMED_KD_STEPS = 10


def seconds(work: object) -> float:
    start = time.perf_counter()
    assert callable(work)
    work()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--classes", type=int, default=100)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    options = dataclasses.replace(SynthesisOptions(), kd_steps=TIMED_KD_STEPS)
    teacher = build_model("resnet32", (3, 32, 32), args.classes).eval()
    synthesizer = Synthesizer(teacher, args.classes, (3, 32, 32), options, seed=0)
    plain = seconds(synthesizer.synthesize)
    synthesizer.ep = options.warmup - 1  # the next round is the first with the adversarial term
    adversarial = seconds(synthesizer.synthesize)
    kd = seconds(synthesizer.kd_round)
    step_plain, step_adv = plain / options.g_steps, adversarial / options.g_steps
    kd_step = kd / TIMED_KD_STEPS
    print(f"threads {args.threads}, ResNet-32, {args.classes} classes, batch 256")
    print(f"synthesis round, {options.g_steps} steps, no adversarial term: {plain:.2f} s")
    print(f"synthesis round, {options.g_steps} steps, adversarial term:    {adversarial:.2f} s")
    print(f"{TIMED_KD_STEPS} KD steps: {kd:.2f} s ({kd_step:.3f} s a step)")
    code = options.syn_round * plain
    print(f"per task, the code's schedule (10 rounds x 10 steps, no KD): {code:.0f} s")
    rounds, steps, warmup, kd_steps = 200, 50, 20, 400
    plain_rounds, adv_rounds = warmup - 1, rounds - (warmup - 1)
    kd_rounds = rounds - warmup
    other = steps * (plain_rounds * step_plain + adv_rounds * step_adv)
    other += kd_rounds * kd_steps * kd_step
    print(
        f"per task, the other branch (200 x 50 steps, {kd_rounds} x 400 KD steps): "
        f"{other:.0f} s = {other / 3600:.1f} h"
    )


if __name__ == "__main__":
    main()
