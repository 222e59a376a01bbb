"""Clients that join over time (``--arrivals``, GLFC's protocol) with any learner.

Hand-computed expectations: the GLFC code's counts (30 clients, 10 more per task, ⌊0.9·E⌋ of
the E clients there get the new task's data), the iid split sizes of the 1,437 embedded
training digits among the receivers, who takes part in which round, and the refusals.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from cfl_bench.core.errors import UserError
from cfl_bench.engine.arrivals import ArrivalPlan, Arrivals, parse_arrivals
from cfl_bench.engine.loop import Schedule
from cfl_bench.runner.config import make_config
from cfl_bench.runner.cost import run_size
from cfl_bench.runner.plan import plan_run
from cfl_bench.runner.run import execute
from cfl_bench.strategies.registry import component_classes
from cfl_bench.streams.partition import (
    ClassSubsetPartitioner,
    IIDPartitioner,
    partitioner_from_spec,
)
from cfl_bench.streams.registry import build_stream
from tests.cli_helpers import assert_runs_refused, cli
from tests.helpers import digits_federation
from tests.test_resume import (
    assert_resumes_after_crash,
    assert_same_run,
    kill_after,
    options,
    uninterrupted,
)
from tests.test_vectorized import assert_same, one_thread  # noqa: F401 - the fixture

# 3 tasks: 3 clients, then 1 joins per task (5 in all); ⌊3·0.5⌋ = 1 and ⌊4·0.5⌋ = 2 old
# clients receive tasks 2 and 3; 2 clients per round.
SMALL = Arrivals(initial=3, new=1, receive=0.5, per_round=2)
# The embedded training digits per class (1,437: every 5th of the 1,797 is test).
DIGITS_PER_CLASS = [136, 154, 151, 135, 143, 143, 151, 153, 138, 133]


def rows_of(records: list[Any], metric: str) -> list[tuple[int, int, int]]:
    """(round, task, client) of every ``metric`` row, with its value."""
    return [
        (int(r[0]), int(r[1]), int(str(r[3]).removeprefix("client_")), int(r[5]))
        for r in records
        if r[4] == metric
    ]


def test_the_digit_counts_used_below_are_the_streams() -> None:
    stream = build_stream(
        "rot-digits",
        num_tasks=1,
        seed=0,
        device=torch.device("cpu"),
        data_root=None,
        download=False,
        train_size=None,
        test_size=None,
    )
    assert torch.bincount(stream.train_labels(0)).tolist() == DIGITS_PER_CLASS
    assert sum(DIGITS_PER_CLASS) == 1437


def test_the_glfc_preset_is_the_official_codes_rule() -> None:
    # conditionWang/FCIL src/option.py: --num_clients 30, --task_size 10 (new clients per
    # task in fl_main.py), --local_clients 10; fl_main.py: int(overall_client * 0.9) of the
    # clients there receive the new task (old_client_1), the rest keep (old_client_0).
    assert parse_arrivals("glfc") == Arrivals(initial=30, new=10, receive=0.9, per_round=10)
    plan = Arrivals().plan(10, seed=0)
    assert plan.joined == (30, 40, 50, 60, 70, 80, 90, 100, 110, 120)
    assert Arrivals().total_clients(10) == 120
    # Keepers E − ⌊0.9 E⌋ for E = 30, 40, …, 110 (0.9·70 = 63.000…01 in floats: still 63).
    assert [len(plan.keepers(t)) for t in range(10)] == [0, 3, 4, 5, 6, 7, 8, 9, 10, 11]
    for t in range(1, 10):
        joining = set(range(plan.joined[t - 1], plan.joined[t]))
        assert joining <= set(plan.receivers[t])  # every new client gets the new task
        assert set(plan.receivers[t]) | set(plan.keepers(t)) == set(range(plan.joined[t]))
        assert not set(plan.receivers[t]) & set(plan.keepers(t))
    assert plan.per_round == 10


def test_a_small_plan_by_hand() -> None:
    plan = SMALL.plan(3, seed=0)
    assert plan.joined == (3, 4, 5)
    assert plan.receivers[0] == (0, 1, 2)
    assert len(plan.receivers[1]) == 2 and plan.receivers[1][-1] == 3  # 1 old + client 3
    assert len(plan.receivers[2]) == 3 and plan.receivers[2][-1] == 4  # 2 old + client 4
    keeper = plan.keepers(1)[0]
    assert plan.held_task(keeper, 1) == 0 and plan.held_task(3, 1) == 1
    assert plan.held_task(4, 1) is None  # not there yet
    # Data ends for the clients that receive the next task, for everybody at the end.
    assert plan.ending_clients(0, last=False) == plan.receivers[1][:1]
    assert plan.ending_clients(2, last=True) == (0, 1, 2, 3, 4)
    assert plan.describe()[1] == {
        "task": 2,
        "clients": 4,
        "joined": [3],
        "receivers": list(plan.receivers[1]),
        "keepers": list(plan.keepers(1)),
    }
    assert SMALL.plan(3, seed=0) == plan  # pure: a resumed run rebuilds it


def test_a_plan_with_no_receiver_is_refused() -> None:
    with pytest.raises(UserError, match="task 2 no client to receive its data") as err:
        Arrivals(initial=1, new=0, receive=0.5).plan(2, seed=0)  # ⌊1 · 0.5⌋ = 0, nobody new
    assert "\n" not in str(err.value)


def test_options_parse_and_bad_values_are_refused_in_one_line() -> None:
    got = parse_arrivals(" glfc:initial=3, new=0, receive=1, per_round=1 ")
    assert got == Arrivals(initial=3, new=0, receive=1.0, per_round=1)
    bad = {
        "": "unknown --arrivals",
        "GLFC": "unknown --arrivals",
        "glfc:": "no options after it",
        "glfc:initial=0": "initial must be",
        "glfc:new=-1": "new must be",
        "glfc:receive=0": "receive must be a fraction in (0, 1]",
        "glfc:receive=1.5": "receive must be a fraction in (0, 1]",
        "glfc:per_round=x": "per_round must be",
        "glfc:inital=3": "unknown --arrivals option 'inital'",
    }
    for spec, words in bad.items():
        with pytest.raises(UserError, match=words.replace("(", r"\(").replace(")", r"\)")) as e:
            parse_arrivals(spec)
        assert "\n" not in str(e.value), spec


def small_federation(strategy: str, **extra: object) -> Any:
    return digits_federation(
        strategy,
        num_tasks=3,
        num_clients=5,
        arrivals=SMALL,
        partitioner=IIDPartitioner(),
        **extra,
    )


def test_who_trains_when_and_on_what() -> None:
    federation = small_federation("er")
    plan = federation.arrivals
    assert isinstance(plan, ArrivalPlan)
    out = federation.run()
    trained = rows_of(out.records, "train_examples")
    # 2 tasks' rounds each: rounds 1-2 task 1, 3-4 task 2, 5-6 task 3; 2 clients per round.
    assert sorted({g for g, *_ in trained}) == [1, 2, 3, 4, 5, 6]
    for g in range(1, 7):
        there = plan.joined[(g - 1) // 2]
        clients = [k for r, _, k, _ in trained if r == g]
        assert len(clients) == 2 and all(k < there for k in clients), (g, clients)
    # iid split of 1,437 digits: 3 receivers 479 each; 2 receivers 719 + 718.
    sizes = {0: {479}, 1: {719, 718}, 2: {479}}
    for _, t, k, n in trained:
        held = plan.held_task(k, t)
        assert held is not None
        assert n in sizes[held], (t, k, n)  # a keeper trains on its old task's part
    # Not there yet: no data; a keeper of task 3 still holds an older task's part.
    assert federation.clients[4].task == 2
    for k in plan.keepers(2):
        assert federation.clients[k].task == plan.held_task(k, 2) < 2
        assert federation.clients[k].num_samples in sizes[federation.clients[k].task]


def test_a_client_not_there_yet_holds_no_data() -> None:
    federation = small_federation("fedavg")
    federation.enter_round(0)
    assert [c.num_samples for c in federation.clients] == [479, 479, 479, 0, 0]
    federation.enter_round(2)  # task 2: one old client and client 3 get 719 / 718
    plan = federation.arrivals
    assert plan is not None
    keepers = plan.keepers(1)
    assert [federation.clients[k].num_samples for k in keepers] == [479, 479]
    assert sorted(federation.clients[k].num_samples for k in plan.receivers[1]) == [718, 719]
    assert federation.clients[4].num_samples == 0


@pytest.mark.parametrize("strategy", ["er", "agem:agem_fill=task_end"])
def test_the_vectorized_executor_agrees(strategy: str, one_thread: None) -> None:  # noqa: F811
    runs = []
    for executor in ("sequential", "vectorized"):
        federation = small_federation(strategy, executor=executor)
        runs.append((federation, federation.run()))
    (seq, a), (vec, b) = runs
    assert_same(seq, a, vec, b)


# 3 tasks, 4 clients (tests.test_resume.BASE): 2 at task 1, one more per task.
RESUME = {"arrivals": "glfc:initial=2,new=1,receive=0.5,per_round=2"}


def test_a_sigkilled_run_with_arrivals_resumes_to_identical_records(tmp_path: Path) -> None:
    whole = uninterrupted(tmp_path, "er", **RESUME)
    values = options("er", tmp_path / "killed", checkpoint_every=2, **RESUME)
    kill_after(values, 3)  # mid-task 2, past the checkpoint of round 2
    execute(make_config(values))
    assert_same_run(tmp_path / "killed", whole)


@pytest.mark.parametrize("strategy", ["ideal", "agem:agem_fill=task_end"])
def test_history_and_task_end_learners_resume_after_a_crash(tmp_path: Path, strategy: str) -> None:
    whole = uninterrupted(tmp_path, strategy, **RESUME)
    assert_resumes_after_crash(tmp_path / "crashed", strategy, whole, 3, **RESUME)


def planned(**values: object) -> None:
    base: dict[str, object] = {"tasks": 3, "clients": 5, "arrivals": "glfc:initial=3,new=1"}
    plan_run(make_config({**base, **values}))


@pytest.mark.parametrize(
    ("values", "words"),
    [
        (
            {"clients": 6},
            "3 + 2 x 1 = 5 clients over 3 tasks, and --clients is 6; pass --clients 5",
        ),
        ({"participation": 0.5}, "so --participation does not apply"),
        ({"async_shift": 1}, "so --async-shift does not apply"),
        ({"lead_rounds": 1}, "so --lead-rounds does not apply"),
    ],
)
def test_option_pairs_it_cannot_mean_are_refused(values: dict[str, object], words: str) -> None:
    with pytest.raises(UserError, match=words.replace("(", r"\(").replace("+", r"\+")) as err:
        planned(**values)
    assert "\n" not in str(err.value)


def test_without_a_partition_arrivals_use_the_glfc_split() -> None:
    """The GLFC code's split by default: every receiver holds all digits of 6 classes."""
    plan = plan_run(make_config({"tasks": 3, "clients": 5, "arrivals": "glfc:initial=3,new=1"}))
    assert plan.resolved["protocol"]["partition"]["name"] == "class-subsets"
    assert plan.resolved["protocol"]["partition"]["classes_per_client"] == 6
    receivers = plan.resolved["arrivals"][0]["receivers"]
    for k, row in enumerate(plan.resolved["client_class_counts"]["1"]):
        if k in receivers:
            assert [n for n in row if n] == [DIGITS_PER_CLASS[c] for c in range(10) if row[c]]
            assert sum(1 for n in row if n) == 6
        else:
            assert sum(row) == 0


def test_the_protocol_records_the_resolved_options() -> None:
    spelled = plan_run(make_config({"tasks": 3, "clients": 5, "arrivals": "glfc:initial=3,new=1"}))
    resolved = plan_run(
        make_config(
            {
                "tasks": 3,
                "clients": 5,
                "arrivals": "glfc:initial=3,new=1,receive=0.9,per_round=10",
            }
        )
    )
    assert spelled.protocol_hash == resolved.protocol_hash
    none = plan_run(make_config({"tasks": 3, "clients": 5}))
    assert "arrivals" not in none.resolved["protocol"]
    assert "arrivals" not in none.resolved
    assert none.protocol_hash != spelled.protocol_hash


def test_cfl_bench_run_end_to_end(tmp_path: Path) -> None:
    """One CLI run: who was there, who received, what classes each held, who trained."""
    out = tmp_path / "run"
    args = ["run", "--tasks", "3", "--rounds-per-task", "1", "--epochs", "1", "--clients", "5"]
    args += ["--arrivals", "glfc:initial=3,new=1,receive=0.5,per_round=2", "--strategy", "er"]
    args += ["--partition", "shards"]  # the FedGP shards, for sizes computed by hand
    result = cli([*args, "--out", str(out)], tmp_path)
    assert result.returncode == 0, result.stderr
    config = json.loads((out / "config.json").read_text())
    plan = SMALL.plan(3, seed=0)
    assert config["arrivals"] == plan.describe()
    assert config["protocol"]["arrivals"] == {
        "name": "glfc",
        "initial": 3,
        "new": 1,
        "receive": 0.5,
        "per_round": 2,
    }
    # shards (2 per client): 1,437 label-sorted digits cut
    # into 2·(receivers) shards; each receiver holds 2 shards, everybody else none of the task.
    for t, shard in ((0, 1437 // 6), (1, 1437 // 4), (2, 1437 // 6)):
        table = config["client_class_counts"][str(t + 1)]
        held = [sum(row) for row in table]
        assert held == [2 * shard if k in plan.receivers[t] else 0 for k in range(5)], t
        # The shards cut the label-sorted digits, so the receivers hold every digit of the
        # task but the remainder 1437 mod (2 · receivers) — 3, then 1, then 3 — dropped from
        # the highest label, 9.
        columns = [sum(row[c] for row in table) for c in range(10)]
        dropped = 1437 % (2 * len(plan.receivers[t]))
        assert columns == [*DIGITS_PER_CLASS[:9], DIGITS_PER_CLASS[9] - dropped], t
    rows = (out / "records.csv").read_text().splitlines()
    trained = [line.split(",") for line in rows if ",train_examples," in line]
    assert len(trained) == 6  # 3 rounds (one per task) × 2 clients
    for line in trained:
        g, k, n = int(line[0]), int(line[3].removeprefix("client_")), float(line[5])
        task = g - 1
        assert k < plan.joined[task]
        held = plan.held_task(k, task)
        assert held is not None
        assert n == sum(config["client_class_counts"][str(held + 1)][k])
    # `cfl-bench clients --task 2` shows what each client trains on: a keeper's task-1 row.
    shown = cli(["clients", str(out), "--task", "2"], tmp_path, wide=True)
    assert shown.returncode == 0, shown.stderr
    rows_shown = {line.split()[0]: line.split() for line in shown.stdout.splitlines()[3:8]}
    assert len(plan.keepers(1)) == 2  # 3 there, ⌊3 · 0.5⌋ = 1 receives
    for keeper in plan.keepers(1):
        assert rows_shown[str(keeper)][1:4] == ["task", "1", "(kept)"]
        assert rows_shown[str(keeper)][-1] == str(2 * (1437 // 6))
    assert rows_shown["4"][1:3] == ["not", "there"] and rows_shown["4"][-1] == "0"
    assert rows_shown["3"][1:3] == ["task", "2"] and rows_shown["3"][-1] == str(2 * (1437 // 4))


def test_bad_arrivals_on_the_command_line_exit_2_in_one_line(tmp_path: Path) -> None:
    bad = [["--arrivals", "glfc:receive=2"], ["--arrivals", "glfc", "--clients", "7"]]
    assert_runs_refused(tmp_path, bad, "--arrivals")


CLASS_IL_ONLY = {"icarl", "glfc", "target", "lander", "mfcl"}


@pytest.mark.slow
@pytest.mark.parametrize("strategy", sorted(component_classes()))
def test_every_component_runs_under_arrivals(strategy: str) -> None:
    """Each component (with the default learner) finishes a run where clients join, keep
    old data and sit out, and only clients that are there ever train (slow: ~1 s each).
    The class-incremental learners refuse the digits stream here; their runs under
    ``--arrivals`` are tests/test_icarl.py's and test_glfc.py's golden case."""
    if strategy in CLASS_IL_ONLY:
        with pytest.raises(UserError, match="it needs a class-incremental stream"):
            small_federation(strategy).run()
        return
    federation = small_federation(strategy)
    out = federation.run()
    assert out.status == "finished", out.message
    plan = federation.arrivals
    assert plan is not None
    for g, _, k, n in rows_of(out.records, "train_examples"):
        assert k < plan.joined[(g - 1) // 2] and n > 0


def test_the_cost_estimate_counts_only_the_clients_there() -> None:
    """run_size by hand: 1 round per task, 1 epoch, batch 100; client k holds 100·(t+1)
    examples of task t when it receives it, so a step count is the held task + 1."""
    schedule = Schedule.of(
        num_tasks=3,
        rounds_per_task=1,
        epochs=1,
        num_clients=5,
        participation=1.0,
        batch_size=100,
        buffer_batch_size=100,
        buffer_size=10,
        buffer_offer="first_pass",
        replay_augment=False,
        weighting="samples",
        lr=0.1,
        momentum=0.0,
        weight_decay=0.0,
        probe_size=10,
        eval_every_round=False,
        seed=0,
        arrivals=SMALL,
    )
    plan = SMALL.plan(3, seed=0)
    shards = [[100 * (t + 1) if k in plan.receivers[t] else 0 for k in range(5)] for t in range(3)]
    size = run_size(schedule, schedule.clock(), shards, False, params=1)
    # Round 1: 3 clients there, 2 drawn (chance 2/3), 1 step each: 2.
    # Round 2: 4 there (chance 2/4); receivers 2 steps, keepers 1: 0.5 · (2 + 2 + 1 + 1) = 3.
    # Round 3: 5 there (chance 2/5); 3 receivers 3 steps; a keeper 2 steps if it received
    # task 2, else 1.
    keepers = sum(2 if k in plan.receivers[1] else 1 for k in plan.keepers(2))
    assert size.total_steps == round(2 + 3 + 0.4 * (9 + keepers))
    assert (size.rounds, size.clients_per_round, size.steps_min, size.steps_max) == (3, 2, 1, 3)


def test_class_subsets_give_every_example_of_the_drawn_classes() -> None:
    """GLFC's split: 4 classes of sizes 2, 3, 1, 2; 3 clients of 2 classes each hold every
    example of their 2 classes (clients may share), so a part's size is its classes' sum."""
    labels = torch.tensor([0, 0, 1, 1, 1, 2, 3, 3, 1])
    sizes = {0: 2, 1: 4, 2: 1, 3: 2}
    parts = ClassSubsetPartitioner(classes_per_client=2).split(labels, 3, task=0, seed=0)
    assert len(parts) == 3
    for part in parts:
        held = set(labels[part].tolist())
        assert len(held) == 2
        assert part.tolist() == [i for i, y in enumerate(labels.tolist()) if y in held]
        assert part.numel() == sum(sizes[c] for c in held)
    again = ClassSubsetPartitioner(classes_per_client=2).split(labels, 3, task=0, seed=0)
    assert [p.tolist() for p in again] == [p.tolist() for p in parts]  # seeded
    everything = ClassSubsetPartitioner(classes_per_client=4).split(labels, 2, task=0, seed=0)
    assert [p.tolist() for p in everything] == [list(range(9))] * 2  # shared, not split
    with pytest.raises(UserError, match="task 1 has 4; use class-subsets:classes_per_client=4"):
        ClassSubsetPartitioner(classes_per_client=5).split(labels, 3, task=0, seed=0)
    assert partitioner_from_spec("class-subsets").describe()["classes_per_client"] == 6  # code


def test_glfc_split_under_arrivals() -> None:
    """Receivers hold all examples of 6 of the 10 digit classes; keepers their old ones."""
    federation = digits_federation(
        "fedavg",
        num_tasks=2,
        num_clients=4,
        arrivals=SMALL,
        partitioner=ClassSubsetPartitioner(),
    )
    federation.enter_round(2)  # task 2's first round (2 rounds per task)
    plan = federation.arrivals
    assert plan is not None
    for k in plan.receivers[1]:
        client = federation.clients[k]
        held = set(client.train_y.tolist())  # type: ignore[union-attr]
        assert len(held) == 6 and client.task == 1
        assert client.num_samples == sum(DIGITS_PER_CLASS[c] for c in held)
    for k in plan.keepers(1):
        assert federation.clients[k].task == 0
