"""Reference results in the repository: ``reproductions/results/<table>/<scale>/``.

What ships per run: ``config.json``, ``records.csv`` and ``summary.json`` (no checkpoints,
models or cost logs: the three files hold every number a report or a leaderboard reads and
the full configuration to rerun it), plus one ``provenance.json`` per table and scale
(commit, torch build, machine, wall time). A user judges their own runs against these
without rerunning ours (``cfl-bench reproduce NAME --compare RUNS``).

**Shipping merges.** ``--ship`` replaces the shipped runs of exactly the cells and seeds it
ships and keeps every other shipped run byte for byte: a table is often run in parts (one
column on a GPU's 15 minutes, a seed at a time), and replacing the whole shipped set with
the part just run dropped every other cell's runs (33 of 66 on the cpu scale). Anything in
the shipped folder that is not a counted run of the table (a stray file, a run at another
protocol) is refused by name rather than kept or dropped, since neither can be right
without a person looking. The new set is built in a staging folder and swapped in only once
complete.

**Only committed code ships.** A shipped run names the commit that made it (``git_commit``
in its ``config.json``), and that name is worth something only if the commit alone holds
the code: a run made in a working tree with uncommitted changes (``<commit>-dirty``) cannot
be rerun by anyone. ``--ship`` therefore refuses a dirty tree before it starts a single run
(:func:`require_committed`), and refuses to ship any run whose own ``config.json`` names a
dirty tree or no commit (:func:`committed_runs`): a run finished earlier in a dirty tree and
only skipped by this command would otherwise slip through. Both checks belong to the
command (``reproduce --ship``); the functions below merge whatever they are given.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from cfl_bench.core.errors import UserError
from cfl_bench.reproduce import provenance
from cfl_bench.reproduce.collect import Collected, RunValue, collect
from cfl_bench.reproduce.tables import SCALES, ReproTable

SHIPPED_FILES = ("config.json", "records.csv", "summary.json")
DIRTY = "-dirty"


def shipped_folder(root: Path, name: str, scale: str) -> Path:
    return root / "results" / name / scale


def shipped_scales(root: Path, name: str) -> list[str]:
    return [s for s in SCALES if shipped_folder(root, name, s).is_dir()]


def require_committed(commit: str | None) -> str:
    """``commit`` (the checkout's, as ``runner.provenance.git_commit`` gives it), refused when
    it is no commit or a tree with uncommitted changes: the runs about to be made would
    name a commit that does not hold their code."""
    if commit is None:
        raise UserError(
            "--ship records the git commit that made the runs, and this cfl-bench is not "
            "a git checkout; install it from a clone (pip install -e .) and ship from there."
        )
    if commit.endswith(DIRTY):
        raise UserError(
            f"--ship refuses a working tree with uncommitted changes (commit "
            f"{commit[:12]} plus edits, see `git status`): commit or stash them, then rerun "
            f"the same command."
        )
    return commit


def committed_runs(runs: list[RunValue]) -> None:
    """Refuse shipping runs whose ``config.json`` names a dirty tree or no commit (see the
    module docstring), naming the first."""
    for run in sorted(runs, key=lambda r: r.path.name):
        config = json.loads((run.path / "config.json").read_text(encoding="utf-8"))
        commit = config.get("git_commit")
        if not isinstance(commit, str) or commit.endswith(DIRTY):
            made = "outside a git checkout" if commit is None else f"at {commit}"
            raise UserError(
                f"the run '{run.path}' was made {made}, so no commit holds its code; rerun "
                f"it from a clean checkout (move it out first) before --ship."
            )


def ship(
    repro: ReproTable,
    folder: Path,
    scale: str,
    root: Path,
    selection: ReproTable | None = None,
) -> Path:
    """Merge the counted runs of ``folder`` (with ``selection``, only its rows, columns and
    seeds) into the shipped folder of ``scale``. A table whose runs are not all finished
    ships what is (``provenance.json`` says how many of how many; the report shows the rest
    as missing), so a finished column need not wait for the next one."""
    if repro.runs_name != repro.name:
        raise UserError(f"{repro.name} reads the runs of {repro.runs_name}; ship that table.")
    collected = collect(repro, folder, scale)
    if selection is not None:
        collected = selected(collected, selection, scale)
    target = shipped_folder(root, repro.name, scale)
    shipped = collect(repro, target, scale) if target.is_dir() else None
    return ship_collected(repro.name, collected, folder, scale, root, repro.runs(scale), shipped)


def selected(collected: Collected, selection: ReproTable, scale: str) -> Collected:
    """The runs of ``collected`` in the cells and seeds of ``selection``."""
    cells = {(r.label, c.label) for r in selection.rows for c in selection.columns}
    seeds = set(selection.scales[scale].seeds)
    return only(collected, lambda cell, seed: cell in cells and seed in seeds)


def only(collected: Collected, keep: Callable[[tuple[str, str], int], bool]) -> Collected:
    """``collected`` cut to the values whose cell and seed ``keep`` accepts."""
    cells = {
        cell: [v for v in values if keep(cell, v.seed)] for cell, values in collected.cells.items()
    }
    return replace(collected, cells={cell: values for cell, values in cells.items() if values})


def ship_collected(
    name: str,
    collected: Collected,
    folder: Path,
    scale: str,
    root: Path,
    expected: int,
    shipped: Collected | None = None,
) -> Path:
    """Merge the runs ``collected`` from ``folder`` into ``name``'s shipped results at
    ``scale`` (``shipped``: those results, collected; a table's or a figure's: both sort
    their runs into a :class:`Collected`)."""
    runs = collected.runs()
    if not runs:
        raise UserError(f"'{folder}' holds no finished run of {name} at scale {scale}.")
    target = shipped_folder(root, name, scale)
    kept = kept_runs(collected, shipped, target) if shipped is not None else []
    clash = {r.path.name for r in kept} & {r.path.name for r in runs}
    if clash:
        raise UserError(
            f"the shipped run '{target / sorted(clash)[0]}' has the name of a run being shipped "
            f"but another cell or seed; remove one of the two by hand."
        )
    staging = target.with_name(f".{scale}.staging")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    for run in kept:
        shutil.copytree(run.path, staging / run.path.name)  # copy2: byte for byte
    for run in runs:
        destination = staging / run.path.name
        destination.mkdir(parents=True)
        for file_name in SHIPPED_FILES:
            shutil.copy2(run.path / file_name, destination / file_name)
    facts = merged_facts(collected, folder, kept, target, expected)
    (staging / "provenance.json").write_text(json.dumps(facts, indent=2) + "\n")
    old = target.with_name(f".{scale}.old")
    shutil.rmtree(old, ignore_errors=True)
    if target.exists():
        target.rename(old)
    staging.rename(target)
    shutil.rmtree(old, ignore_errors=True)
    return target


def kept_runs(new: Collected, shipped: Collected, target: Path) -> list[RunValue]:
    """The shipped runs no run of ``new`` replaces (one that fills none of their cells at
    their seed); refuses an entry of ``target`` that is no counted run."""
    known = {run.path.name for run in shipped.runs()} | {provenance.PROVENANCE}
    stray = sorted(p.name for p in target.iterdir() if p.name not in known)
    if stray:
        why = next((n for n in shipped.notes if n.startswith(stray[0])), "not a counted run")
        raise UserError(
            f"the shipped folder '{target}' holds '{stray[0]}', which is no counted run of it "
            f"({why}); shipping keeps every shipped run it does not replace, so move that out "
            f"by hand first."
        )
    replaced = {(cell, v.seed) for cell, values in new.cells.items() for v in values}
    fills: dict[Path, set[tuple[tuple[str, str], int]]] = {}
    for cell, values in shipped.cells.items():
        for value in values:
            fills.setdefault(value.path, set()).add((cell, value.seed))
    return [run for run in shipped.runs() if not fills[run.path] & replaced]


def merged_facts(
    collected: Collected, folder: Path, kept: list[RunValue], target: Path, expected: int
) -> dict[str, Any]:
    """provenance.json of the merged set: the new runs' facts, with the lists of what made
    the runs (commits, torch, devices, threads) read again from every run kept or shipped,
    their run time added, and the wall times of the parts added up (each part's sweep time)
    until the set is whole; a part replacing runs of a whole set keeps its wall time."""
    facts: dict[str, Any] = {**provenance.describe(collected, folder), "expected_runs": expected}
    stored = target / provenance.PROVENANCE
    earlier = json.loads(stored.read_text(encoding="utf-8")) if kept and stored.is_file() else None
    if not kept:
        return facts
    facts["runs"] = len(collected.runs()) + len(kept)
    facts["run_time_s_total"] = round(
        sum(r.wall_time_s for r in collected.runs()) + sum(r.wall_time_s for r in kept), 1
    )
    # What made the merged set, read from every run in it: a replaced run's commit (say a
    # "-dirty" one) must leave the list with the run.
    facts.update(provenance.run_facts([r.path for r in collected.runs()] + [r.path for r in kept]))
    if earlier:
        facts["scales"] = sorted(set(facts.get("scales") or []) | set(earlier.get("scales") or []))
        if earlier.get("runs") == expected:
            # The earlier set held every run, so this part only replaces some: the table's
            # wall time and parallelism stay those measured when it shipped whole (rerunning
            # a few of its runs makes it no slower; their own times are in run_time_s_total).
            facts["elapsed_s"], facts["jobs"] = earlier.get("elapsed_s"), earlier.get("jobs")
        elif facts.get("elapsed_s") is not None and earlier.get("elapsed_s") is not None:
            facts["elapsed_s"] = round(facts["elapsed_s"] + earlier["elapsed_s"], 1)
        for key in ("machine", "torch_build", "jobs"):
            if earlier.get(key) != facts.get(key):
                facts[f"earlier_{key}"] = earlier.get(key)
    return facts
