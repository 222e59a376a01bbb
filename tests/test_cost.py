"""Honest cost up front (cfl_bench/runner/cost.py): the run's size and workload counts on
hand-made splits, the probe leaving every result untouched, the messages, and the estimate
of a small real run against its actual time."""

from __future__ import annotations

import ast
import dataclasses
import json
import math
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from cfl_bench.engine.loop import Schedule
from cfl_bench.runner import cost
from cfl_bench.runner.config import make_config
from cfl_bench.runner.run import RunPlan, execute, plan_run
from cfl_bench.runner.threads import usable_cores
from cfl_bench.strategies.base import Component, ExtraWork, ModelFacts
from cfl_bench.strategies.compose import build_strategy
from cfl_bench.strategies.registry import component_classes
from tests.helpers import env

SHARDS = [[25, 10, 0], [5, 30, 11]]  # task × client
SMALL = {"tasks": 2, "rounds_per_task": 1, "clients": 3, "epochs": 1, "threads": 1}


@pytest.fixture(autouse=True)
def keep_threads() -> Iterator[None]:
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def schedule(**overrides: Any) -> Schedule:
    values: dict[str, Any] = dict(
        num_tasks=2,
        rounds_per_task=2,
        epochs=2,
        num_clients=3,
        participation=1.0,
        batch_size=10,
        buffer_batch_size=10,
        buffer_size=5,
        buffer_offer="first_pass",
        replay_augment=False,
        weighting="samples",
        lr=0.1,
        momentum=0.0,
        weight_decay=0.0,
        probe_size=4,
        eval_every_round=False,
        seed=0,
    )
    return Schedule.of(**{**values, **overrides})


def units(step: float) -> cost.UnitTimes:
    return cost.UnitTimes(step, 1e-5, 1e-4, 0.01, 1e-4, 0.1, 6, 100)


# -- pure counts ------------------------------------------------------------------------------
def test_run_size_counts_local_steps_from_the_splits() -> None:
    s = schedule()
    size = cost.run_size(s, s.clock(), SHARDS, needs_history=False, params=1234)
    # task 0 rounds: ⌈25/10⌉·2 + ⌈10/10⌉·2 + 0 = 8; task 1 rounds: 2 + 6 + 4 = 12
    assert (size.rounds, size.clients_per_round, size.total_steps) == (4, 3, 2 * 8 + 2 * 12)
    assert (size.steps_min, size.steps_max) == (0, 6)
    assert size.line("mlp") == (
        "run size: 4 rounds × 3 clients × 0–6 local steps (⌈shard / 10⌉ × 2 epochs) = "
        "40 local steps; mlp: 1,234 parameters"
    )


def test_run_size_under_partial_participation_and_for_the_joint_learner() -> None:
    s = schedule(participation=0.67)  # 2 of 3 clients a round
    partial = cost.run_size(s, s.clock(), SHARDS, needs_history=False, params=1)
    assert (partial.clients_per_round, partial.total_steps) == (2, round(40 * 2 / 3))
    s = schedule()
    joint = cost.run_size(s, s.clock(), SHARDS, needs_history=True, params=1)
    assert joint.total_steps == 2 * 8 + 2 * (6 + 8 + 4)  # task 1 holds 30, 40, 11 samples


def test_run_size_counts_the_exemplars_joined_to_the_task_data() -> None:
    """iCaRL/GLFC (``exemplar_memory`` 8): in task 1 each client trains on its shard plus
    min(8, what it held of task 0) kept examples: 5 + 8, 30 + 8, 11 + 0 rows."""
    s = schedule()
    size = cost.run_size(s, s.clock(), SHARDS, needs_history=False, params=1, exemplars=8)
    # task 1 rounds: ⌈13/10⌉·2 + ⌈38/10⌉·2 + ⌈11/10⌉·2 = 4 + 8 + 4
    assert size.total_steps == 2 * 8 + 2 * (4 + 8 + 4)
    learners = {name: build_strategy(name).learner for name in ("icarl", "glfc", "er")}
    assert {name: learner.exemplar_memory() for name, learner in learners.items()} == {
        "icarl": 2000,
        "glfc": 2000,
        "er": 0,
    }


def test_workload_counts_evaluation_buffers_and_strategy_extras() -> None:
    s = schedule()
    extra = ExtraWork(request_samples=32, shard_samples=12, public_examples=0, distill_epochs=1)
    work = cost.StrategyWork((extra,), holdouts=(7, 14))
    w = cost.workload(
        s, s.clock(), SHARDS, [10, 10], needs_buffer=True, needs_history=False, work=work
    )
    assert w.parts["evaluation"] == 20 + (20 + 4) + (20 + 8)  # start, end of task 1, 2
    assert w.parts["client spread"] == 3 * 4 + 3 * 8
    assert w.parts["buffer drift"] == 10 + 10 + 15 + 15  # min(5, seen) per client
    assert w.parts["client requests"] == pytest.approx(10 + 10 + 15 + 15)
    assert w.parts["client extra passes"] == 2 * (20 + 10) + 2 * (5 + 20 + 11)  # ≤ n
    assert w.parts["task-end activations"] == 0  # nothing declared it
    assert w.parts["public logits"] == 2 * 3 * 7 + 2 * 3 * 14
    assert w.parts["distillation"] == 2 * 7 + 2 * 14
    assert w.forward_samples == 72 + 36 + 50 + 126
    assert w.backward_samples == pytest.approx(50 + 132 + 42)
    assert (w.steps, w.materialisations, w.visits) == (40, 4, 12)

    plain = cost.workload(
        s, s.clock(), SHARDS, [10, 10], needs_buffer=False, needs_history=False,
        work=cost.StrategyWork(),
    )  # fmt: skip
    assert plain.backward_samples == 0 and plain.parts["buffer drift"] == 0
    every = cost.workload(
        dataclasses.replace(s, eval_every_round=True), s.clock(), SHARDS, [10, 10],
        needs_buffer=False, needs_history=False, work=cost.StrategyWork(),
    )  # fmt: skip
    assert every.parts["evaluation"] == 72 + 2 * 20  # rounds 1 and 3 evaluate tasks 0..1


def test_task_start_work_counts_each_client_with_data_in_its_tasks_first_round() -> None:
    """GLFC's prototypes and inversions: rounds 0 and 2 start tasks 0 and 1; client 2 holds
    nothing of task 0, so 2 + 3 clients do the work."""
    s = schedule()
    extra = ExtraWork(task_start_samples=100, task_start_server_units=1000, server_unit=print)
    w = cost.workload(
        s, s.clock(), SHARDS, [10, 10], needs_buffer=False, needs_history=False,
        work=cost.StrategyWork((extra,), holdouts=(0, 0)),
    )  # fmt: skip
    assert w.parts["client extra passes"] == 5 * 100
    assert w.parts["gradient inversion"] == 5 * 1000 and w.server_units == (5000,)
    assert w.backward_samples == 5 * 100  # the server units are timed apart
    # 500 samples at 1e-4 s and 5000 units at 0.01 s: 0.05 + 50 s
    timed = dataclasses.replace(units(0.1), server=(0.01,))
    extras = cost.estimate(w, timed, checkpoints=False).parts["server and client extras"]
    assert extras == pytest.approx(0.05 + 50.0)
    assert cost.server_unit_seconds((ExtraWork(),)) == (0.0,)
    # glfc at 2 classes a task: 50 steps per class; 250 L-BFGS steps × 20 closures
    glfc = build_strategy("glfc").learner
    facts = ModelFacts("identity", frozenset({"features"}))
    stream = env("seq-test", "class-il", 4, 2)
    glfc.setup(dataclasses.replace(stream, classes_per_task=2, input_shape=(1, 4, 4), model=facts))
    work = glfc.extra_work()
    assert (work.task_start_samples, work.task_start_server_units) == (100, 10_000)
    assert work.server_unit is not None and work.server_unit() is None
    assert build_strategy("glfc:proxy=none").learner.extra_work() == ExtraWork(
        task_end_client_passes=1
    )


def test_task_end_server_work_counts_every_task_end_but_the_last() -> None:
    """FOT's basis SVDs: three tasks end after rounds 1, 3 and 5; the last grows nothing."""
    s = schedule(num_tasks=3)
    sized = dataclasses.replace(ExtraWork(task_end_server_units=7.5), server_unit=print)
    w = cost.workload(
        s, s.clock(), [*SHARDS, [1, 1, 1]], [10, 10, 10], needs_buffer=False,
        needs_history=False, work=cost.StrategyWork((sized,), holdouts=(0, 0, 0)),
    )  # fmt: skip
    assert w.server_units == (2 * 7.5,) and w.parts["task-end server work"] == 15.0
    # Declared with a sizing function: the run's model sizes it, no model no units.

    class Sized(Component):
        name = "sized"

        def extra_work(self) -> ExtraWork:
            return ExtraWork(
                task_end_forward=True,
                task_end_server=lambda model: ((float(model.in_features), print), (2.0, repr)),
            )

    strategy = build_strategy("fedavg")
    strategy.components.append(Sized())
    # Two kinds of work: the first stays in the declaration, the second is one of its own.
    first, second = cost.strategy_work(strategy, {}, torch.nn.Linear(3, 2)).extras
    assert (first.task_end_server_units, first.server_unit, first.task_end_forward) == (
        3.0,
        print,
        True,
    )
    assert second == ExtraWork(task_end_server_units=2.0, server_unit=repr)
    assert not second.task_end_forward
    (only,) = cost.strategy_work(strategy, {}).extras  # nothing to size the server work by
    assert only.task_end_forward and only.task_end_server_units == 0


def test_generated_rows_count_each_later_task_step() -> None:
    """MFCL's syn_size generated rows per local step, in task 2 only: clients of 5, 30 and
    11 samples take 1, 3 and 2 batches of 10, twice (2 epochs), in each of task 2's 2 rounds:
    2 · 2 · (1 + 3 + 2) = 24 steps of 7 rows."""
    s = schedule()
    extra = ExtraWork(step_rows_after_first_task=7)
    w = cost.workload(
        s, s.clock(), SHARDS, [10, 10], needs_buffer=False, needs_history=False,
        work=cost.StrategyWork((extra,), holdouts=(0, 0)),
    )  # fmt: skip
    assert w.parts["generated rows"] == 24 * 7
    mfcl = build_strategy("mfcl:syn_size=16").learner.extra_work()
    assert mfcl.step_rows_after_first_task == 16


def test_exemplar_passes_cover_every_client_with_data_at_task_ends() -> None:
    """iCaRL's herding runs on every client holding the task, trained this round or not:
    at half participation the task-end passes are not halved."""
    s = schedule(participation=1 / 3)
    work = cost.StrategyWork((ExtraWork(task_end_client_passes=2),), holdouts=(0, 0))
    w = cost.workload(
        s, s.clock(), SHARDS, [10, 10], needs_buffer=False, needs_history=False, work=work
    )
    assert w.parts["exemplar passes"] == 2 * ((25 + 10 + 0) + (5 + 30 + 11))
    passes = {
        spec: build_strategy(spec).learner.extra_work().task_end_client_passes
        for spec in ("icarl", "icarl:selection=herding", "icarl:selection=herding,classifier=nme")
    }
    assert passes == {
        "icarl": 0,
        "icarl:selection=herding": 1,
        "icarl:selection=herding,classifier=nme": 2,
    }


def test_a_task_end_forward_covers_every_participant_at_task_ends() -> None:
    s = schedule()  # task ends after rounds 2 and 4; shards (25, 10, 0), then (5, 30, 11)
    work = cost.StrategyWork((ExtraWork(task_end_forward=True),), holdouts=(0, 0))
    w = cost.workload(
        s, s.clock(), SHARDS, [10, 10], needs_buffer=False, needs_history=False, work=work
    )
    assert w.parts["task-end activations"] == (25 + 10 + 0) + (5 + 30 + 11)


def test_estimate_is_counts_times_unit_times() -> None:
    s = schedule()
    w = cost.workload(
        s, s.clock(), SHARDS, [10, 10], needs_buffer=False, needs_history=False,
        work=cost.StrategyWork(),
    )  # fmt: skip
    u = units(0.5)
    result = cost.estimate(w, u, checkpoints=False)
    expected = 40 * 0.5 + w.forward_samples * 1e-5 + 4 * 0.01 + 12 * 1e-4
    assert result.seconds == pytest.approx(expected)
    with_checkpoints = cost.estimate(w, u, checkpoints=True).seconds
    assert with_checkpoints == pytest.approx(expected * (1 + cost.CHECKPOINT_SHARE))


def test_strategy_work_is_what_the_components_declare() -> None:
    strategy = build_strategy("der+fedcurv:samples=100+fedgp:gref_samples=all,gref_interval=2")
    work = cost.strategy_work(strategy, {})
    assert work.extras == (
        ExtraWork(shard_samples=100),
        ExtraWork(request_samples=math.inf, request_interval=2),
    )
    assert cost.strategy_work(build_strategy("fedavg"), {}) == cost.StrategyWork()


def test_a_new_method_changes_the_estimate_by_declaring_its_work() -> None:
    """A component the estimate has never heard of counts through its declaration alone."""

    class Probe(Component):
        name = "probe"

        def extra_work(self) -> ExtraWork:
            return ExtraWork(shard_samples=5)

    s = schedule()
    plain = cost.strategy_work(build_strategy("fedavg"), {})
    strategy = build_strategy("fedavg")
    strategy.components.append(Probe())
    declared = cost.strategy_work(strategy, {})
    counts = [
        cost.workload(
            s, s.clock(), SHARDS, [10, 10], needs_buffer=False, needs_history=False, work=w
        ).backward_samples
        for w in (plain, declared)
    ]
    assert counts == [0, 2 * (10 + 10) + 2 * (5 + 10 + 10)]  # a whole batch of 10, ≤ n


def test_the_estimate_names_no_component() -> None:
    """cost.py holds no component's name in its code (docstrings may cite methods)."""
    tree = ast.parse(Path(cost.__file__).read_text(encoding="utf-8"))
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
    }
    names = set(component_classes())
    words = {
        word.lower()
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
        if id(node) not in docstrings
        for word in re.findall(r"[A-Za-z]+", node.value)
    }
    assert not words & names


def test_fedproj_holdouts_grow_the_public_set() -> None:
    plan = plan_run(make_config({**SMALL, "strategy": "fedavg+fedproj", "out": "unused"}))
    held = [int(plan.splits[t].held.numel()) for t in range(2)]  # type: ignore[union-attr]
    work = cost.strategy_work(plan.strategy, plan.splits)
    (extra,) = work.extras
    assert extra.public_examples == 0 and extra.distill_epochs == 1
    assert [work.public_after(extra, t) for t in (0, 1)] == [held[0], held[0] + held[1]]


# -- the probe --------------------------------------------------------------------------------
def small_plan(strategy: str = "der+fedgp") -> RunPlan:
    return plan_run(make_config({**SMALL, "strategy": strategy, "out": "unused"}))


def test_the_probe_leaves_model_strategy_and_random_state_untouched() -> None:
    plan = small_plan()
    params = {k: v.clone() for k, v in plan.model.state_dict().items()}
    rng = torch.get_rng_state()
    u = cost.measure(
        plan.stream, plan.partitioner, plan.strategy, plan.model, plan.schedule, plan.splits,
        budget=lambda _rough: 0.5,
    )  # fmt: skip
    assert u.steps_timed > 0 and u.step > 0 and u.forward > 0 and u.backward > 0
    assert u.test_size == 360  # rot-digits: every task holds the 360 test digits
    assert torch.equal(torch.get_rng_state(), rng)
    assert all(torch.equal(params[k], v) for k, v in plan.model.state_dict().items())
    fedgp = next(c for c in plan.strategy.all if c.name == "fedgp")
    assert fedgp.gref is None  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "strategy",
    [
        "der+fedgp",
        "der+fedcurv+fedgp+ifa:generation=1",
        "fedavg+fedproj",
        "agem:agem_fill=task_end+fedprox:mu=0.1",
        "derpp+fedntd",
    ],
)
def test_a_full_probe_changes_no_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, strategy: str
) -> None:
    """The same run with the full probe forced and with no probe at all: identical bytes."""
    values = {**SMALL, "strategy": strategy}
    monkeypatch.setattr(cost, "TINY_SECONDS", 0.0)
    execute(make_config({**values, "out": str(tmp_path / "probed")}))
    estimate = json.loads((tmp_path / "probed" / "config.json").read_text())["cost_estimate"]
    assert estimate["seconds"] is not None and estimate["steps_timed"] > 0
    monkeypatch.setattr(cost, "announce", lambda _plan, _say: {})
    execute(make_config({**values, "out": str(tmp_path / "bare")}))
    probed = (tmp_path / "probed" / "records.csv").read_bytes()
    assert probed == (tmp_path / "bare" / "records.csv").read_bytes()


# -- what a run says --------------------------------------------------------------------------
def test_a_small_run_says_nothing_and_records_its_size(tmp_path: Path) -> None:
    notes: list[str] = []
    execute(make_config({**SMALL, "out": str(tmp_path / "r")}), notify=notes.append)
    assert notes == []
    estimate = json.loads((tmp_path / "r" / "config.json").read_text())["cost_estimate"]
    assert estimate["seconds"] is None and estimate["steps"] > 0


def test_a_long_cpu_run_says_so_and_names_the_faster_choices(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    plan = small_plan()
    monkeypatch.setattr(cost, "measure", lambda *_args: units(10.0))
    notes: list[str] = []
    record = cost.announce(plan, notes.append)
    assert len(notes) == 2 and notes[0].startswith("run size: 2 rounds × 3 clients × ")
    assert "estimated duration on CPU (1 thread): about" in notes[1]
    assert "over 10 minutes" in notes[1]
    assert "fewer --rounds-per-task / --tasks" in notes[1] and "--device cuda" in notes[1]
    assert "--model cifar-cnn" not in notes[1]  # the digits MLP has no smaller sibling
    assert isinstance(record["seconds"], float) and record["seconds"] > cost.LONG_RUN_SECONDS
    monkeypatch.setattr(cost, "measure", lambda *_args: units(1e-4))
    notes.clear()
    cost.announce(plan, notes.append)
    assert len(notes) == 1 and notes[0].endswith("on CPU")


def test_resnet18_on_cifar_is_pointed_at_cifar_cnn() -> None:
    choices = cost.faster_choices("resnet18", (3, 32, 32), schedule())
    assert choices[0].startswith("--model cifar-cnn")
    assert not any("cifar-cnn" in c for c in cost.faster_choices("mlp", (1, 8, 8), schedule()))


def test_off_the_cpu_only_the_size_is_said() -> None:
    plan = dataclasses.replace(small_plan(), device=torch.device("cuda"))
    notes: list[str] = []
    record = cost.announce(plan, notes.append)
    assert len(notes) == 1 and notes[0].startswith("run size:")
    assert record["seconds"] is None


def test_the_estimate_of_a_small_real_run_is_within_2x_of_its_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """rot-digits, DER + FedGP, 3 tasks × 3 rounds, 10 clients, 5 epochs (~2 s): the estimate
    made before training against the run loop's own clock, in this one process. Skipped
    only under extreme load (1-minute load average above twice the usable cores), where no
    timing means anything. A second run when the first is off: on CI's 2 cores the other
    test worker can inflate the probe's few timed steps for a moment (seen once: 6.6 s
    estimated against a 2.6 s run at load 2.1), and two runs off by 2× are no accident."""
    load, cores = os.getloadavg()[0], usable_cores()
    if load > 2 * cores:
        pytest.skip(f"load average {load:.1f} on {cores} cores: timings are meaningless")
    monkeypatch.setattr(cost, "TINY_SECONDS", 0.0)
    options = {"stream": "rot-digits", "strategy": "der+fedgp", "tasks": 3}
    seen = []
    for attempt in range(2):
        out = tmp_path / f"r{attempt}"
        execute(make_config({**options, "rounds_per_task": 3, "threads": 1, "out": str(out)}))
        estimated = json.loads((out / "config.json").read_text())["cost_estimate"]["seconds"]
        actual = json.loads((out / "summary.json").read_text())["wall_time_s"]
        seen.append((estimated, actual))
        if 0.5 <= estimated / actual <= 2.0:
            break
    assert 0.5 <= estimated / actual <= 2.0, (seen, os.getloadavg())
