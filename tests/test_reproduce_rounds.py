"""A column that reads one round of a run: IFA's "Gen. g" cells.

Why: IFA's tables report one run at several generations, i.e. several rounds. The value
must be the global accuracy recorded after exactly round round(fraction x total rounds),
and a run without that record (not evaluated every round, or a continual run with several
tasks' accuracies per round) must be left out with a reason, never read as something else.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from cfl_bench.core.run_reader import RunReading
from cfl_bench.reproduce.collect import accuracy_at_round, column_value
from cfl_bench.reproduce.tables import Column


def reading(total: int, accuracies: dict[int, float], num_tasks: int = 1) -> RunReading:
    """A finished static run of ``total`` rounds whose records hold ``accuracies`` by round
    (and a training loss every round, which must not be read)."""
    rows = [(r, 0, -1, "global", "train_loss", 2.0) for r in range(1, total + 1)]
    rows += [(r, 0, 0, "global", "acc", a) for r, a in accuracies.items()]
    rows += [(r, 0, 0, "client", "acc", 99.0) for r in accuracies]
    records = pd.DataFrame(
        rows, columns=["round", "trained_task", "eval_task", "scope", "metric", "value"]
    )
    return RunReading(
        Path("run"),
        "finished",
        "",
        {"task_clock": {"total_rounds": total}},
        {"num_tasks": num_tasks},
        row={"Acc_T": 50.0},
        records=records,
    )


def test_the_round_is_a_fraction_of_the_total_rounds() -> None:
    run = reading(30, {r: float(r) for r in range(1, 31)})
    assert accuracy_at_round(run, 0.1)[0] == 3.0  # Gen. 1 of 10 generations of 3 rounds
    assert accuracy_at_round(run, 0.3)[0] == 9.0  # 0.3 x 30 = 9.000000000000002
    assert accuracy_at_round(run, 1.0)[0] == 30.0
    assert accuracy_at_round(reading(660, {66: 12.5}), 0.1)[0] == 12.5
    assert accuracy_at_round(reading(5, {1: 7.0}), 0.01)[0] == 7.0  # at least round 1


def test_a_missing_round_or_a_continual_run_gives_no_value_and_says_why() -> None:
    value, why = accuracy_at_round(reading(30, {30: 40.0}), 0.1)
    assert value is None
    assert why == "global accuracy at round 3 of 30 in records.csv"
    value, why = accuracy_at_round(reading(30, {3: 40.0}, num_tasks=2), 0.1)
    assert value is None and why.endswith("(a static run evaluated every round)")
    no_records = reading(30, {3: 40.0})
    no_records.records = None
    assert accuracy_at_round(no_records, 0.1)[0] is None


def test_a_column_without_a_fraction_reads_the_summary_metric() -> None:
    run = reading(30, {3: 40.0})
    plain = Column("c", "CIFAR-10", "", {}, "Acc_T")
    by_round = Column("c", "CIFAR-10", "", {}, "accuracy after generation 1", 0.1)
    assert column_value(plain, run) == (50.0, "Acc_T")
    assert column_value(by_round, run)[0] == 40.0
