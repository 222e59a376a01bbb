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

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cfl_bench.core.errors import UserError

if TYPE_CHECKING:
    import torch

    from cfl_bench.engine.client_update import LocalTrainer
    from cfl_bench.engine.executor import Executor, ExecutorBuild
    from cfl_bench.engine.loop import Schedule
    from cfl_bench.runner.config import RunConfig
    from cfl_bench.runner.plan import RunPlan
    from cfl_bench.runner.run import RunResult
    from cfl_bench.strategies.compose import Strategy
    from cfl_bench.streams.base import Stream


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
#: ``launch(plan, annotations, say)``: a hosted executor's run started inside its host.
Launcher = Callable[["RunPlan", "Mapping[str, object] | None", Callable[[str], None]], "RunResult"]


@dataclass(frozen=True)
class ExecutorKind:
    """One executor as the run sees it.

    ``check``: refuse, before anything is written, what the executor cannot run.
    ``build``: the executor itself. ``stacked_buffers``: the clients' buffers are rows of
    one stack (``engine.loop.new_clients``). ``hosted``: the client side runs inside a host
    process that passes itself to ``run.execute`` (Flower's ServerApp passes its grid);
    ``execute`` without one starts that host. ``channels_last``: the executor can run the
    model's convolutions on channels-last inputs (``--channels-last`` auto turns them on
    only where it can; the vectorized executor's ``vmap`` cannot).
    """

    check: Callable[[PlannedRun], None]
    build: Builder
    stacked_buffers: bool = False
    hosted: bool = False
    channels_last: bool = True
    # A hosted executor's start: ``launch(plan, annotations, say)`` runs the plan inside
    # its host (Flower's simulation) when ``run.execute`` is called without one.
    launch: Launcher | None = None
    # Its client updates are independent one by one, so an interrupted round keeps its
    # finished clients (``engine.executor.ExecutorBuild.keeps_clients``).
    keeps_clients: bool = False

    def for_federation(self, schedule: Schedule, host: object = None) -> ExecutorBuild:
        """What a ``Federation`` is given: how to build this executor for its trainer."""
        from cfl_bench.engine.executor import ExecutorBuild

        def make(trainer: LocalTrainer) -> Executor:
            return self.build(schedule, trainer, host)

        return ExecutorBuild(make, self.stacked_buffers, self.keeps_clients)


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
            "--channels-last is not supported with --executor vectorized (vmap refuses "
            "channels-last inputs: 'required rank 4 tensor to use channels_last format'); drop "
            "--channels-last or use --executor sequential."
        )


def build_sequential(schedule: Schedule, trainer: LocalTrainer, host: object) -> Executor:
    """Clients one after another (``engine.executor.SequentialExecutor``)."""
    from cfl_bench.engine.executor import SequentialExecutor

    return SequentialExecutor(trainer)


def build_vectorized(schedule: Schedule, trainer: LocalTrainer, host: object) -> Executor:
    """Clients batched with ``torch.func`` (``engine.vectorized``)."""
    from cfl_bench.engine.vectorized import VectorizedExecutor

    return VectorizedExecutor(trainer, schedule.clients_per_chunk, schedule.compile_step)


#: Each executor's entry, or the module that holds it as ``KIND``: Flower's entry lives in
#: its application package (``cfl_bench.flower.kind``), which stands above the run (it
#: launches runs), so the run names it here and loads it only when asked.
EXECUTOR_KINDS: dict[str, ExecutorKind | str] = {
    "sequential": ExecutorKind(refuse_vectorized_options, build_sequential, keeps_clients=True),
    "vectorized": ExecutorKind(
        check_vectorized, build_vectorized, stacked_buffers=True, channels_last=False
    ),
    "flower": "cfl_bench.flower.kind",
}


def executor_kind(name: str) -> ExecutorKind:
    """The registry entry of ``--executor NAME`` (the configuration has checked the name)."""
    entry = EXECUTOR_KINDS[name]
    if isinstance(entry, str):
        kind = importlib.import_module(entry).KIND
        assert isinstance(kind, ExecutorKind), f"{entry}.KIND is not an ExecutorKind"
        return kind
    return entry
