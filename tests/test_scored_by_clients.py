"""A method whose global model is not what it is scored by (FedWeIT's clients keep private
per-task models): no global accuracy-derived number is reported as the method's.

The records below are written by hand: two tasks, two clients, global accuracies
a = [[60, 20], [40, 80]] (a[0, 1] = 20 is task 1 before training, FWT's entry), the
untrained model at 10 on both tasks, two rounds of 100 bytes up each, and the clients'
local accuracies 30 and 50 at the final task's end.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from cfl_bench.core.metrics import RECORD_COLUMNS, summarize
from cfl_bench.core.run_agreement import disagreement
from cfl_bench.leaderboard.aggregate import aggregate
from cfl_bench.leaderboard.runs import load_runs
from cfl_bench.strategies import declarations
from cfl_bench.strategies.fedweit import FedWeIT
from tests.leaderboard_fixtures import write_run

REASON = "its clients keep private models"


def hand_records() -> pd.DataFrame:
    rows = [
        (0, -1, 0, "global", "acc", 10.0),
        (0, -1, 1, "global", "acc", 10.0),
        (1, 0, 0, "global", "acc", 60.0),
        (1, 0, 1, "global", "acc", 20.0),
        (1, 0, -1, "global", "bytes_up", 100.0),
        (2, 1, 0, "global", "acc", 40.0),
        (2, 1, 1, "global", "acc", 80.0),
        (2, 1, -1, "global", "bytes_up", 100.0),
        (2, 1, -1, "client_0", "client_acc", 30.0),
        (2, 1, -1, "client_1", "client_acc", 50.0),
    ]
    return pd.DataFrame(rows, columns=list(RECORD_COLUMNS))


def test_the_global_model_s_numbers_are_withheld_with_the_reason() -> None:
    scored = summarize(hand_records(), 2)
    # Acc_T = (40 + 80) / 2; Fgt_T = 60 − 40; FWT = 20 − 10.
    assert (scored["Acc_T"], scored["Fgt_T"], scored["FWT"]) == (60.0, 20.0, 10.0)
    assert "global_not_scored" not in scored
    withheld = summarize(hand_records(), 2, REASON)
    for key in ("Acc_T", "acc_t", "acc_matrix", "Fgt_T", "Fgt_T_clipped", "BWT", "FWT", "MD_T"):
        assert withheld[key] is None, key
    assert withheld["global_not_scored"] == REASON
    # What is not the global model's accuracy stays: the bytes and the clients' spread.
    assert withheld["bytes_up_total"] == 200
    assert withheld["client_acc_p50"] == 40.0


def test_a_withholding_summary_agrees_with_its_records_and_a_stated_number_does_not() -> None:
    summary = summarize(hand_records(), 2, REASON)
    assert disagreement(summary, hand_records(), 2) is None
    edited = {**summary, "Acc_T": 60.0}
    assert disagreement(edited, hand_records(), 2) == (
        "summary.json says Acc_T is 60 but records.csv gives null"
    )
    silent = {k: v for k, v in summary.items() if k != "global_not_scored"}
    assert disagreement(silent, hand_records(), 2) == (
        "summary.json says Acc_T is null but records.csv gives 60"
    )


def test_fedweit_declares_it_and_an_unfinished_runs_config_says_it() -> None:
    """The leaderboard imports no strategy: config.json carries the reason for a run that
    has no summary.json yet; a finished run's summary says it itself."""
    from cfl_bench.leaderboard.run_data import not_scored_reason

    assert FedWeIT.scored_by_clients == declarations.FEDWEIT.scored_by_clients != ""
    config = {"global_not_scored": declarations.FEDWEIT.scored_by_clients}
    assert not_scored_reason(None, config) == declarations.FEDWEIT.scored_by_clients
    assert not_scored_reason({"global_not_scored": "own"}, config) == "own"
    assert not_scored_reason({}, config) == ""  # a finished run's summary decides
    assert not_scored_reason(None, {}) == ""


def test_the_leaderboard_does_not_rank_a_run_on_withheld_numbers(tmp_path: Path) -> None:
    plain = write_run(tmp_path, "plain", strategy="fedavg", acc=60.0)
    private = write_run(tmp_path, "private", strategy="fedweit", acc=90.0)
    summary = json.loads((private / "summary.json").read_text())
    records = pd.read_csv(private / "records.csv")
    summary.update(summarize(records, int(summary["num_tasks"]), REASON))
    (private / "summary.json").write_text(json.dumps(summary))
    board = aggregate(load_runs([plain, private]))
    assert list(board["strategy"]) == ["fedavg", "fedweit"]
    assert board["Acc_T_mean"].iloc[0] == 60.0
    assert pd.isna(board["Acc_T_mean"].iloc[1])


# Each client's own model, by hand (shared order, T = 2): client 0 scores 80 on task 0
# after step 0, then 60 and 90 on tasks 0 and 1; client 1 scores 50, then 50 and 70.
OWN = {0: [[80.0], [60.0, 90.0]], 1: [[50.0], [50.0, 70.0]]}


def own_records(own: dict[int, list[list[float]]], orders: list[list[int]] | None) -> pd.DataFrame:
    """Chance-level global rows, then each client's own scores after each step, on its
    own i-th task (stream task ``orders[k][i]``)."""
    rows: list[tuple[int, int, int, str, str, float]] = []
    rows += [(0, -1, j, "global", "acc", 10.0) for j in range(2)]
    if orders is not None:
        rows += [(0, t, task, f"client_{k}", "task_order", float(task))
                 for k, o in enumerate(orders) for t, task in enumerate(o)]  # fmt: skip
    for t in range(2):
        rows += [(t + 1, t, j, "global", "acc", 10.0) for j in range(2)]
        for k, steps in own.items():
            order = [0, 1] if orders is None else orders[k]
            rows += [(t + 1, t, order[i], f"client_{k}", "own_acc", v)
                     for i, v in enumerate(steps[t])]  # fmt: skip
    return pd.DataFrame(rows, columns=list(RECORD_COLUMNS))


def test_the_run_s_metrics_are_the_mean_over_clients_of_their_own_models() -> None:
    s = summarize(own_records(OWN, None), 2, REASON)
    # Client 0: Acc 80, (60 + 90)/2 = 75; Fgt 80 − 60 = 20; BWT −20. Client 1: 50, 60; 0; 0.
    assert s["client_Acc_T"] == [75.0, 60.0] and s["client_Fgt_T"] == [20.0, 0.0]
    assert s["acc_t"] == [65.0, 67.5] and s["Acc_T"] == 67.5
    assert (s["Fgt_T"], s["Fgt_T_clipped"], s["BWT"]) == (10.0, 10.0, -10.0)
    # No own model exists before its task is trained: no FWT; the global matrix is withheld.
    assert s["FWT"] is None and s["acc_matrix"] is None and s["MD_T"] is None
    assert disagreement(s, own_records(OWN, None), 2) is None


def test_under_per_client_orders_each_client_reads_its_own_tasks() -> None:
    # Client 1 trains task 1 first: 40 on it, then 30 on it and 70 on task 0.
    own = {0: OWN[0], 1: [[40.0], [30.0, 70.0]]}
    s = summarize(own_records(own, [[0, 1], [1, 0]]), 2, REASON)
    # Client 1: Acc 40, (30 + 70)/2 = 50; Fgt 40 − 30 = 10; BWT −10.
    assert s["client_Acc_T"] == [75.0, 50.0] and s["client_Fgt_T"] == [20.0, 10.0]
    assert s["acc_t"] == [60.0, 62.5]
    assert (s["Fgt_T"], s["BWT"]) == (15.0, -15.0)
    assert s["task_orders"] == [[0, 1], [1, 0]]
