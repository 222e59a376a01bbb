"""Executors: who runs the client side of a round, and how.

An executor receives the round's ``ClientJob`` s and hands each ``ClientResult`` to the
server as soon as it exists (``sink``), so the server folds uploads into its running average
without holding K models. It also runs the client-side computations the server asks for at
θ_g after aggregation (``ClientRequest``: FedGP's reference gradient) and the learner's
task-end work (A-GEM's episodic memory). The sequential executor below is the first one:
one working model, clients one after another, exactly the reference loop. A vectorized
executor batches clients on a GPU; a Flower executor sends jobs to ClientApps — both
implement this same protocol.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from cfl_bench.core.context import ClientState
from cfl_bench.core.payloads import ClientRequest
from cfl_bench.core.seeding import seed_torch_default
from cfl_bench.engine.client_update import ClientJob, ClientResult, LocalTrainer

ResultSink = Callable[[ClientResult], None]
AnswerSink = Callable[[ClientState, torch.Tensor], None]


class Executor(Protocol):
    """Runs the client side of rounds."""

    def train(self, jobs: Sequence[ClientJob], sink: ResultSink) -> None:
        """Run every job; call ``sink`` with each result (its upload tensors are only valid
        until ``sink`` returns)."""
        ...

    def answer(
        self,
        request: ClientRequest,
        global_state: tuple[torch.Tensor, torch.Tensor],
        sink: AnswerSink,
    ) -> None:
        """Compute ``request`` on each of its clients at θ_g; ``sink`` gets each answer."""
        ...

    def end_tasks(
        self, ending: list[tuple[ClientState, int]], global_state: tuple[torch.Tensor, torch.Tensor]
    ) -> None:
        """The learner's task-end work for clients finishing a task, at θ_g (eval mode)."""
        ...


class SequentialExecutor:
    """Clients one after another on one reusable working model (the reference executor)."""

    def __init__(self, trainer: LocalTrainer) -> None:
        self.trainer = trainer

    def train(self, jobs: Sequence[ClientJob], sink: ResultSink) -> None:
        for job in jobs:
            sink(self.trainer.update(job))

    def answer(
        self,
        request: ClientRequest,
        global_state: tuple[torch.Tensor, torch.Tensor],
        sink: AnswerSink,
    ) -> None:
        model = self.trainer.model
        model.load(*global_state)
        model.module.train(request.train_mode)
        for client in request.clients:
            seed_torch_default(
                self.trainer.steps.seed, "dropout-request", request.round_index, client.index
            )
            sink(client, request.compute(client, model))
        # Training-mode forwards may have moved BatchNorm statistics of the working model;
        # every later use reloads θ_g first, so nothing leaks into the global model.
        model.module.train(True)

    def end_tasks(
        self, ending: list[tuple[ClientState, int]], global_state: tuple[torch.Tensor, torch.Tensor]
    ) -> None:
        if not ending:
            return
        model = self.trainer.model
        model.load(*global_state)
        model.module.eval()
        for client, task in ending:
            self.trainer.strategy.learner.on_task_end(client, task, model)
        model.module.train()


@dataclass(frozen=True)
class ExecutorBuild:
    """How a ``Federation`` gets its executor, injected by whoever chose it (the run's
    executor registry, ``cfl_bench.runner.executors``), so the engine never dispatches on an
    executor's name.

    ``make`` turns the federation's trainer into the executor (the trainer exists only once
    the federation has wrapped the model). ``stacked_buffers``: the clients' replay buffers
    are rows of one ``ReservoirStack`` (batched draws and inserts over clients), which also
    keeps their inputs as float32 rather than a stream's compact stored form.
    ``keeps_clients``: each client update is computed on its own, from the broadcast and
    that client's state alone, so an interrupted round's finished clients can be kept and
    the others trained without them (``engine.kept_clients``); not so for an executor
    that trains clients together (the vectorized one's chunks).
    """

    make: Callable[[LocalTrainer], Executor] = SequentialExecutor
    stacked_buffers: bool = False
    keeps_clients: bool = False


#: The reference executor: clients one after another, per-client buffers.
SEQUENTIAL = ExecutorBuild(keeps_clients=True)
