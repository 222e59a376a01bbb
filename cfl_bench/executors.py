"""The executor registry: each ``--executor`` name → what refuses a run it cannot execute
(``check``) and what builds it for a federation (``build``).

Why a registry: the run, the sweep and the engine used to compare the executor's name as a
string wherever they differed, and the engine imported the Flower app to find its grid.
Now an executor is one entry here, the engine receives the executor built from it
(``engine.executor.ExecutorBuild``) and the run asks the entry what it needs to know
(whether the executor runs inside a host such as Flower's ServerApp, whether it resumes).
Adding an executor = its module + one entry below (and its name in ``config.EXECUTORS``,
which the CLI reads without importing this registry's torch-heavy builders).

Importing this module imports no torch: the builders and checks import what they use when
called, so the sweep's option checks can ask an entry without paying torch's import.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cfl_bench.errors import UserError

if TYPE_CHECKING:
    import torch

    from cfl_bench.config import RunConfig
    from cfl_bench.engine.client_update import LocalTrainer
    from cfl_bench.engine.executor import Executor, ExecutorBuild
    from cfl_bench.engine.loop import Schedule
    from strategies.compose import Strategy
    from streams.base import Stream


@dataclass(frozen=True)
class PlannedRun:
    """What an executor's check sees: the run as planned when its executor is checked
    (configuration with the stream's defaults, the stream, the set-up strategy, the model)."""

    config: RunConfig
    stream: Stream
    strategy: Strategy
    model: torch.nn.Module


#: ``build(schedule, trainer, host)``: the executor running ``trainer``'s client updates;
#: ``host`` is what a hosted executor runs in (Flower's grid), None otherwise.
Builder = Callable[["Schedule", "LocalTrainer", object], "Executor"]


@dataclass(frozen=True)
class ExecutorKind:
    """One executor as the run sees it.

    ``check``: refuse, before anything is written, what the executor cannot run.
    ``build``: the executor itself. ``stacked_buffers``: the clients' buffers are rows of
    one stack (``engine.loop.new_clients``). ``hosted``: the client side runs inside a host
    process that passes itself to ``run.execute`` (Flower's ServerApp passes its grid);
    ``execute`` without one starts that host.
    """

    check: Callable[[PlannedRun], None]
    build: Builder
    stacked_buffers: bool = False
    hosted: bool = False

    def for_federation(self, schedule: Schedule, host: object = None) -> ExecutorBuild:
        """What a ``Federation`` is given: how to build this executor for its trainer."""
        from cfl_bench.engine.executor import ExecutorBuild

        def make(trainer: LocalTrainer) -> Executor:
            return self.build(schedule, trainer, host)

        return ExecutorBuild(make, self.stacked_buffers)


def refuse_vectorized_options(run: PlannedRun) -> None:
    """``--clients-per-chunk`` and ``--compile`` shape the vectorized executor only; with
    another one they would be silently ignored, so they are refused."""
    config = run.config
    if config.clients_per_chunk is not None or config.compile:
        flag = "--clients-per-chunk" if config.clients_per_chunk is not None else "--compile"
        raise UserError(
            f"{flag} applies to --executor vectorized only; drop it or add --executor vectorized."
        )


def check_vectorized(run: PlannedRun) -> None:
    """The vectorized executor's refusals (``engine.vectorized.check_vectorizable``)."""
    from cfl_bench.engine.vectorized import check_vectorizable

    check_vectorizable(run.strategy, run.model, str(run.config.model))
    if run.config.channels_last:
        raise UserError(
            "--channels-last is not supported with --executor vectorized (torch cannot choose "
            "memory formats inside vmap); drop --channels-last or use --executor sequential."
        )


def check_flower(run: PlannedRun) -> None:
    """Refuse what ``--executor flower`` does not run yet (docs/executors.md, "Flower")."""
    from cfl_bench.flower import require_flwr

    refuse_vectorized_options(run)
    require_flwr()
    if run.stream.per_round or run.strategy.learner.needs_history:
        raise UserError(
            "--executor flower loads each client's shard of the current task only; per-round "
            "streams and learners that keep history (joint) need another --executor."
        )


def build_sequential(schedule: Schedule, trainer: LocalTrainer, host: object) -> Executor:
    """Clients one after another (``engine.executor.SequentialExecutor``)."""
    from cfl_bench.engine.executor import SequentialExecutor

    return SequentialExecutor(trainer)


def build_vectorized(schedule: Schedule, trainer: LocalTrainer, host: object) -> Executor:
    """Clients batched with ``torch.func`` (``engine.vectorized``)."""
    from cfl_bench.engine.vectorized import VectorizedExecutor

    return VectorizedExecutor(trainer, schedule.clients_per_chunk, schedule.compile_step)


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


EXECUTOR_KINDS: dict[str, ExecutorKind] = {
    "sequential": ExecutorKind(refuse_vectorized_options, build_sequential),
    "vectorized": ExecutorKind(check_vectorized, build_vectorized, stacked_buffers=True),
    "flower": ExecutorKind(check_flower, build_flower, hosted=True),
}


def executor_kind(name: str) -> ExecutorKind:
    """The registry entry of ``--executor NAME`` (the configuration has checked the name)."""
    return EXECUTOR_KINDS[name]
