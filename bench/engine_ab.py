"""Engine throughput of two versions of the code, measured in one process.

    python bench/engine_ab.py --before 1dfc821 --data-root ../shared/data --threads 1

Why one process: a refactor of the engine must keep its speed (issue 12: within 3 %), and
on a shared machine two separate runs differ by more than that. This script extracts the
``--before`` revision with ``git archive`` into a temporary directory, and then, pass after
pass, runs the same protocol with the old and with the current tree. Before each run it
swaps the project's packages in ``sys.modules``. torch stays loaded, so only our code
differs. Each number is the best of ``--repeats`` interleaved passes, the order of the
two trees alternating from pass to pass.

Protocol: the ``bench/throughput.py`` one. That is rot-mnist, the first ``--train-size``
training images, 10 clients with 2 label shards each, batch 32, lr 0.01, 1 local epoch,
``--tasks`` × ``--rounds`` rounds, buffer 200, for fedavg, der and der+fedgp. samples/s
is counted over wall time (the run loop's own clock, evaluation included) and over local
training time alone (costs.csv ``train_time_s``).
"""

from __future__ import annotations

import argparse
import importlib
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

PACKAGES = ("cfl_bench", "streams", "strategies", "leaderboard")
STRATEGIES = ("fedavg", "der", "der+fedgp")
ROOT = Path(__file__).resolve().parents[1]


def extract(revision: str, into: Path) -> Path:
    """The tree of ``revision`` of this repository, unpacked under ``into``."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", revision], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    # From the layer move on, streams/ & co. install as cfl_bench.streams & co.
    # (pyproject's package-dir); an unpacked tree imported from sys.path needs them inside
    # cfl_bench, so link them there (older trees import them top-level and need nothing).
    if (into / "cfl_bench" / "core").is_dir():
        for folder in ("streams", "strategies", "leaderboard", "carla_bridge"):
            (into / "cfl_bench" / folder).symlink_to(into / folder, target_is_directory=True)
    return into


def use_tree(tree: Path, trees: list[Path]) -> None:
    """Make ``import cfl_bench`` (and the other packages) load from ``tree``, one of
    ``trees`` (all of which are taken off ``sys.path`` first)."""
    for name in list(sys.modules):
        if name.split(".")[0] in PACKAGES:
            del sys.modules[name]
    for path in [p for p in sys.path if p in {str(t) for t in trees}]:
        sys.path.remove(path)
    sys.path.insert(0, str(tree))
    importlib.invalidate_caches()


def run_once(
    trees: list[Path], tree: Path, strategy: str, args: argparse.Namespace, out: Path
) -> tuple[float, float]:
    """(wall seconds, local-training seconds) of one engine run from ``tree``."""
    use_tree(tree, trees)
    config = importlib.import_module("cfl_bench.runner.config")
    run = importlib.import_module("cfl_bench.runner.run")
    assert Path(run.__file__).is_relative_to(tree), run.__file__
    cfg = config.make_config(
        {
            "stream": "rot-mnist", "strategy": strategy, "data_root": args.data_root,
            "train_size": args.train_size, "test_size": args.test_size,
            "tasks": args.tasks, "rounds_per_task": args.rounds, "clients": 10,
            "seed": 0, "device": "cpu", "out": str(out), "threads": args.threads,
        }
    )  # fmt: skip
    summary = run.execute(cfg).summary
    return float(summary["wall_time_s"]), float(summary["train_time_s_total"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="git revision to compare against")
    parser.add_argument("--data-root", default="../shared/data")
    parser.add_argument("--train-size", type=int, default=12000)
    parser.add_argument("--test-size", type=int, default=2000)
    parser.add_argument("--tasks", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3, help="best of N for each number")
    parser.add_argument(
        "--strategies", default=",".join(STRATEGIES), help="comma-separated, e.g. der+fedgp"
    )
    args = parser.parse_args()
    strategies = [name.strip() for name in args.strategies.split(",") if name.strip()]
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "before").mkdir()
        before = extract(args.before, Path(tmp) / "before")
        trees = {"before": before, "after": ROOT}
        paths = list(trees.values())
        best: dict[tuple[str, str], list[float]] = {}
        run_once(paths, ROOT, "fedavg", args, Path(tmp) / "warm")  # oneDNN set-up, imports
        for rep in range(args.repeats):
            for strategy in strategies:
                # Alternate which tree goes first: a process that has run longer (allocator
                # state, caches) must not always favour the same side.
                order = list(trees.items())
                for label, tree in order if rep % 2 == 0 else order[::-1]:
                    out = Path(tmp) / f"{label}-{strategy}-{rep}"
                    wall, train = run_once(paths, tree, strategy, args, out)
                    slot = best.setdefault((label, strategy), [float("inf"), float("inf")])
                    best[(label, strategy)] = [min(slot[0], wall), min(slot[1], train)]
    print(f"torch {torch.__version__}, {args.threads} thread(s); best of {args.repeats}")
    print(f"{'strategy':<11}{'wall before':>12}{'wall after':>11}{'after/before':>13}"
          f"{'train before':>13}{'train after':>12}{'after/before':>13}")  # fmt: skip
    for strategy in strategies:
        wb, tb = best[("before", strategy)]
        wa, ta = best[("after", strategy)]
        # Ratios of throughput (samples/s): before-time / after-time; > 1 means faster now.
        print(
            f"{strategy:<11}{wb:>11.2f}s{wa:>10.2f}s{wb / wa:>13.3f}"
            f"{tb:>12.2f}s{ta:>11.2f}s{tb / ta:>13.3f}"
        )
    print("after/before = throughput ratio (samples/s of the current tree over the old one).")


if __name__ == "__main__":
    main()
