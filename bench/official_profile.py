"""Where cfl-bench's CPU time goes on the protocol of ``bench.official_speed``.

    python -m bench.official_profile --data-root ../shared/data [--save prof.out]

Why: ``bench.official_speed`` says how cfl-bench compares with the official FedGP /
Fed-A-GEM code; this says which part of cfl-bench to make cheaper. It runs the very same
cfl-bench command once, in a child process with one thread, under ``cProfile`` with a CPU
clock (``time.process_time``, so time lost to other work on a shared machine is not
counted), then prints the run split into phases (start and imports, data, cost estimate,
local steps and their parts, client probes, g_ref requests, evaluation, records and
checkpoints) with seconds and shares, and the top functions by cumulative and by self time.

Phases are the cumulative times of named engine functions (``PHASES``); a name the engine
no longer has shows as 0, and "other" is what no phase covers. The parts of the local steps
also hold the few steps the cost estimate times (under a second). cProfile adds a little per
Python call; the steps' time is almost all inside torch's C++ kernels, which it does not
slow down.
"""

from __future__ import annotations

import argparse
import io
import pstats
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from bench.official_speed import REPO, cfl_program

# The child: cfl-bench's CLI under cProfile with a CPU clock; argv[1] is the stats file.
CHILD = """
import cProfile, runpy, sys, time
out = sys.argv[1]
sys.argv = ["cfl_bench", *sys.argv[2:]]
profile = cProfile.Profile(time.process_time)
try:
    profile.runcall(runpy.run_module, "cfl_bench", run_name="__main__")
except SystemExit as stop:
    if stop.code not in (0, None):
        raise
finally:
    profile.dump_stats(out)
"""

# phase → functions (path suffix, function name) whose cumulative times add up to it.
# Indented names are parts of the phase above them (shown, not added to the total).
Key = tuple[str, str]
PHASES: dict[str, tuple[Key, ...]] = {
    "data: MNIST files, rotated tasks, client shards": (
        ("cfl_bench/runner/run.py", "load_stream"),
        ("streams/domain_il.py", "task_train"),
        ("streams/domain_il.py", "task_test"),
        ("cfl_bench/engine/client_data.py", "advance"),
    ),
    "cost estimate (timed steps before the run)": (("cfl_bench/runner/cost.py", "announce"),),
    "local steps": (("cfl_bench/engine/client_update.py", "local_steps"),),
    "  backward": (("cfl_bench/engine/one_client.py", "backward"),),
    "  forward + CE on the batch": (("cfl_bench/engine/one_client.py", "batch_loss"),),
    "  DER replay draw + forward + MSE": (("cfl_bench/engine/one_client.py", "plan_loss"),),
    "  buffer insert (reservoir)": (("cfl_bench/core/buffer.py", "add"),),
    "  FedGP projection": (("strategies/fedgp.py", "transform_grad"),),
    "  SGD step": (("cfl_bench/engine/optim.py", "step"),),
    "  batch draw (decode rows)": (("cfl_bench/core/context.py", "inputs"),),
    "client probes (client spread at task ends)": (("cfl_bench/engine/client_update.py", "score"),),
    "g_ref requests (server asks clients)": (("cfl_bench/engine/round_server.py", "ask"),),
    "evaluation (test sets, drift)": (
        ("cfl_bench/engine/measurement.py", "evaluate"),
        ("cfl_bench/engine/measurement.py", "buffer_drift"),
    ),
    "records, checkpoints, summary": (
        ("cfl_bench/core/records.py", "append"),
        ("cfl_bench/core/records.py", "sync"),
        ("cfl_bench/engine/checkpoint.py", "save"),
        ("cfl_bench/runner/run.py", "run_summary"),
    ),
}
# "DER replay" is measured as the plan's loss minus the batch loss it calls.
SUBTRACT = {"  DER replay draw + forward + MSE": "  forward + CE on the batch"}
EXECUTE: Key = ("cfl_bench/runner/run.py", "execute")
LOCAL_STEPS: tuple[Key, Key] = (
    ("cfl_bench/engine/client_update.py", "local_steps"),
    ("cfl_bench/engine/client_update.py", "update"),
)


def profile_run(data_root: Path, stats_path: Path, scratch: Path) -> None:
    """Run cfl-bench's protocol command once under cProfile in a child process."""
    program = cfl_program(sys.executable, data_root, scratch / "run")
    argv = [sys.executable, "-c", CHILD, str(stats_path), *program.argv[3:]]
    subprocess.run(argv, cwd=program.cwd, env=program.env, check=True)


def cumulative(stats: pstats.Stats, key: Key, caller: Key | None = None) -> float:
    """Cumulative seconds of the function ``key`` (0 when absent), or only of its calls
    from ``caller``."""
    suffix, name = key
    table = stats.stats  # type: ignore[attr-defined]
    total = 0.0
    for (f, _, n), v in table.items():
        if n != name or not f.endswith(suffix):
            continue
        if caller is None:
            total += v[3]
        else:
            total += sum(c[3] for (cf, _, cn), c in v[4].items() if matches((cf, cn), caller))
    return total


def matches(found: Key, key: Key) -> bool:
    return found[1] == key[1] and found[0].endswith(key[0])


def phase_seconds(stats: pstats.Stats) -> dict[str, float]:
    """Seconds per phase, with "start and imports" and "other" filling the total."""
    total = float(stats.total_tt)  # type: ignore[attr-defined]
    seconds = {name: sum(cumulative(stats, k) for k in keys) for name, keys in PHASES.items()}
    # The cost estimate times a few client updates itself: count those under its phase.
    seconds["local steps"] = cumulative(stats, *LOCAL_STEPS)
    for part, whole in SUBTRACT.items():
        seconds[part] -= seconds[whole]
    covered = sum(s for name, s in seconds.items() if not name.startswith(" "))
    start = total - cumulative(stats, EXECUTE)
    seconds = {"start: interpreter, imports, CLI": start, **seconds}
    seconds["other (engine bookkeeping, aggregation, ...)"] = total - start - covered
    seconds["total (CPU)"] = total
    return seconds


def breakdown(stats: pstats.Stats) -> str:
    """The phase table as Markdown."""
    seconds = phase_seconds(stats)
    total = seconds["total (CPU)"]
    lines = ["| phase | CPU s | share |", "|---|---:|---:|"]
    for name, s in seconds.items():
        lines.append(f"| {name} | {s:.1f} | {100 * s / total:.1f} % |")
    return "\n".join(lines)


def top(stats: pstats.Stats, order: str, n: int) -> str:
    """pstats' own listing of the top ``n`` functions by ``order``."""
    out = io.StringIO()
    stats.stream = out  # type: ignore[attr-defined]
    stats.sort_stats(order).print_stats(n)
    return out.getvalue()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--data-root",
        type=Path,
        default=REPO.parent / "shared" / "data",
        help="folder holding MNIST/raw [default: ../shared/data]",
    )
    parser.add_argument("--save", type=Path, default=None, help="keep the cProfile stats here")
    parser.add_argument("--top", type=int, default=20, help="functions per listing [20]")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="official-profile-") as tmp:
        scratch = Path(tmp)
        stats_path = args.save.resolve() if args.save else scratch / "prof.out"
        profile_run(args.data_root, stats_path, scratch)
        stats = pstats.Stats(str(stats_path))
    print(breakdown(stats))  # before strip_dirs: phases match on path suffixes
    stats.strip_dirs()
    print(top(stats, "cumulative", args.top))
    print(top(stats, "tottime", args.top))


if __name__ == "__main__":
    main()
