"""Which data each client holds, round by round: task splits, shards, task entry.

Why a unit: under an async shift clients enter tasks in different rounds, a task's data is
materialised only while some client still has to enter it, and a resumed run rebuilds every
client's data instead of checkpointing it (it is a deterministic gather of the stream's
tensors). Keeping this apart leaves the round conductor, the server and the executors free
of data bookkeeping.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from cfl_bench.core.context import ClientState
from cfl_bench.engine.arrivals import ArrivalPlan
from cfl_bench.engine.splits import TaskSplit, plan_task_split
from cfl_bench.engine.task_clock import TaskClock
from cfl_bench.strategies.compose import Strategy
from cfl_bench.streams.base import Stream, TaskTrain
from cfl_bench.streams.partition import Partitioner

# Called once per task, when its first client enters it, with the public holdout inputs.
TaskStart = Callable[[int, "torch.Tensor | None"], None]
# Then, when the task withholds a holdout, with its inputs and labels.
HoldoutLabels = Callable[[int, torch.Tensor, torch.Tensor], None]


class ClientAssignment:
    """The clients' data state and how a client is given its data: a task's planned split,
    the client's part of it (with history for learners that keep it), or a per-round stream's
    rows. :class:`ClientData` decides when each client enters a task and rebuilds the data on
    resume."""

    def __init__(
        self,
        stream: Stream,
        partitioner: Partitioner,
        strategy: Strategy,
        clock: TaskClock,
        seed: int,
        device: torch.device,
        splits: dict[int, TaskSplit] | None = None,
        arrivals: ArrivalPlan | None = None,
        orders: tuple[tuple[int, ...], ...] | None = None,
    ) -> None:
        self.stream = stream
        # Clients joining over time (``--arrivals``): who is there and gets each task's data.
        self.arrivals = arrivals
        # ``--task-order per-client``: ``orders[k][t]`` is the stream task client k trains at
        # step t; None: the stream's order for everyone.
        self.orders = orders
        self.partitioner = partitioner
        self.strategy = strategy
        self.clock = clock
        self.seed = seed
        self.device = device
        # Task splits planned ahead (run.py writes their class counts to config.json).
        self.splits: dict[int, TaskSplit] = dict(splits or {})
        self.shards: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}
        self.started_tasks: set[int] = set()
        # Materialised train splits some client is still entering (several rounds under a
        # shift); a task's train data exists only from its first client's entry on.
        self.live_tasks: dict[int, TaskTrain] = {}
        # Per-round streams: the distinct rows each client has received (learners that keep
        # history train on all of them), by row key, in arrival order.
        self.received: dict[int, dict[str, tuple[torch.Tensor, torch.Tensor]]] = {}

    def split(self, t: int, num_clients: int) -> TaskSplit:
        """Task ``t``'s split among ``num_clients`` clients (planned once, then reused)."""
        split = self.splits.get(t)
        if split is None:
            labels = self.stream.train_labels(t).cpu()
            receivers = None if self.arrivals is None else self.arrivals.receivers[t]
            split = plan_task_split(
                labels, self.strategy, self.partitioner, num_clients, t, self.seed, receivers
            )
            self.splits[t] = split
        return split

    def stream_task(self, client: int, step: int) -> int:
        """The stream task ``client`` trains at (global) ``step``: the step itself, or the
        client's own order's entry under ``--task-order per-client``."""
        return step if self.orders is None else self.orders[client][step]

    def assign(
        self,
        client: ClientState,
        t: int,
        train_x: torch.Tensor,
        train_y: torch.Tensor,
        parts: list[torch.Tensor],
    ) -> None:
        """Client ``client`` trains task ``t`` on its part (plus history for the joint
        learner)."""
        client.task = t
        idx = parts[client.index].to(self.device)
        shard = (train_x[idx], train_y[idx])
        learner = self.strategy.learner
        history = self.shards.get(client.index, []) if learner.needs_history else []
        self.shards[client.index] = [*history, shard]
        x, y = learner.training_data(self.shards[client.index])
        client.train_x, client.train_y = learner.local_data(client, x, y)

    def _receive_round(self, g: int, clients: list[ClientState], on_task_start: TaskStart) -> None:
        """A per-round stream: every client trains on what it received in round ``g``
        (plus every distinct row received before, for learners that keep history)."""
        tasks = {c.index: self.clock.client_task(c.index, g) for c in clients}
        for t in sorted(set(tasks.values()) - self.started_tasks):
            self.started_tasks.add(t)
            on_task_start(t, None)
        entries = {
            k: tuple(self.clock.client_task_start(k, t) for t in range(task + 1))
            for k, task in tasks.items()
        }
        data = self.stream.round_data(g, entries)
        history = self.strategy.learner.needs_history
        for client in clients:
            client.task = tasks[client.index]
            # Every round's frames are new to the client: the first-pass buffer policy offers
            # them in the round's first epoch (not only in a task's first round).
            client.tasks_started.discard(client.task)
            got = data[client.index]
            if not history:
                client.train_x, client.train_y = got.x.to(self.device), got.y.to(self.device)
                continue
            seen = self.received.setdefault(client.index, {})
            for row, key in enumerate(got.keys):
                seen.setdefault(key, (got.x[row], got.y[row]))
            client.train_x = torch.stack([x for x, _ in seen.values()]).to(self.device)
            client.train_y = torch.stack([y for _, y in seen.values()]).to(self.device)


class ClientData(ClientAssignment):
    """The clients' training data over the run: which task each client enters in which
    round (async shift, arrivals, per-client orders), and the rebuild of every client's data
    when a run resumes."""

    def advance(
        self,
        g: int,
        clients: list[ClientState],
        on_task_start: TaskStart,
        on_holdout_labels: HoldoutLabels | None = None,
    ) -> None:
        """Give every client whose task changes in round ``g`` its shard of the new task.

        A task's start hooks run once, when its first client enters it (the server's public
        holdout of that task becomes usable then, and its labels go to
        ``on_holdout_labels``).
        """
        if self.stream.per_round:
            self._receive_round(g, clients, on_task_start)
            return
        if self.arrivals is not None:
            self._arrive(g, clients, on_task_start, on_holdout_labels)
            return
        entering: dict[int, list[ClientState]] = {}
        for client in clients:
            t = self.stream_task(client.index, self.clock.client_task(client.index, g))
            if client.train_y is None or t != client.task:
                entering.setdefault(t, []).append(client)
        for t, group in sorted(entering.items()):
            self._enter(t, group, len(clients), on_task_start, on_holdout_labels)
        if self.orders is not None:  # synchronous: every client entered its task at once
            self.live_tasks = {}
            return
        # Keep a materialised task only while some client has yet to enter it.
        behind = min(c.task for c in clients)
        self.live_tasks = {t: d for t, d in self.live_tasks.items() if t > behind}

    def _enter(
        self,
        t: int,
        group: list[ClientState],
        num_clients: int,
        on_task_start: TaskStart,
        on_holdout_labels: HoldoutLabels | None,
    ) -> None:
        """``group`` enters task ``t``: the task's start hooks if it is the first, then each
        client's part."""
        task = self.live_tasks.get(t) or self.stream.task_train(t)
        self.live_tasks[t] = task
        split = self.split(t, num_clients)
        if t not in self.started_tasks:
            self.started_tasks.add(t)
            held = split.held
            stored = None if held is None else task.train_x[held.to(task.train_x.device)]
            holdout = None if stored is None else self.stream.as_model_input(stored)
            on_task_start(t, holdout)
            if holdout is not None and held is not None and on_holdout_labels is not None:
                on_holdout_labels(t, holdout, task.train_y[held.to(task.train_y.device)])
        for client in group:
            self.assign(client, t, task.train_x, task.train_y, split.parts)

    def _arrive(
        self,
        g: int,
        clients: list[ClientState],
        on_task_start: TaskStart,
        on_holdout_labels: HoldoutLabels | None,
    ) -> None:
        """``--arrivals``: at a task's first round its receivers (joining clients among
        them) enter it; keepers hold on to their data, clients not there yet hold none."""
        assert self.arrivals is not None
        t = self.clock.global_task(g)
        group = [
            clients[k]
            for k in self.arrivals.receivers[t]
            if clients[k].train_y is None or clients[k].task != t
        ]
        if group:
            self._enter(t, group, len(clients), on_task_start, on_holdout_labels)
        self.live_tasks = {}  # every receiver entered at once

    def restore(self, next_round: int, clients: list[ClientState]) -> None:
        """Give every client the training data it held at the end of round ``next_round``−1.

        A client's data is its part of the task's deterministic tensors (plus the older tasks'
        parts for learners that keep history), so it is rebuilt instead of checkpointed.
        """
        if self.stream.per_round:
            # The task-start hooks already ran before the checkpoint (their effects are in the
            # saved state); replaying the received rounds rebuilds the histories.
            last = max(self.clock.client_task(c.index, next_round - 1) for c in clients)
            self.started_tasks |= set(range(last + 1))
            if self.strategy.learner.needs_history:
                for g in range(next_round):
                    self._receive_round(g, clients, lambda _t, _holdout: None)
            return
        if self.arrivals is not None:
            self._restore_arrivals(next_round, clients)
            return
        if self.orders is not None:
            self._restore_ordered(self.clock.global_task(next_round - 1), clients)
            return
        held = {c.index: self.clock.client_task(c.index, next_round - 1) for c in clients}
        history = self.strategy.learner.needs_history
        self.shards = {}
        for t in range(max(held.values()) + 1):
            group = [c for c in clients if held[c.index] == t or (history and held[c.index] > t)]
            if not group:
                continue
            task = self.stream.task_train(t)
            parts = self.split(t, len(clients)).parts
            for client in group:
                self.assign(client, t, task.train_x, task.train_y, parts)

    def _restore_arrivals(self, next_round: int, clients: list[ClientState]) -> None:
        """``--arrivals``: every client that is there gets the data of the last task it
        received (all the tasks it received, for learners that keep history)."""
        assert self.arrivals is not None
        now = self.clock.global_task(next_round - 1)
        history = self.strategy.learner.needs_history
        self.shards = {}
        for t in range(now + 1):
            group = [
                clients[k]
                for k in self.arrivals.receivers[t]
                if history or self.arrivals.held_task(k, now) == t
            ]
            task = self.stream.task_train(t)
            parts = self.split(t, len(clients)).parts
            for client in group:
                self.assign(client, t, task.train_x, task.train_y, parts)

    def _restore_ordered(self, now: int, clients: list[ClientState]) -> None:
        """``--task-order per-client`` at step ``now``: every client gets its part of its
        step-``now`` task (and, for learners that keep history, of its earlier steps' tasks,
        in its own order, as the run gave them), and every task some client entered counts
        as started, so no task-start hook runs twice."""
        assert self.orders is not None
        history = self.strategy.learner.needs_history
        self.shards = {}
        for step in range(now + 1) if history else (now,):
            groups: dict[int, list[ClientState]] = {}
            for client in clients:
                groups.setdefault(self.orders[client.index][step], []).append(client)
            for t, group in sorted(groups.items()):
                task = self.stream.task_train(t)
                parts = self.split(t, len(clients)).parts
                for client in group:
                    self.assign(client, t, task.train_x, task.train_y, parts)
        self.started_tasks |= {order[step] for order in self.orders for step in range(now + 1)}
