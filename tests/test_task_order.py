"""Per-client task orders (``--task-order per-client``, FedWeIT's clients that see the tasks
in different orders) with any learner.

Hand-computed expectations: the per-client metrics of a 3-task matrix worked out on paper
(docs/metrics.md, "Per-client task orders"), which stream task each client trains at each
step, the evaluation of every task at every step, and the refusals.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from cfl_bench.core.errors import UserError
from cfl_bench.core.metrics import client_matrix, summarize
from cfl_bench.core.run_reader import parse_run
from cfl_bench.engine.loop import Schedule
from cfl_bench.engine.task_order import TaskOrder, parse_task_order
from cfl_bench.runner.config import make_config
from cfl_bench.runner.cost import run_size, step_shards
from cfl_bench.runner.plan import plan_run
from cfl_bench.runner.run_names import point_request
from cfl_bench.strategies.registry import component_classes
from tests.cli_helpers import assert_runs_refused
from tests.helpers import digits_federation
from tests.synthetic_data import write_tiny_cifar10
from tests.test_cli import in_process
from tests.test_resume import BASE, assert_config_resumes_after_crash
from tests.test_vectorized import assert_same, one_thread  # noqa: F401 - the fixture

# The worked example of docs/metrics.md: a[t][j], the global model after step t on stream
# task j; b[j], the initial model; client 0 trains tasks (0, 1, 2), client 1 (2, 0, 1).
A = [[50.0, 40.0, 10.0], [30.0, 60.0, 20.0], [20.0, 50.0, 80.0]]
B = [12.0, 8.0, 10.0]
ORDERS = [[0, 1, 2], [2, 0, 1]]


def example_records() -> pd.DataFrame:
    rows: list[tuple[int, int, int, str, str, object]] = []
    rows += [(0, -1, j, "global", "acc", B[j]) for j in range(3)]
    rows += [(0, t, task, f"client_{k}", "task_order", task) for k, o in enumerate(ORDERS)
             for t, task in enumerate(o)]  # fmt: skip
    rows += [(t + 1, t, j, "global", "acc", A[t][j]) for t in range(3) for j in range(3)]
    return pd.DataFrame(rows, columns=["round", "trained_task", "eval_task", "scope", "metric",
                                       "value"])  # fmt: skip


def test_client_matrix_permutes_the_columns() -> None:
    # Client 1's column i is the task it trains at step i: stream tasks 2, 0, 1.
    assert client_matrix(A, ORDERS[1]).tolist() == [[10, 50, 40], [20, 30, 60], [80, 20, 50]]
    with pytest.raises(ValueError, match="permutation of the 3 tasks"):
        client_matrix(A, [0, 0, 1])


def test_per_client_metrics_are_the_hand_computed_ones() -> None:
    s = summarize(example_records(), 3)
    # Client 0 (the stream's order): Acc_t = 50, (30+60)/2 = 45, (20+50+80)/3 = 50.
    # Client 1 (tasks 2, 0, 1):       Acc_t = 10, (20+30)/2 = 25, (80+20+50)/3 = 50.
    assert s["acc_t"] == pytest.approx([30.0, 35.0, 50.0])
    assert s["Acc_T"] == pytest.approx(50.0)
    assert s["client_Acc_T"] == pytest.approx([50.0, 50.0])
    # Fgt_3, client 0: task 0 max(50, 30) − 20 = 30, task 1 60 − 50 = 10 → 20;
    # client 1: its task 2 max(10, 20) − 80 = −60, its task 0 30 − 20 = 10 → −25.
    assert s["client_Fgt_T"] == pytest.approx([20.0, -25.0])
    assert s["Fgt_T"] == pytest.approx(-2.5)
    # Fgt_2: client 0 50 − 30 = 20, client 1 10 − 20 = −10 → 5.
    assert s["fgt_acc_t"][0] is None and s["fgt_acc_t"][1:] == pytest.approx([5.0, -2.5])
    # The max including the current row: client 0 (50−20 + 60−50)/2 = 20, client 1
    # (80−80 + 30−20)/2 = 5 → 12.5.
    assert s["Fgt_T_clipped"] == pytest.approx(12.5)
    # BWT: client 0 ((20−50) + (50−60))/2 = −20, client 1 ((80−10) + (20−30))/2 = 30 → 5.
    assert s["BWT"] == pytest.approx(5.0)
    # FWT: client 0 ((40−8) + (20−10))/2 = 21; client 1 its task 0 before training it at
    # step 1: a[0][0] − b[0] = 50 − 12 = 38, its task 1 at step 2: 60 − 8 = 52 → 45 → 33.
    assert s["FWT"] == pytest.approx(33.0)
    # The global matrix is kept as measured (stream-task columns).
    assert s["acc_matrix"] == A
    assert s["task_orders"] == ORDERS


def test_the_shared_order_summary_is_unchanged() -> None:
    """Without task_order rows the summary is the global matrix's: Acc_t = 50, 45, 50."""
    records = example_records()
    s = summarize(records[records["metric"] != "task_order"], 3)
    assert s["acc_t"] == pytest.approx([50.0, 45.0, 50.0])
    assert "task_orders" not in s and "client_Acc_T" not in s


def test_the_run_reader_rederives_forgetting_per_client() -> None:
    s = summarize(example_records(), 3)
    config = {"protocol": {"tasks": 3}, "config": {"stream": "rot-digits", "seed": 0}}
    row = parse_run("run", config, {**s, "status": "finished", "message": ""})
    assert row["Fgt_T"] == pytest.approx(-2.5) and row["Fgt_T_clipped"] == pytest.approx(12.5)


def test_options_parse_and_bad_values_are_refused_in_one_line() -> None:
    assert parse_task_order("shared") is None
    assert parse_task_order(" per-client ") == TaskOrder()
    assert parse_task_order("per-client:seed=7") == TaskOrder(seed=7)
    for bad, words in (
        ("per-clients", "unknown --task-order 'per-clients'"),
        ("shared:seed=1", "unknown --task-order 'shared:seed=1'"),
        ("per-client:seed=-1", "--task-order option seed must be an integer ≥ 0, got '-1'"),
        ("per-client:order=2", "unknown --task-order option 'order'; its only option is seed"),
    ):
        with pytest.raises(UserError, match=words) as err:
            parse_task_order(bad)
        assert "\n" not in str(err.value)


def test_orders_are_seeded_permutations() -> None:
    order = TaskOrder()
    drawn = order.orders(3, 4, run_seed=5)
    assert [sorted(o) for o in drawn] == [[0, 1, 2, 3]] * 3
    assert drawn == order.orders(3, 4, run_seed=5)  # a resumed run rebuilds them
    fixed = TaskOrder(seed=1)
    assert fixed.orders(3, 4, run_seed=0) == fixed.orders(3, 4, run_seed=9)
    assert fixed.orders(3, 4, 0) == TaskOrder().orders(3, 4, run_seed=1)


def test_each_client_trains_its_own_task_at_every_step() -> None:
    federation = digits_federation("fedavg", num_tasks=3, num_clients=3, task_order=TaskOrder())
    orders = federation.orders
    assert orders is not None and orders != ((0, 1, 2),) * 3
    for step in range(3):
        federation.enter_round(2 * step)  # 2 rounds per task
        assert [c.task for c in federation.clients] == [o[step] for o in orders]
        # rot-digits' 1,437 training digits in 3 label shards per task … each client's part
        # of its own task: the same sizes as its part of that task under the shared order.
        for c in federation.clients:
            assert c.num_samples == int(federation.data.split(c.task, 3).parts[c.index].numel())


def test_every_task_is_evaluated_at_every_step() -> None:
    federation = digits_federation("er", num_tasks=3, num_clients=3, task_order=TaskOrder())
    reports: list[Any] = []
    out = federation.run(on_round=reports.append)
    evaluated = {(r[1], r[2]) for r in out.records if r[4] == "acc"}
    assert evaluated == {(t, j) for t in (-1, 0, 1, 2) for j in range(3)}
    # The progress display's Acc after step 1 (round 2): the mean over the clients of the
    # global model's accuracy on each client's first task, a[0][π_k(0)].
    a = {(r[1], r[2]): float(r[5]) for r in out.records if r[4] == "acc"}  # type: ignore[arg-type]
    assert federation.orders is not None
    firsts = [a[(0, o[0])] for o in federation.orders]
    assert reports[1].latest_acc == pytest.approx(sum(firsts) / 3)
    assert not [r for r in out.records if r[4] in ("kl_drift", "client_acc")]
    order_rows = sorted((r[3], r[1], r[2]) for r in out.records if r[4] == "task_order")
    orders = federation.orders
    assert orders is not None
    assert order_rows == sorted(
        (f"client_{k}", t, task) for k, o in enumerate(orders) for t, task in enumerate(o)
    )


def test_the_vectorized_executor_agrees(one_thread: None) -> None:  # noqa: F811
    """ER: replay buffers filled with each client's own tasks, in its own order."""
    runs = []
    for executor in ("sequential", "vectorized"):
        federation = digits_federation(
            "er",
            num_tasks=3,
            num_clients=3,
            task_order=TaskOrder(),
            executor=executor,
            train_size=600,
        )
        runs.append((federation, federation.run()))
    (seq, a), (vec, b) = runs
    assert_same(seq, a, vec, b)


# rot-digits, 3 tasks × 2 rounds, 4 clients (tests.test_resume.BASE); the orders of seed 0.
RESUME = {**BASE, "task_order": "per-client"}


@pytest.mark.parametrize("strategy", ["ideal", "agem:agem_fill=task_end"])
def test_a_crashed_run_resumes_to_identical_records(tmp_path: Path, strategy: str) -> None:
    """``ideal`` keeps every task's part (the history, in the client's own order); A-GEM
    fills its memory at the client's own task ends."""
    assert_config_resumes_after_crash({**RESUME, "strategy": strategy}, tmp_path, crash_round=3)


def planned(**values: object) -> None:
    plan_run(make_config({"tasks": 3, "clients": 3, "task_order": "per-client", **values}))


@pytest.mark.parametrize(
    ("values", "words"),
    [
        ({"arrivals": "glfc:initial=1,new=1"}, "which --arrivals does not follow"),
        ({"async_shift": 1}, "which --async-shift does not follow"),
        ({"lead_rounds": 1}, "which --lead-rounds does not follow"),
        ({"diagnostics": True, "eval_every_round": True}, "which --diagnostics does not"),
    ],
)
def test_option_pairs_it_cannot_mean_are_refused(values: dict[str, object], words: str) -> None:
    with pytest.raises(UserError, match=words) as err:
        planned(**values)
    assert "\n" not in str(err.value)


@pytest.fixture(scope="module")
def cifar_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("cifar-format")
    write_tiny_cifar10(root, n=40, n_test=20)
    return root


def class_il(root: Path, strategy: str) -> dict[str, Any]:
    return {"stream": "seq-cifar10", "data_root": str(root), "model": "mlp", "tasks": 2,
            "clients": 2, "strategy": strategy, "task_order": "per-client:seed=0"}  # fmt: skip


@pytest.mark.parametrize("strategy", ["icarl", "glfc"])
def test_learners_with_stream_ordered_classes_are_refused(cifar_root: Path, strategy: str) -> None:
    with pytest.raises(UserError, match=f"{strategy} takes a client's seen classes") as err:
        plan_run(make_config(class_il(cifar_root, strategy)))
    assert "\n" not in str(err.value)


def test_class_il_clients_hold_their_own_tasks_classes(cifar_root: Path) -> None:
    """seq-cifar10 has classes 2t, 2t+1 in task t. With seed 0 client 0 trains tasks (0, 1)
    and client 1 (1, 0): at step 1 client 0 holds classes {0, 1}, client 1 {2, 3}, so the
    classes the global model has been trained on — the union over clients — are {0, 1, 2,
    3} already, and the accuracy matrix has both tasks' entries at both steps."""
    assert TaskOrder(seed=0).orders(2, 2, 0) == ((0, 1), (1, 0))
    plan = plan_run(make_config({**class_il(cifar_root, "fedavg"), "rounds_per_task": 1}))
    federation = plan.federation()
    federation.enter_round(0)
    held = [sorted(set(c.train_y.tolist())) for c in federation.clients]  # type: ignore[union-attr]
    assert held == [[0, 1], [2, 3]]
    out = federation.run()
    evaluated = {(r[1], r[2]) for r in out.records if r[4] == "acc"}
    assert evaluated == {(t, j) for t in (-1, 0, 1) for j in range(2)}


def test_cfl_bench_run_end_to_end(tmp_path: Path) -> None:
    """One CLI run: the orders in config.json, every task scored at every step, acc_t the
    mean over clients of each client's accuracy on its own tasks, read from records.csv."""
    out = tmp_path / "run"
    args = ["run", "--tasks", "3", "--rounds-per-task", "1", "--epochs", "1", "--clients", "3"]
    args += ["--train-size", "600", "--threads", "1"]
    code, shown = in_process(*args, "--task-order", "per-client:seed=1", "--out", str(out))
    assert code == 0, shown
    config = json.loads((out / "config.json").read_text())
    # seed 1: clients train tasks (2, 3, 1), (1, 3, 2), (3, 1, 2) (1-based).
    assert config["task_orders"] == [[2, 3, 1], [1, 3, 2], [3, 1, 2]]
    assert config["protocol"]["task_order"] == "per-client:seed=1"
    records = pd.read_csv(out / "records.csv")
    acc = records[(records["metric"] == "acc") & (records["trained_task"] >= 0)]
    a = {(int(r.trained_task), int(r.eval_task)): float(r.value) for r in acc.itertuples()}
    assert set(a) == {(t, j) for t in range(3) for j in range(3)}
    orders = [[t - 1 for t in o] for o in config["task_orders"]]
    by_hand = [
        sum(sum(a[(t, o[i])] for i in range(t + 1)) / (t + 1) for o in orders) / 3 for t in range(3)
    ]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["acc_t"] == pytest.approx(by_hand)
    assert summary["task_orders"] == orders
    # Not the shared order's Acc_1 (task 1 alone): the clients' first tasks are 2, 1, 3.
    assert not math.isclose(by_hand[0], a[(0, 0)])
    # `cfl-bench clients RUN --task 1` shows step 1: each client's row of its own task.
    code, shown = in_process("clients", str(out), "--task", "1")
    assert code == 0, shown
    rows = {line.split()[0]: line.split() for line in shown.splitlines()[3:6]}
    tables = config["client_class_counts"]
    for k, first in enumerate((2, 1, 3)):
        assert rows[str(k)][1:3] == ["task", str(first)]
        assert rows[str(k)][-1] == str(sum(tables[str(first)][k]))


def test_a_bad_task_order_exits_2_in_one_line(tmp_path: Path) -> None:
    bad = [
        ["--task-order", "per-client:seed=x"],
        ["--task-order", "per-client", "--async-shift", "1"],
    ]
    assert_runs_refused(tmp_path, bad, "--task-order")


def test_the_cost_estimate_follows_each_clients_order() -> None:
    """Shards (task × client) [[25, 10, 0], [5, 30, 11]]; clients 0 and 2 train task 1
    first, client 1 task 0: step 0 holds 5, 10, 11 and step 1 25, 30, 0 examples."""
    steps = step_shards([[25, 10, 0], [5, 30, 11]], ((1, 0), (0, 1), (1, 0)))
    assert steps == [[5, 10, 11], [25, 30, 0]]
    s = Schedule.of(num_tasks=2, rounds_per_task=2, epochs=2, num_clients=3, participation=1.0,
                    batch_size=10, buffer_batch_size=10, buffer_size=5,
                    buffer_offer="first_pass", replay_augment=False, weighting="samples",
                    lr=0.1, momentum=0.0, weight_decay=0.0, probe_size=4,
                    eval_every_round=False, seed=0, task_order=TaskOrder())  # fmt: skip
    # The joint learner at step 1: 5 + 25, 10 + 30, 11 + 0 → ⌈30/10⌉·2 + ⌈40/10⌉·2 +
    # ⌈11/10⌉·2 = 18 steps a round; step 0: 2 + 2 + 4 = 8.
    joint = run_size(s, s.clock(), steps, needs_history=True, params=1)
    assert joint.total_steps == 2 * 8 + 2 * 18
    assert (joint.steps_min, joint.steps_max) == (2, 8)


@pytest.mark.slow
@pytest.mark.parametrize("strategy", sorted(component_classes()))
def test_every_component_runs_under_per_client_orders(strategy: str) -> None:
    """Each component (with the default learner) finishes a run in which the clients train
    the tasks in their own orders, and every client ends on its own last task (slow: ~1 s
    each). iCaRL, GLFC and the data-free synthesis learners refuse the digits stream here,
    as under the shared order; with a class-incremental stream ``plan_run`` refuses iCaRL
    and GLFC for the order (above)."""
    if strategy in ("icarl", "glfc", "target", "lander", "mfcl"):
        with pytest.raises(UserError, match="it needs a class-incremental stream"):
            digits_federation(strategy, task_order=TaskOrder())
        return
    federation = digits_federation(strategy, num_tasks=3, num_clients=3, task_order=TaskOrder())
    out = federation.run()
    assert out.status == "finished", out.message
    assert federation.orders is not None
    assert [c.task for c in federation.clients] == [o[-1] for o in federation.orders]


def test_existing_points_and_protocols_keep_their_identity() -> None:
    """``shared`` is left out of a sweep point's request and of the protocol, so the runs
    and sweep points made before the option keep their names and hashes."""
    shared, ordered = make_config({}), make_config({"task_order": "per-client:seed=2"})
    assert "task_order" not in point_request(shared) and "task_order" not in shared.protocol()
    assert point_request(ordered)["task_order"] == "per-client:seed=2"
    assert ordered.protocol()["task_order"] == "per-client:seed=2"
