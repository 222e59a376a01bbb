"""Honest cost up front: a run's size and, on CPU, an estimate of its duration.

Why: the design card's own command (ResNet-18 on seq-cifar100) ran half an hour on a 2-core
CPU without a word. Before training, a run now says how big it is — rounds × participating
clients × local steps, parameters — and, on CPU, about how long it will take, with the
faster choices that apply when that is more than ~10 minutes. The protocols stay the
defaults; nothing is changed for the user.

The estimate is a sum of counts × unit times:

* **counts** (:func:`workload`, pure): local steps from the planned splits (⌈shard / batch⌉ ×
  epochs per participating client and round, older shards included for the joint learner,
  the expectation under partial participation); evaluation-mode forwards (every test set
  at the start, the seen and next tasks' test sets at each task end or every round with
  ``--eval-every-round``, memory-drift probes, each participant's probes at task ends,
  every client's buffer every round, public-set logits per participant); forward + backward
  samples outside local steps, as each component declares them (``Component.extra_work``:
  client requests over buffers such as FedGP's reference gradient, passes over a
  participant's examples such as FedCurv's Fisher, server distillation over a public set,
  forwards over every client's examples at its task ends such as iCaRL's herding); server
  work in units of a callable the probe times (GLFC's inversions, FOT's task-end SVDs as a
  scaled-down copy sized by the run's model);
  task materialisations (each task twice) and client visits (load, aggregate). The
  estimate never names a component: a method that does extra work declares it.
* **unit times** (:func:`measure`): one local step as the engine runs it — the strategy's
  loss and loss terms, backward, penalties, A-GEM, FedProj and FedGP projections, SGD —
  through the executor's ``LocalTrainer`` on a scratch one-client federation after one
  warm-up round (so replay buffers are non-empty and FedGP's g_ref, FedCurv's sums and
  FedProj's ensemble exist), plus a forward and a forward + backward of real task-0
  batches. The probe takes at most ``PROBE_SHARE`` of the rough estimate (a few seconds
  for ResNet-18; the fixed part — one warm-up round and one timed step — may exceed it
  when a single step is slow); runs whose rough estimate is under ``TINY_SECONDS`` skip
  the step timing and say nothing.

Simplifications (each small against the 2× the estimate promises; measured, it errs 10–30 %
high on CIFAR, see README): every task is as large as task 0 (test sizes); a partial last
batch counts as a full step; step cost is that of the steady state of task 0 (the first
steps of a run, with empty buffers and no g_ref yet, are cheaper; A-GEM's ``task_end``
memory and later tasks' buffers are as full as after one round); buffers fill at one shard
per task seen; overheads outside local steps are per-sample times at one batch size;
checkpoints add their policy's 5 %.

The probe never changes a result: it runs under ``torch.random.fork_rng`` on deep copies of
the model and the strategy, with its own generators; the stream is only read
(tests/test_cost.py and the golden records check this bit for bit).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch.nn import functional as F

from cfl_bench.engine.arrivals import ArrivalPlan
from cfl_bench.engine.client_update import ClientJob
from cfl_bench.engine.executor import SequentialExecutor
from cfl_bench.engine.loop import Federation, RunOutcome, Schedule
from cfl_bench.engine.splits import TaskSplit
from cfl_bench.engine.task_clock import TaskClock
from cfl_bench.strategies.base import ExtraWork
from cfl_bench.strategies.compose import Strategy
from cfl_bench.streams.base import Stream, TaskTest, TaskTrain
from cfl_bench.streams.partition import Partitioner

if TYPE_CHECKING:
    from cfl_bench.runner.plan import RunPlan

# An estimate above this many seconds on CPU says so and names the faster choices.
LONG_RUN_SECONDS = 600.0
# The probe may spend this share of the run it estimates, within these bounds (seconds).
PROBE_SHARE = 0.02
PROBE_MIN_SECONDS = 0.25
PROBE_MAX_SECONDS = 6.0
# Runs whose rough estimate (plain forward + backward steps) is below this are not timed.
TINY_SECONDS = 1.0
# Runs estimated below this get their duration on the size line, not a line of its own.
QUIET_SECONDS = 30.0
# The automatic checkpoint policy bounds its cost at ~1/20 of the run (round_keeper).
CHECKPOINT_SHARE = 0.05
FORWARD_SAMPLES = 128  # forward timing batch (per-sample time is flat beyond this on CPU)
# What the forward-only and the forward + backward samples outside local steps are for.
FORWARD_PARTS = (
    "evaluation",
    "client spread",
    "buffer drift",
    "public logits",
    "task-end activations",
    "exemplar passes",
)
BACKWARD_PARTS = ("client requests", "client extra passes", "distillation", "generated rows")
# Units of server work a component times itself (``ExtraWork.server_unit``), by purpose.
SERVER_PARTS = ("gradient inversion", "task-end server work")


@dataclass(frozen=True)
class RunSize:
    """What a run trains: the numbers the size line shows."""

    rounds: int
    clients_per_round: int
    steps_min: int  # local steps of one participating client in one round
    steps_max: int
    epochs: int
    batch_size: int
    total_steps: int
    params: int

    def line(self, model: str) -> str:
        steps = (
            str(self.steps_min)
            if self.steps_min == self.steps_max
            else f"{self.steps_min}–{self.steps_max}"
        )
        epochs = f"{self.epochs} epoch{'s' if self.epochs != 1 else ''}"
        return (
            f"run size: {self.rounds} rounds × {self.clients_per_round} clients × {steps} "
            f"local steps (⌈shard / {self.batch_size}⌉ × {epochs}) = "
            f"{self.total_steps:,} local steps; {model}: {self.params:,} parameters"
        )


@dataclass(frozen=True)
class StrategyWork:
    """The per-round extra work the strategy's components declare, with the public
    examples the tasks' holdouts have added to any public set by the end of each task."""

    extras: tuple[ExtraWork, ...] = ()
    holdouts: tuple[int, ...] = ()  # cumulative held-out examples after task t

    def public_after(self, work: ExtraWork, task: int) -> int:
        """The public set of ``work`` while task ``task`` trains (fixed part + holdouts)."""
        return int(work.public_examples or 0) + self.holdouts[task]


@dataclass(frozen=True)
class Workload:
    """Counts the duration model multiplies by measured unit times (see module doc)."""

    steps: float
    forward_samples: float  # evaluation-mode forwards
    backward_samples: float  # forward + backward outside local steps
    materialisations: int
    visits: float  # client visits: load the global model, aggregate the upload
    parts: dict[str, float]  # forward/backward samples by purpose, for the breakdown
    # Calls of each declared extra work's ``server_unit`` (in ``StrategyWork.extras`` order).
    server_units: tuple[float, ...] = ()


@dataclass(frozen=True)
class UnitTimes:
    """Measured seconds: a local step, a forward and a forward + backward per sample, one
    task materialisation, one client visit; and what measuring them cost."""

    step: float
    forward: float
    backward: float
    task: float
    visit: float
    probe_seconds: float
    steps_timed: int  # 0: the steady-state step was not timed (step is a plain batch)
    test_size: int  # task 0's test examples (every task is assumed as large)
    # Seconds of one ``server_unit`` call of each declared extra work (0: none declared).
    server: tuple[float, ...] = ()


@dataclass(frozen=True)
class Estimate:
    seconds: float
    parts: dict[str, float]  # seconds by kind: local steps, evaluation, …


def shard_sizes(splits: dict[int, TaskSplit], num_tasks: int) -> list[list[int]]:
    """Samples each client holds of each task (task × client)."""
    return [[int(p.numel()) for p in splits[t].parts] for t in range(num_tasks)]


def step_shards(
    shards: list[list[int]], orders: tuple[tuple[int, ...], ...] | None
) -> list[list[int]]:
    """Samples each client holds at each step (step × client): the task's shard sizes
    under the shared order; under ``--task-order per-client`` client k's part of the task
    it trains at that step, so the estimate's per-step sums follow each client's own
    order (the joint learner's history included)."""
    if orders is None:
        return shards
    return [[shards[order[t]][k] for k, order in enumerate(orders)] for t in range(len(shards))]


def run_size(
    schedule: Schedule,
    clock: TaskClock,
    shards: list[list[int]],
    needs_history: bool,
    params: int,
    exemplars: int = 0,
) -> RunSize:
    """The run's rounds, participants and local steps from the planned splits (pure);
    ``exemplars``: the learner's ``exemplar_memory``."""
    plan = schedule.arrival_plan()
    entries = [round_clients(schedule, clock, plan, g) for g in range(clock.total_rounds)]
    per_client = [
        [client_steps(schedule, shards, k, t, needs_history, exemplars) for k, t, _ in row]
        for row in entries
    ]
    if plan is None:
        fraction = participation_fraction(schedule)
        total = sum(fraction * sum(row) for row in per_client)
        per_round = min(schedule.clients_per_round, schedule.num_clients)
    else:  # each client there trains with its own round's chance
        total = sum(
            f * n
            for row, steps in zip(entries, per_client, strict=True)
            for (_, _, f), n in zip(row, steps, strict=True)
        )
        per_round = min(plan.per_round, max(plan.joined))
    flat = [s for row in per_client for s in row] or [0]
    return RunSize(
        rounds=clock.total_rounds,
        clients_per_round=per_round,
        steps_min=min(flat),
        steps_max=max(flat),
        epochs=schedule.steps.epochs,
        batch_size=schedule.steps.batch_size,
        total_steps=round(total),
        params=params,
    )


def round_clients(
    schedule: Schedule, clock: TaskClock, plan: ArrivalPlan | None, g: int
) -> list[tuple[int, int, float]]:
    """(client, task whose data it trains on, chance it trains) for round ``g``: every
    client at the participation fraction, or under ``--arrivals`` the clients there, each
    on its held task, with chance min(per_round, there) / there."""
    if plan is None:
        f = participation_fraction(schedule)
        return [(k, clock.client_task(k, g), f) for k in range(schedule.num_clients)]
    t = clock.global_task(g)
    there = plan.joined[t]
    chance = min(plan.per_round, there) / there
    held = [plan.held_task(k, t) for k in range(there)]
    return [(k, h, chance) for k, h in enumerate(held) if h is not None]


def participation_fraction(schedule: Schedule) -> float:
    """The chance that a client trains in a round (1 under full participation)."""
    return min(1.0, schedule.clients_per_round / max(1, schedule.num_clients))


def client_samples(
    shards: list[list[int]], k: int, t: int, needs_history: bool, exemplars: int = 0
) -> int:
    """Samples client ``k`` trains on in task ``t``: all its shards so far for the joint
    learner; its shard plus up to ``exemplars`` kept examples of its earlier shards
    (iCaRL, GLFC) otherwise."""
    earlier = sum(shards[s][k] for s in range(t))
    if needs_history:
        return earlier + shards[t][k]
    return shards[t][k] + min(exemplars, earlier)


def client_steps(
    schedule: Schedule,
    shards: list[list[int]],
    k: int,
    t: int,
    needs_history: bool,
    exemplars: int = 0,
) -> int:
    n = client_samples(shards, k, t, needs_history, exemplars)
    return math.ceil(n / schedule.steps.batch_size) * schedule.steps.epochs


def workload(
    schedule: Schedule,
    clock: TaskClock,
    shards: list[list[int]],
    test_sizes: Sequence[int],
    *,
    needs_buffer: bool,
    needs_history: bool,
    work: StrategyWork,
    exemplars: int = 0,
) -> Workload:
    """Every count the estimate needs, from the schedule and the planned splits (pure)."""
    s, T, K = schedule, schedule.num_tasks, schedule.num_clients
    plan = s.arrival_plan()
    cpr = min(s.clients_per_round, K) if plan is None else min(plan.per_round, max(plan.joined))
    probes = [min(s.probe_size, n) for n in test_sizes]
    parts = dict.fromkeys((*FORWARD_PARTS, *BACKWARD_PARTS, *SERVER_PARTS), 0.0)
    server_units = [0.0] * len(work.extras)
    steps = visits = 0.0
    parts["evaluation"] += sum(test_sizes)  # round 0: every task
    seen = [0] * K  # examples offered to each client's buffer so far
    last_task = [-1] * K
    eval_rounds = {clock.eval_round(t): t for t in range(T)}
    for g in range(clock.total_rounds):
        entries = round_clients(s, clock, plan, g)
        tasks = [t for _, t, _ in entries]
        for k, t, f in entries:
            n = client_samples(shards, k, t, needs_history, exemplars)
            steps += f * math.ceil(n / s.steps.batch_size) * s.steps.epochs
            visits += f
            if t != last_task[k]:
                seen[k] += shards[t][k]
                last_task[k] = t
            at = ClientVisit(g, k, t, f, n, task_end=g in eval_rounds)
            count_client_extras(parts, server_units, work, s, clock, at)
        if g in eval_rounds and eval_rounds[g] < T - 1:
            count_task_end_server(parts, server_units, work)
        filled = [min(s.buffer_size, x) for x in seen]
        count_shared_extras(parts, work, s, cpr, filled, tasks, g)
        if needs_buffer:
            parts["buffer drift"] += sum(filled)
        count_evaluation(parts, s, clock.global_task(g), test_sizes, probes, cpr, g in eval_rounds)
    forward = sum(parts[k] for k in FORWARD_PARTS)
    backward = sum(parts[k] for k in BACKWARD_PARTS)
    return Workload(steps, forward, backward, 2 * T, visits, parts, tuple(server_units))


@dataclass(frozen=True)
class ClientVisit:
    """One participating client in one planned round, as the counts need it."""

    round_index: int
    client: int
    task: int
    share: float  # expected participation (1 unless participation is partial)
    samples: int  # local training samples (older shards included for the joint learner)
    task_end: bool  # the round ends a task (its evaluation round)


def count_client_extras(
    parts: dict[str, float],
    server_units: list[float],
    work: StrategyWork,
    s: Schedule,
    clock: TaskClock,
    at: ClientVisit,
) -> None:
    """Add one client visit's declared extra work to ``parts`` and ``server_units``, in
    place: why separate, each component's extras are counted per participating client."""
    f, n = at.share, at.samples
    for i, extra in enumerate(work.extras):
        if extra.shard_samples and n:
            batches = math.ceil(min(extra.shard_samples, n) / s.steps.batch_size)
            parts["client extra passes"] += f * min(n, batches * s.steps.batch_size)
        if extra.task_end_forward and at.task_end:
            parts["task-end activations"] += f * n
        if extra.step_rows_after_first_task and at.task > 0 and n:
            steps = math.ceil(n / s.steps.batch_size) * s.steps.epochs
            parts["generated rows"] += f * steps * extra.step_rows_after_first_task
        if extra.task_end_client_passes and at.task_end:  # every client there, trained or not
            parts["exemplar passes"] += extra.task_end_client_passes * n
        starts = extra.task_start_samples or extra.task_start_server_units
        if starts and n and at.round_index == clock.client_task_start(at.client, at.task):
            parts["client extra passes"] += f * extra.task_start_samples
            parts["gradient inversion"] += f * extra.task_start_server_units
            server_units[i] += f * extra.task_start_server_units


def count_task_end_server(
    parts: dict[str, float], server_units: list[float], work: StrategyWork
) -> None:
    """Add one task end's server work (every task end but the run's last) to ``parts`` and
    ``server_units``, in place: it is the server's, once per task end, not per client."""
    for i, extra in enumerate(work.extras):
        if extra.task_end_server_units:
            parts["task-end server work"] += extra.task_end_server_units
            server_units[i] += extra.task_end_server_units


def count_shared_extras(
    parts: dict[str, float],
    work: StrategyWork,
    s: Schedule,
    cpr: int,
    filled: list[int],
    tasks: list[int],
    g: int,
) -> None:
    """Add round ``g``'s public-set work (logits per participant, server distillation) and
    buffer requests to ``parts``, in place: these depend on the round, not on one client.
    ``tasks``: the tasks its participants train (the latest sizes the public set)."""
    for extra in work.extras:
        if extra.public_examples is not None:
            public = work.public_after(extra, min(max(tasks), s.num_tasks - 1))
            parts["public logits"] += cpr * public
            parts["distillation"] += extra.distill_epochs * public
            parts["distillation"] += extra.distill_steps * min(s.steps.batch_size, public)
    for extra in work.extras:
        if extra.request_samples and (g + 1) % extra.request_interval == 0:
            mean_fill = sum(filled) / s.num_clients
            parts["client requests"] += cpr * min(extra.request_samples, mean_fill)


def count_evaluation(
    parts: dict[str, float],
    s: Schedule,
    t: int,
    test_sizes: Sequence[int],
    probes: list[int],
    cpr: int,
    task_end: bool,
) -> None:
    """Add one round's evaluation forwards to ``parts``, in place: the seen and next tasks'
    test sets (every task under per-client orders) at a task end, or every round with
    ``--eval-every-round``; memory-drift and client-spread probes at task ends only."""
    T = s.num_tasks
    upto = min(t + 1, T - 1) if s.task_order is None else T - 1  # every task then
    if task_end:
        # No memory drift or client spread under per-client orders (their probes).
        probed = sum(probes[: t + 1]) if s.task_order is None else 0
        parts["evaluation"] += sum(test_sizes[: upto + 1]) + probed
        parts["client spread"] += cpr * probed
    elif s.eval_every_round:
        parts["evaluation"] += sum(test_sizes[: upto + 1])


def strategy_work(
    strategy: Strategy, splits: dict[int, TaskSplit], model: torch.nn.Module | None = None
) -> StrategyWork:
    """What the strategy's components declare they compute besides the local steps
    (``Component.extra_work``, after setup), and the holdouts that grow a public set.
    ``model``: the run's, which sizes the task-end server work a component declares (none
    is counted without it)."""
    extras = tuple(e for c in strategy.all for e in sized(c.extra_work(), model))
    return StrategyWork(tuple(e for e in extras if e != ExtraWork()), holdout_totals(splits))


def sized(work: ExtraWork, model: torch.nn.Module | None) -> tuple[ExtraWork, ...]:
    """``work`` with its task-end server work sized by ``model``: per kind of work, the
    units per task end and the unit the probe times (``ExtraWork.task_end_server``); the
    first kind stays in ``work``, each further kind is a declaration of its own."""
    if work.task_end_server is None or model is None:
        return (work,)
    kinds = work.task_end_server(model)
    if not kinds:
        return (dataclasses.replace(work, task_end_server=None),)
    (units, unit), *more = kinds
    first = dataclasses.replace(work, task_end_server_units=units, server_unit=unit)
    return (first, *(ExtraWork(task_end_server_units=n, server_unit=u) for n, u in more))


def holdout_totals(splits: dict[int, TaskSplit]) -> tuple[int, ...]:
    """Examples withheld from every client by the end of each task (cumulative)."""
    totals, held = [], 0
    for t in range(len(splits)):
        split = splits[t]
        held += 0 if split.held is None else int(split.held.numel())
        totals.append(held)
    return tuple(totals)


def estimate(work: Workload, units: UnitTimes, *, checkpoints: bool) -> Estimate:
    """Seconds of the run: counts × unit times, plus the checkpoint policy's share."""
    parts = {
        "local steps": work.steps * units.step,
        "evaluation and drift": work.forward_samples * units.forward,
        "server and client extras": work.backward_samples * units.backward
        + sum(n * t for n, t in zip(work.server_units, units.server, strict=False)),
        "data and aggregation": work.materialisations * units.task + work.visits * units.visit,
    }
    total = sum(parts.values()) * (1.0 + (CHECKPOINT_SHARE if checkpoints else 0.0))
    return Estimate(total, parts)


# -- the probe --------------------------------------------------------------------------------
@dataclass(frozen=True)
class StoredTask:
    """Task 0 as the engine holds it: train and test splits in the stream's stored form.

    Why not ``stream.task(0)``: that materialises the whole task as floats (four times the
    memory of uint8 pixels), which made the probe the run's memory peak.
    """

    train: TaskTrain
    test: TaskTest


def measure(
    stream: Stream,
    partitioner: Partitioner,
    strategy: Strategy,
    model: torch.nn.Module,
    schedule: Schedule,
    splits: dict[int, TaskSplit],
    budget: Callable[[UnitTimes], float | None],
) -> UnitTimes:
    """Unit times from real task-0 batches on a scratch one-client federation (CPU).

    First a plain forward + backward and a forward of real batches (milliseconds for the
    small models); ``budget`` turns these rough unit times into the seconds the steady-state
    step timing may take, or None to skip it (a run too small to be worth it: the result
    then has ``steps_timed`` 0). Runs under a forked RNG on deep copies: the run's model,
    strategy state and generators are untouched.
    """
    started = time.perf_counter()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        t0 = time.perf_counter()
        task = StoredTask(stream.task_train(0), stream.task_test(0))
        task_seconds = time.perf_counter() - t0
        fed = scratch_federation(stream, partitioner, strategy, model, schedule)
        split = splits[0]
        shard = max(split.parts, key=lambda p: int(p.numel()))
        if shard.numel() == 0:
            shard = torch.arange(int(task.train.train_y.shape[0]))
        batch = schedule.steps.batch_size

        def rows(batches: int) -> torch.Tensor:
            return shard[torch.arange(batches * batch) % shard.numel()]

        units = rough_units(fed, task, rows(1), batch, task_seconds)
        extras = strategy_work(strategy, splits, model).extras
        units = dataclasses.replace(units, server=server_unit_seconds(extras))
        allowed = budget(units)
        if allowed is not None:
            units = steady_step_units(fed, task, split, rows, units, started + allowed)
    return dataclasses.replace(units, probe_seconds=time.perf_counter() - started)


def scratch_federation(
    stream: Stream,
    partitioner: Partitioner,
    strategy: Strategy,
    model: torch.nn.Module,
    schedule: Schedule,
) -> Federation:
    """The probe's one-client CPU federation on deep copies of the model and the strategy,
    so that timing it leaves the run's own state untouched.

    One client, one epoch: a local step costs the same in every epoch, and a shard of k
    batches then times exactly k steps. Steps are timed through the sequential trainer
    whatever the run's executor: the federation is given no other.
    """
    scratch = dataclasses.replace(
        schedule,
        num_clients=1,
        participation=1.0,
        async_shift=0,
        arrivals=None,
        steps=dataclasses.replace(schedule.steps, epochs=1),
    )
    probe_strategy = copy.deepcopy(strategy)
    for component in probe_strategy.all:
        component.probe_copy()
    return Federation(
        stream,
        partitioner,
        probe_strategy,
        copy.deepcopy(model),
        scratch,
        torch.device("cpu"),
        {},
    )


def rough_units(
    fed: Federation, task: StoredTask, idx: torch.Tensor, batch: int, task_seconds: float
) -> UnitTimes:
    """Plain forward + backward and forward-only times of real batches, and a client visit;
    the local step is a plain forward + backward of one batch until it is timed."""
    module, flat = fed.model.module, fed.model
    x, y = fed.stream.as_model_input(task.train.train_x[idx]), task.train.train_y[idx]

    def forward_backward() -> None:
        flat.zero_grad()
        F.cross_entropy(module(x), y).backward()

    module.train()
    reps = 3 if timed(forward_backward) < 0.05 else 1  # the first call sets up kernels
    backward = min(timed(forward_backward) for _ in range(reps)) / batch
    test_x = fed.stream.as_model_input(task.test.test_x[:FORWARD_SAMPLES])
    predict(module, test_x[:2])
    forward = min(timed(lambda: predict(module, test_x)) for _ in range(reps))
    forward /= max(1, int(test_x.shape[0]))
    visit = 2 * min(timed(lambda: visit_work(fed)) for _ in range(reps))
    test_size = int(task.test.test_y.shape[0])
    return UnitTimes(backward * batch, forward, backward, task_seconds, visit, 0.0, 0, test_size)


def server_unit_seconds(extras: tuple[ExtraWork, ...]) -> tuple[float, ...]:
    """Seconds of one ``server_unit`` call of each extra work (the fastest of three, the
    first call setting up kernels; 0 where none is declared)."""
    return tuple(
        0.0 if e.server_unit is None else min(timed(e.server_unit) for _ in range(3))
        for e in extras
    )


def steady_step_units(
    fed: Federation,
    task: StoredTask,
    split: TaskSplit,
    rows: Callable[[int], torch.Tensor],
    units: UnitTimes,
    deadline: float,
) -> UnitTimes:
    """The strategy's steady-state local step: one full warm-up round, one timed
    single-batch training to size the rest, then up to 3 × 8 timed batches that fit before
    ``deadline`` (``time.perf_counter()`` at which the probe's budget is spent)."""
    warm_round(fed, task, split, rows(1))
    give(fed, task, rows(1))
    first = timed(lambda: local_training(fed))
    samples, count = [first], 1  # seconds a step, one sample per timed call
    more = int((deadline - time.perf_counter()) / max(first, 1e-6))
    if more >= 2:
        reps = min(3, more // 2) if more >= 4 else 1
        k = max(1, min(8, more // reps))
        give(fed, task, rows(k))
        samples += [timed(lambda: local_training(fed)) / k for _ in range(reps)]
        count += k * reps
    return dataclasses.replace(units, step=statistics.median(samples), steps_timed=count)


def timed(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def predict(module: torch.nn.Module, x: torch.Tensor) -> None:
    from cfl_bench.core.evaluation import predict_logits

    predict_logits(module, x)


def visit_work(fed: Federation) -> None:
    """What a client visit costs besides training: load θ_g, add the upload to the mean."""
    server = fed.server
    fed.model.load(server.global_params, server.global_buffers)
    server.global_params.clone().add_(fed.model.params)


def give(fed: Federation, task: StoredTask, idx: torch.Tensor) -> None:
    """The scratch client's training data: rows ``idx`` of task 0."""
    client = fed.clients[0]
    client.task = 0
    client.train_x = task.train.train_x[idx]  # stored form: the client decodes its batches
    client.train_y = task.train.train_y[idx]


def warm_round(fed: Federation, task: StoredTask, split: TaskSplit, idx: torch.Tensor) -> None:
    """One full round of the scratch federation, so the state every later local step sees
    exists: replay buffers hold examples, FedGP has g_ref, FedCurv its sums, FedProj its
    ensemble (A-GEM's task-end memory is filled too)."""
    server = fed.server
    held = split.held
    holdout = None if held is None else fed.stream.as_model_input(task.train.train_x[held])
    for component in fed.strategy.all:
        component.on_task_start(server, 0, holdout)
    if holdout is not None and held is not None:
        for component in fed.strategy.all:
            component.on_holdout_labels(server, 0, holdout, task.train.train_y[held])
    give(fed, task, idx)
    server.rounds_per_task = 2  # not a task end: no client-spread evaluation
    server.round_index += 1
    fed._round(RunOutcome())
    fed.executor.end_tasks([(fed.clients[0], 0)], fed.global_state)


def local_training(fed: Federation) -> None:
    """One client's local training as a round runs it, after the round-start hooks."""
    executor = fed.executor
    assert isinstance(executor, SequentialExecutor)  # the probe's federation: the default
    trainer = executor.trainer
    broadcast = fed.round_server.make_broadcast()
    job = ClientJob(fed.clients[0], broadcast)
    trainer.local_steps(job.client, trainer.start(job))


# -- what a run says ---------------------------------------------------------------------------
def announce_per_round(rounds: int, clients: int, say: Callable[[str], None]) -> dict[str, object]:
    """A per-round stream (CARLA vehicles) has no shards to size the run from."""
    reason = "clients receive new data every round, so there are no shards to size"
    say(f"{rounds} rounds × {clients} clients; {reason}")
    return {"steps": None, "seconds": None, "reason": reason}


def announce(plan: RunPlan, say: Callable[[str], None]) -> dict[str, object]:
    """Say the run's size and, on CPU, its estimated duration; return config.json's
    ``cost_estimate`` (``steps``, ``seconds`` — None when not estimated — and details)."""
    schedule, strategy = plan.schedule, plan.strategy
    clock = schedule.clock()
    if plan.stream.per_round:
        return announce_per_round(clock.total_rounds, schedule.num_clients, say)
    shards = step_shards(shard_sizes(plan.splits, schedule.num_tasks), schedule.task_orders())
    params = sum(p.numel() for p in plan.model.parameters() if p.requires_grad)
    history = strategy.learner.needs_history
    exemplars = strategy.learner.exemplar_memory()
    size = run_size(schedule, clock, shards, history, params, exemplars)
    line = size.line(str(plan.config.model))
    record: dict[str, object] = {"steps": size.total_steps, "seconds": None}
    if plan.device.type != "cpu":
        say(line)
        record["reason"] = "durations are estimated on CPU only"
        return record
    work_of = functools.partial(
        workload,
        schedule,
        clock,
        shards,
        needs_buffer=strategy.needs_buffer,
        needs_history=history,
        work=strategy_work(strategy, plan.splits, plan.model),
        exemplars=exemplars,
    )
    checkpoints = plan.config.checkpoint_every != 0

    def budget(units: UnitTimes) -> float | None:
        rough = estimate(
            work_of([units.test_size] * schedule.num_tasks), units, checkpoints=checkpoints
        )
        if rough.seconds < TINY_SECONDS:
            return None
        return min(PROBE_MAX_SECONDS, max(PROBE_MIN_SECONDS, PROBE_SHARE * rough.seconds))

    units = measure(
        plan.stream, plan.partitioner, strategy, plan.model, schedule, plan.splits, budget
    )
    if units.steps_timed == 0:  # a few seconds at most: nothing worth a line
        record["reason"] = "a small run: not worth timing"
        return record
    work = work_of([units.test_size] * schedule.num_tasks)
    result = estimate(work, units, checkpoints=checkpoints)
    threads = torch.get_num_threads()
    record.update(estimate_record(result, units, threads))
    say_estimate(plan, line, result, units, threads, say)
    return record


def estimate_record(result: Estimate, units: UnitTimes, threads: int) -> dict[str, object]:
    """The timed estimate's part of config.json's ``cost_estimate``: the duration, what
    measured it and its parts, so that a reader can see where the seconds come from."""
    return {
        "seconds": round(result.seconds, 1),
        "threads": threads,
        "probe_seconds": round(units.probe_seconds, 2),
        "steps_timed": units.steps_timed,
        "unit_seconds": {
            "local_step": units.step,
            "forward_per_sample": units.forward,
            "forward_backward_per_sample": units.backward,
        },
        "parts": {k: round(v, 1) for k, v in result.parts.items()},
    }


def say_estimate(
    plan: RunPlan,
    line: str,
    result: Estimate,
    units: UnitTimes,
    threads: int,
    say: Callable[[str], None],
) -> None:
    """The size line with a short duration, or the size line then the estimate with its
    large parts — and the faster choices when it exceeds ``LONG_RUN_SECONDS``."""
    if result.seconds < QUIET_SECONDS:
        say(f"{line}; about {duration(result.seconds)} on CPU")
        return
    say(line)
    shown = ", ".join(
        f"{name} {duration(v)}" for name, v in result.parts.items() if v >= 0.05 * result.seconds
    )
    text = (
        f"estimated duration on CPU ({threads} thread{'s' if threads != 1 else ''}): about "
        f"{duration(result.seconds)} ({shown}; one local step {units.step:.3g} s, from "
        f"{units.steps_timed} timed step{'s' if units.steps_timed != 1 else ''})"
    )
    if result.seconds > LONG_RUN_SECONDS:
        model, shape = str(plan.config.model), tuple(plan.stream.input_shape)
        text += (
            f". That is over {LONG_RUN_SECONDS / 60:.0f} minutes; faster choices: "
            f"{'; '.join(faster_choices(model, shape, plan.schedule))}"
        )
    say(text)


# -- the messages -----------------------------------------------------------------------------
def duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def faster_choices(model: str, input_shape: tuple[int, ...], schedule: Schedule) -> list[str]:
    """The options that would shorten this run, without changing anything silently."""
    choices = []
    if model == "resnet18" and tuple(input_shape[-2:]) == (32, 32):
        choices.append("--model cifar-cnn (~95-106k parameters instead of ResNet-18's 11M)")
    if schedule.rounds_per_task > 1 or schedule.num_tasks > 1:
        choices.append("fewer --rounds-per-task / --tasks")
    choices.append("--train-size N / --test-size N")
    choices.append("a GPU (--device cuda)")
    return choices
