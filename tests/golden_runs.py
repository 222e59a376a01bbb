"""The fixed set of runs whose results must not change when engine code is refactored.

Why digests of real runs: a refactor of the round loop, the state objects or the record
writer can change a result in the last bit without any unit test noticing. Each case here is
a small CLI run covering one composition or engine feature (together: every component and
every stream family — embedded digits, MNIST, CIFAR, text — plus asynchronous shift, partial
participation and per-round checkpoints); its ``records.csv`` sha256 and the deterministic
keys of its ``summary.json`` are stored in ``golden_digests.json`` (made by ``python -m
tests.golden_runs --write``) and compared by ``tests/test_golden.py``.

Floating-point results depend on the CPU's vector unit (torch's kernels differ between
AVX2 and AVX512), so the digests are stored with the CPU capability they were made on and
compared only on a machine that reports the same one, with one torch thread.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

# Where the real datasets are: CFL_BENCH_SHARED_DATA overrides it (tests/conftest.py).
from tests.conftest import SHARED_DATA

ROOT = Path(__file__).resolve().parent.parent
DIGESTS = Path(__file__).with_name("golden_digests.json")

DIGITS = ["--stream", "rot-digits", "--tasks", "3", "--rounds-per-task", "2", "--clients", "5"]
PERM_DIGITS = ["perm-digits" if arg == "rot-digits" else arg for arg in DIGITS]
COMMON = ["--epochs", "1", "--threads", "1"]

# name → (needs ../shared/data, extra CLI args)
CASES: dict[str, tuple[bool, list[str]]] = {
    "fedavg": (False, [*DIGITS, "--strategy", "fedavg"]),
    "der+fedgp": (False, [*DIGITS, "--strategy", "der+fedgp"]),
    "der+fedcurv+fedgp+ifa": (
        False,
        [*DIGITS, "--strategy", "der+fedcurv+fedgp+ifa:generation=3"],
    ),
    "fedavg+fedproj": (False, [*DIGITS, "--strategy", "fedavg+fedproj"]),
    "agem-task-end+fedprox": (
        False,
        [*DIGITS, "--strategy", "agem:agem_fill=task_end+fedprox:mu=0.1"],
    ),
    "derpp+fedntd": (False, [*DIGITS, "--strategy", "derpp+fedntd"]),
    "er-async-participation": (
        False,
        [*DIGITS, "--strategy", "er", "--participation", "0.6", "--async-shift", "1"],
    ),
    "ideal": (False, [*DIGITS, "--strategy", "ideal"]),
    "agem+fedgp-eval-every-round": (
        False,
        [*DIGITS, "--strategy", "agem+fedgp:gref_samples=all,gref_mode=eval", "--eval-every-round"],
    ),
    "der+fedgp-every-step-momentum": (
        False,
        [
            *DIGITS,
            "--strategy",
            "der+fedgp",
            "--buffer-offer",
            "every_step",
            "--momentum",
            "0.5",
            "--weight-decay",
            "0.001",
        ],
    ),
    "fedavg-iid-uniform": (
        False,
        [*DIGITS, "--strategy", "fedavg", "--partition", "iid", "--weighting", "uniform"],
    ),
    "rot-mnist-der+fedgp": (
        True,
        [
            "--stream",
            "rot-mnist",
            "--tasks",
            "2",
            "--rounds-per-task",
            "2",
            "--clients",
            "4",
            "--train-size",
            "2000",
            "--test-size",
            "500",
            "--strategy",
            "der+fedgp",
        ],
    ),
    "seq-cifar10-cnn-der+fedgp": (
        True,
        [
            "--stream",
            "seq-cifar10",
            "--model",
            "cifar-cnn",
            "--tasks",
            "2",
            "--rounds-per-task",
            "1",
            "--clients",
            "3",
            "--partition",
            "iid",
            "--strategy",
            "der+fedgp",
        ],
    ),
    "perm-digits-derpp-checkpoint-every-round": (
        False,
        [
            *PERM_DIGITS,
            "--strategy",
            "derpp",
            "--checkpoint-every",
            "1",
            "--keep-checkpoint",
        ],
    ),
    "seq-dbpedia-der+fedgp": (
        True,
        [
            "--stream",
            "seq-dbpedia",
            "--tasks",
            "2",
            "--rounds-per-task",
            "2",
            "--clients",
            "3",
            "--train-size",
            "600",
            "--test-size",
            "300",
            "--strategy",
            "der+fedgp",
        ],
    ),
}

# summary.json keys that measure time or memory, or name the machine: never reproducible.
VOLATILE = frozenset(
    {
        "wall_time_s",
        "round_time_s_mean",
        "train_time_s_total",
        "peak_rss_bytes",
        "cuda_peak_bytes",
        "checkpoint",
    }
)


def cpu_capability() -> str:
    import torch

    return str(torch.backends.cpu.get_cpu_capability())


def run_case(name: str, out: Path, cwd: Path = ROOT) -> dict[str, Any]:
    """Run one case through the CLI in a fresh process; its records digest and summary."""
    needs_data, args = CASES[name]
    shutil.rmtree(out, ignore_errors=True)
    data = ["--data-root", str(SHARED_DATA)] if needs_data else []
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run(
        [sys.executable, "-m", "cfl_bench.cli", "run", *args, *COMMON, *data, "--out", str(out)],
        check=True,
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=900,
    )
    summary = json.loads((out / "summary.json").read_text())
    return {
        "records_sha256": hashlib.sha256((out / "records.csv").read_bytes()).hexdigest(),
        "summary": {k: v for k, v in summary.items() if k not in VOLATILE},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--write", action="store_true", help="(re)write golden_digests.json")
    parser.add_argument("--tree", type=Path, default=ROOT, help="source tree to run")
    parser.add_argument("--scratch", type=Path, required=True, help="folder for the runs")
    args = parser.parse_args()
    results = {}
    for name, (needs_data, _) in CASES.items():
        if needs_data and not SHARED_DATA.is_dir():
            print(f"skip {name}: no {SHARED_DATA}", flush=True)
            continue
        results[name] = run_case(name, args.scratch / name, cwd=args.tree)
        print(
            name,
            results[name]["records_sha256"][:16],
            results[name]["summary"].get("Acc_T"),
            flush=True,
        )
    if args.write:
        payload = {"cpu_capability": cpu_capability(), "torch_threads": 1, "cases": results}
        DIGESTS.write_text(json.dumps(payload, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
