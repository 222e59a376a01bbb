"""Refusals of option combinations that no single option's range can express.

Torch-free, so the command line answers before the engine is imported; ``plan_run`` calls
the same checks again with what only the built stream knows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cfl_bench.core.errors import UserError
from cfl_bench.runner.config import MAX_CLIENT_ROUNDS, MAX_TOTAL_ROUNDS, RunConfig

if TYPE_CHECKING:
    from cfl_bench.strategies.compose import Strategy


def first_given(*flags: tuple[str, object]) -> str | None:
    """The first of (flag, given) pairs whose value is set: the option a refusal names."""
    return next((flag for flag, given in flags if given), None)


def check_diagnostics(config: RunConfig, capabilities: frozenset[str] | None = None) -> None:
    """``--diagnostics`` reads the global model every round and class logits: refuse it
    without ``--eval-every-round`` and on streams whose models give no class logits."""
    if not config.diagnostics:
        return
    if not config.eval_every_round:
        raise UserError(
            "--diagnostics measures the global model after every round; add --eval-every-round"
        )
    if capabilities is not None and "class_logits" not in capabilities:
        raise UserError(
            "--diagnostics measures class accuracies, and this stream's model gives no class "
            "logits (a detection stream); drop --diagnostics"
        )


def check_option_pairs(config: RunConfig) -> None:
    """Refuse options the rest of the configuration makes meaningless, instead of silently
    ignoring them: ``--data-root``/``--download`` on an embedded stream, ``--momentum``
    under Adam, ``--keep-checkpoint`` when no checkpoint is written; and a run longer than
    the bounds in ``cfl_bench.runner.config``.

    For `cfl-bench run` (and `flower app`) only: a sweep's base options are shared by all
    its points, so a --data-root for the MNIST points must not refuse the digits points."""
    from cfl_bench.streams.catalogue import check_class_order, check_classes_per_task, stream_info

    info = stream_info(config.stream)
    if info.base == "digits":  # embedded: no stream or public set reads a data folder
        for flag, given in (("--data-root", config.data_root), ("--download", config.download)):
            if given:
                raise UserError(
                    f"stream {config.stream!r} is embedded and reads no data files, so {flag} "
                    f"has no effect; drop {flag}."
                )
    optimizer = config.optimizer or info.default_optimizer
    if config.momentum and optimizer == "adam":
        default = "" if config.optimizer else f" (stream {config.stream!r} trains with Adam)"
        raise UserError(
            f"--momentum applies to --optimizer sgd only and this run uses adam{default}, "
            f"which keeps its own moments; drop --momentum or pass --optimizer sgd."
        )
    if config.keep_checkpoint and config.checkpoint_every == 0:
        raise UserError(
            "--keep-checkpoint keeps the last checkpoint, and --checkpoint-every 0 writes "
            "none, so it has no effect; drop one of them."
        )
    check_classes_per_task(info, config.classes_per_task)
    check_class_order(info, config.class_order)
    check_run_length(config)
    check_arrivals(config)
    check_task_order(config)
    check_lr_schedule(config)


def check_lr_schedule(config: RunConfig) -> None:
    """Refuse a per-task ``--lr-schedule`` without the rate it ends at, beside ``--lr-decay``
    (two schedules for one rate) or under ``--async-shift`` (clients' tasks start in
    different rounds, and the schedule follows the run's synchronous tasks); refuse
    ``--lr-end`` with no per-task schedule to read it, and a zero end for the exponential."""
    schedule = config.lr_schedule
    if schedule == "run":
        if config.lr_end is not None:
            raise UserError(
                "--lr-end sets where a per-task --lr-schedule ends, and this run has none; "
                "pass --lr-schedule task-cosine or task-exponential, or drop --lr-end."
            )
        return
    if config.lr_end is None:
        raise UserError(
            f"--lr-schedule {schedule} needs the rate it moves towards; pass --lr-end "
            "(LANDER's code: 1e-3, MFCL's: 0.01)."
        )
    if schedule == "task-exponential" and config.lr_end == 0:
        raise UserError(
            "--lr-schedule task-exponential cannot reach a rate of 0 (lr·(0/lr)^(i/R)); "
            "pass a positive --lr-end or use task-cosine."
        )
    other = first_given(
        ("--lr-decay", config.lr_decay != 1.0), ("--async-shift", config.async_shift != 0)
    )
    if other is not None:
        raise UserError(
            f"--lr-schedule {schedule} restarts the rate at the run's synchronous task "
            f"starts, which {other} does not follow; drop one of them."
        )


def check_run_length(config: RunConfig, tasks: int | None = None) -> None:
    """A run of ``tasks`` tasks stays within ``MAX_TOTAL_ROUNDS`` rounds and
    ``MAX_CLIENT_ROUNDS`` client-rounds (bounded by --async-shift, the largest lag it can
    draw), so a slip is refused at once rather than hanging in the planning."""
    from cfl_bench.streams.catalogue import default_task_count, stream_info

    info = stream_info(config.stream)
    # Avalanche: known once built
    tasks = tasks or config.tasks or default_task_count(info, config.classes_per_task) or 1
    rounds = config.rounds_per_task or info.default_rounds_per_task
    total = tasks * rounds + config.lead_rounds + config.async_shift
    extra = " + --lead-rounds + --async-shift" if config.lead_rounds or config.async_shift else ""
    if total > MAX_TOTAL_ROUNDS:
        raise UserError(
            f"the run would have up to {total:,} rounds ({tasks:,} tasks × {rounds:,} rounds per "
            f"task{extra}) and a run has at most {MAX_TOTAL_ROUNDS:,}; lower --tasks or "
            f"--rounds-per-task."
        )
    if total * config.clients > MAX_CLIENT_ROUNDS:
        raise UserError(
            f"the run would have up to {total * config.clients:,} client-rounds ({total:,} "
            f"rounds × {config.clients:,} clients) and a run has at most "
            f"{MAX_CLIENT_ROUNDS:,}; lower --clients, --tasks or --rounds-per-task."
        )


def check_arrivals(
    config: RunConfig, tasks: int | None = None, *, per_round_stream: bool = False
) -> None:
    """Refuse ``--arrivals`` with what it cannot mean: a client count other than its own, a
    participation fraction (``per_round`` says how many), asynchronous or lengthened
    boundaries (the joins happen at the global task starts) and a stream whose clients
    bring their own data (Flower's own limit is ``flower.kind.check_flower``). ``tasks``:
    the stream's count once built (an Avalanche benchmark's is known only then)."""
    from cfl_bench.engine.arrivals import parse_arrivals
    from cfl_bench.streams.catalogue import default_task_count, stream_info

    if config.arrivals is None:
        return
    arrivals = parse_arrivals(config.arrivals)
    info = stream_info(config.stream)
    tasks = tasks or config.tasks or default_task_count(info, config.classes_per_task)
    total = arrivals.total_clients(tasks) if tasks else config.clients
    if config.clients != total:
        raise UserError(
            f"--arrivals {config.arrivals} has {arrivals.initial} + {tasks - 1} x "
            f"{arrivals.new} = {total} clients over {tasks} tasks, and --clients is "
            f"{config.clients}; pass --clients {total}."
        )
    flag = first_given(
        ("--participation", config.participation != 1.0),
        ("--async-shift", config.async_shift != 0),
        ("--lead-rounds", config.lead_rounds != 0),
    )
    if flag is not None:
        raise UserError(
            f"--arrivals fixes who trains when (per_round clients of those there, at "
            f"synchronous task boundaries), so {flag} does not apply; drop {flag}."
        )
    if per_round_stream:
        raise UserError(
            f"stream {config.stream!r} gives each client its own data every round, so "
            "--arrivals does not apply; drop it."
        )


def check_task_order(config: RunConfig, *, per_round_stream: bool = False) -> None:
    """Refuse ``--task-order per-client`` with what it cannot mean: clients joining over
    time (who holds which task is then GLFC's plan), asynchronous or lengthened boundaries
    (a step is a task for every client at once), the per-round diagnostics (they score the
    step's task as if it were everyone's) and a stream whose clients bring their own data
    (Flower's own limit is ``flower.kind.check_flower``)."""
    if config.task_order == "shared":
        return
    flag = "--task-order per-client"
    other = first_given(
        ("--arrivals", config.arrivals is not None),
        ("--async-shift", config.async_shift != 0),
        ("--lead-rounds", config.lead_rounds != 0),
        ("--diagnostics", config.diagnostics),
    )
    if other is not None:
        raise UserError(
            f"{flag} has every client enter its next task at the same synchronous "
            f"boundary and scores each on its own tasks, which {other} does not follow; "
            f"drop one of them."
        )
    if per_round_stream:
        raise UserError(
            f"stream {config.stream!r} gives each client its own data every round, so "
            f"{flag} does not apply; drop it."
        )


def check_components_follow_orders(config: RunConfig, strategy: Strategy) -> None:
    """Refuse a component that reads a client's classes off the stream's task order (its
    task t's classes are then those of tasks 0..t: iCaRL's and GLFC's old/seen classes and
    exemplar budget), which per-client orders break."""
    if config.task_order == "shared":
        return
    for component in strategy.all:
        if component.assumes_stream_order:
            raise UserError(
                f"{component.name} takes a client's seen classes to be those of the stream's "
                f"tasks 1..t, which --task-order per-client breaks; drop --task-order or use "
                f"another learner."
            )
