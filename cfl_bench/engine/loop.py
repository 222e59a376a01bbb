"""The continual-federated round loop (DESIGN.md §3), sequential executor.

    for round g: clients entering a task get its data (task start hooks on first entry)
                 broadcast θ_g (+ payloads) → sampled clients train locally on their task
                 → uploads → weighted average → server hooks
                 → evaluation when a task is finished by every client → client task ends

Which client trains which task in which round, and when task t counts as finished, is the
``TaskClock``: synchronous by default, per-client delayed boundaries under ``--async-shift``.

Speed: one reusable module whose parameters are views of a flat vector (``FlatModel``);
loading a client is one copy, aggregation is a running weighted sum of flat vectors, the
local step touches the host only through Python ints it already knows. The one host sync per
round is the divergence check on the summed training loss.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.nn import functional as F

from cfl_bench.buffer import ReservoirBuffer
from cfl_bench.engine.aggregation import RunningAverage, client_weight
from cfl_bench.engine.comm import CommCounter
from cfl_bench.engine.context import (
    ClientState,
    ServerState,
    StepContext,
    Upload,
    tensor_bytes,
)
from cfl_bench.engine.evaluation import accuracy, log_probs, mean_kl, predict_logits
from cfl_bench.engine.optim import FlatSGD
from cfl_bench.engine.splits import TaskSplit, plan_task_split
from cfl_bench.engine.task_clock import TaskClock
from cfl_bench.flat import FlatModel
from cfl_bench.progress import RoundReport
from cfl_bench.seeding import generator
from strategies.compose import Strategy
from streams.base import Stream, TaskTrain
from streams.partition import Partitioner

# (round, trained_task, eval_task, scope, metric, value); value may be a 0-d tensor until flushed.
Record = tuple[int, int, int, str, str, object]


@dataclass(frozen=True)
class Schedule:
    """The numbers that shape the loop (after strategy schedule adjustments)."""

    num_tasks: int
    rounds_per_task: int
    epochs: int
    num_clients: int
    participation: float
    batch_size: int
    buffer_batch_size: int
    buffer_size: int
    buffer_offer: str
    replay_augment: bool
    weighting: str
    lr: float
    momentum: float
    weight_decay: float
    probe_size: int
    eval_every_round: bool
    seed: int
    async_shift: int = 0

    @property
    def clients_per_round(self) -> int:
        return max(1, round(self.participation * self.num_clients))

    def clock(self) -> TaskClock:
        """Who trains which task when (seeded per-client offsets under an async shift)."""
        return TaskClock.draw(
            self.num_tasks, self.rounds_per_task, self.num_clients, self.async_shift, self.seed
        )


@dataclass
class RunOutcome:
    records: list[Record] = field(default_factory=list)
    costs: list[Record] = field(default_factory=list)
    status: str = "running"
    message: str = ""
    buffer_bytes_per_client: int = 0
    num_params: int = 0
    comm_by_payload: dict[str, int] = field(default_factory=dict)


@dataclass
class EvalSet:
    x: torch.Tensor
    y: torch.Tensor
    classes: tuple[int, ...]


class Federation:
    """One run: a stream, a partitioner, a validated strategy and a model, on one device."""

    def __init__(
        self,
        stream: Stream,
        partitioner: Partitioner,
        strategy: Strategy,
        model: torch.nn.Module,
        schedule: Schedule,
        device: torch.device,
        splits: dict[int, TaskSplit] | None = None,
    ) -> None:
        self.stream = stream
        # Task splits planned ahead (run.py writes their class counts to config.json).
        self.splits: dict[int, TaskSplit] = dict(splits or {})
        self.partitioner = partitioner
        self.strategy = strategy
        self.schedule = schedule
        self.device = device
        self.model = FlatModel(model.to(device))
        self.loss_terms = strategy.loss_terms
        self.penalties = strategy.loss_terms
        self.transforms = strategy.transforms
        self.task_il = stream.scenario == "class-il"
        self.optimizer = FlatSGD(
            self.model.params,
            self.model.grads,
            schedule.lr,
            schedule.momentum,
            schedule.weight_decay,
        )
        seed = schedule.seed
        self.clients = [
            ClientState(
                index=k,
                generator=generator(seed, "client", k, device=device),
                buffer=self._make_buffer(k) if strategy.needs_buffer else None,
                decode=stream.as_model_input,
            )
            for k in range(schedule.num_clients)
        ]
        self.server_rng = generator(seed, "participation")
        self.server = ServerState(
            model=self.model,
            global_params=self.model.params.detach().clone(),
            global_buffers=self.model.buffers.detach().clone(),
            clients=self.clients,
            comm=CommCounter(),
            device=device,
            rounds_per_task=schedule.rounds_per_task,
        )
        self.shards: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}
        self.clock = schedule.clock()
        self.started_tasks: set[int] = set()
        # Materialised train splits some client is still entering (several rounds under a
        # shift); a task's train data exists only from its first client's entry on.
        self.live_tasks: dict[int, TaskTrain] = {}
        self.eval_sets: list[EvalSet] = []
        self.reference_log_probs: dict[int, torch.Tensor] = {}
        # Mean accuracy over the seen tasks at the latest evaluation (progress display).
        self.latest_acc: float | None = None

    def _make_buffer(self, k: int) -> ReservoirBuffer:
        s = self.schedule
        return ReservoirBuffer(
            s.buffer_size,
            self.stream.input_shape,
            self.stream.num_classes,
            device=self.device,
            generator=generator(s.seed, "buffer", k, device=self.device),
        )

    # -- the run ----------------------------------------------------------------------------------
    def run(
        self,
        on_round: Callable[[RoundReport], None] | None = None,
        on_round_end: Callable[[RunOutcome], None] | None = None,
    ) -> RunOutcome:
        """Run the remaining rounds: all of them, or those after a loaded checkpoint.

        ``on_round_end`` sees the outcome after every completed round, when the federation's
        state is exactly what :meth:`state_dict` would save (records flushed, checkpoints).
        """
        s, clock, server = self.schedule, self.clock, self.server
        out = RunOutcome(num_params=self.model.num_params)
        if self.clients[0].buffer is not None:
            out.buffer_bytes_per_client = self.clients[0].buffer.nbytes
        self._prepare_eval_sets()
        if server.round_index == 0:
            self._evaluate(out, round_index=0, trained_task=-1, upto=s.num_tasks - 1, drift=False)
        else:
            self._restore_shards(server.round_index)
        for g in range(server.round_index, clock.total_rounds):
            started = time.perf_counter()
            t = clock.global_task(g)
            server.task, server.round_in_task = t, g - clock.task_start(t)
            server.rounds_per_task = clock.task_rounds(t)
            self._advance_clients(g)
            server.round_index += 1
            loss_sum, steps, train_seconds = self._round(out)
            mean_loss = (loss_sum / max(steps, 1)).item()
            ri = server.round_index
            up, down = server.comm.end_round()
            out.records += [
                (ri, t, -1, "global", "bytes_up", up),
                (ri, t, -1, "global", "bytes_down", down),
                (ri, t, -1, "global", "train_loss", mean_loss),
            ]
            if not math.isfinite(mean_loss):
                out.status = "diverged"
                out.message = f"training loss became {mean_loss} in round {ri} (task {t + 1})"
                out.costs.append(
                    (ri, t, -1, "global", "round_time_s", time.perf_counter() - started)
                )
                return self._finish(out)
            self._record_buffer_drift(out, ri, t)
            if server.is_task_end or s.eval_every_round:
                upto = min(t + 1, s.num_tasks - 1)
                self.latest_acc = self._evaluate(out, ri, t, upto=upto, drift=server.is_task_end)
            self._end_client_tasks(clock.ending_tasks(g))
            out.costs += [
                (ri, t, -1, "global", "round_time_s", time.perf_counter() - started),
                (ri, t, -1, "global", "train_time_s", train_seconds),
            ]
            if on_round_end is not None:
                on_round_end(out)
            if on_round is not None:
                on_round(RoundReport(ri, clock.total_rounds, t, s.num_tasks, self.latest_acc))
        out.status = "finished"
        return self._finish(out)

    def _finish(self, out: RunOutcome) -> RunOutcome:
        out.comm_by_payload = dict(self.server.comm.by_payload)
        return out

    # -- state (checkpoints) ----------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Everything the next round needs, at a round end: the global model, every client
        (generator, buffer, task, component state), every component's server state, every
        random generator, the traffic counters and the memory-drift references. Client data
        is not saved: it is a deterministic gather of the stream's task data (see
        :meth:`_restore_shards`)."""
        server = self.server
        return {
            "round_index": server.round_index,
            "version": server.version,
            "global_params": server.global_params,
            "global_buffers": server.global_buffers,
            "comm_by_payload": dict(server.comm.by_payload),
            # Integer module buffers (BatchNorm's num_batches_tracked) live outside the flat
            # vectors and persist across rounds.
            "module_int_buffers": {
                name: b
                for name, b in self.model.module.named_buffers()
                if not b.is_floating_point()
            },
            "server_rng": self.server_rng,
            "torch_rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state(self.device)
            if self.device.type == "cuda"
            else None,
            "started_tasks": self.started_tasks,
            "reference_log_probs": self.reference_log_probs,
            "latest_acc": self.latest_acc,
            "clients": [client_state_dict(c) for c in self.clients],
            "components": {c.name: c.state_dict() for c in self.strategy.all},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Put the federation back where :meth:`state_dict` found it; :meth:`run` then goes
        on with the next round."""
        server = self.server
        server.round_index = int(state["round_index"])
        server.version = int(state["version"])
        server.global_params = state["global_params"]
        server.global_buffers = state["global_buffers"]
        server.comm.by_payload = dict(state["comm_by_payload"])
        buffers = dict(self.model.module.named_buffers())
        with torch.no_grad():
            for name, value in state["module_int_buffers"].items():
                buffers[name].copy_(value)
        self.server_rng.set_state(state["server_rng"].get_state())
        torch.set_rng_state(state["torch_rng"].cpu())
        if state["cuda_rng"] is not None and self.device.type == "cuda":
            torch.cuda.set_rng_state(state["cuda_rng"].cpu(), self.device)
        self.started_tasks = set(state["started_tasks"])
        self.reference_log_probs = dict(state["reference_log_probs"])
        self.latest_acc = state["latest_acc"]
        for client, saved in zip(self.clients, state["clients"], strict=True):
            load_client_state(client, saved)
        components = state["components"]
        if sorted(components) != sorted(c.name for c in self.strategy.all):
            raise ValueError("the checkpoint was written for another strategy")
        for component in self.strategy.all:
            component.load_state_dict(components[component.name])

    def _restore_shards(self, next_round: int) -> None:
        """Give every client the training data it held at the end of round ``next_round``−1.

        A client's data is its part of the task's deterministic tensors (plus the older tasks'
        parts for learners that keep history), so it is rebuilt instead of checkpointed.
        """
        held = {c.index: self.clock.client_task(c.index, next_round - 1) for c in self.clients}
        history = self.strategy.learner.needs_history
        self.shards = {}
        for t in range(max(held.values()) + 1):
            clients = [
                c for c in self.clients if held[c.index] == t or (history and held[c.index] > t)
            ]
            if not clients:
                continue
            task = self.stream.task_train(t)
            parts = self._split(t).parts
            for client in clients:
                self._assign_shard(client, t, task.train_x, task.train_y, parts)

    # -- data -------------------------------------------------------------------------------------
    def _prepare_eval_sets(self) -> None:
        """Every task's test split, in the stream's stored form (decoded per chunk)."""
        for i in range(self.schedule.num_tasks):
            task = self.stream.task_test(i)
            self.eval_sets.append(EvalSet(task.test_x, task.test_y, tuple(task.classes)))

    def _split(self, t: int) -> TaskSplit:
        split = self.splits.get(t)
        if split is None:
            s = self.schedule
            labels = self.stream.train_labels(t).cpu()
            split = plan_task_split(
                labels, self.strategy, self.partitioner, s.num_clients, t, s.seed
            )
            self.splits[t] = split
        return split

    def _advance_clients(self, g: int) -> None:
        """Give every client whose task changes in round ``g`` its shard of the new task.

        A task's start hooks run once, when its first client enters it (the server's public
        holdout of that task becomes usable then).
        """
        entering: dict[int, list[ClientState]] = {}
        for client in self.clients:
            t = self.clock.client_task(client.index, g)
            if client.train_y is None or t != client.task:
                entering.setdefault(t, []).append(client)
        for t, clients in sorted(entering.items()):
            task = self.live_tasks.get(t) or self.stream.task_train(t)
            self.live_tasks[t] = task
            split = self._split(t)
            if t not in self.started_tasks:
                self.started_tasks.add(t)
                held = split.held
                stored = None if held is None else task.train_x[held.to(task.train_x.device)]
                holdout = None if stored is None else self.stream.as_model_input(stored)
                for component in self.strategy.all:
                    component.on_task_start(self.server, t, holdout)
            for client in clients:
                self._assign_shard(client, t, task.train_x, task.train_y, split.parts)
        # Keep a materialised task only while some client has yet to enter it.
        behind = min(c.task for c in self.clients)
        self.live_tasks = {t: d for t, d in self.live_tasks.items() if t > behind}

    def _assign_shard(
        self,
        client: ClientState,
        t: int,
        train_x: torch.Tensor,
        train_y: torch.Tensor,
        parts: list[torch.Tensor],
    ) -> None:
        client.task = t
        idx = parts[client.index].to(self.device)
        shard = (train_x[idx], train_y[idx])
        keep_history = self.strategy.learner.needs_history
        history = self.shards.get(client.index, []) if keep_history else []
        self.shards[client.index] = [*history, shard]
        client.train_x, client.train_y = self.strategy.learner.training_data(
            self.shards[client.index]
        )

    # -- one round --------------------------------------------------------------------------------
    def _sample_participants(self) -> list[ClientState]:
        s = self.schedule
        if s.clients_per_round >= s.num_clients:
            return list(self.clients)
        chosen = torch.randperm(s.num_clients, generator=self.server_rng)[: s.clients_per_round]
        return [self.clients[k] for k in sorted(chosen.tolist())]

    def _round(self, out: RunOutcome) -> tuple[torch.Tensor, int, float]:
        """One round; returns the summed loss, the step count and the local-training seconds."""
        server = self.server
        server.participants = self._sample_participants()
        server.payloads = {}
        for component in self.strategy.all:
            component.on_round_start(server)
        for component in self.strategy.all:
            server.payloads.update(component.broadcast(server))
        average = RunningAverage(server.global_params, server.global_buffers)
        loss_sum = torch.zeros((), device=self.device)
        steps = 0
        train_seconds = 0.0
        for client in server.participants:
            self._download(client)
            self.model.load(server.global_params, server.global_buffers)
            for component in self.strategy.all:
                component.on_client_start(client, server)
            started = time.perf_counter()
            client_loss, client_steps = self._train_client(client)
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)  # once per client: honest timing
            train_seconds += time.perf_counter() - started
            loss_sum += client_loss
            steps += client_steps
            if server.is_task_end:
                self._record_client_accuracy(out, client)
            upload = Upload(client.index, self.model.params, self.model.buffers, client.num_samples)
            for component in self.strategy.all:
                component.after_local(client, upload, server)
            server.comm.up(server.model_bytes, "model")
            for name, tensor in upload.extras.items():
                server.comm.up(tensor_bytes(tensor), name)
            client.model_version = -1  # it now holds its own local model
            weight = client_weight(client.num_samples, self.schedule.weighting)
            average.add(self.model.params, self.model.buffers, weight)
        aggregated = average.result()
        if aggregated is not None:
            server.global_params, server.global_buffers = aggregated
            if self.strategy.aggregator is not None:
                self.strategy.aggregator.aggregate(server)
        server.version += 1
        for component in self.strategy.server_hooks:
            component.after_aggregate(server)
        return loss_sum, steps, train_seconds

    def _download(self, client: ClientState) -> None:
        server = self.server
        if client.model_version != server.version:
            server.comm.down(server.model_bytes, "model")
            client.model_version = server.version
        for name, tensor in server.payloads.items():
            server.comm.down(tensor_bytes(tensor), name)

    def _train_client(self, client: ClientState) -> tuple[torch.Tensor, int]:
        s = self.schedule
        model, learner = self.model, self.strategy.learner
        model.module.train()
        self.optimizer.reset()
        first_visit = client.task not in client.tasks_started
        client.tasks_started.add(client.task)
        n = client.num_samples
        loss_sum = torch.zeros((), device=self.device)
        steps = 0
        if n == 0 or client.train_x is None or client.train_y is None:
            return loss_sum, steps
        augments = self.stream.augments
        gen = client.generator

        def augment(x: torch.Tensor) -> torch.Tensor:
            return self.stream.augment(x, gen)

        replay_augment = augment if augments and s.replay_augment else None
        for epoch in range(s.epochs):
            order = torch.randperm(n, device=self.device, generator=client.generator)
            offer = s.buffer_offer == "every_step" or (first_visit and epoch == 0)
            for start in range(0, n, s.batch_size):
                batch = order[start : start + s.batch_size]
                raw = client.inputs(batch)
                step = StepContext(
                    model=model,
                    client=client,
                    server=self.server,
                    x=augment(raw) if augments else raw,
                    y=client.train_y[batch],
                    task=client.task,
                    epoch=epoch,
                    offer_to_buffer=offer,
                    buffer_batch_size=s.buffer_batch_size,
                    raw_x=raw if augments else None,
                    replay_augment=replay_augment,
                )
                model.zero_grad()
                loss = learner.loss(step)
                for term in self.loss_terms:
                    extra = term.loss_term(step)
                    if extra is not None:
                        loss = loss + extra
                loss.backward()
                for term in self.penalties:
                    value = term.penalty(step)
                    if value is not None:
                        loss = loss + value
                learner.refine_grad(step)
                for transform in self.transforms:
                    transform.transform_grad(step)
                self.optimizer.step()
                learner.observe(step)
                loss_sum += loss.detach()
                steps += 1
        return loss_sum, steps

    def _end_client_tasks(self, ending: list[tuple[int, int]]) -> None:
        """The learner's task-end work for clients that finish a task this round, done with
        the freshly aggregated global model (e.g. A-GEM fills its episodic memory)."""
        if not ending:
            return
        self.model.load(self.server.global_params, self.server.global_buffers)
        self.model.module.eval()
        for k, t in ending:
            self.strategy.learner.on_task_end(self.clients[k], t, self.model)
        self.model.module.train()

    # -- measurements -----------------------------------------------------------------------------
    def _probe(self, i: int) -> EvalSet:
        e = self.eval_sets[i]
        n = min(self.schedule.probe_size, e.y.shape[0])
        return EvalSet(e.x[:n], e.y[:n], e.classes)

    def _evaluate(
        self, out: RunOutcome, round_index: int, trained_task: int, upto: int, drift: bool
    ) -> float | None:
        """Global model on tasks 0..upto; returns the mean accuracy over seen tasks."""
        self.model.load(self.server.global_params, self.server.global_buffers)
        module = self.model.module
        decode = self.stream.as_model_input  # test data is stored compact: decode per chunk
        seen: list[torch.Tensor] = []
        for i in range(upto + 1):
            e = self.eval_sets[i]
            logits = predict_logits(module, e.x, decode=decode)
            acc = accuracy(logits, e.y)
            out.records.append((round_index, trained_task, i, "global", "acc", acc))
            if self.task_il:
                acc_til = accuracy(logits, e.y, e.classes)
                out.records.append((round_index, trained_task, i, "global", "acc_task_il", acc_til))
            if i <= trained_task:
                seen.append(acc)
        if drift:
            for i in range(trained_task + 1):
                current = log_probs(predict_logits(module, self._probe(i).x, decode=decode))
                if i == trained_task:
                    self.reference_log_probs[i] = current
                else:
                    kl = mean_kl(self.reference_log_probs[i], current)
                    out.records.append((round_index, trained_task, i, "global", "kl_drift", kl))
        if not seen:
            return None
        return float(torch.stack(seen).mean().item())

    def _record_client_accuracy(self, out: RunOutcome, client: ClientState) -> None:
        """Local model (before aggregation) on probes of the seen tasks: client spread."""
        accs = []
        for i in range(self.server.task + 1):
            probe = self._probe(i)
            logits = predict_logits(self.model.module, probe.x, decode=self.stream.as_model_input)
            accs.append(accuracy(logits, probe.y))
        scope = f"client_{client.index}"
        value = torch.stack(accs).mean()
        out.records.append(
            (self.server.round_index, self.server.task, -1, scope, "client_acc", value)
        )

    def _record_buffer_drift(self, out: RunOutcome, round_index: int, t: int) -> None:
        """Per client: mean KL(softmax(stored logits) ‖ softmax(global model)) on its buffer."""
        if self.clients[0].buffer is None:
            return
        self.model.load(self.server.global_params, self.server.global_buffers)
        for client in self.clients:
            draw = client.buffer.all() if client.buffer is not None else None
            if draw is None:
                continue
            current = log_probs(predict_logits(self.model.module, draw.x))
            stored = F.log_softmax(draw.logits, dim=1)
            out.records.append(
                (
                    round_index,
                    t,
                    -1,
                    f"client_{client.index}",
                    "buffer_drift",
                    mean_kl(stored, current),
                )
            )


def client_state_dict(client: ClientState) -> dict[str, Any]:
    """One client's persistent state (its data excepted: see ``Federation._restore_shards``)."""
    return {
        "generator": client.generator,
        "task": client.task,
        "tasks_started": client.tasks_started,
        "model_version": client.model_version,
        "extras": client.extras,
        "buffer": None if client.buffer is None else client.buffer.state_dict(),
    }


def load_client_state(client: ClientState, state: dict[str, Any]) -> None:
    client.generator.set_state(state["generator"].get_state())
    client.task = int(state["task"])
    client.tasks_started = set(state["tasks_started"])
    client.model_version = int(state["model_version"])
    client.extras = dict(state["extras"])
    if client.buffer is not None:
        client.buffer.load_state_dict(state["buffer"])
