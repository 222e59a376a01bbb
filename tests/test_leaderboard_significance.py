"""Which rows are indistinguishable from the best, confidence intervals, and the FCL
metrics of the leaderboard (average incremental accuracy, rounds / bytes to a target).

Every expected number is computed by hand in the comments (t quantiles and p values from a
Student-t table), so a wrong formula cannot pass by agreeing with itself.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest

from cfl_bench.core.errors import UserError
from cfl_bench.core.metrics import first_reaching, progress_by_round
from cfl_bench.leaderboard.aggregate import BOARD_COLUMNS, aggregate
from cfl_bench.leaderboard.runs import load_runs
from cfl_bench.leaderboard.significance import (
    BEST,
    BEST_ONE_SEED,
    ONE_SEED,
    WELCH,
    ci95_half_width,
    compare_with_best,
    holm,
    paired_t,
    welch_t,
)
from cfl_bench.leaderboard.table import board_csv
from cfl_bench.leaderboard.targets import check_target
from tests.leaderboard_fixtures import protocol, standard_runs, write_recorded_run, write_run
from tests.sweep_helpers import TINY
from tests.test_cli import in_process


def flat(text: str) -> str:
    return " ".join(text.split())


# --- the statistics, by hand --------------------------------------------------------------


def test_ci95_half_width_for_three_seeds() -> None:
    # 50, 60, 70: s = 10, n = 3, t_0.975(2) = 4.303 (a table, ± 0.0005 → ± 0.003) → 24.84
    assert ci95_half_width([50.0, 60.0, 70.0]) == pytest.approx(4.303 * 10 / math.sqrt(3), abs=3e-3)
    # 80, 90: s = √50, t_0.975(1) = 12.706 → 12.706 · √50 / √2 = 63.53
    assert ci95_half_width([80.0, 90.0]) == pytest.approx(63.53, abs=5e-3)
    assert math.isnan(ci95_half_width([42.0]))  # one seed: no interval
    assert math.isnan(ci95_half_width([1.0, math.nan]))


def test_paired_t_of_three_seeds() -> None:
    # differences other − best per seed: −1, −2, −3 → mean −2, s_d = 1, se = 1/√3,
    # t = −2√3 = −3.4641 with 2 df; a t table gives P(|T| ≥ 3.4641) = 0.0742
    best = {0: 71.0, 1: 72.0, 2: 73.0}
    other = {0: 70.0, 1: 70.0, 2: 70.0}
    test = paired_t(best, other)
    assert test.name == "paired t, 3 seeds" and test.df == 2.0
    assert test.statistic == pytest.approx(-2 * math.sqrt(3), abs=1e-12)
    assert test.p == pytest.approx(0.0742, abs=5e-4)
    # only the shared seeds are paired: seed 7 of ``best`` is left out
    assert paired_t({**best, 7: 10.0}, other).p == test.p
    # no spread in the differences: a constant gap is certain, no gap is p = 1
    assert paired_t({0: 1.0, 1: 2.0}, {0: 3.0, 1: 4.0}).p == 0.0
    assert paired_t({0: 1.0, 1: 2.0}, {0: 1.0, 1: 2.0}).p == 1.0
    # the same gap of 0.1 computed in floats (0.10000000000000009, 0.09999999999999998) is
    # still "no spread", not a t of 10¹⁵ with a p of 1e-16
    assert paired_t({0: 0.7, 1: 0.1 + 0.2}, {0: 0.8, 1: 0.4}).p == 0.0
    with pytest.raises(ValueError, match="two shared seeds"):
        paired_t({0: 1.0, 1: 2.0}, {0: 1.0, 5: 2.0})


def test_welch_t_by_hand() -> None:
    # best 80, 90 (var 50, n 2); other 50, 60, 70 (var 100, n 3):
    # se² = 50/2 + 100/3 = 58.333, t = (60 − 85)/√58.333 = −3.2733
    # df = 58.333² / (25²/1 + 33.333²/2) = 3402.8 / 1180.6 = 2.8824
    test = welch_t([80.0, 90.0], [50.0, 60.0, 70.0])
    assert test.name == WELCH
    assert test.statistic == pytest.approx(-25 / math.sqrt(175 / 3), abs=1e-12)
    assert test.df == pytest.approx(2.8824, abs=5e-4)
    # P(|T| ≥ 3.2733) falls as df grows, so with 2.88 df it lies between its values at
    # df 3 (0.0467) and df 2 (0.0820)
    assert 0.0467 < test.p < 0.0820
    assert welch_t([1.0, 1.0], [1.0, 1.0]).p == 1.0  # no spread, no difference


def test_holm_adjustment_of_known_p_values() -> None:
    # sorted 0.01, 0.02, 0.04 (m = 3): 3·0.01 = 0.03, 2·0.02 = 0.04, 1·0.04 = 0.04
    assert holm([0.04, 0.01, 0.02]) == pytest.approx([0.04, 0.03, 0.04])
    # monotone: 3·0.01 = 0.03, 2·0.012 = 0.024 → raised to 0.03; capped at 1
    assert holm([0.01, 0.012, 0.9]) == pytest.approx([0.03, 0.03, 0.9])
    assert holm([0.5, 0.6]) == pytest.approx([1.0, 1.0])
    assert holm([]) == []


def test_compare_with_best_marks_best_tied_and_untested() -> None:
    rows = [
        {0: 71.0, 1: 72.0, 2: 73.0},  # best (mean 72)
        {0: 70.0, 1: 70.0, 2: 70.0},  # paired: raw p 0.0742
        {0: 10.0, 1: 11.0, 2: 13.0},  # paired: d = −61, −61, −60 → raw p ≈ 0.0001
        {0: 9.0},  # one seed
        {0: math.nan, 1: 1.0},  # no mean (a NaN seed)
    ]
    out = compare_with_best(rows, "higher")
    assert out[0].test == BEST and out[0].tied is True and math.isnan(out[0].p)
    # Holm over 2 tests: the smaller p times 2, then 0.0742 times 1 (≥ the previous)
    assert out[1].test == "paired t, 3 seeds" and out[1].p == pytest.approx(0.0742, abs=5e-4)
    assert out[1].tied is True  # 0.074 ≥ 0.05: indistinguishable
    assert out[2].tied is False and out[2].p < 0.01
    assert (out[3].test, out[3].tied) == (ONE_SEED, None) and math.isnan(out[3].p)
    assert (out[4].test, out[4].tied) == ("", None)
    # a best with one seed: nothing is tested
    single = compare_with_best([{0: 90.0}, {0: 50.0, 1: 60.0}], "higher")
    assert [c.test for c in single] == [BEST, BEST_ONE_SEED]
    # lower is better (forgetting): the smallest mean is the best
    assert compare_with_best([{0: 5.0, 1: 6.0}, {0: 1.0, 1: 2.0}], "lower")[1].test == BEST


# --- the board ---------------------------------------------------------------------------


def test_board_columns_on_the_standard_runs(tmp_path: Path) -> None:
    board = aggregate(load_runs([standard_runs(tmp_path)]))
    a = board[board.protocol_hash == board.iloc[1].protocol_hash].set_index("strategy")
    der, fedavg = a.loc["der+fedgp"], a.loc["fedavg"]
    # der+fedgp (80, 90) is best; fedavg (50, 60, 70) shares seeds 0 and 1 with it:
    # paired d = −30, −30 → no spread, a certain difference (p = 0); the hostile-named row
    # (40, 42) shares seeds 0, 1 too: d = −40, −48 → t = −44/(4) = −11, 1 df, p = 0.0577
    assert der.Acc_T_test == BEST and der.Acc_T_tied_best == "true"
    assert fedavg.Acc_T_test == "paired t, 2 seeds" and fedavg.Acc_T_p_vs_best == 0.0
    assert fedavg.Acc_T_tied_best == "false"
    evil = a.drop(index=["der+fedgp", "fedavg"]).iloc[0]
    # Holm over 2: sorted 0 (×2 = 0), 0.0577 (×1) → 0.0577 ≥ 0.05: indistinguishable
    assert evil.Acc_T_p_vs_best == pytest.approx(0.0577, abs=5e-4)
    assert evil.Acc_T_tied_best == "true"
    assert fedavg.Acc_T_ci95 == pytest.approx(4.303 * 10 / math.sqrt(3), abs=3e-3)
    single = board[board.n_seeds == 1].iloc[0]  # protocol B: one seed, alone
    assert single.Acc_T_test == BEST and math.isnan(single.Acc_T_ci95)
    # the CSV holds text for the test and the tie, empty where nothing was tested
    text = board_csv(board)
    header = text.splitlines()[0].split(",")
    assert header == list(BOARD_COLUMNS)
    for column in ("Acc_T_ci95", "Acc_T_test", "Acc_T_p_vs_best", "Acc_T_tied_best", "AIA_mean"):
        assert column in header


def test_aia_is_the_mean_of_acc_t(tmp_path: Path) -> None:
    # fixture matrix of Acc_T = 50: rows 60 / 60 60 / 50 50 50 → Acc_t = 60, 60, 50,
    # AIA = 170 / 3 = 56.667; task-IL (70 + 5 = 75, 75, 70) → 220 / 3 = 73.333
    write_run(tmp_path, "r", acc=50.0, proto=protocol("seq-cifar10"), scenario="class-il")
    runs = load_runs([tmp_path])
    assert pytest.approx(170 / 3, abs=1e-12) == runs.iloc[0].AIA
    board = aggregate(runs)
    assert board.iloc[0].AIA_mean == pytest.approx(170 / 3, abs=1e-12)
    assert board.iloc[0].AIA_task_il_mean == pytest.approx(220 / 3, abs=1e-12)


# --- rounds / bytes to a target ------------------------------------------------------------


def test_progress_and_first_reaching_by_hand(tmp_path: Path) -> None:
    # write_recorded_run: 3 tasks × 2 rounds, evaluated at task ends (rounds 2, 4, 6);
    # a[t][i] = 40 + 10 i + 5 t − 3 (t − i): after task 0: 40; after task 1: 42, 55 →
    # 48.5; after task 2: 44, 57, 70 → 57 (the task-t+1 entries, 12.5, are left out).
    # Bytes: 4 clients × (1000 up + 3000 down) = 16000 a round.
    path = write_recorded_run(tmp_path, "r")
    records = pd.read_csv(path / "records.csv")
    progress = progress_by_round(records, 3)
    assert progress == [(2, 40.0, 32000.0), (4, 48.5, 64000.0), (6, 57.0, 96000.0)]
    assert first_reaching(progress, 48.5) == (4, 64000.0)  # ≥, not >
    assert first_reaching(progress, 57.5) is None


def test_target_columns_reached_and_not_reached(tmp_path: Path) -> None:
    for seed in (0, 1):
        write_recorded_run(tmp_path, f"s{seed}", seed=seed)
    runs = load_runs([tmp_path])
    got = aggregate(runs, target=45.0).iloc[0]
    assert (got.target, got.rounds_to_target_mean, got.rounds_to_target_std) == (45.0, 4.0, 0.0)
    assert got.bytes_to_target_mean == 64000.0 and got.n_target_not_reached == 0
    missed = aggregate(runs, target=60.0).iloc[0]
    assert missed.n_target_not_reached == 2 and math.isnan(missed.rounds_to_target_mean)
    none = aggregate(runs).iloc[0]  # no --target: every target cell empty
    assert math.isnan(none.target) and none.n_target_not_reached is None
    row = board_csv(aggregate(runs)).splitlines()[1].split(",")
    header = board_csv(aggregate(runs)).splitlines()[0].split(",")
    assert row[header.index("n_target_not_reached")] == ""


@pytest.mark.parametrize("bad", [0.0, -5.0, 100.5, math.nan, math.inf])
def test_check_target_refuses_outside_percent(bad: float) -> None:
    with pytest.raises(UserError, match=r"not an accuracy in percent.*\(0, 100\]"):
        check_target(bad)


def test_target_on_the_command_line(tmp_path: Path) -> None:
    for seed in (0, 1):
        write_recorded_run(tmp_path / "runs", f"s{seed}", seed=seed)
    out = tmp_path / "o"
    code, output = in_process("leaderboard", str(tmp_path / "runs"), "--out", str(out),
                              "--target", "120")  # fmt: skip
    assert code == 2 and "Traceback" not in output, output
    lines = [line for line in output.splitlines() if line.strip()]
    assert len(lines) == 1 and "--target 120 is not an accuracy in percent" in flat(output)
    assert not out.exists()  # refused before anything was written
    code, output = in_process("leaderboard", str(tmp_path / "runs"), "--out", str(out),
                              "--target", "46")  # fmt: skip
    assert code == 0, output
    assert "to 46%" in output and "(first evaluated round, mean over seeds)" in flat(output)
    html = (out / "leaderboard.html").read_text()
    assert "4 rounds · 64 KB" in html  # 64000 B, decimal units
    code, output = in_process("leaderboard", str(tmp_path / "runs"), "--out", str(out),
                              "--target", "99")  # fmt: skip
    assert code == 0 and "not reached" in output, output
    assert "not reached" in (out / "leaderboard.html").read_text()
    csv = pd.read_csv(out / "leaderboard.csv", keep_default_na=False)
    assert csv.n_target_not_reached[0] == 2 and csv.rounds_to_target_mean[0] == ""
    # a fraction is a legal (tiny) percentage, but the command says how it was read
    code, output = in_process("leaderboard", str(tmp_path / "runs"), "--out", str(out),
                              "--target", "0.8")  # fmt: skip
    assert code == 0 and "--target 0.8 means 0.8 %; accuracies are percentages" in flat(output)


# --- end to end ---------------------------------------------------------------------------


def test_terminal_and_html_mark_the_rows(tmp_path: Path) -> None:
    root = standard_runs(tmp_path / "runs")
    code, output = in_process("leaderboard", str(root), "--out", str(tmp_path / "o"))
    assert code == 0, output
    text = flat(output)
    assert "85.00±7.07   ▲ best" in output  # der+fedgp: the best
    assert "60.00±10.00   ≠ best" in output  # fedavg: p = 0 after Holm
    assert "41.00±1.41   ≈ tied" in output  # the hostile name: Holm p = 0.0577
    assert "Holm-corrected over the 2 rows tested, α = 0.05" in text
    assert "≈ tied = statistically indistinguishable" in text
    html = flat((tmp_path / "o" / "leaderboard.html").read_text())
    assert "▲ best" in html and "≈ indistinguishable (Holm p = 0.0577, paired t, 2 seeds)" in html
    assert "Holm–Bonferroni-corrected over the 2 rows compared with the best" in html


def test_end_to_end_real_runs_share_splits_and_get_marked(tmp_path: Path) -> None:
    """Two strategies × two seeds on the embedded stream: seed k gives both strategies the
    same client split (what pairing by seed relies on), and the board tests them paired."""
    tiny = [*TINY, "--probe-size", "50", "--threads", "1"]
    for strategy in ("fedavg", "der"):
        for seed in (0, 1):
            out = tmp_path / "runs" / f"{strategy}_s{seed}"
            code, output = in_process(
                "run", *tiny, "--strategy", strategy, "--seed", str(seed), "--out", str(out)
            )
            assert code == 0, output
    splits = {
        p.name: json.loads((p / "config.json").read_text())["client_class_counts"]
        for p in (tmp_path / "runs").iterdir()
    }
    assert splits["fedavg_s0"] == splits["der_s0"] and splits["fedavg_s1"] == splits["der_s1"]
    assert splits["fedavg_s0"] != splits["fedavg_s1"]
    code, output = in_process(
        "leaderboard", str(tmp_path / "runs"), "--out", str(tmp_path / "lb"), "--target", "20"
    )
    assert code == 0, output
    csv = pd.read_csv(tmp_path / "lb" / "leaderboard.csv", keep_default_na=False, dtype=str)
    assert sorted(csv.Acc_T_test) == [BEST, "paired t, 2 seeds"]
    other = csv[csv.Acc_T_test != BEST].iloc[0]
    assert other.Acc_T_tied_best in ("true", "false") and 0.0 <= float(other.Acc_T_p_vs_best) <= 1.0
    assert "▲ best" in output and "to 20%" in output


def test_check_reads_the_new_columns(tmp_path: Path) -> None:
    """``--check`` targets may name the CI, the adjusted p and the target columns."""
    from cfl_bench.leaderboard.check import check_targets, read_targets

    for seed in (0, 1):
        write_recorded_run(tmp_path / "runs", f"s{seed}", seed=seed)
    board = aggregate(load_runs([tmp_path / "runs"]), target=45.0)
    targets = tmp_path / "t.csv"
    targets.write_text(
        "strategy,metric,target,tolerance\n"
        "der,rounds_to_target_mean,4,0\n"  # both seeds: round 4 (Acc_t 48.5 ≥ 45)
        "der,n_target_not_reached,0,0\n"
        "der,Acc_T_ci95,0,0\n"  # identical seeds: s = 0, so the interval is 0 wide
    )
    outcomes = check_targets(board, read_targets(targets))
    assert [o.met for o in outcomes] == [True, True, True], outcomes
