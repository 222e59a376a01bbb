"""CPU time, wall time and peak memory of cfl-bench against the official FedGP / Fed-A-GEM code.

    nice -n 5 python -m bench.official_speed --official /tmp/official \\
        --official-python /tmp/vo/bin/python --data-root ../shared/data [--repeats 3]

Why: issue 27 (item 5) asks whether cfl-bench runs the FedGP paper's protocol cheaper than
the authors' own code (Dai et al., "Buffer-based gradient projection for continual federated
learning", later titled Fed-A-GEM; github.com/shenghongdai/Fed-A-GEM, measured at commit
a01b8752). A claim like "2x less CPU" is only worth something if both programs do the same
work, are measured the same way and are measured often enough to see the noise, so this
script fixes all three.

Same protocol, both sides: rotated MNIST (full 60k train / 10k test, one random angle per
task, no normalisation), 10 clients holding 2 label shards of 3,000 images each (drawn once
for all tasks), 2 tasks x 2 rounds, 1 local epoch, batch 32, SGD lr 0.01 without momentum,
DER with alpha = 1 plus FedGP, a 200-example reservoir per client (filled on the first pass
over a task), replay draws of 32, and g_ref from 32 buffer examples per client in train mode.
FedAvg weights are uniform in the official code; cfl-bench is given ``--weighting uniform``
(every client holds 6,000 images, so the two weightings coincide anyway). cfl-bench also
computes what the official code does not (memory drift on 500 probe examples per task, the
client spread at task ends, records and checkpoints): that is part of its cost, not removed.

How: each repeat runs both programs as whole child processes, one after the other, the first
alternating between repeats so slow drift of the (shared) machine hits both alike. Each
child is reaped with ``os.wait4``, which gives that process's own user + system CPU seconds
and its peak resident set (``ru_maxrss``); wall time is taken around spawn and reap. Both run
single-threaded: ``OMP_NUM_THREADS=1`` and ``MKL_NUM_THREADS=1`` in their environment (the
official code has no thread option; torch reads these at start), and ``--threads 1`` for
cfl-bench. cfl-bench runs twice per repeat: as is (its defaults: channels-last convolutions
and the batch and replay forwards joined, docs/executors.md "The CPU fast path"), and with
``--no-channels-last`` (contiguous convolutions, which round differently). The
table gives medians over the repeats and the ratios official / cfl-bench for each variant
(above 1: cfl-bench is cheaper). Each run's final average accuracy over the two tasks is
printed too, so a fast run that learned nothing would show.

Offline, without touching the official checkout: it reads MNIST through
``torchvision.datasets.MNIST('../data/mnist/', download=True)`` relative to its working
directory, and torchvision skips the download only when the *uncompressed* idx files exist.
So the script copies the checkout into a temporary folder, runs it there (its
``result.txt`` and ``save/`` land in the copy), and gunzips ``<data-root>/MNIST/raw/*.gz``
into ``<tmp>/data/mnist/MNIST/raw/``. No source patch is needed. The official code needs
torch, torchvision, numpy and matplotlib; ``--official-python`` names an interpreter that
has them (e.g. a separate venv with torch 2.14.1 / torchvision 0.29.1, as cfl-bench's lock).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# The protocol, written once and passed to both programs.
CLIENTS = 10
TASKS = 2
ROUNDS_PER_TASK = 2
EPOCHS = 1
BATCH = 32
LR = 0.01
BUFFER = 200
ALPHA = 1.0
SEED = 0

MNIST_FILES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)
THREAD_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
# Ten classes: chance is 10 %; a run below this did not learn and its timing means little.
SANE_ACCURACY = 20.0
OFFICIAL_ACCURACY = re.compile(r"Domain-il accuracy: ([0-9.]+)")
MIB = 1024 * 1024
# The second cfl-bench side: the same run with contiguous convolutions (cfl_bench.runner.models).
CONTIGUOUS = "cfl-bench --no-channels-last"


@dataclass(frozen=True)
class Program:
    """One side of the comparison: a command, where it runs and how its accuracy is read."""

    name: str
    argv: list[str]
    cwd: Path
    env: dict[str, str]
    run_dir: Path | None  # cfl-bench: the --out folder (summary.json); official: None


@dataclass(frozen=True)
class Measurement:
    """One child process: CPU (user + sys) and wall seconds, peak RSS, final accuracy."""

    cpu_s: float
    wall_s: float
    peak_mib: float
    accuracy: float


def child_env(extra: dict[str, str]) -> dict[str, str]:
    """The parent's environment with one thread forced and ``extra`` added."""
    env = dict(os.environ)
    env.update(THREAD_ENV)
    env.update(extra)
    return env


def cfl_program(
    python: str, data_root: Path, out: Path, name: str = "cfl-bench", extra: Sequence[str] = ()
) -> Program:
    """cfl-bench's command for the protocol (run from this checkout), plus ``extra`` flags."""
    argv = [
        python, "-m", "cfl_bench", "run",
        "--stream", "rot-mnist",
        "--strategy", f"der:alpha={ALPHA}+fedgp",
        "--tasks", str(TASKS),
        "--rounds-per-task", str(ROUNDS_PER_TASK),
        "--clients", str(CLIENTS),
        "--epochs", str(EPOCHS),
        "--batch-size", str(BATCH),
        "--lr", str(LR),
        "--buffer-size", str(BUFFER),
        "--weighting", "uniform",
        "--seed", str(SEED),
        "--threads", "1",
        "--device", "cpu",
        "--data-root", str(data_root.resolve()),
        "--out", str(out),
        "--overwrite",
        *extra,
    ]  # fmt: skip
    env = child_env({"PYTHONPATH": str(REPO)})
    return Program(name, argv, REPO, env, out)


def official_program(python: str, copy: Path) -> Program:
    """The official ``main.py`` for the protocol, run in its temporary copy."""
    argv = [
        python, "main.py",
        "--algo", "der", "--booster",
        "--dataset", "mnist", "--model", "cnn", "--num_channels", "1",
        "--num_tasks", str(TASKS),
        "--task_epoch", str(ROUNDS_PER_TASK),
        "--num_users", str(CLIENTS),
        "--local_ep", str(EPOCHS),
        "--local_bs", str(BATCH),
        "--lr", str(LR),
        "--momentum", "0",
        "--buffer_size", str(BUFFER),
        "--minibatch_size", str(BATCH),
        "--alpha", str(ALPHA),
        "--num_exp", "1",
        "--gpu", "-1",
        "--seed", str(SEED),
    ]  # fmt: skip
    return Program("official", argv, copy, child_env({}), None)


def stage_official(checkout: Path, data_root: Path, scratch: Path) -> Path:
    """Copy the official checkout to ``scratch/official`` and lay MNIST out where it looks
    (``../data/mnist/MNIST/raw``, uncompressed); returns the copy."""
    if not (checkout / "main.py").is_file():
        raise SystemExit(f"{checkout} has no main.py: not the Fed-A-GEM checkout")
    copy = scratch / "official"
    for stale in (copy, scratch / "data"):
        shutil.rmtree(stale, ignore_errors=True)
    shutil.copytree(checkout, copy, ignore=shutil.ignore_patterns(".git", "save", "__pycache__"))
    raw = scratch / "data" / "mnist" / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for name in MNIST_FILES:
        source = data_root / "MNIST" / "raw" / f"{name}.gz"
        if not source.is_file():
            raise SystemExit(f"missing {source} (see ../shared/data/README.md)")
        with gzip.open(source, "rb") as src, open(raw / name, "wb") as dst:
            shutil.copyfileobj(src, dst)
    return copy


def run_child(program: Program, log: Path) -> tuple[float, float, float]:
    """Run ``program`` to its end; returns (CPU s, wall s, peak MiB) of that process alone."""
    with open(log, "wb") as out:
        started = time.perf_counter()
        proc = subprocess.Popen(
            program.argv, cwd=program.cwd, env=program.env, stdout=out, stderr=subprocess.STDOUT
        )
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        tail = log.read_text(errors="replace")[-3000:]
        raise SystemExit(f"{program.name} exited with {proc.returncode}; log {log}:\n{tail}")
    peak_mib = usage.ru_maxrss * 1024 / MIB  # Linux: ru_maxrss is in KiB
    return usage.ru_utime + usage.ru_stime, wall, peak_mib


def final_accuracy(program: Program, log: Path) -> float:
    """The run's final average accuracy over the tasks seen (percent)."""
    if program.run_dir is not None:
        summary = json.loads((program.run_dir / "summary.json").read_text())
        return float(summary["Acc_T"])
    found = OFFICIAL_ACCURACY.findall(log.read_text(errors="replace"))
    if not found:
        raise SystemExit(f"no 'Domain-il accuracy' line in {log}")
    return float(found[-1])


def measure(program: Program, log: Path) -> Measurement:
    """One timed run of ``program`` and its accuracy."""
    if program.run_dir is not None and program.run_dir.exists():
        shutil.rmtree(program.run_dir)
    cpu, wall, peak = run_child(program, log)
    return Measurement(cpu, wall, peak, final_accuracy(program, log))


def paired_repeats(
    programs: dict[str, list[Program]], repeats: int, logs: Path
) -> dict[str, list[Measurement]]:
    """``repeats`` pairs, interleaved; the side that goes first alternates."""
    results: dict[str, list[Measurement]] = {name: [] for name in programs}
    names = list(programs)
    for i in range(repeats):
        order = names if i % 2 == 0 else names[::-1]
        for name in order:
            m = measure(programs[name][i], logs / f"{name}-{i}.log")
            results[name].append(m)
            print(
                f"repeat {i + 1}/{repeats} {name:>9}: CPU {m.cpu_s:7.1f} s  wall {m.wall_s:7.1f} s"
                f"  peak {m.peak_mib:6.0f} MiB  acc {m.accuracy:5.2f} %",
                flush=True,
            )
    return results


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def table(results: dict[str, list[Measurement]]) -> str:
    """Medians per cfl-bench variant against the official code's, and the ratios
    official / variant (per pair too), as Markdown."""
    official = results["official"]
    metrics = (("CPU s (user+sys)", "cpu_s"), ("wall s", "wall_s"), ("peak RSS MiB", "peak_mib"))
    lines = [
        f"| median of {len(official)} | cfl-bench as | cfl-bench | official "
        "| official / cfl-bench | per-pair ratios |",
        "|---|---|---:|---:|---:|---|",
    ]
    for name, ms in results.items():
        if name == "official":
            continue
        for label, attr in metrics:
            a = [getattr(m, attr) for m in ms]
            b = [getattr(m, attr) for m in official]
            ma, mb = median(a), median(b)
            pairs = ", ".join(f"{y / x:.2f}" for x, y in zip(a, b, strict=True))
            lines.append(f"| {label} | {name} | {ma:.1f} | {mb:.1f} | {mb / ma:.2f}x | {pairs} |")
    for name, ms in results.items():
        accuracies = ", ".join(f"{m.accuracy:.2f}" for m in ms)
        lines.append(f"| final avg accuracy % | {name} | {accuracies} | | | |")
    return "\n".join(lines)


def sanity(results: dict[str, list[Measurement]]) -> list[str]:
    """Warnings for runs whose final accuracy is not clearly above chance."""
    return [
        f"warning: {name} repeat {i + 1} ended at {m.accuracy:.2f} % (< {SANE_ACCURACY} %)"
        for name, ms in results.items()
        for i, m in enumerate(ms)
        if m.accuracy < SANE_ACCURACY
    ]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--official", type=Path, required=True, help="Fed-A-GEM checkout")
    parser.add_argument(
        "--official-python",
        default=sys.executable,
        help="interpreter with the official code's packages [default: this one]",
    )
    parser.add_argument(
        "--python",
        default=sys.executable,
        help="interpreter with cfl-bench's packages [default: this one]",
    )
    parser.add_argument(
        "--data-root",
        type=Path,
        default=REPO.parent / "shared" / "data",
        help="folder holding MNIST/raw/*-ubyte.gz [default: ../shared/data]",
    )
    parser.add_argument("--repeats", type=int, default=3, help="paired repeats [default: 3]")
    parser.add_argument(
        "--work",
        type=Path,
        default=None,
        help="keep logs and runs here [default: a temporary folder, removed]",
    )
    parser.add_argument("--json", type=Path, default=None, help="also write every number here")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    return args


def build_programs(args: argparse.Namespace, scratch: Path) -> dict[str, list[Program]]:
    """Both sides' commands, one per repeat (cfl-bench gets a fresh run folder each time)."""
    copy = stage_official(args.official.resolve(), args.data_root, scratch)
    return {
        "cfl-bench": [
            cfl_program(args.python, args.data_root, scratch / f"cfl-run-{i}")
            for i in range(args.repeats)
        ],
        CONTIGUOUS: [
            cfl_program(
                args.python,
                args.data_root,
                scratch / f"cfl-nchw-run-{i}",
                CONTIGUOUS,
                ("--no-channels-last",),
            )
            for i in range(args.repeats)
        ],
        "official": [official_program(args.official_python, copy)] * args.repeats,
    }


def report(results: dict[str, list[Measurement]], path: Path | None) -> None:
    """Print the table and warnings; optionally write the raw numbers as JSON."""
    print()
    print(table(results))
    for line in sanity(results):
        print(line)
    if path is not None:
        raw = {name: [m.__dict__ for m in ms] for name, ms in results.items()}
        path.write_text(json.dumps(raw, indent=2) + "\n")


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    owned = args.work is None
    scratch = Path(tempfile.mkdtemp(prefix="official-speed-")) if owned else args.work
    scratch.mkdir(parents=True, exist_ok=True)
    try:
        programs = build_programs(args, scratch)
        print(f"scratch {scratch}; load average {os.getloadavg()}", flush=True)
        results = paired_repeats(programs, args.repeats, scratch)
        report(results, args.json)
    finally:
        if owned:
            shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
