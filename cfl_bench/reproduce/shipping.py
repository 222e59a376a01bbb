"""Reference results in the repository: ``reproductions/results/<table>/<scale>/``.

What ships per run: ``config.json``, ``records.csv`` and ``summary.json`` (no checkpoints,
models or cost logs: the three files hold every number a report or a leaderboard reads and
the full configuration to rerun it), plus one ``provenance.json`` per table and scale
(commit, torch build, machine, wall time). A user judges their own runs against these
without rerunning ours (``cfl-bench reproduce NAME --compare RUNS``).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from cfl_bench.errors import UserError
from cfl_bench.reproduce import provenance
from cfl_bench.reproduce.collect import Collected, collect
from cfl_bench.reproduce.tables import SCALES, ReproTable

SHIPPED_FILES = ("config.json", "records.csv", "summary.json")


def shipped_folder(root: Path, name: str, scale: str) -> Path:
    return root / "results" / name / scale


def shipped_scales(root: Path, name: str) -> list[str]:
    return [s for s in SCALES if shipped_folder(root, name, s).is_dir()]


def ship(repro: ReproTable, folder: Path, scale: str, root: Path) -> Path:
    """Copy the counted runs of ``folder`` into the shipped folder of ``scale``, replacing
    what was shipped before only once the new copy is complete. A table whose runs are not
    all finished ships what is (``provenance.json`` says how many of how many; the report
    shows the rest as missing), so a finished column need not wait for the next one."""
    if repro.runs_name != repro.name:
        raise UserError(f"{repro.name} reads the runs of {repro.runs_name}; ship that table.")
    return ship_collected(repro.name, collect(repro, folder, scale), folder, scale, root,
                          repro.runs(scale))


def ship_collected(
    name: str, collected: Collected, folder: Path, scale: str, root: Path, expected: int
) -> Path:
    """Ship the runs ``collected`` from ``folder`` as ``name``'s results at ``scale`` (a
    table's or a figure's: both sort their runs into a :class:`Collected`)."""
    runs = collected.runs()
    if not runs:
        raise UserError(f"'{folder}' holds no finished run of {name} at scale {scale}.")
    target = shipped_folder(root, name, scale)
    staging = target.with_name(f".{scale}.staging")
    shutil.rmtree(staging, ignore_errors=True)
    for run in runs:
        destination = staging / run.path.name
        destination.mkdir(parents=True)
        for file_name in SHIPPED_FILES:
            shutil.copy2(run.path / file_name, destination / file_name)
    facts = {**provenance.describe(collected, folder), "expected_runs": expected}
    (staging / "provenance.json").write_text(json.dumps(facts, indent=2) + "\n")
    old = target.with_name(f".{scale}.old")
    shutil.rmtree(old, ignore_errors=True)
    if target.exists():
        target.rename(old)
    staging.rename(target)
    shutil.rmtree(old, ignore_errors=True)
    return target
