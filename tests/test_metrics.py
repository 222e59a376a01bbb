"""Tests for cfl_bench.metrics against hand-computed values.

Why hand-computed: the metrics define what the leaderboard means, so each test pins a number
worked out on paper from specs/metrics.md rather than re-deriving it with the same code.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pandas as pd
import pytest

from cfl_bench.metrics import (
    average_accuracy,
    backward_transfer,
    client_spread,
    forgetting,
    forward_transfer,
    initial_from_records,
    matrix_from_records,
    memory_drift,
    summarize,
)

NAN = math.nan

# The worked example of specs/metrics.md (T = 3, values in %).
WORKED = np.array(
    [
        [90.0, NAN, NAN],
        [70.0, 85.0, NAN],
        [60.0, 75.0, 80.0],
    ]
)


def _rec(
    round_: int,
    trained: int,
    eval_: int,
    metric: str,
    value: float,
    scope: str = "global",
) -> dict[str, Any]:
    """One records row in the engine's tidy long format."""
    return {
        "round": round_,
        "trained_task": trained,
        "eval_task": eval_,
        "scope": scope,
        "metric": metric,
        "value": value,
    }


def _frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------------------------
# Matrix metrics
# --------------------------------------------------------------------------------------------


def test_worked_example() -> None:
    acc = average_accuracy(WORKED)
    np.testing.assert_allclose(acc, [90.0, 77.5, 215.0 / 3])
    assert acc[-1] == pytest.approx(71.667, abs=1e-3)

    fgt = forgetting(WORKED)
    assert math.isnan(fgt[0])
    assert fgt[1] == pytest.approx(20.0)  # 90 - 70
    assert fgt[2] == pytest.approx(20.0)  # ((90-60) + (85-75)) / 2
    # No old task improved, so the clipped rule agrees.
    np.testing.assert_allclose(forgetting(WORKED, include_current=True)[1:], [20.0, 20.0])

    assert backward_transfer(WORKED) == pytest.approx(-20.0)


def test_forgetting_rules_differ_when_old_task_improves() -> None:
    # Task 0 rises from 50 (and 40) to 60 after task 2: negative forgetting under Chaudhry.
    a = np.array(
        [
            [50.0, NAN, NAN],
            [40.0, 80.0, NAN],
            [60.0, 70.0, 75.0],
        ]
    )
    chaudhry = forgetting(a)
    # t=1: 50 - 40 = 10. t=2: ((50 - 60) + (80 - 70)) / 2 = 0.
    np.testing.assert_allclose(chaudhry[1:], [10.0, 0.0])
    clipped = forgetting(a, include_current=True)
    # t=2: (max(50, 40, 60) - 60 + (80 - 70)) / 2 = 5.
    np.testing.assert_allclose(clipped[1:], [10.0, 5.0])

    rising = np.array([[50.0, NAN], [70.0, 90.0]])
    assert forgetting(rising)[1] == pytest.approx(-20.0)
    assert forgetting(rising, include_current=True)[1] == pytest.approx(0.0)
    assert backward_transfer(rising) == pytest.approx(20.0)


def test_missing_required_entry_propagates_nan() -> None:
    a = WORKED.copy()
    a[2, 1] = NAN
    assert math.isnan(average_accuracy(a)[2])
    assert math.isnan(forgetting(a)[2])
    assert math.isnan(backward_transfer(a))
    assert average_accuracy(a)[1] == pytest.approx(77.5)


def test_forward_transfer_hand_made() -> None:
    a = np.array(
        [
            [80.0, 20.0, 15.0],
            [70.0, 85.0, 30.0],
            [65.0, 75.0, 90.0],
        ]
    )
    b = np.array([10.0, 12.0, 8.0])
    # ((20 - 12) + (30 - 8)) / 2 = 15
    assert forward_transfer(a, b) == pytest.approx(15.0)

    a_missing = a.copy()
    a_missing[1, 2] = NAN
    assert math.isnan(forward_transfer(a_missing, b))
    assert math.isnan(forward_transfer(a, [10.0, NAN, 8.0]))
    # The lower triangle alone (the usual evaluation) gives no FWT.
    assert math.isnan(forward_transfer(WORKED, b))
    with pytest.raises(ValueError, match="one entry per task"):
        forward_transfer(a, [1.0, 2.0])


def test_memory_drift_hand_made() -> None:
    kl = np.array(
        [
            [0.0, NAN, NAN],
            [0.2, 0.0, NAN],
            [0.4, 0.6, 0.0],
        ]
    )
    md = memory_drift(kl)
    assert math.isnan(md[0])
    np.testing.assert_allclose(md[1:], [0.2, 0.5])


def test_client_spread_percentiles() -> None:
    # Linear interpolation on 5 sorted values: p10 at position 0.4, p90 at position 3.6.
    spread = client_spread([50.0, 10.0, 30.0, 40.0, 20.0])
    assert spread == pytest.approx({"p10": 14.0, "p50": 30.0, "p90": 46.0})
    assert client_spread([10.0, NAN, 20.0, 30.0, 40.0, 50.0]) == pytest.approx(spread)
    empty = client_spread([])
    assert set(empty) == {"p10", "p50", "p90"}
    assert all(math.isnan(v) for v in empty.values())


def test_non_square_matrix_rejected() -> None:
    with pytest.raises(ValueError, match="square"):
        average_accuracy(np.zeros((2, 3)))
    with pytest.raises(ValueError, match="square"):
        memory_drift(np.zeros(3))


def test_single_task_edge_cases() -> None:
    a = np.array([[73.0]])
    np.testing.assert_allclose(average_accuracy(a), [73.0])
    assert math.isnan(forgetting(a)[0])
    assert math.isnan(forgetting(a, include_current=True)[0])
    assert math.isnan(backward_transfer(a))
    assert math.isnan(forward_transfer(a, [10.0]))
    assert math.isnan(memory_drift(np.array([[0.0]]))[0])


# --------------------------------------------------------------------------------------------
# Records → matrices
# --------------------------------------------------------------------------------------------


def _two_task_records() -> pd.DataFrame:
    """Per-round evaluations inside each task; the task-end round carries the true values."""
    return _frame(
        [
            # task 0: rounds 0 and 1 (round 1 = task end)
            _rec(0, 0, 0, "acc", 30.0),
            _rec(1, 0, 0, "acc", 90.0),
            # task 1: rounds 2 and 3 (round 3 = task end)
            _rec(2, 1, 0, "acc", 10.0),
            _rec(2, 1, 1, "acc", 11.0),
            _rec(3, 1, 0, "acc", 70.0),
            _rec(3, 1, 1, "acc", 85.0),
            # other scopes / metrics / n.a. eval_task must be ignored
            _rec(3, 1, 0, "acc", 1.0, scope="client_0"),
            _rec(3, 1, 1, "acc_task_il", 99.0),
            _rec(3, 1, -1, "acc", 55.0),
            _rec(3, 1, -1, "bytes_up", 1000.0),
        ]
    )


def test_matrix_from_records_takes_last_round_per_task() -> None:
    m = matrix_from_records(_two_task_records(), "acc")
    np.testing.assert_array_equal(m, np.array([[90.0, NAN], [70.0, 85.0]]))
    client = matrix_from_records(_two_task_records(), "acc", scope="client_0")
    np.testing.assert_array_equal(client, np.array([[NAN, NAN], [1.0, NAN]]))


def test_matrix_from_records_num_tasks_and_duplicates() -> None:
    recs = _two_task_records()
    m = matrix_from_records(recs, "acc", num_tasks=3)
    assert m.shape == (3, 3)
    assert np.isnan(m[2]).all()
    with pytest.raises(ValueError, match="num_tasks"):
        matrix_from_records(recs, "acc", num_tasks=1)
    # A round re-recorded after a resume: the later row in table order wins.
    resumed = pd.concat([recs, _frame([_rec(3, 1, 1, "acc", 86.0)])], ignore_index=True)
    assert matrix_from_records(resumed, "acc")[1, 1] == 86.0
    # An eval task absent at the task-end round stays NaN (not filled from round 2).
    partial = recs[~((recs["round"] == 3) & (recs["eval_task"] == 1))]
    assert np.isnan(matrix_from_records(partial, "acc")[1, 1])
    assert matrix_from_records(recs.iloc[0:0], "acc").shape == (0, 0)


def test_matrix_from_records_missing_column() -> None:
    with pytest.raises(ValueError, match="lacks columns"):
        matrix_from_records(_two_task_records().drop(columns=["scope"]), "acc")


def test_initial_from_records() -> None:
    recs = _frame(
        [
            _rec(0, -1, 0, "acc", 10.0),
            _rec(0, -1, 2, "acc", 8.0),
            _rec(0, -1, 1, "acc_task_il", 50.0),
            _rec(1, 0, 1, "acc", 99.0),
        ]
    )
    np.testing.assert_array_equal(initial_from_records(recs, "acc", 3), [10.0, NAN, 8.0])


# --------------------------------------------------------------------------------------------
# Summary
# --------------------------------------------------------------------------------------------


def _run_records() -> pd.DataFrame:
    """A complete 3-task run: the worked example plus task-IL, drift, bytes and clients."""
    rows: list[dict[str, Any]] = [_rec(0, -1, i, "acc", v) for i, v in enumerate([10.0, 12.0, 8.0])]
    rows += [_rec(-1, -1, i, "acc_task_il", 50.0) for i in range(3)]
    for t in range(3):
        end = 2 * t + 1
        rows.append(_rec(end - 1, t, t, "acc", 0.0))  # mid-task evaluation, ignored
        for i in range(t + 1):
            rows.append(_rec(end, t, i, "acc", float(WORKED[t, i])))
            rows.append(_rec(end, t, i, "acc_task_il", 95.0 - 5.0 * (t - i)))
        if t + 1 < 3:
            rows.append(_rec(end, t, t + 1, "acc", [20.0, 30.0][t]))  # for FWT
        for i in range(t):
            rows.append(_rec(end, t, i, "kl_drift", [[0.2], [0.4, 0.6]][t - 1][i]))
    for r in range(6):
        rows.append(_rec(r, r // 2, -1, "bytes_up", 1000.0 + r))
        rows.append(_rec(r, r // 2, -1, "bytes_down", 500.0))
    for k, v in enumerate([50.0, 10.0, 30.0, 40.0, 20.0]):
        rows.append(_rec(3, 1, -1, "client_acc", 0.0, scope=f"client_{k}"))  # earlier task
        rows.append(_rec(5, 2, -1, "client_acc", v, scope=f"client_{k}"))
    return _frame(rows)


def test_summarize_all_keys() -> None:
    s = summarize(_run_records(), num_tasks=3)
    text = json.dumps(s, allow_nan=False)  # must not raise
    assert json.loads(text) == s

    expected_keys = {
        "Acc_T",
        "Fgt_T",
        "Fgt_T_clipped",
        "BWT",
        "FWT",
        "md_t",
        "MD_T",
        "bytes_up_total",
        "bytes_down_total",
        "bytes_up_per_round_mean",
        "client_acc_p10",
        "client_acc_p50",
        "client_acc_p90",
    }
    for m in ("acc", "acc_task_il"):
        expected_keys |= {
            f"{m}_matrix",
            f"{m}_t",
            f"{m}_T",
            f"fgt_{m}_t",
            f"fgt_{m}_T",
            f"fgt_clipped_{m}_T",
            f"bwt_{m}",
            f"fwt_{m}",
        }
    assert expected_keys <= set(s)

    assert s["acc_matrix"][0] == [90.0, 20.0, None]
    assert s["acc_matrix"][2] == [60.0, 75.0, 80.0]
    assert s["Acc_T"] == pytest.approx(215.0 / 3)
    assert s["acc_T"] == s["Acc_T"]
    assert s["acc_t"] == pytest.approx([90.0, 77.5, 215.0 / 3])
    assert s["fgt_acc_t"][0] is None
    assert s["Fgt_T"] == pytest.approx(20.0)
    assert s["Fgt_T_clipped"] == pytest.approx(20.0)
    assert s["BWT"] == pytest.approx(-20.0)
    assert s["FWT"] == pytest.approx(((20.0 - 12.0) + (30.0 - 8.0)) / 2)

    assert s["acc_task_il_T"] == pytest.approx((85.0 + 90.0 + 95.0) / 3)
    assert s["bwt_acc_task_il"] == pytest.approx(-7.5)
    assert s["fwt_acc_task_il"] is None  # no above-diagonal task-IL entries

    assert s["md_t"][0] is None
    assert s["md_t"][1:] == pytest.approx([0.2, 0.5])
    assert s["MD_T"] == pytest.approx(0.5)

    assert s["bytes_up_total"] == 6015 and isinstance(s["bytes_up_total"], int)
    assert s["bytes_down_total"] == 3000 and isinstance(s["bytes_down_total"], int)
    assert s["bytes_up_per_round_mean"] == pytest.approx(1002.5)

    assert s["client_acc_p10"] == pytest.approx(14.0)
    assert s["client_acc_p50"] == pytest.approx(30.0)
    assert s["client_acc_p90"] == pytest.approx(46.0)

    # Pure function of the records: row order does not matter.
    shuffled = _run_records().sample(frac=1.0, random_state=0)
    assert summarize(shuffled, num_tasks=3) == s


def test_summarize_unfinished_run_and_missing_extras() -> None:
    # Only the accuracy of two of three tasks: the _T numbers are unknown, not made up.
    recs = _frame([_rec(1, 0, 0, "acc", 90.0), _rec(3, 1, 0, "acc", 70.0)])
    s = summarize(recs, num_tasks=3)
    json.dumps(s, allow_nan=False)
    assert s["acc_t"][0] == 90.0
    assert s["Acc_T"] is None and s["Fgt_T"] is None and s["BWT"] is None
    assert "acc_task_il_T" not in s
    assert s["md_t"] == [None, None, None] and s["MD_T"] is None
    assert s["bytes_up_total"] is None and s["bytes_up_per_round_mean"] is None
    assert s["client_acc_p50"] is None


def test_summarize_single_task() -> None:
    recs = _frame(
        [
            _rec(0, -1, 0, "acc", 10.0),
            _rec(0, 0, 0, "acc", 73.0),
            _rec(0, 0, -1, "bytes_up", 100.0),
            _rec(0, 0, -1, "client_acc", 70.0, scope="client_0"),
        ]
    )
    s = summarize(recs, num_tasks=1)
    json.dumps(s, allow_nan=False)
    assert s["Acc_T"] == 73.0
    assert s["Fgt_T"] is None and s["Fgt_T_clipped"] is None
    assert s["BWT"] is None and s["FWT"] is None
    assert s["md_t"] == [None] and s["MD_T"] is None
    assert s["bytes_up_total"] == 100
    assert s["client_acc_p10"] == s["client_acc_p90"] == 70.0
