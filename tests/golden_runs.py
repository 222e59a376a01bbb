"""The fixed set of runs whose results must not change when engine code is refactored.

Why digests of real runs: a refactor of the round loop, the state objects or the record
writer can change a result in the last bit without any unit test noticing. Each case here is
a small CLI run covering one composition or engine feature (together: every component and
every stream family — embedded digits, MNIST, CIFAR, text — plus asynchronous shift, partial
participation and per-round checkpoints); its ``records.csv`` sha256 and the deterministic
keys of its ``summary.json`` are stored in ``golden_digests.json`` (made by ``python -m
tests.golden_runs --write``) and compared by ``tests/test_golden.py``.

Floating-point results depend on the torch build and the CPU's vector unit (torch's
kernels differ between AVX2 and AVX512, and between releases), so the file records the
build the digests were made with (``BUILD_KEYS``: torch version, its git commit, CUDA
version of the wheel, CPU capability). Under that exact build the test compares sha256;
under any other it compares the stored records (``golden_records/<case>.csv``) numerically,
row for row and column for column, each value within ``REL_TOL`` relative (``ABS_TOL``
absolute near zero), and says which build it fell back from. Remake both after a torch
upgrade with ``python -m tests.golden_runs --write --scratch DIR``.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import io
import json
import math
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

# Where the real datasets are: CFL_BENCH_SHARED_DATA overrides it (tests/conftest.py).
from tests.conftest import SHARED_DATA

ROOT = Path(__file__).resolve().parent.parent
DIGESTS = Path(__file__).with_name("golden_digests.json")
RECORDS = Path(__file__).with_name("golden_records")
BUILD_KEYS = ("torch", "torch_git", "torch_cuda", "cpu_capability")
# The numeric fallback: every value within REL_TOL relative (ABS_TOL absolute near zero).
# Measured between torch 2.14.1's AVX2 kernels and its generic ones (ATEN_CPU_CAPABILITY=
# default), the largest relative gap of 13 cases was 2.0e-5 (derpp+fedntd; the others
# 1.5e-7 to 5.0e-6). Two cases are chaotic enough that a test example changes its predicted
# class under other rounding, so an accuracy moves by one example or more: they get a
# stated, looser tolerance (BUILD_SENSITIVE) under another build, and exact digests under
# the recorded one.
REL_TOL = 1e-4
ABS_TOL = 1e-6
BUILD_SENSITIVE: dict[str, tuple[float, float]] = {
    # 1 of 1080 test examples flips in two clients' accuracies: 17.22 vs 17.31 (5.4e-3).
    "fedavg-iid-uniform": (1e-2, ABS_TOL),
    # A CNN trained from scratch for one round per task on 2000 images: accuracies move by
    # up to 1.4 points of 500 test examples (2.8e-2 relative), FWT (a difference of two
    # accuracies) by 0.4 points: within 5e-2 relative or 2 points absolute.
    "seq-cifar10-cnn-der+fedgp": (5e-2, 2.0),
    # The data-free methods train the same CNN and also invert it (generator steps through
    # BatchNorm statistics), which amplifies rounding. Measured on an AVX-512 EPYC against
    # the store's forced-AVX2 records: TARGET's kl_drift by 6.6 of 208.0 (3.2e-2 relative),
    # LANDER's client accuracies by 0.51 points (2.1e-2), MFCL's kl_drift by 4.0e-3.
    "seq-cifar10-cnn-target": (5e-2, 2.0),
    "seq-cifar10-cnn-lander": (5e-2, 2.0),
    "seq-cifar10-cnn-mfcl": (5e-2, 2.0),
}


def tolerance(name: str) -> tuple[float, float]:
    """(relative, absolute) tolerance of case ``name`` under another build."""
    return BUILD_SENSITIVE.get(name, (REL_TOL, ABS_TOL))


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
    # Clients joining over time (GLFC's protocol): 3 clients, then one more per task.
    "er-arrivals": (
        False,
        [*DIGITS, "--strategy", "er", "--arrivals", "glfc:initial=3,new=1,receive=0.5,per_round=2"],
    ),
    # FedWeIT's per-client task orders: each client its own permutation of the 3 tasks;
    # every task scored at every step, the metrics per client (docs/metrics.md).
    "er-task-order": (
        False,
        [*DIGITS, "--strategy", "er", "--task-order", "per-client"],
    ),
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
    # Federated iCaRL: herded exemplars join task 2's shards, the old classes distilled.
    "seq-cifar10-mlp-icarl-herding": (
        True,
        [
            *("--stream", "seq-cifar10", "--model", "mlp", "--tasks", "2"),
            *("--rounds-per-task", "1", "--clients", "3"),
            *("--train-size", "2000", "--test-size", "500"),
            *("--strategy", "icarl:memory=60,selection=herding"),
        ],
    ),
    # GLFC's clients under GLFC's protocol: 2 clients at task 1, 1 joins at task 2, one of
    # the first two receives task 2 (with its herded exemplars), the other keeps task 1;
    # each holds every example of 1 class of its task (GLFC's class subsets); L_GC + L_RD,
    # the previous task's model as the old model (no proxy server).
    "seq-cifar10-mlp-glfc-arrivals": (
        True,
        [
            *("--stream", "seq-cifar10", "--model", "mlp", "--tasks", "2"),
            *("--rounds-per-task", "1", "--clients", "3"),
            *("--train-size", "2000", "--test-size", "500"),
            *("--arrivals", "glfc:initial=2,new=1,receive=0.5,per_round=3"),
            *("--partition", "class-subsets:classes_per_client=1"),
            *("--strategy", "glfc:memory=60,proxy=none"),
        ],
    ),
    # The same with GLFC's proxy server, 2 rounds per task: prototype gradients in each
    # task's first round (not from the keeper), 2-step inversions, best_2 and best_1 as
    # the old models.
    "seq-cifar10-mlp-glfc-proxy": (
        True,
        [
            *("--stream", "seq-cifar10", "--model", "mlp", "--tasks", "2"),
            *("--rounds-per-task", "2", "--clients", "3"),
            *("--train-size", "2000", "--test-size", "500"),
            *("--arrivals", "glfc:initial=2,new=1,receive=0.5,per_round=3"),
            *("--partition", "class-subsets:classes_per_client=1"),
            *("--strategy", "glfc:memory=60,inversion_iterations=2"),
        ],
    ),
    # TARGET: after task 1 the server inverts the CNN (BatchNorm statistics + CE, 2 rounds
    # of 2 generator steps on 16 images) into the pool; in task 2 each client's step adds
    # a separate synthetic batch from its pool walk, distilled from the previous task's
    # model, and its epoch ends with the synthetic loader.
    "seq-cifar10-cnn-target": (
        True,
        [
            *("--stream", "seq-cifar10", "--model", "cifar-cnn", "--tasks", "2"),
            *("--rounds-per-task", "1", "--clients", "3"),
            *("--train-size", "2000", "--test-size", "500"),
            *("--strategy", "target:syn_round=2,g_steps=2,synthesis_batch_size=16"),
        ],
    ),
    # LANDER: the MiniLM label-text anchors and the mapping head beside the CNN's classifier;
    # at each task end the round-start model of the lower summed first-epoch loss becomes
    # θ_g (the code's best_model); after task 1 the server's NAYER synthesis (1 warm-up
    # round, then 2 rounds of 2 generator steps on 16 images, 2 student KD steps each)
    # fills the pool; in task 2 the clients' steps add w_pre · (KD over the old classes +
    # the embeddings' MSE) on it.
    "seq-cifar10-cnn-lander": (
        True,
        [
            *("--stream", "seq-cifar10", "--model", "cifar-cnn", "--tasks", "2"),
            *("--rounds-per-task", "2", "--clients", "3"),
            *("--train-size", "2000", "--test-size", "500"),
            "--strategy",
            "lander:syn_round=2,warmup=1,g_steps=2,synthesis_batch_size=16,kd_steps=2",
        ],
    ),
    # iCaRL on a shuffled class order (numpy seed 1993, as TARGET's and LANDER's codes
    # shuffle) with the learning rate restarted each task on a cosine to 0.001 (LANDER's
    # schedule): the tasks' classes, the exemplars and every round's rate change if the
    # relabelling or the schedule does.
    "seq-cifar10-mlp-icarl-shuffled-cosine": (
        True,
        [
            *("--stream", "seq-cifar10", "--model", "mlp", "--tasks", "2"),
            *("--rounds-per-task", "3", "--clients", "3"),
            *("--train-size", "2000", "--test-size", "500"),
            *("--class-order", "numpy:seed=1993"),
            *("--lr-schedule", "task-cosine", "--lr-end", "0.001"),
            *("--strategy", "icarl:memory=60"),
        ],
    ),
    # MFCL: after task 1 the server trains its generator (2 steps of CE, diversity and
    # BatchNorm statistics on 8 images, z of 16) and broadcasts it; in task 2 each step
    # joins 16 generated images of the old classes to the batch (head CE and head KD).
    "seq-cifar10-cnn-mfcl": (
        True,
        [
            *("--stream", "seq-cifar10", "--model", "cifar-cnn", "--tasks", "2"),
            *("--rounds-per-task", "1", "--clients", "3"),
            *("--train-size", "2000", "--test-size", "500"),
            *("--strategy", "mfcl:pi=2,server_ss=8,z_dim=16,syn_size=16"),
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
    # FOT on the official code's MLP (dropout on while clients record activations): bases
    # grown at the two first task ends, the later rounds' updates projected.
    "perm-digits-fot-mlp": (False, [*PERM_DIGITS, "--strategy", "fot", "--model", "fot-mlp"]),
    # FedWeIT on its LeNet, one head per task: pruned bases aggregated per channel, the
    # knowledge base of task 1's A's sent at task 2's start, the retroactive term in task 2.
    "perm-digits-fedweit-lenet": (
        False,
        [
            *("--stream", "perm-digits", "--heads", "per-task", "--tasks", "2"),
            *("--rounds-per-task", "2", "--clients", "3", "--train-size", "120"),
            *("--test-size", "60", "--model", "fedweit-lenet", "--optimizer", "adam"),
            *("--lr", "0.001", "--strategy", "fedavg+fedweit"),
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
    """The vector unit torch's own kernels use; marked when ``ATEN_CPU_CAPABILITY`` forced it.

    Why the mark: the variable switches ATen's kernels only; MKL and oneDNN still pick theirs
    from the CPU itself, so AVX2 forced on an AVX-512 CPU is not a real AVX2 machine's
    arithmetic (measured: the fedavg case differs in the last bits from round 4 on). A
    store made under the variable is then compared by sha256 only under it again.
    """
    import torch

    capability = str(torch.backends.cpu.get_cpu_capability())
    return (
        f"{capability} (ATEN_CPU_CAPABILITY)"
        if os.environ.get("ATEN_CPU_CAPABILITY")
        else capability
    )


def current_build() -> dict[str, str]:
    """What decides the last bits of a CPU run: the torch build and the kernels it picks."""
    import torch

    return {
        "torch": str(torch.__version__),
        "torch_git": str(torch.version.git_version),
        "torch_cuda": str(torch.version.cuda),
        "cpu_capability": cpu_capability(),
    }


def describe(build: dict[str, str]) -> str:
    return f"torch {build['torch']} ({build['torch_git'][:10]}), {build['cpu_capability']}"


def read_csv(text: str) -> tuple[list[str], list[list[str]]]:
    rows = list(csv.reader(io.StringIO(text)))
    return rows[0], rows[1:]


def close(a: float, b: float, rel: float = REL_TOL, abs_tol: float = ABS_TOL) -> bool:
    """Equal within ``rel`` of the larger magnitude (``abs_tol`` near zero); NaN == NaN."""
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return abs(a - b) <= max(rel * max(abs(a), abs(b)), abs_tol)


def record_differences(
    want: str,
    got: str,
    rel: float = REL_TOL,
    abs_tol: float = ABS_TOL,
    abs_for: Mapping[str, float] | None = None,
) -> list[str]:
    """Why two records.csv texts are not the same run up to rounding (empty: they are).

    Same header, same rows in the same order with equal keys (every column but the
    last, ``value``), and values within ``rel``. ``abs_for``: a wider absolute tolerance
    for the rows of some metrics (an accuracy moves by whole test examples)."""
    wider = abs_for or {}
    (head_a, rows_a), (head_b, rows_b) = read_csv(want), read_csv(got)
    if head_a != head_b:
        return [f"columns differ: {head_a} vs {head_b}"]
    if len(rows_a) != len(rows_b):
        return [f"{len(rows_b)} rows instead of {len(rows_a)}"]
    problems = []
    for line, (a, b) in enumerate(zip(rows_a, rows_b, strict=True), start=2):
        if a[:-1] != b[:-1]:
            problems.append(f"line {line}: keys {b[:-1]} instead of {a[:-1]}")
        elif not close(float(a[-1]), float(b[-1]), rel, max(abs_tol, wider.get(a[4], 0.0))):
            problems.append(f"line {line} {a[:-1]}: {b[-1]} instead of {a[-1]}")
    return problems


def largest_gap(want: str, got: str) -> float:
    """The largest relative difference between two runs' values (same rows assumed)."""
    (_, rows_a), (_, rows_b) = read_csv(want), read_csv(got)
    gaps = [0.0]
    for a, b in zip(rows_a, rows_b, strict=True):
        x, y = float(a[-1]), float(b[-1])
        if max(abs(x), abs(y)) > ABS_TOL / REL_TOL:
            gaps.append(abs(x - y) / max(abs(x), abs(y)))
    return max(gaps)


def summary_differences(
    want: Any, got: Any, where: str = "summary", tol: tuple[float, float] = (REL_TOL, ABS_TOL)
) -> list[str]:
    """Why two summaries' deterministic keys differ beyond rounding (numbers within ``tol``,
    relative and absolute)."""
    if isinstance(want, dict) and isinstance(got, dict):
        if sorted(want) != sorted(got):
            return [f"{where}: keys {sorted(got)} instead of {sorted(want)}"]
        return [p for k in want for p in summary_differences(want[k], got[k], f"{where}.{k}", tol)]
    if isinstance(want, list) and isinstance(got, list):
        if len(want) != len(got):
            return [f"{where}: {len(got)} items instead of {len(want)}"]
        pairs = zip(want, got, strict=True)
        return [
            p
            for i, (a, b) in enumerate(pairs)
            for p in summary_differences(a, b, f"{where}[{i}]", tol)
        ]
    numbers = (int, float)
    if isinstance(want, numbers) and isinstance(got, numbers) and not isinstance(want, bool):
        same = close(float(want), float(got), *tol)
        return [] if same else [f"{where}: {got} instead of {want}"]
    return [] if want == got else [f"{where}: {got!r} instead of {want!r}"]


def run_case(
    name: str, out: Path, cwd: Path = ROOT, env: dict[str, str] | None = None
) -> dict[str, Any]:
    """Run one case through the CLI in a fresh process (``env``: extra variables); its
    records, their digest and the summary's deterministic keys."""
    needs_data, args = CASES[name]
    shutil.rmtree(out, ignore_errors=True)
    data = ["--data-root", str(SHARED_DATA)] if needs_data else []
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
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
    records = (out / "records.csv").read_bytes()
    return {
        "records_sha256": hashlib.sha256(records).hexdigest(),
        "summary": {k: v for k, v in summary.items() if k not in VOLATILE},
        "records": records.decode(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--write", action="store_true", help="(re)write golden_digests.json")
    parser.add_argument("--tree", type=Path, default=ROOT, help="source tree to run")
    parser.add_argument("--scratch", type=Path, required=True, help="folder for the runs")
    parser.add_argument(
        "--case",
        action="append",
        choices=sorted(CASES),
        help="run (and with --write, rewrite) only this case; repeatable. Why: a deliberate "
        "behaviour change of one method remakes its case and leaves the others' digests as "
        "they were recorded",
    )
    args = parser.parse_args()
    results = {}
    for name, (needs_data, _) in CASES.items():
        if args.case and name not in args.case:
            continue
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
        RECORDS.mkdir(exist_ok=True)
        for name, result in results.items():
            (RECORDS / f"{name}.csv").write_text(result.pop("records"))
        if args.case:
            payload = json.loads(DIGESTS.read_text())
            if payload["build"] != current_build():
                sys.exit("--case rewrites cases under the recorded build only; rewrite all.")
            payload["cases"].update(results)
        else:
            payload = {"build": current_build(), "torch_threads": 1, "cases": results}
        DIGESTS.write_text(json.dumps(payload, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
