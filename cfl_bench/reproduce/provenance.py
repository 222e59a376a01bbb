"""Where a table's results come from, and what a scale costs.

``describe`` gathers the facts a reader needs to trust or rerun shipped results: the git
commits and torch build of the runs (from their ``config.json``), the machine, the number
of runs, their summed run time and the sweeps' elapsed wall time (from ``sweep.log``:
first to last event of each sweep process, so a resumed sweep does not count the pause,
and two sweeps running at once count once).
``cost_text`` turns shipped provenance into the cost of each scale: measured where a scale
was run, otherwise scaled by the local steps (runs × tasks × rounds × training examples
per task × epochs) from a measured scale — an estimate, and said to be one.
"""

from __future__ import annotations

import json
import os
import platform
from datetime import datetime
from pathlib import Path
from typing import Any

from cfl_bench.reproduce.collect import Collected
from cfl_bench.reproduce.tables import SCALES, ReproTable, Scale
from cfl_bench.sweeps import ledger

PROVENANCE = "provenance.json"


def cpu_model() -> str:
    """The CPU's model name (Linux), else the platform's processor string."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def sweep_elapsed(folder: Path) -> float | None:
    """Seconds the sweeps of ``folder`` ran: per sweep process, first to last event, with
    overlapping processes counted once."""
    events = sweep_events(folder)
    if events is None:
        return None
    spans: dict[str, list[datetime]] = {}
    for stamp, process, _, _ in events:
        spans.setdefault(process, []).append(stamp)
    return round(covered_seconds([(min(s), max(s)) for s in spans.values()]), 1) if spans else None


def sweep_events(folder: Path) -> list[tuple[datetime, str, str, str]] | None:
    """The sweep log's events of ``folder`` (``ledger.read_log``) as (time, sweep process,
    event, run name), in file order; None without a log."""
    for where in (folder / ".sweep", folder):
        if (where / ledger.LOG).is_file():
            return [
                (datetime.fromisoformat(row["time"]), str(row["pid"]), row["event"], row["point"])
                for row in ledger.read_log(where)
            ]
    return None


def most_runs_at_once(events: list[tuple[datetime, str, str, str]]) -> int | None:
    """The most runs that were running at the same moment: each run from its ``start`` to
    its ``finish`` / ``fail`` (a run whose sweep was killed, to its process's last event);
    None when the log started no run."""
    last: dict[str, datetime] = {}
    for stamp, process, _, _ in events:
        last[process] = stamp
    begun: dict[tuple[str, str], datetime] = {}
    edges: list[tuple[datetime, int]] = []
    for stamp, process, event, name in events:
        if event == "start":
            begun[(process, name)] = stamp
        elif event in ("finish", "fail") and (process, name) in begun:
            edges += [(begun.pop((process, name)), 1), (stamp, -1)]
    for (process, _), stamp in begun.items():
        edges += [(stamp, 1), (last[process], -1)]
    if not edges:
        return None
    running = most = 0
    for _, step in sorted(edges):  # at one instant an end (-1) sorts before a start (+1)
        running += step
        most = max(most, running)
    return most


def covered_seconds(intervals: list[tuple[datetime, datetime]]) -> float:
    """Seconds covered by the union of ``intervals``: two sweeps that ran at the same time
    (two column groups started side by side) count once."""
    total, end = 0.0, None
    for start, stop in sorted(intervals):
        if end is None or start > end:
            total += (stop - start).total_seconds()
            end = stop
        elif stop > end:
            total += (stop - end).total_seconds()
            end = stop
    return total


def run_facts(folders: list[Path]) -> dict[str, Any]:
    """What made the runs in ``folders`` (their ``config.json``): git commits, torch
    versions, devices and torch threads, each a sorted list of the distinct values."""
    commits, torches, devices, threads = set(), set(), set(), set()
    for folder in folders:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        commits.add(str(config.get("git_commit")))
        torches.add(str(config.get("packages", {}).get("torch")))
        environment = config.get("environment", {})
        devices.add(str(environment.get("device")))
        threads.add(str(environment.get("torch_threads")))
    return {
        "git_commits": sorted(commits),
        "torch": sorted(torches),
        "devices": sorted(devices),
        "torch_threads_per_run": sorted(threads),
    }


def describe(collected: Collected, folder: Path) -> dict[str, Any]:
    """The provenance of the runs in ``folder``: the stored one for shipped results."""
    stored = folder / PROVENANCE
    if stored.is_file():
        return json.loads(stored.read_text(encoding="utf-8"))
    runs = collected.runs()
    facts: dict[str, Any] = {
        "runs": len(runs),
        "scales": collected.scales(),
        **run_facts([run.path for run in runs]),
        "torch_build": _torch_build(),
        "machine": f"{cpu_model()}, {os.cpu_count()} cores, {platform.platform()}",
        "jobs": _jobs(folder),
        "elapsed_s": sweep_elapsed(folder),
        "run_time_s_total": round(sum(r.wall_time_s for r in runs), 1),
    }
    return facts


def _torch_build() -> str:
    import torch

    capability = torch.backends.cpu.get_cpu_capability()
    git = torch.version.git_version[:12]
    return f"{torch.__version__} (git {git}, cuda {torch.version.cuda}, cpu {capability})"


def _jobs(folder: Path) -> int | None:
    """How many runs ran at once, read from the sweep log; the manifest's ``--jobs`` where
    the log started none (runs made elsewhere and copied in).

    Why the log first: every ``reproduce`` call rewrites the manifest with its own
    ``--jobs``, so a ``--ship`` call without it (nothing left to run) would report 1 for a
    table run two at a time (seen on fot-table-cifar100)."""
    events = sweep_events(folder)
    at_once = None if events is None else most_runs_at_once(events)
    return at_once if at_once is not None else _manifest_jobs(folder)


def _manifest_jobs(folder: Path) -> int | None:
    manifest = folder / "sweep.json"
    if not manifest.is_file():
        manifest = folder / ".sweep" / "sweep.json"
    try:
        return int(json.loads(manifest.read_text(encoding="utf-8"))["sweep"]["jobs"])
    except (OSError, KeyError, TypeError, ValueError):
        return None


def local_steps(repro: ReproTable, scale: str) -> float:
    """A relative count of a scale's local training work (see the module docstring), summed
    over the column groups (a column may set its own stream and tasks)."""
    from cfl_bench.streams.catalogue import STREAMS, default_task_count

    total = 0.0
    for group in repro.column_groups():
        options = {**repro.base_options(scale), **group}
        stream = STREAMS.get(str(options.get("stream")))
        per_task = options.get("classes_per_task")
        default = default_task_count(stream, per_task) if stream else 1
        tasks = options.get("tasks") or default or 1
        train = options.get("train_size") or repro.train_per_task
        runs = len(repro.rows) * len(repro.scales[scale].seeds)
        total += runs * tasks * options["rounds_per_task"] * train * options.get("epochs", 1)
    return total


def shipped_provenance(root: Path, name: str, scale: str) -> dict[str, Any] | None:
    path = root / "results" / name / scale / PROVENANCE
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def _hours(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"


def table_measured(scales: dict[str, Scale], scale: str, facts: dict[str, Any] | None) -> str:
    """The table file's measured time of ``scale`` ('48 s measured (jobs 1)'), or '' where
    the file has none or complete shipped results of that scale measure it instead."""
    measured = scales[scale].measured_s
    shipped_whole = facts is not None and facts.get("runs") == facts.get("expected_runs")
    if measured is None or (facts and facts.get("elapsed_s") and shipped_whole):
        return ""
    return f"{_hours(measured)} measured (jobs 1)"


def cost_text(repro: ReproTable, scale: str, root: Path) -> str:
    """'1.7 h measured (jobs 2)', '48 s measured (jobs 1)' (the table file's
    ``measured_s``), '~68 h estimated from cpu', or 'not measured'. Shipped results with
    runs missing count as a measurement of their share of the runs."""
    own = table_measured(repro.scales, scale, shipped_provenance(root, repro.runs_name, scale))
    if own:
        return own
    for other in (scale, *(s for s in SCALES if s != scale)):
        facts = shipped_provenance(root, repro.runs_name, other)
        if not facts or not facts.get("elapsed_s"):
            continue
        runs, expected = facts.get("runs"), repro.runs(other)
        share = runs / expected if isinstance(runs, int) and 0 < runs < expected else 1.0
        seconds = facts["elapsed_s"] / share * local_steps(repro, scale) / local_steps(repro, other)
        if other == scale and share == 1.0:
            return f"{_hours(seconds)} measured (jobs {facts.get('jobs')})"
        basis = other if share == 1.0 else f"{runs} of {expected} {other} runs"
        return f"~{_hours(seconds)} estimated from {basis}"
    return "not measured"
