"""The continual-federated round conductor (docs/architecture.md, "One round").

    for round g: ClientData      clients entering a task get its data (task start hooks)
                 RoundServer     sample participants, broadcast θ_g + declared payloads
                 Executor        client updates → uploads, streamed to the server
                 RoundServer     weighted average → aggregator → server hooks (+ requests)
                 Measurement     buffer drift; evaluation when every client finished a task
                 Executor        the learner's task-end work for clients that finished one

Which client trains which task in which round, and when task t counts as finished, is the
``TaskClock``: synchronous by default, per-client delayed boundaries under ``--async-shift``.

Speed: one reusable module whose parameters are views of a flat vector (``FlatModel``);
loading a client is one copy, aggregation is a running weighted sum of flat vectors, the
local step touches the host only through Python ints it already knows. The one host sync per
round is the divergence check on the summed training loss.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from cfl_bench.core.buffer import ReservoirBuffer, StoredInputs
from cfl_bench.core.context import ClientState, ServerState
from cfl_bench.core.evaluation import EvalSet
from cfl_bench.core.flat import FlatModel
from cfl_bench.core.seeding import generator
from cfl_bench.engine.arrivals import ArrivalPlan, Arrivals
from cfl_bench.engine.buffer_stack import ReservoirStack
from cfl_bench.engine.client_data import ClientData
from cfl_bench.engine.client_update import ClientJob, ClientResult, LocalTrainer, StepSchedule
from cfl_bench.engine.executor import SEQUENTIAL, Executor, ExecutorBuild, ResultSink
from cfl_bench.engine.federation_state import federation_state, load_federation_state
from cfl_bench.engine.kept_clients import KeptLoader, RoundWork, kept_update, replay
from cfl_bench.engine.measurement import Measurement, Record
from cfl_bench.engine.optim import local_optimizer
from cfl_bench.engine.progress import ClientsReport, RoundReport
from cfl_bench.engine.round_server import RoundServer
from cfl_bench.engine.splits import TaskSplit
from cfl_bench.engine.task_clock import TaskClock
from cfl_bench.engine.task_order import TaskOrder
from cfl_bench.strategies.compose import Strategy
from cfl_bench.streams.base import Stream
from cfl_bench.streams.partition import Partitioner

__all__ = ["EvalSet", "Federation", "Record", "RunOutcome", "Schedule"]


@dataclass(frozen=True)
class Schedule:
    """The numbers that shape the loop (after strategy schedule adjustments)."""

    num_tasks: int
    rounds_per_task: int
    num_clients: int
    participation: float
    buffer_size: int
    weighting: str
    lr: float
    momentum: float
    weight_decay: float
    probe_size: int
    eval_every_round: bool
    # How a client walks its data in a round: epochs, batch sizes, buffer offers, replay
    # augmentation, lr decay, the run's seed and ``--amp`` (``client_update.StepSchedule``).
    steps: StepSchedule
    async_shift: int = 0
    lead_rounds: int = 0
    # Clients that join over time (``--arrivals``, engine.arrivals); None: all from the start.
    arrivals: Arrivals | None = None
    # Each client's own order of the tasks (``--task-order per-client``, engine.task_order);
    # None: every client in the stream's order.
    task_order: TaskOrder | None = None
    optimizer: str = "sgd"
    diagnostics: bool = False
    # Which executor runs the client side, and its options (results are the same up to
    # float rounding): its name in ``cfl_bench.runner.executors``, which builds it and injects it
    # into the ``Federation`` (the engine itself never reads the name); the vectorized one
    # takes ``clients_per_chunk`` clients at a time (None: all of a round's participants).
    executor: str = "sequential"
    clients_per_chunk: int | None = None
    compile_step: bool = False  # torch.compile the vectorized executor's client step

    @classmethod
    def of(cls, **settings: Any) -> Schedule:
        """A schedule from flat settings, ``StepSchedule``'s fields among them (how tests
        and small tools write one down)."""
        local = {f.name for f in dataclasses.fields(StepSchedule)}
        steps = StepSchedule(**{k: v for k, v in settings.items() if k in local})
        return cls(steps=steps, **{k: v for k, v in settings.items() if k not in local})

    @property
    def seed(self) -> int:
        """The run's seed (clients' generators, the task clock's offsets)."""
        return self.steps.seed

    @property
    def clients_per_round(self) -> int:
        return max(1, round(self.participation * self.num_clients))

    def clock(self) -> TaskClock:
        """Who trains which task when (seeded per-client offsets under an async shift)."""
        return TaskClock.draw(
            self.num_tasks,
            self.rounds_per_task,
            self.num_clients,
            self.async_shift,
            self.seed,
            lead=self.lead_rounds,
        )

    def arrival_plan(self) -> ArrivalPlan | None:
        """Who is there and who receives data at every task, under ``--arrivals``."""
        if self.arrivals is None:
            return None
        return self.arrivals.plan(self.num_tasks, self.seed)

    def task_orders(self) -> tuple[tuple[int, ...], ...] | None:
        """Under ``--task-order per-client``, the stream task client k trains at step t."""
        if self.task_order is None:
            return None
        return self.task_order.orders(self.num_clients, self.num_tasks, self.seed)


@dataclass
class RunOutcome:
    records: list[Record] = field(default_factory=list)
    costs: list[Record] = field(default_factory=list)
    status: str = "running"
    message: str = ""
    buffer_bytes_per_client: int = 0
    num_params: int = 0
    comm_by_payload: dict[str, int] = field(default_factory=dict)


class FederationUnits:
    """The units of one run and the calls into them that a round makes: the clients and the
    server state, ``ClientData``, ``RoundServer``, the ``Executor`` and ``Measurement``, with the
    task hooks and the replay of kept client updates. :class:`Federation` conducts the rounds;
    the units stay apart so that the conductor reads as the round's order alone."""

    def __init__(
        self,
        stream: Stream,
        partitioner: Partitioner,
        strategy: Strategy,
        model: torch.nn.Module,
        schedule: Schedule,
        device: torch.device,
        splits: dict[int, TaskSplit] | None = None,
        executor: ExecutorBuild = SEQUENTIAL,
    ) -> None:
        self.stream = stream
        self.strategy = strategy
        self.schedule = schedule
        self.device = device
        self.model = FlatModel(model.to(device))
        s = schedule
        self.clients = new_clients(
            stream, s, strategy.needs_buffer, device, stacked=executor.stacked_buffers
        )
        self.server = new_server(self.model, self.clients, device, s.rounds_per_task)
        self.clock = s.clock()
        self.arrivals = s.arrival_plan()
        self.orders = s.task_orders()
        self.data = ClientData(
            stream,
            partitioner,
            strategy,
            self.clock,
            s.seed,
            device,
            splits,
            self.arrivals,
            self.orders,
        )
        self.round_server = RoundServer(
            self.server, strategy, s.clients_per_round, s.weighting, s.seed, self.arrivals
        )
        self.measure = new_measurement(self.model, s, stream, strategy, self.orders)
        trainer = build_trainer(self.model, strategy, s, stream)
        self.executor: Executor = executor.make(trainer)
        # Told after each client update of a round (``ClientsReport``), so a long round
        # (ResNet-18 on a CPU) shows progress inside it. Never changes results.
        self.on_client: Callable[[ClientsReport], None] | None = None
        # (clients done, participants) of the round in progress; None between rounds. An
        # interrupt's message says it (``round_keeper.interruption``).
        self.round_progress: tuple[int, int] | None = None
        # Where finished client updates of a round are kept (the runner's round keeper), so
        # an interrupted round resumes without training them again; None: nowhere.
        self.round_work: RoundWork | None = None
        self.keeps_clients = executor.keeps_clients

    @property
    def global_state(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.server.global_params, self.server.global_buffers

    def _prepare_eval_sets(self) -> None:
        """Every task's test split, in the stream's stored form (decoded per chunk)."""
        for i in range(self.schedule.num_tasks):
            task = self.stream.task_test(i)
            self.measure.add_eval_set(EvalSet(task.test_x, task.test_y, tuple(task.classes)))
        test = self.stream.test_domain()
        if test is not None:
            self.measure.test_domain = EvalSet(test.test_x, test.test_y, tuple(test.classes))

    def enter_round(self, g: int) -> None:
        """Clients whose task changes in round ``g`` get their shard of the new task."""
        self.data.advance(g, self.clients, self._start_task, self._holdout_labels)

    def end_tasks(self, g: int) -> None:
        """The learner's task-end work for the clients that finish a task in round ``g``,
        at the freshly aggregated θ_g (A-GEM fills its episodic memory)."""
        if self.arrivals is None:
            ending = [
                (self.clients[k], t if self.orders is None else self.orders[k][t])
                for k, t in self.clock.ending_tasks(g)
            ]
        elif g == self.clock.eval_round(t := self.clock.global_task(g)):
            last = t == self.schedule.num_tasks - 1
            ks = self.arrivals.ending_clients(t, last)
            ending = [(self.clients[k], self.clients[k].task) for k in ks]
        else:
            ending = []
        self.executor.end_tasks(ending, self.global_state)

    def _start_task(self, t: int, holdout: torch.Tensor | None) -> None:
        for component in self.strategy.all:
            component.on_task_start(self.server, t, holdout)

    def _holdout_labels(self, t: int, x: torch.Tensor, y: torch.Tensor) -> None:
        for component in self.strategy.all:
            component.on_holdout_labels(self.server, t, x, y)

    def _kept_updates(self, work: RoundWork, jobs: list[ClientJob]) -> dict[int, KeptLoader]:
        """The round's client updates an earlier process kept, by client index."""
        kept = work.opened(self.server.round_index)
        indices = (job.client.index for job in jobs)
        return {k: kept[k] for k in indices if k in kept}

    def _train(self, jobs: list[ClientJob], kept: dict[int, KeptLoader], sink: ResultSink) -> None:
        """The executor trains the jobs; a kept client's update is replayed in its place
        instead, in the same job order, so the server receives the same sequence."""
        waiting: list[ClientJob] = []
        for job in jobs:
            update = kept.get(job.client.index)
            if update is None:
                waiting.append(job)
                continue
            if waiting:
                self.executor.train(waiting, sink)
                waiting = []
            sink(replay(self.model, job.client, update()))
        if waiting:
            self.executor.train(waiting, sink)


class Federation(FederationUnits):
    """One run: a stream, a partitioner, a validated strategy and a model, on one device.

    The conductor of docs/architecture.md, "One round": it owns the units
    (:class:`FederationUnits`) and calls them in the round's order; the work is in
    ``ClientData``, ``RoundServer``, the ``Executor`` and ``Measurement``.
    """

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
            self.measure.evaluate(out.records, self.global_state, 0, -1, s.num_tasks - 1, False)
            out.records += task_order_records(self.orders)
        else:
            self.data.restore(server.round_index, self.clients)
        for g in range(server.round_index, clock.total_rounds):
            if not self._play_round(g, out):
                return self._finish(out)
            self.round_progress = None
            if on_round_end is not None:
                on_round_end(out)
            if on_round is not None:
                on_round(self.round_report())
        out.status = "finished"
        return self._finish(out)

    def round_report(self) -> RoundReport:
        """What the progress display shows after a round (host-side values only)."""
        server, clients = self.server, self.clients
        return RoundReport(
            server.round_index,
            self.clock.total_rounds,
            server.task,
            self.schedule.num_tasks,
            self.measure.latest_acc,
            client_examples=tuple(c.num_samples for c in clients),
            buffer_fill=tuple(0 if c.buffer is None else c.buffer.filled for c in clients),
            latest_scores=tuple(self.measure.latest_scores.items()),
        )

    def _play_round(self, g: int, out: RunOutcome) -> bool:
        """Round ``g`` (0-based) in the order of docs/architecture.md, "One round", its records
        and costs added to ``out``; False when the training loss diverged (``out`` then says so)."""
        s, clock, server = self.schedule, self.clock, self.server
        started = time.perf_counter()
        t = clock.global_task(g)
        server.task, server.round_in_task = t, g - clock.task_start(t)
        server.rounds_per_task = clock.task_rounds(t)
        self.enter_round(g)
        server.round_index += 1
        loss_sum, steps, train_seconds = self._round(out)
        mean_loss = (loss_sum / max(steps, 1)).item()
        ri = server.round_index
        if self.arrivals is not None:  # who trained, on how many examples (docs/protocols.md)
            out.records += [
                (ri, t, -1, f"client_{c.index}", "train_examples", c.num_samples)
                for c in server.participants
            ]
        up, down = self.round_server.comm.end_round()
        out.records += [
            (ri, t, -1, "global", "bytes_up", up),
            (ri, t, -1, "global", "bytes_down", down),
            (ri, t, -1, "global", "train_loss", mean_loss),
        ]
        if not math.isfinite(mean_loss):
            out.status = "diverged"
            out.message = f"training loss became {mean_loss} in round {ri} (task {t + 1})"
            out.costs.append((ri, t, -1, "global", "round_time_s", time.perf_counter() - started))
            return False
        self.measure.buffer_drift(out.records, self.clients, self.global_state, ri, t)
        if server.is_task_end or s.eval_every_round:
            # Per-client orders: every task, since some client may have trained any of them
            # (and memory drift, which needs task t's end at step t, is not measured).
            upto = min(t + 1, s.num_tasks - 1) if self.orders is None else s.num_tasks - 1
            drift = server.is_task_end and self.orders is None
            self.measure.evaluate(out.records, self.global_state, ri, t, upto, drift)
            if self.strategy.scored_by_clients:  # what the method is scored by
                own = self.strategy.own_model
                self.measure.evaluate_own(out.records, self.clients, own, self.global_state, ri, t)
        self.end_tasks(g)
        out.costs += [
            (ri, t, -1, "global", "round_time_s", time.perf_counter() - started),
            (ri, t, -1, "global", "train_time_s", train_seconds),
        ]
        return True

    def _finish(self, out: RunOutcome) -> RunOutcome:
        out.comm_by_payload = dict(self.round_server.comm.by_payload)
        return out

    def _round(self, out: RunOutcome) -> tuple[torch.Tensor, int, float]:
        """One round; returns the summed loss, the step count and the local-training seconds."""
        server = self.server
        broadcast = self.round_server.open_round()
        # The client spread scores the tasks seen so far, which per-client orders make
        # differ between clients: not measured then (docs/protocols.md).
        spread = server.is_task_end and self.orders is None
        probes = self.measure.probes(server.task) if spread else None
        # (The cost estimate's warm-up round runs before the evaluation sets exist.)
        measured = self.schedule.diagnostics and bool(self.measure.eval_sets)
        diagnose = self.measure.probe(server.task) if measured else None
        jobs = self.round_server.jobs(broadcast, probes, diagnose)
        work = self.round_work if self.keeps_clients else None
        kept = {} if work is None else self._kept_updates(work, jobs)
        loss_sum = torch.zeros((), device=self.device)
        totals = {"steps": 0, "seconds": 0.0, "clients": 0}
        self.round_progress = (0, len(jobs))

        def receive(result: ClientResult) -> None:
            nonlocal loss_sum
            if work is not None and result.client.index not in kept:
                # Offered before the server folds it in: the client's state is then exactly
                # what its update left (``engine.kept_clients``).
                work.finished(result.client.index, lambda: kept_update(self.model, result))
            loss_sum += result.loss_sum
            totals["steps"] += result.steps
            totals["seconds"] += result.train_seconds
            if result.probe_accuracy is not None:
                index = result.client.index
                Measurement.client_spread(
                    out.records, server.round_index, server.task, index, result.probe_accuracy
                )
            if result.class_accuracy is not None:
                Measurement.client_diagnostics(out.records, server.round_index, server.task, result)
            self.round_server.receive(result)
            totals["clients"] += 1
            self.round_progress = (int(totals["clients"]), len(jobs))
            if self.on_client is not None:
                self.on_client(
                    ClientsReport(
                        server.round_index,
                        self.clock.total_rounds,
                        int(totals["clients"]),
                        len(jobs),
                    )
                )

        self._train(jobs, kept, receive)
        self.round_server.close_round(self.executor)
        return loss_sum, int(totals["steps"]), float(totals["seconds"])

    # -- state (checkpoints) ----------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Everything the next round needs, at a round end (``engine.federation_state``)."""
        return federation_state(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Put the federation back where :meth:`state_dict` found it; :meth:`run` then goes
        on with the next round."""
        load_federation_state(self, state)


def new_server(
    model: FlatModel, clients: list[ClientState], device: torch.device, rounds_per_task: int
) -> ServerState:
    """The server's state at the start: θ_g and the global buffers are copies of the working
    model's (the model then trains each client's update in place)."""
    return ServerState(
        model=model,
        global_params=model.params.detach().clone(),
        global_buffers=model.buffers.detach().clone(),
        clients=clients,
        device=device,
        rounds_per_task=rounds_per_task,
    )


def new_measurement(
    model: FlatModel,
    schedule: Schedule,
    stream: Stream,
    strategy: Strategy,
    orders: tuple[tuple[int, ...], ...] | None,
) -> Measurement:
    """The run's measurement unit: the stream's objective and input decoding, the
    strategy's evaluation classifier, and the per-client task orders it scores under."""
    measure = Measurement(
        model,
        schedule.probe_size,
        stream.objective,
        stream.as_model_input,
        schedule.diagnostics,
        strategy.evaluation_classifier(),
    )
    measure.orders = orders
    return measure


def task_order_records(orders: tuple[tuple[int, ...], ...] | None) -> list[Record]:
    """Round-0 rows saying which stream task (``eval_task``) client k trains at step t
    (``trained_task``), so the per-client metrics are a function of records.csv alone
    (``cfl_bench.core.metrics``); none under the shared order."""
    if orders is None:
        return []
    return [
        (0, t, task, f"client_{k}", "task_order", task)
        for k, order in enumerate(orders)
        for t, task in enumerate(order)
    ]


def build_trainer(
    model: FlatModel, strategy: Strategy, schedule: Schedule, stream: Stream
) -> LocalTrainer:
    """The client updates' trainer for ``model``: the run's local optimiser over its flat
    parameters, the strategy's client hooks, the step schedule and the stream's
    augmentation, objective and decoder. One function for the federation and for a Flower
    ClientApp (``flower.client_app``), so both train with the same pieces."""
    s = schedule
    optimizer = local_optimizer(
        s.optimizer, model.params, model.grads, s.lr, s.momentum, s.weight_decay
    )
    augment = stream.augment if stream.augments else None
    return LocalTrainer(
        model, optimizer, strategy, s.steps, augment, stream.objective, stream.as_model_input
    )


def buffer_inputs(stream: Stream, stacked: bool, device: torch.device) -> StoredInputs | None:
    """The compact form replay buffers keep inputs in, when the stream has an exact one
    (``Stream.model_input_to_stored``: CARLA's uint8 frames); float32 otherwise, and always
    for ``stacked`` buffers (the vectorized executor's), which are read without decoding."""
    probe = torch.zeros((1, *stream.input_shape), device=device)
    stored = stream.model_input_to_stored(probe)
    if stored is None or stacked:
        return None

    def encode(x: torch.Tensor) -> torch.Tensor:
        compact = stream.model_input_to_stored(x)
        assert compact is not None  # the stream said it has an exact stored form
        return compact

    return StoredInputs(stored.dtype, encode, stream.as_model_input)


def new_clients(
    stream: Stream,
    schedule: Schedule,
    needs_buffer: bool,
    device: torch.device,
    stacked: bool = False,
) -> list[ClientState]:
    """The run's clients in their initial state: seeded generators, empty buffers (when
    the strategy uses one; with ``stacked`` — the executor's ``ExecutorBuild`` says so —
    rows of one ``ReservoirStack``) and the stream's input decoder."""
    s = schedule

    compact = buffer_inputs(stream, stacked, device)

    def buffer(k: int) -> ReservoirBuffer:
        return ReservoirBuffer(
            s.buffer_size,
            stream.input_shape,
            stream.output_shape,
            device=device,
            generator=generator(s.seed, "buffer", k, device=device),
            target_shape=stream.target_shape,
            target_dtype=stream.target_dtype,
            stored_inputs=compact,
        )

    clients = [
        ClientState(
            index=k,
            generator=generator(s.seed, "client", k, device=device),
            buffer=buffer(k) if needs_buffer else None,
            decode=stream.as_model_input,
        )
        for k in range(s.num_clients)
    ]
    if needs_buffer and stacked:  # batched draws and inserts over clients
        ReservoirStack([c.buffer for c in clients if c.buffer is not None])
    return clients
