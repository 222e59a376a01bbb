"""The Flower executor's entry in the executor registry (``cfl_bench.runner.executors``): what it
refuses, how it is built inside a ServerApp, and how a run started outside Flower launches
the simulation that hosts it.

Why here and not in the registry: launching imports the Flower application (``launch``),
which itself imports the run's configuration and plan; the registry sits in the run layer
below and names this module by string, so no import goes upward.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping

from cfl_bench.core.errors import UserError
from cfl_bench.engine.client_update import LocalTrainer
from cfl_bench.engine.executor import Executor
from cfl_bench.engine.loop import Schedule
from cfl_bench.runner.executors import ExecutorKind, PlannedRun, refuse_vectorized_options
from cfl_bench.runner.plan import RunPlan
from cfl_bench.runner.round_keeper import RunInterruptedError
from cfl_bench.runner.run import RunResult, claim_run_directory
from cfl_bench.runner.run_checks import first_given


def check_flower(run: PlannedRun) -> None:
    """Refuse what ``--executor flower`` does not run yet (docs/executors.md, "Flower")."""
    from cfl_bench.flower import require_flwr

    refuse_vectorized_options(run)
    for component in run.strategy.all:
        if component.sequential_only:
            raise UserError(
                f"--executor flower cannot run '{component.name}': "
                f"{component.sequential_only}; use --executor sequential."
            )
    require_flwr()
    learner = run.strategy.learner
    if run.stream.per_round or learner.needs_history or learner.keeps_exemplars:
        raise UserError(
            "--executor flower loads each client's shard of the current task only; per-round "
            "streams and learners that keep history or exemplars of earlier tasks need "
            "another --executor."
        )
    refuse_holdouts_off_the_shared_order(run)


def refuse_holdouts_off_the_shared_order(run: PlannedRun) -> None:
    """A node starts the tasks up to its own client's (``node_work.deliver_holdouts``), where
    the engine starts each task when its first client enters it. With synchronous shared
    boundaries the two agree; with asynchronous boundaries (a client behind the first),
    clients joining over time (a keeper stays on an old task) or per-client task orders
    they do not, and a public holdout (FedProj's, FedDF's) would then differ between the
    node and the server. Without a holdout nothing else depends on it: records
    were checked to equal the sequential executor's (tests/test_flower_deploy.py)."""
    config = run.config
    flag = first_given(
        ("--arrivals", config.arrivals is not None),
        ("--task-order per-client", config.task_order != "shared"),
        ("--async-shift", config.async_shift != 0),
    )
    if flag is None or run.strategy.holdout_per_task(len(run.stream.train_labels(0))) == 0:
        return
    raise UserError(
        f"--executor flower gives each node the public holdouts of its own client's tasks, "
        f"which under {flag} are not the server's; use --executor sequential or a public "
        f"set that is not a holdout."
    )


def build_flower(schedule: Schedule, trainer: LocalTrainer, host: object) -> Executor:
    """Client updates in Flower ClientApps, over the grid of the ServerApp running the run
    (``host``); without one the run was not started inside Flower."""
    from flwr.serverapp import Grid

    from cfl_bench.flower.executor import FlowerExecutor

    if not isinstance(host, Grid):  # None: the run was not started inside Flower
        raise UserError(
            "--executor flower runs inside a Flower simulation; start it with "
            "cfl-bench run ... --executor flower."
        )
    return FlowerExecutor(host, schedule.num_clients, trainer.strategy.learner)


def execute_in_flower(
    plan: RunPlan, annotations: Mapping[str, object] | None, say: Callable[[str], None]
) -> RunResult:
    """Launch a Flower simulation that runs ``plan`` (``flower.launch``); the ServerApp
    executes the same configuration, with ``out`` fixed to this plan's directory, and adds
    ``annotations`` (a sweep's request hash) to its summary.

    The directory is claimed here, before Flower starts, exactly as for every executor (a
    finished run is refused at once, not after a minute of Flower), and its lock is handed
    to the ServerApp (``flower.handover``): nothing writes the directory without it."""
    from cfl_bench.flower.launch import run_in_flower

    config = dataclasses.replace(plan.config, out=str(plan.out.resolve()))
    run_dir, resume = claim_run_directory(plan, say)
    try:
        say("starting a Flower simulation (Flower and Ray take about a minute to start)")
        path = run_in_flower(config, plan.device, say, annotations, claim=(run_dir, resume))
    except BaseException as exc:
        run_dir.abandon()
        run_dir.release(remove_created=True)  # only folders this claim made and left empty
        if isinstance(exc, KeyboardInterrupt):
            raise RunInterruptedError(
                f"interrupted during the Flower simulation; '{plan.out}' keeps its last "
                "checkpoint (if one was written yet); rerun the same command to resume"
            ) from None
        raise
    run_dir.release()
    summary = json.loads((path / "summary.json").read_text())
    return RunResult(path, summary)


KIND = ExecutorKind(check_flower, build_flower, hosted=True, launch=execute_in_flower)
