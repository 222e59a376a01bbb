"""One run from a validated ``RunConfig`` to a complete run directory: the plan
(``cfl_bench.runner.plan``: everything resolved and refused before anything is written) executed
into its run directory, resumed from its checkpoint when it holds an unfinished run, and
summarised.

The plan's names stay importable from here (``plan_run``, ``RunPlan``, …): callers that
run a configuration need not know where the plan is made.
"""

from __future__ import annotations

import contextlib
import errno
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from cfl_bench.core.atomic import atomic_write
from cfl_bench.core.errors import UserError
from cfl_bench.core.run_dir import RunDirectory, os_problem
from cfl_bench.engine.loop import Federation
from cfl_bench.engine.progress import RoundReport
from cfl_bench.runner import cost
from cfl_bench.runner.config import RunConfig
from cfl_bench.runner.executors import executor_kind
from cfl_bench.runner.image_sets import write_image_sets
from cfl_bench.runner.plan import (
    RunPlan,
    check_amp,
    check_disk,
    check_memory,
    configure_cpu,
    note_threads,
    plan_run,
    run_identity,
)
from cfl_bench.runner.round_keeper import RoundKeeper, RunInterruptedError, interruption
from cfl_bench.runner.run_summary import run_summary
from cfl_bench.runner.trackers import Tracker, check_available, open_trackers, parse_trackers

# The plan's public names, re-exported for the callers that import them from here.
__all__ = [
    "RunPlan",
    "RunResult",
    "check_amp",
    "configure_cpu",
    "execute",
    "plan_run",
    "run_identity",
]


@dataclass
class RunResult:
    path: Path
    summary: dict[str, object]


def claim_run_directory(plan: RunPlan, say: Callable[[str], None]) -> tuple[RunDirectory, bool]:
    """Refuse what can be refused, then create, lock and claim the run directory; the
    directory and whether the run resumes from its checkpoint."""
    check_memory(plan)
    if plan.config.log:
        check_available(parse_trackers(plan.config.log))
    note_threads(plan.config, say)
    run_dir = RunDirectory(plan.out)
    resume = run_dir.claim(
        plan.config_hash,
        overwrite=plan.config.overwrite,
        restart=plan.config.restart,
        preflight=lambda path: check_disk(plan, path),
    )
    return run_dir, resume


def execute(
    config: RunConfig,
    on_round: Callable[[RoundReport], None] | None = None,
    annotations: Mapping[str, object] | None = None,
    notify: Callable[[str], None] | None = None,
    host: object = None,
    claimed: tuple[RunDirectory, bool] | None = None,
    started: Callable[[Path], None] | None = None,
) -> RunResult:
    """Run ``config`` into its run directory, resuming it from its checkpoint when the
    directory holds an unfinished run of the same configuration.

    ``annotations``: caller keys added to summary.json (the run's own keys win), so a
    caller such as ``cfl-bench sweep`` can recognise its finished runs in one read.
    ``notify`` receives one-line messages for the user (resuming, notes).
    ``host``: what a hosted executor's client side runs in, passed by that host (Flower's
    ServerApp passes its grid); without one, such a run starts its host (``ExecutorKind.launch``).
    ``claimed``: the directory already claimed for this run, and whether it resumes (a
    Flower ServerApp's, handed over by its launcher: ``flower.handover``).
    ``started`` receives the run directory once it is claimed, before anything is computed
    (`cfl-bench run` prints it first, so a long first round can be found and followed).
    """
    say = notify or (lambda _text: None)
    plan = plan_run(config)
    kind = executor_kind(plan.config.executor)
    if kind.launch is not None and host is None:
        return kind.launch(plan, annotations, say)
    if claimed is None:
        run_dir, resume = claim_run_directory(plan, say)
    else:
        run_dir, resume = claimed
        if run_dir.out.resolve() != plan.out.resolve():
            run_dir.release()
            raise UserError(f"the directory claimed is '{run_dir.out}', not '{plan.out}'.")
    with run_dir:
        if started is not None:
            started(plan.out)
        try:
            ran = run_in(run_dir, plan, resume, on_round, say, host)
            summary = {**(annotations or {}), **ran}
            run_dir.write_summary(summary)
            run_dir.commit()  # a replacement takes the old run's place only now, complete
        except OSError as exc:
            if exc.errno == errno.EPIPE:
                raise  # the terminal's output closed (`| head`): not the run directory's fault
            raise UserError(
                f"writing the run into '{plan.out}' failed ({os_problem(exc)}); fix that and "
                f"rerun the same command to resume."
            ) from None
    return RunResult(plan.out, summary)


def run_in(
    run_dir: RunDirectory,
    plan: RunPlan,
    resume: bool,
    on_round: Callable[[RoundReport], None] | None,
    say: Callable[[str], None],
    host: object = None,
) -> dict[str, object]:
    """The federated run itself, with records appended and checkpoints written as it goes.

    A fresh run first says its size and estimated duration (``cost.announce``, before the
    federation touches the model; recorded as config.json's ``cost_estimate``); a resumed
    one says where it resumes instead.
    """
    config = plan.config
    check_resumable(plan, resume)
    total = plan.schedule.clock().total_rounds
    trackers: list[Tracker] = []
    try:
        with interrupts_before_rounds(total, resume, run_dir.checkpoint_path.is_file()):
            if not resume:  # before the federation touches the model
                plan.resolved["cost_estimate"] = cost.announce(plan, say)
            federation = plan.federation(host)
            # config.json first: a folder holding a tracker's output without it would not
            # be a run (cfl_bench.core.run_dir), and a rerun would refuse it.
            keeper = start_keeper(run_dir, plan, federation, resume, say)
            trackers = open_run_trackers(plan, run_dir)
            keeper.observers.extend(tracker.log for tracker in trackers)
            keeper.observers.append(image_writer(run_dir.path, federation))
        # A display may also follow the clients inside a round (``RoundLog.clients_done``).
        federation.on_client = getattr(on_round, "clients_done", None)
        federation.round_work = keeper  # finished clients of a long round are kept
        outcome = federation.run(on_round, keeper.round_end)
        keeper.finish(outcome)
        if config.save_model:
            save_global_model(federation, run_dir.path / "model.pt")
    except RunInterruptedError:
        raise
    except KeyboardInterrupt:
        raise keeper.interrupted(total) from None
    finally:
        for tracker in trackers:
            tracker.close()
        plan.stream.close()
    return run_summary(keeper, outcome, plan)


def image_writer(run_path: Path, federation: Federation) -> Callable[[object], None]:
    """A round keeper's observer (called once each round's rows are on disk) that writes
    the components' new image sets into the run folder (``runner.image_sets``)."""

    def write(_rows: object) -> None:
        write_image_sets(run_path, federation.strategy)

    return write


def resuming_line(saved: int, total: int, kept: int = 0, clients: int = 0) -> str:
    """What a resumed run says first: the round its checkpoint ends and the one that comes
    next ("resuming from round 2" after "kept rounds 1-2" read as if round 2 ran again),
    or, when ``kept`` of that round's ``clients`` were kept inside it, that round and them."""
    if kept:
        return f"resuming round {saved + 1} of {total} with {kept} of {clients} clients done"
    return f"resuming after round {saved} of {total} (next: round {saved + 1})"


def start_keeper(
    run_dir: RunDirectory,
    plan: RunPlan,
    federation: Federation,
    resume: bool,
    say: Callable[[str], None],
) -> RoundKeeper:
    """The round keeper of a fresh run (config.json written) or of a resumed one (its
    checkpoint loaded)."""
    config = plan.config
    keeper = RoundKeeper(
        run_dir,
        federation,
        every=config.checkpoint_every,
        fingerprint=fingerprint(plan),
        keep_last=config.keep_checkpoint,
    )
    if resume:
        try:
            keeper.resume(plan.device, say, adopt_threads=config.threads is None)
        except ValueError as exc:
            raise UserError(
                f"cannot resume the run in '{plan.out}': {exc}; pass --restart to start it over."
            ) from None
        schedule = plan.schedule
        clients = min(schedule.clients_per_round, schedule.num_clients)
        kept = len(keeper.partial.loaded)
        if keeper.saved_round or kept:  # else round 1's kept files were all unusable
            say(resuming_line(keeper.saved_round, schedule.clock().total_rounds, kept, clients))
    else:
        run_dir.write_config(plan.resolved)
        keeper.start_fresh()
    return keeper


@contextlib.contextmanager
def interrupts_before_rounds(total: int, resuming: bool, checkpoint: bool = True) -> Iterator[None]:
    """Ctrl-C or SIGTERM before this process's first round (the cost probe, loading the
    checkpoint): one line saying what is kept — a resumed run's checkpoint (or, stopped in
    round 1 before any, its kept clients), else nothing."""
    try:
        yield
    except KeyboardInterrupt:
        if resuming:
            kept = "the checkpoint" if checkpoint else "the finished clients of round 1"
            raise RunInterruptedError(
                f"interrupted while resuming (before its next round of {total}); kept "
                f"{kept}; rerun the same command to resume"
            ) from None
        raise interruption(total, 0, 0) from None


def check_resumable(plan: RunPlan, resume: bool) -> None:
    """Refuse to resume a run whose stream cannot be rewound (live CARLA frames)."""
    if resume and not plan.stream.resumable:
        raise UserError(
            f"the unfinished run in '{plan.out}' streamed live frames, which cannot be replayed "
            "from its checkpoint; pass --restart to start it over."
        )


def save_global_model(federation: Federation, path: Path) -> None:
    """θ_g as the module's ``state_dict`` (atomically), loadable into ``build_model``."""
    federation.model.load(*federation.global_state)
    state = {k: v.detach().cpu() for k, v in federation.model.module.state_dict().items()}
    atomic_write(path, lambda fh: torch.save(state, fh))


def open_run_trackers(plan: RunPlan, run_dir: RunDirectory) -> list[Tracker]:
    """The trackers --log asks for, given the run's protocol, strategy and seed as params."""
    if not plan.config.log:
        return []
    protocol = plan.resolved["protocol"]
    assert isinstance(protocol, dict)  # run_identity's protocol (config.json's "protocol")
    params = {
        **protocol,
        "strategy": plan.strategy.name,
        "seed": plan.config.seed,
        "protocol_hash": plan.protocol_hash,
    }
    return open_trackers(parse_trackers(plan.config.log), run_dir.path, params)


def fingerprint(plan: RunPlan) -> dict[str, object]:
    """What must match for a checkpoint to be resumed (threads only draw a note)."""
    return {
        "config_hash": plan.config_hash,
        "git_commit": plan.resolved["git_commit"],
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
    }
