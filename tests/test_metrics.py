"""Tests for cfl_bench.core.metrics against hand-computed values.

Why hand-computed: the metrics define what the leaderboard means, so each test pins a number
worked out on paper from the definitions (docs/metrics.md) rather than re-deriving it with the
same code. Several matrices carry deliberately *high* entries above the diagonal (task i
evaluated before it was trained, which the engine records for FWT): any metric other than
FWT that read them would change its value, so the tests catch such a leak.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pandas as pd
import pytest

from cfl_bench.core.metrics import (
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

# The worked example of docs/metrics.md (T = 3, values in %).
WORKED = np.array(
    [
        [90.0, NAN, NAN],
        [70.0, 85.0, NAN],
        [60.0, 75.0, 80.0],
    ]
)
# Its second example: the same lower triangle plus the pre-training evaluations the engine
# makes for FWT. a[0][1] = 95 was measured before task 1 (0-based) was trained.
WORKED_FWT = np.array(
    [
        [90.0, 95.0, NAN],
        [70.0, 85.0, 40.0],
        [60.0, 75.0, 80.0],
    ]
)
# An old task that improves, under a wall of 99s above the diagonal.
IMPROVES_HIGH = np.array(
    [
        [50.0, 99.0, 99.0],
        [40.0, 80.0, 99.0],
        [60.0, 70.0, 75.0],
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


def test_forgetting_ignores_evaluations_before_training() -> None:
    """The bug: a[0][1] = 95 (task 1 before training) entered the max → Fgt_3 = 25."""
    chaudhry = forgetting(WORKED_FWT)
    assert math.isnan(chaudhry[0])
    # t=1: 90 - 70 = 20. t=2: task 0: max(90, 70) - 60 = 30; task 1: max(85) - 75 = 10.
    np.testing.assert_allclose(chaudhry[1:], [20.0, 20.0])
    assert chaudhry[2] != pytest.approx(25.0)  # the leaky value: (30 + (95 - 75)) / 2
    clipped = forgetting(WORKED_FWT, include_current=True)
    # t=1: max(90, 70) - 70 = 20. t=2: task 0: max(90, 70, 60) - 60 = 30;
    # task 1: max(85, 75) - 75 = 10; mean 20 (leaky: max(95, 85, 75) - 75 = 20 → 25).
    np.testing.assert_allclose(clipped[1:], [20.0, 20.0])
    # Identical to the matrix without the pre-training entries.
    np.testing.assert_array_equal(chaudhry, forgetting(WORKED))
    np.testing.assert_array_equal(clipped, forgetting(WORKED, include_current=True))


def test_forgetting_rules_differ_under_a_high_upper_triangle() -> None:
    chaudhry = forgetting(IMPROVES_HIGH)
    # t=1: 50 - 40 = 10. t=2: ((max(50, 40) - 60) + (80 - 70)) / 2 = (-10 + 10) / 2 = 0
    # (leaky: (-10 + (99 - 70)) / 2 = 9.5).
    np.testing.assert_allclose(chaudhry[1:], [10.0, 0.0])
    clipped = forgetting(IMPROVES_HIGH, include_current=True)
    # t=1: max(50, 40) - 40 = 10. t=2: ((max(50, 40, 60) - 60) + (max(80, 70) - 70)) / 2
    # = (0 + 10) / 2 = 5 (leaky: (0 + 29) / 2 = 14.5).
    np.testing.assert_allclose(clipped[1:], [10.0, 5.0])


@pytest.mark.parametrize("fill", [99.0, 100.0, 0.0, -1e9])
def test_upper_triangle_changes_nothing_but_fwt(fill: float) -> None:
    """Whatever sits above the diagonal, only FWT (which is defined on a[i-1][i]) moves."""
    for base in (WORKED, IMPROVES_HIGH):
        lower = np.where(np.tril(np.ones_like(base)) > 0, base, NAN)
        filled = np.where(np.isnan(lower), fill, lower)
        np.testing.assert_array_equal(average_accuracy(filled), average_accuracy(lower))
        for rule in (False, True):
            np.testing.assert_array_equal(
                forgetting(filled, include_current=rule), forgetting(lower, include_current=rule)
            )
        assert backward_transfer(filled) == backward_transfer(lower)
        np.testing.assert_array_equal(memory_drift(filled), memory_drift(lower))
        b = np.array([1.0, 2.0, 3.0])
        assert forward_transfer(filled, b) == pytest.approx(((fill - 2.0) + (fill - 3.0)) / 2)


def _reference_metrics(a: list[list[float]], b: list[float]) -> dict[str, list[float] | float]:
    """The definitions, written out with loops over 0-based indices (no numpy slicing), so a
    slicing mistake in the library cannot be repeated here."""
    size = len(a)
    acc = [sum(a[t][i] for i in range(t + 1)) / (t + 1) for t in range(size)]
    fgt: list[float] = [NAN]
    fgt_clipped: list[float] = [NAN]
    for t in range(1, size):
        terms, clipped_terms = [], []
        for i in range(t):
            best_before = max(a[s][i] for s in range(i, t))  # s from i: after training i
            best_incl = max(a[s][i] for s in range(i, t + 1))
            terms.append(best_before - a[t][i])
            clipped_terms.append(best_incl - a[t][i])
        fgt.append(sum(terms) / t)
        fgt_clipped.append(sum(clipped_terms) / t)
    last = size - 1
    bwt = sum(a[last][i] - a[i][i] for i in range(last)) / last
    fwt = sum(a[i - 1][i] - b[i] for i in range(1, size)) / (size - 1)
    return {"acc": acc, "fgt": fgt, "fgt_clipped": fgt_clipped, "bwt": bwt, "fwt": fwt}


def _leaky_forgetting(a: np.ndarray) -> float:
    """Fgt_T as the suite computed it before the fix (max over every earlier row), used
    only to prove that the random matrices below would have caught the bug."""
    last = a.shape[0] - 1
    return float(np.mean([np.nanmax(a[:last, i]) - a[last, i] for i in range(last)]))


def test_random_matrices_match_the_reference() -> None:
    """200 random matrices, lower triangle in [0, 90], every entry above the diagonal in
    [95, 100]: any read of a pre-training evaluation raises a max and changes the result."""
    rng = np.random.default_rng(20240611)
    leaks_visible = 0
    for _ in range(200):
        size = int(rng.integers(2, 8))
        a = np.triu(rng.uniform(95.0, 100.0, (size, size)), k=1)
        a += np.tril(rng.uniform(0.0, 90.0, (size, size)))
        b = rng.uniform(0.0, 20.0, size)
        ref = _reference_metrics(a.tolist(), b.tolist())
        np.testing.assert_allclose(average_accuracy(a), ref["acc"], rtol=0, atol=1e-9)
        np.testing.assert_allclose(forgetting(a), ref["fgt"], rtol=0, atol=1e-9)
        np.testing.assert_allclose(
            forgetting(a, include_current=True), ref["fgt_clipped"], rtol=0, atol=1e-9
        )
        assert backward_transfer(a) == pytest.approx(ref["bwt"], abs=1e-9)
        assert forward_transfer(a, b) == pytest.approx(ref["fwt"], abs=1e-9)
        if size > 2:  # from T = 3 on, a[i-1][i] with i < T-1 sits inside the max's rows
            leaks_visible += _leaky_forgetting(a) != pytest.approx(forgetting(a)[-1])
    assert leaks_visible > 100  # the test has teeth: the old rule fails on these matrices


def test_missing_required_entry_propagates_nan() -> None:
    a = WORKED.copy()
    a[2, 1] = NAN
    assert math.isnan(average_accuracy(a)[2])
    assert math.isnan(forgetting(a)[2])
    assert math.isnan(backward_transfer(a))
    assert average_accuracy(a)[1] == pytest.approx(77.5)
    # An entry inside the max's rows (s >= i) is required too: a max over fewer evaluations
    # would report less forgetting than happened.
    gap = np.array(
        [
            [90.0, NAN, NAN, NAN],
            [NAN, 85.0, NAN, NAN],
            [60.0, 75.0, 80.0, NAN],
            [50.0, 70.0, 78.0, 88.0],
        ]
    )
    fgt = forgetting(gap)
    assert math.isnan(fgt[1]) and math.isnan(fgt[2]) and math.isnan(fgt[3])
    assert math.isnan(forgetting(gap, include_current=True)[3])


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


def test_mean_kl_by_hand_and_never_below_zero() -> None:
    """KL([0.5, 0.5] ‖ [0.25, 0.75]) = 0.5·ln 2 + 0.5·ln(2/3) = 0.143841; a q equal to p
    up to rounding (log q = log p + 1e-7) sums to -1e-7 and is floored at 0, since a
    negative kl_drift would make the run reader call the run damaged."""
    import torch

    from cfl_bench.core.evaluation import mean_kl

    log_p = torch.tensor([[0.5, 0.5]]).log()
    log_q = torch.tensor([[0.25, 0.75]]).log()
    assert float(mean_kl(log_p, log_q)) == pytest.approx(0.143841, abs=1e-6)
    assert float((log_p.exp() * (log_p - (log_p + 1e-7))).sum(dim=1).mean()) < 0
    assert float(mean_kl(log_p, log_p + 1e-7)) == 0.0


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


# Task-IL matrix of the records test below: task 0 improves at the end (rules differ), and
# the pre-training entries a[0][1], a[1][2] are 99, above everything that was trained.
TASK_IL_FWT = np.array(
    [
        [50.0, 99.0, NAN],
        [40.0, 80.0, 99.0],
        [60.0, 70.0, 75.0],
    ]
)


def _records_with_pre_training_rows() -> pd.DataFrame:
    """A 3-task run as the engine records it: the initial model on every task (trained_task
    = -1), a mid-task evaluation round per task (100 everywhere, must be ignored), and at each
    task end tasks 0..t+1, i.e. including task t+1 before it is trained."""
    rows: list[dict[str, Any]] = []
    for i, (b, b_til) in enumerate(zip([10.0, 12.0, 8.0], [50.0, 50.0, 50.0], strict=True)):
        rows += [_rec(0, -1, i, "acc", b), _rec(0, -1, i, "acc_task_il", b_til)]
    for t in range(3):
        end = 2 * t + 2
        for i in range(min(t + 1, 2) + 1):
            rows += [_rec(end - 1, t, i, "acc", 100.0), _rec(end - 1, t, i, "acc_task_il", 100.0)]
            rows.append(_rec(end, t, i, "acc", float(WORKED_FWT[t, i])))
            rows.append(_rec(end, t, i, "acc_task_il", float(TASK_IL_FWT[t, i])))
    return _frame(rows)


def test_summarize_ignores_pre_training_rows() -> None:
    s = summarize(_records_with_pre_training_rows(), num_tasks=3)
    assert s["acc_matrix"] == [[90.0, 95.0, None], [70.0, 85.0, 40.0], [60.0, 75.0, 80.0]]
    # class-IL: the spec's second example. Fgt_3 = ((90-60) + (85-75)) / 2 = 20, not 25.
    assert s["fgt_acc_t"][0] is None and s["fgt_acc_t"][1:] == pytest.approx([20.0, 20.0])
    assert s["fgt_acc_T"] == pytest.approx(20.0) and s["Fgt_T"] == s["fgt_acc_T"]
    # clipped: ((max(90,70,60) - 60) + (max(85,75) - 75)) / 2 = 20 (leaky: 25).
    assert s["fgt_clipped_acc_T"] == pytest.approx(20.0) and s["Fgt_T_clipped"] == 20.0
    assert s["Acc_T"] == pytest.approx(215.0 / 3)
    assert s["BWT"] == pytest.approx(-20.0)  # ((60-90) + (75-85)) / 2
    assert s["FWT"] == pytest.approx(((95.0 - 12.0) + (40.0 - 8.0)) / 2)  # reads a[i-1][i]
    # task-IL: Chaudhry t=1: 50-40 = 10; t=2: ((50-60) + (80-70)) / 2 = 0 (leaky: 9.5).
    assert s["fgt_acc_task_il_t"][1:] == pytest.approx([10.0, 0.0])
    assert s["fgt_acc_task_il_T"] == pytest.approx(0.0)
    # clipped: ((max(50,40,60) - 60) + (max(80,70) - 70)) / 2 = 5 (leaky: 14.5).
    assert s["fgt_clipped_acc_task_il_T"] == pytest.approx(5.0)
    assert s["acc_task_il_T"] == pytest.approx((60.0 + 70.0 + 75.0) / 3)
    assert s["bwt_acc_task_il"] == pytest.approx(0.0)  # ((60-50) + (70-80)) / 2
    assert s["fwt_acc_task_il"] == pytest.approx(((99.0 - 50.0) + (99.0 - 50.0)) / 2)


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
