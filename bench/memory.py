"""Peak resident memory of one command, measured from outside it.

    python bench/memory.py [--timeout S] [--trace FILE] -- python -m cfl_bench run ...

Why a wrapper and not ``/usr/bin/time -v``: the number must be reproducible on any machine
with only Python, and a long protocol (the 10-task paper run) is often measured until its
memory plateaus rather than to the end. The command runs in a subprocess; its peak RSS is
the kernel's high-water mark (``VmHWM`` of the process while it runs, and
``getrusage(RUSAGE_CHILDREN).ru_maxrss`` once it is reaped, which also covers any
processes it started and waited for). With ``--timeout`` the command is stopped with
SIGTERM (then SIGKILL) after that many seconds and the peak so far is reported, marked as
such. ``--trace`` writes the sampled RSS over time as CSV (seconds, rss_mib), to see
*when* the peak happens.

The numbers in the README (rot-mnist ``der+fedgp``, CPU, one thread) come from::

    python bench/memory.py -- python -m cfl_bench run --stream rot-mnist --tasks 2 \
        --rounds-per-task 1 --strategy der+fedgp --data-root ../shared/data --threads 1 \
        --device cpu --out /tmp/mem_a --overwrite
    python bench/memory.py --timeout 120 -- python -m cfl_bench run --stream rot-mnist \
        --tasks 10 --strategy der+fedgp --data-root ../shared/data --threads 1 \
        --device cpu --out /tmp/mem_b --overwrite
    python bench/memory.py --timeout 130 -- python -m cfl_bench run --stream rot-mnist \
        --tasks 10 --rounds-per-task 1 --strategy der+fedgp --data-root ../shared/data \
        --threads 1 --device cpu --out /tmp/mem_b1 --overwrite

One round per task reaches the same peak as the paper's 20: memory peaks when clients
enter a task, and later rounds of a task add nothing.
"""

from __future__ import annotations

import argparse
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

KIB_PER_MIB = 1024


def status_kib(pid: int, field: str) -> int | None:
    """A ``/proc/<pid>/status`` memory field in KiB (None once the process is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timeout", type=float, default=None, help="stop after S seconds")
    parser.add_argument("--interval", type=float, default=0.2, help="RSS sampling period (s)")
    parser.add_argument("--trace", type=Path, default=None, help="write (s, rss_mib) as CSV")
    parser.add_argument("--quiet", action="store_true", help="discard the command's output")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- command and arguments")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to measure after --")

    output = subprocess.DEVNULL if args.quiet else None
    started = time.perf_counter()
    child = subprocess.Popen(command, stdout=output, stderr=output)
    trace: list[tuple[float, float]] = []
    hwm_kib = 0
    peak_at = 0.0
    stopped = False
    while child.poll() is None:
        elapsed = time.perf_counter() - started
        rss = status_kib(child.pid, "VmRSS")
        hwm = status_kib(child.pid, "VmHWM")
        if rss is not None:
            trace.append((elapsed, rss / KIB_PER_MIB))
        if hwm is not None and hwm > hwm_kib:
            hwm_kib, peak_at = hwm, elapsed
        if args.timeout is not None and elapsed > args.timeout and not stopped:
            stopped = True
            child.send_signal(signal.SIGTERM)
            try:
                child.wait(10)
            except subprocess.TimeoutExpired:
                child.kill()
            break
        time.sleep(args.interval)
    code = child.wait()
    wall = time.perf_counter() - started
    # ru_maxrss is in KiB on Linux: the largest peak among reaped children.
    children_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    peak_kib = max(hwm_kib, children_kib)
    if args.trace is not None:
        args.trace.write_text("seconds,rss_mib\n" + "".join(f"{s:.2f},{m:.1f}\n" for s, m in trace))
    how = f"stopped after {args.timeout:g} s (peak so far)" if stopped else f"exit code {code}"
    print(
        f"peak RSS {peak_kib / KIB_PER_MIB:.0f} MiB (first reached ~{peak_at:.1f} s), "
        f"wall {wall:.1f} s, {how}: {' '.join(command)}",
        file=sys.stderr,
    )
    return 0 if stopped else code


if __name__ == "__main__":
    sys.exit(main())
