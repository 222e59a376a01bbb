"""What LANDER's server-side synthesis (NAYER) costs per task end on CPU.

    OMP_NUM_THREADS=1 python bench/lander_synthesis_cost.py [--threads 1] [--repeats 2]

Why: issue 43 asks for the synthesis cost of each data-free method per task on CPU; TARGET's
is ``bench/synthesis_cost.py``, MFCL's was timed from its generator step. LANDER's schedule
(``methods/lander.py`` at the code's defaults, ``strategies.synthesis_nayer``) is
``syn_round + warmup`` = 50 rounds of ``g_steps`` = 40 generator steps on 256 images; the
adversarial student term joins from round ``warmup + 3`` = 13 on; from round ``warmup`` =
10 on every round also trains the KD student ``kd_steps`` = 50 steps on batches of the
local batch size (128). This builds the probe copy the run's cost estimate builds
(``NayerSynthesizer.price``, on the code's ResNet-18 with its embedding head, the anchors'
width 384 as MiniLM's), times one step of each kind (the best of ``--repeats``; the first
call also sets up kernels) and prints the kinds' counts and the implied seconds per task end.

The anchors here are random unit vectors: they change no shape and so no cost. The
machine's other load counts; run it on an idle machine for a clean number.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import torch

from cfl_bench.runner.models import build_model
from cfl_bench.strategies.lander_model import (
    EmbeddingModel,
    feature_width,
    outputs_and_embedding,
)
from cfl_bench.strategies.synthesis_nayer import NayerOptions, NayerSynthesizer, nayer_defaults
from cfl_bench.strategies.target import classifier_name

CLASSES, ANCHOR_WIDTH = 100, 384
KINDS = ("generator step, no adversarial term", "generator step, adversarial term", "KD step")


def best_seconds(work: object, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        assert callable(work)
        work()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=2, help="calls timed of each kind")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    base = build_model("resnet18", (3, 32, 32), CLASSES)
    teacher = EmbeddingModel(base, feature_width(base), ANCHOR_WIDTH, gen).eval()
    anchors = torch.nn.functional.normalize(torch.randn(CLASSES, ANCHOR_WIDTH, generator=gen))
    options = nayer_defaults(classifier="base." + classifier_name(base))
    probe = (dataclasses.replace(options, g_steps=1, kd_steps=1), NayerOptions())
    nayer = NayerSynthesizer(teacher, anchors, CLASSES, outputs_and_embedding, probe, seed=0)
    print(f"threads {args.threads}, ResNet-18 + embedding head, {CLASSES} classes")
    total = 0.0
    for kind, (count, unit) in zip(KINDS, nayer.price(options), strict=True):
        seconds = best_seconds(unit, args.repeats)
        total += count * seconds
        print(f"{kind}: {seconds:.2f} s x {count:.0f} = {count * seconds:.0f} s")
    print(f"per task end: {total:.0f} s = {total / 3600:.1f} h")


if __name__ == "__main__":
    main()
