"""The glue behind ``cfl-bench sweep``: grid → checks → skip → run → table → exit code.

Everything that can be refused is refused before anything is written: the grid (keys,
values, ``validate`` on every point), then the names of every point that still has to run
(strategy grammar, stream, model, partition — checked in a child of the preloaded fork
server). Only then is the sweep folder touched. Exit codes: 0 when every run finished or
diverged, 1 when any failed (or was busy in another sweep), 2 for bad input.

With ``--slurm-script FILE`` the sweep stops after preparing the folder and writes the
pending points as a Slurm job array instead of running them (``sweep.slurm``).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import yaml
from rich.console import Console

from cfl_bench.core.atomic import atomic_write_text
from cfl_bench.core.errors import RunInterruptedError, UserError
from cfl_bench.core.run_dir import refuse_run_directory
from cfl_bench.sweeps import ledger
from cfl_bench.sweeps.display import SweepProgress, announce_skipped, results_table
from cfl_bench.sweeps.grid import SweepSpec, build_spec, expand
from cfl_bench.sweeps.launcher import Backend, Launcher
from cfl_bench.sweeps.scheduler import PointState, run_points

# Where a sweep's points can run (``--backend``).
BACKENDS = ("local", "ray")
# Where a sweep writes the leaderboard of its runs (a folder without run records, so it
# is never mistaken for a run by the leaderboard's directory search).
LEADERBOARD = "leaderboard"


@dataclass(frozen=True)
class Placement:
    """Where the points run (``--backend``): this machine, or a Ray cluster at ``address``
    (None: ``RAY_ADDRESS`` or a local instance) with these resources per point; or, with
    ``slurm_script``, nowhere yet: the pending points are written as a Slurm job array of
    ``cpus_per_run`` CPUs per task, for the user to submit."""

    backend: str = "local"
    address: str | None = None
    cpus_per_run: int | None = None
    gpus_per_run: float | None = None
    slurm_script: str | None = None

    def check(self) -> None:
        """Refuse options of another placement and impossible resources, before anything
        is written."""
        if self.backend not in BACKENDS:
            hint = " (for Slurm, write a job array with --slurm-script FILE)"
            raise UserError(
                f"unknown --backend '{self.backend}'; choose one of: {', '.join(BACKENDS)}"
                f"{hint if self.backend == 'slurm' else ''}."
            )
        if self.slurm_script is not None and self.backend != "local":
            raise UserError(
                f"--slurm-script writes a Slurm job array and cannot be combined with "
                f"--backend {self.backend}; drop one of the two."
            )
        ray_only = {"--address": self.address, "--gpus-per-run": self.gpus_per_run}
        given = [flag for flag, value in ray_only.items() if value is not None]
        if self.backend != "ray" and given:
            raise UserError(
                f"{given[0]} applies to --backend ray only; drop it or add --backend ray."
            )
        if self.cpus_per_run is not None and self.backend == "local" and not self.slurm_script:
            raise UserError(
                "--cpus-per-run applies to --backend ray or --slurm-script only; drop it or "
                "add one of them."
            )
        if self.cpus_per_run is not None and self.cpus_per_run < 1:
            raise UserError(f"--cpus-per-run must be at least 1, got {self.cpus_per_run}.")
        if self.gpus_per_run is not None and not 0 <= self.gpus_per_run <= 64:
            raise UserError(f"--gpus-per-run must be between 0 and 64, got {self.gpus_per_run}.")
        if self.slurm_script is not None:
            from cfl_bench.sweeps.slurm import check_script_path

            check_script_path(self.slurm_script)
        if self.backend == "ray":  # before the sweep folder is touched
            from cfl_bench.sweeps.ray_backend import check_reachable, require_ray

            require_ray()
            check_reachable(self.address)

    def backend_for(self, launcher: Launcher) -> Backend:
        if self.backend == "local":
            return launcher
        from cfl_bench.sweeps.ray_backend import RayBackend

        return RayBackend(self.address, self.cpus_per_run or 1, self.gpus_per_run or 0.0)


def sweep(
    sweep_file: str | None,
    args: list[str],
    out: str | None = None,
    jobs: int | None = None,
    console: Console | None = None,
    leaderboard: bool = True,
    placement: Placement | None = None,
) -> int:
    """Run (or resume) a sweep; returns the exit code. With ``leaderboard`` the sweep ends
    by writing ``<out>/leaderboard/`` (CSV + HTML) over every run folder in ``<out>``."""
    return sweep_spec(build_spec(sweep_file, args, out, jobs), console, leaderboard, placement)


def sweep_spec(
    spec: SweepSpec,
    console: Console | None = None,
    leaderboard: bool = True,
    placement: Placement | None = None,
) -> int:
    """Run (or resume) the sweep ``spec`` describes (from a file and the command line, or
    from ``cfl_bench.sweep``'s arguments); returns the exit code."""
    console = console or Console()
    placement = placement or Placement()
    placement.check()
    states = [PointState(p, spec.out) for p in expand(spec)]
    if spec.out.exists() and not spec.out.is_dir():
        raise UserError(f"--out '{spec.out}' is a file; give a folder for the sweep.")
    refuse_run_directory(spec.out, "--out", "a sweep's run folders and bookkeeping")
    for state in states:
        if ledger.is_done(state.run_dir, state.point.request_hash):
            state.absorb(ledger.read_summary(state.run_dir) or {})
            state.skipped = True
        else:
            state.damage = ledger.damage_line(state.run_dir)
    try:
        if placement.slurm_script is not None:
            return write_slurm_array(spec, states, console, placement)
        return run_sweep(spec, states, console, leaderboard, placement)
    except RunInterruptedError:
        raise
    except KeyboardInterrupt:
        write_manifest_if_prepared(spec, states)
        raise RunInterruptedError(interrupted_line(states)) from None


def run_sweep(
    spec: SweepSpec,
    states: list[PointState],
    console: Console,
    leaderboard: bool,
    placement: Placement,
) -> int:
    """Check the names of the points still to run, join the backend, prepare the folder,
    run, report. The backend comes before the folder: joining a Ray cluster can still be
    refused (``auto`` finds none, no node can hold a point), and a refusal writes nothing."""
    todo = [s for s in states if not s.skipped]
    launcher = Launcher()
    check_pending(states, launcher)
    backend = placement.backend_for(launcher) if todo else launcher
    # On a cluster an unset ``jobs`` puts every point in flight: Ray queues them by the
    # resources they declare.
    in_flight = spec.jobs if backend is launcher or spec.jobs_set else max(1, len(todo))
    try:
        prepare_folder(spec, states)
        announce_skipped(console, states)
        with SweepProgress(console, states, in_flight) as progress:

            def changed(state: PointState) -> None:
                progress.changed(state)
                write_manifest(spec, states)

            run_points(states, in_flight, backend, changed)
    finally:
        backend.close()
    write_manifest(spec, states)
    console.print(results_table(states))
    code = report(console, spec.out, states)
    if leaderboard and any(s.status in ("finished", "diverged") for s in states):
        from cfl_bench.leaderboard.command import leaderboard_command

        board = leaderboard_command([str(spec.out)], str(spec.out / LEADERBOARD), None, console)
        code = max(code, board)
    return code


def prepare(
    spec: SweepSpec, states: list[PointState], console: Console, launcher: Launcher
) -> None:
    """Refuse a pending point whose names `cfl-bench run` would refuse, then prepare the
    folder: what every route does before its points run (on Slurm here; ``run_sweep``
    joins its backend between the two)."""
    check_pending(states, launcher)
    prepare_folder(spec, states)
    announce_skipped(console, states)


def check_pending(states: list[PointState], launcher: Launcher) -> None:
    """Refuse a pending point whose names `cfl-bench run` would refuse (writes nothing)."""
    todo = [s for s in states if not s.skipped]
    if todo:
        errors = launcher.check_names([s.point.request for s in todo])
        for state, error in zip(todo, errors, strict=True):
            if error:
                raise UserError(
                    f"grid point {state.point.index + 1} ({state.point.label()}): {error}"
                )


def write_slurm_array(
    spec: SweepSpec, states: list[PointState], console: Console, placement: Placement
) -> int:
    """The Slurm route: check and prepare the folder as a run would, then write the pending
    points as a job array (``sweep.slurm``) instead of running them; no script when every
    point is already done. ``--jobs`` (or ``jobs:``) caps the array tasks running at once."""
    from cfl_bench.sweeps import slurm

    assert placement.slurm_script is not None
    slurm.check_sweep_folder(spec.out)
    prepare(spec, states, console, Launcher())
    todo = [s for s in states if not s.skipped]
    if not todo:
        console.print(
            f"nothing to submit: all {len(states)} points are done, so "
            f"{placement.slurm_script} was not written; rerun the sweep command without "
            f"--slurm-script to write sweep.json and the leaderboard.",
            highlight=False,
        )
        return 0
    throttle = spec.jobs if spec.jobs_set else None
    array = slurm.write_array(
        spec.out, todo, Path(placement.slurm_script), placement.cpus_per_run or 1, throttle
    )
    console.print(slurm.submit_line(array), highlight=False)
    return 0


def interrupted_line(states: list[PointState]) -> str:
    """The one line a Ctrl-C or SIGTERM of the sweep ends with: what is done, what is not
    (by name, the first few), and how to go on. The running runs were stopped at once; each
    keeps its last checkpoint (``cfl-bench run``'s rule), so the rerun resumes them."""
    done = [s for s in states if s.status in ("finished", "diverged")]
    stopped = [s.point.name for s in states if s.status == "interrupted"]
    waiting = [s.point.name for s in states if s.status in ("pending", "running")]
    failed = [s for s in states if s.status in ("failed", "busy")]
    parts = [f"{len(done)} of {len(states)} runs done"]
    if stopped:
        parts.append(f"stopped {names(stopped)} (kept: its last checkpoint)")
    if waiting:
        parts.append(f"not started {names(waiting)}")
    if failed:
        parts.append(f"{len(failed)} failed (run again)")
    return f"sweep interrupted: {'; '.join(parts)}; rerun the same sweep command to resume"


def names(points: list[str], shown: int = 2) -> str:
    """``a, b +3 more``: the first names, and how many more."""
    more = f" +{len(points) - shown} more" if len(points) > shown else ""
    return ", ".join(points[:shown]) + more


def write_manifest_if_prepared(spec: SweepSpec, states: list[PointState]) -> None:
    """sweep.json with the interrupted points, when the folder was already prepared (an
    interrupt during the name check leaves nothing written)."""
    if (spec.out / ledger.BOOKKEEPING).is_dir():
        write_manifest(spec, states)


def prepare_folder(spec: SweepSpec, states: list[PointState]) -> None:
    """Bookkeeping folder, one rerunnable YAML per point to run, skip lines, manifest."""
    (spec.out / ledger.BOOKKEEPING).mkdir(parents=True, exist_ok=True)
    for state in states:
        if state.skipped:
            ledger.append_log(spec.out, "skip", state.point.name, status=state.status)
            continue
        if state.damage:
            ledger.append_log(spec.out, "damaged", state.point.name)  # the reason: on screen
        header = (
            f"# grid point {state.point.index + 1} of the sweep in {spec.out}; to rerun it alone:\n"
            f"# cfl-bench run --config {state.yaml_path} "
            f"--out {state.run_dir} --overwrite\n"
        )
        body = yaml.safe_dump(state.point.request, sort_keys=False)
        atomic_write_text(state.yaml_path, header + body)
    write_manifest(spec, states)


def write_manifest(spec: SweepSpec, states: list[PointState]) -> None:
    ledger.write_manifest(
        spec.out,
        {"out": str(spec.out), "jobs": spec.jobs, "axes": spec.axes, "points": len(states)},
        (s.record() for s in states),
    )


def report(console: Console, out: Path, states: list[PointState]) -> int:
    """The closing line, and the exit code it implies."""
    counts = Counter(s.status for s in states)
    skipped = sum(s.skipped for s in states)
    parts = [f"{counts[k]} {k}" for k in ("finished", "diverged", "failed", "busy") if counts[k]]
    console.print(
        f"{len(states)} runs: {', '.join(parts)} ({skipped} skipped as already done); results in "
        f"[bold]{out}[/] (sweep.json, sweep.log, one folder per run)",
        highlight=False,
    )
    if counts["failed"] or counts["busy"]:
        console.print(
            "[red]some runs did not finish:[/] failed ones hold the reason in their "
            "summary.json (and .sweep/<run>.log); busy ones run in another sweep. Rerun the "
            "same sweep to retry them.",
            highlight=False,
        )
        return 1
    return 0
