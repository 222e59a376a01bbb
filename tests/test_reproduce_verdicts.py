"""The verdict rules of `cfl-bench reproduce`, on hand-made tables.

Why by hand: a verdict is what a reader takes away from a reproduction ("FedGP's gain holds",
"this cell differs"), so each rule is checked on numbers whose answer is worked out here:
the combined spread, the three verdicts and "missing", claims whose printed direction is a
decrease, claims inside their seed noise, the seed pairing, the upper-bound claims and
Kendall's τ-a.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from cfl_bench.reproduce.verdict import (
    DIFFERS,
    HOLDS,
    INSIDE_NOISE,
    MISSING,
    ONE_SEED,
    REVERSED,
    SAME_DIRECTION,
    WITHIN,
    Cell,
    Claim,
    ClaimResult,
    Ours,
    combined_spread,
    counts,
    judge_cells,
    judge_claims,
    kendall_tau,
    paired_difference,
    resolving_t,
    table_claims,
)


def test_ours_mean_and_sample_sd() -> None:
    ours = Ours((52.0, 56.0))
    assert ours.mean == 54.0
    assert ours.sd == pytest.approx(math.sqrt(8.0))  # ((−2)² + 2²) / (2 − 1)
    assert Ours((3.0,)).sd is None


def test_combined_spread_is_the_root_sum_of_squares() -> None:
    assert combined_spread(3.0, 4.0) == 5.0
    assert combined_spread(None, 4.0) == 4.0  # the paper printed no ±
    assert combined_spread(2.0, None) == 2.0  # one seed of ours


def two_row_table(
    paper: tuple[float, float],
    ours: tuple[tuple[float, ...], tuple[float, ...]],
    pm: float = 1.0,
) -> tuple[list[Cell], list[Claim]]:
    """Rows 'A w/o' and 'A w/' in one column 'c', with one pair claim between them."""
    cells = [
        Cell("A w/o", "c", paper[0], pm, Ours(ours[0]) if ours[0] else None),
        Cell("A w/", "c", paper[1], pm, Ours(ours[1]) if ours[1] else None),
    ]
    return cells, table_claims(["c"], ["A w/o", "A w/"], [("A w/o", "A w/")], None)


def test_within_noise_same_direction_and_differs() -> None:
    # Paper 50 ± 1 → 60 ± 1. Ours 50.5 (inside 1) and 58, 60 (mean 59, sd √2; spread √3).
    cells, claims = two_row_table((50.0, 60.0), ((50.5,), (58.0, 60.0)))
    verdicts = judge_cells(cells, judge_claims(cells, claims))
    assert [v.verdict for v in verdicts] == [WITHIN, WITHIN]
    assert verdicts[1].spread == pytest.approx(math.sqrt(1.0 + 2.0))
    # Ours 40, 41 → 45, 47: both 9+ below the paper, but FedGP still raises accuracy, by
    # 5 and 6 per seed (mean 5.5, standard error 0.5: 11 SE > t₀.₉₅(1) = 6.31, resolved).
    cells, claims = two_row_table((50.0, 60.0), ((40.0, 41.0), (45.0, 47.0)))
    verdicts = judge_cells(cells, judge_claims(cells, claims))
    assert [v.verdict for v in verdicts] == [SAME_DIRECTION, SAME_DIRECTION]
    # Ours 40, 41 → 35, 36: the gain is reversed, so both cells differ and say why.
    cells, claims = two_row_table((50.0, 60.0), ((40.0, 41.0), (35.0, 36.0)))
    verdicts = judge_cells(cells, judge_claims(cells, claims))
    assert [v.verdict for v in verdicts] == [DIFFERS, DIFFERS]
    assert verdicts[0].failed_claims == ("A w/o → A w/ (reversed)",)


def test_a_claim_inside_its_noise_or_on_one_seed_does_not_hold() -> None:
    """The sign alone is not enough: +5 and −3 per seed (mean +1, SE 4) is noise."""
    cells, claims = two_row_table((50.0, 60.0), ((40.0, 44.0), (45.0, 41.0)))
    (result,) = judge_claims(cells, claims)
    assert (result.ours_difference, result.ours_se) == (1.0, pytest.approx(4.0))
    assert result.seeds == 2
    assert (result.status, result.holds) == (INSIDE_NOISE, False)
    verdicts = judge_cells(cells, [result])
    assert [v.verdict for v in verdicts] == [DIFFERS, DIFFERS]
    assert verdicts[1].failed_claims == ("A w/o → A w/ (inside noise)",)
    # One seed: no standard error, so nothing is resolved.
    cells, claims = two_row_table((50.0, 60.0), ((40.0,), (45.0,)))
    (result,) = judge_claims(cells, claims)
    assert (result.ours_difference, result.ours_se, result.status) == (5.0, None, ONE_SEED)
    assert result.seeds == 1
    assert [v.verdict for v in judge_cells(cells, [result])] == [DIFFERS, DIFFERS]


def test_claims_pair_the_seeds_both_rows_ran() -> None:
    low = Ours((10.0, 12.0, 14.0), (0, 1, 2))
    # Per-seed differences 1, 3, 0: mean 4/3, sd √(7/3), standard error √(7/3)/√3.
    assert paired_difference(low, Ours((11.0, 15.0, 14.0), (0, 1, 2))) == (
        pytest.approx(4 / 3),
        pytest.approx(math.sqrt(7 / 3) / math.sqrt(3)),
        3,
    )
    # Seeds 1 and 2 only: 15 − 12 and 14 − 14, mean 1.5, sd √4.5, SE √4.5/√2 = 1.5.
    assert paired_difference(low, Ours((15.0, 14.0), (1, 2))) == (1.5, pytest.approx(1.5), 2)
    # No seed in common: the difference of the means, no standard error.
    assert paired_difference(low, Ours((20.0,), (7,))) == (8.0, None, 0)


@pytest.mark.parametrize(
    ("seeds", "quantile"),
    [(2, 6.3138), (3, 2.9200), (5, 2.1318)],  # Student t, one-sided 95 %, df = seeds − 1
)
def test_a_claim_is_resolved_by_a_one_sided_paired_t_test(seeds: int, quantile: float) -> None:
    assert resolving_t(seeds) == pytest.approx(quantile, abs=1e-4)
    claim = Claim("c", "a", "b", "with vs without")
    above, below = 1.01 * quantile, 0.99 * quantile  # in standard errors of 1.0
    assert ClaimResult(claim, 5.0, above, 1.0, seeds).status == HOLDS
    assert ClaimResult(claim, 5.0, below, 1.0, seeds).status == INSIDE_NOISE
    assert ClaimResult(claim, -5.0, above, 1.0, seeds).status == REVERSED
    assert ClaimResult(claim, -5.0, -below, 1.0, seeds).status == INSIDE_NOISE
    # Three seeds at +2.2 SE: 2 SE would call it resolved, t₀.₉₅(2) = 2.92 does not.
    assert ClaimResult(claim, 5.0, 2.2, 1.0, 3).status == INSIDE_NOISE


def test_a_printed_decrease_is_a_claim_too() -> None:
    """Forgetting tables print decreases: the claim takes the paper's own sign."""
    cells, claims = two_row_table((26.0, 12.0), ((40.0, 42.0), (30.0, 31.0)))
    results = judge_claims(cells, claims)
    assert results[0].paper_difference == -14.0 and results[0].ours_difference == -10.5
    assert results[0].ours_se == pytest.approx(0.5) and results[0].holds is True
    assert [v.verdict for v in judge_cells(cells, results)] == [SAME_DIRECTION] * 2


def test_a_cell_without_claims_outside_the_noise_differs() -> None:
    cells = [Cell("Ideal", "c", 90.0, 2.0, Ours((80.0, 80.0)))]
    verdicts = judge_cells(cells, [])
    assert verdicts[0].verdict == DIFFERS and verdicts[0].difference == -10.0


def test_missing_cells_and_claims_without_runs() -> None:
    cells, claims = two_row_table((50.0, 60.0), ((50.0,), ()))
    results = judge_claims(cells, claims)
    assert results[0].holds is None and results[0].ours_difference is None
    verdicts = judge_cells(cells, results)
    # The run cell is within noise; its claim cannot be judged and does not fail it.
    assert [v.verdict for v in verdicts] == [WITHIN, MISSING]
    assert counts(verdicts) == {WITHIN: 1, SAME_DIRECTION: 0, DIFFERS: 0, MISSING: 1}


def test_upper_bound_claims_cover_every_other_row_of_every_column() -> None:
    claims = table_claims(["x", "y"], ["A", "B", "Ideal"], [("A", "B")], "Ideal")
    bound = [c for c in claims if c.kind == "upper bound"]
    assert [(c.column, c.lower, c.upper) for c in bound] == [
        ("x", "A", "Ideal"),
        ("x", "B", "Ideal"),
        ("y", "A", "Ideal"),
        ("y", "B", "Ideal"),
    ]
    assert len(claims) == 6


def test_same_direction_needs_every_claim_of_the_cell() -> None:
    """The bound row holds its pair with A but not with B: it differs."""
    cells = [
        Cell("A", "c", 50.0, 1.0, Ours((40.0, 40.0))),
        Cell("B", "c", 60.0, 1.0, Ours((70.0, 70.0))),
        Cell("Ideal", "c", 90.0, 1.0, Ours((65.0, 66.0))),
    ]
    results = judge_claims(cells, table_claims(["c"], ["A", "B", "Ideal"], [], "Ideal"))
    verdicts = {v.cell.row: v for v in judge_cells(cells, results)}
    assert verdicts["A"].verdict == SAME_DIRECTION  # A < Ideal holds
    assert verdicts["B"].verdict == DIFFERS  # B > Ideal in ours
    assert verdicts["Ideal"].verdict == DIFFERS
    assert verdicts["Ideal"].failed_claims == ("B → Ideal (reversed)",)


@pytest.mark.parametrize(
    ("paper", "ours", "tau"),
    [
        ([1, 2, 3, 4], [10, 20, 30, 40], 1.0),
        ([1, 2, 3, 4], [40, 30, 20, 10], -1.0),
        ([1, 2, 3], [1, 3, 2], 1 / 3),  # pairs: (+)(+)(−)
        ([1, 1, 2], [5, 6, 7], 2 / 3),  # a tie in the paper counts as neither order
        ([1], [1], None),
    ],
)
def test_kendall_tau(paper: list[float], ours: list[float], tau: float | None) -> None:
    result = kendall_tau(paper, ours)
    assert result == (pytest.approx(tau) if tau is not None else None)


def test_unjudged_claims_count_neither_way() -> None:
    """Ideal not run yet: A's pair with B decides alone; B's only judged claim holds too."""
    cells = [
        Cell("A", "c", 50.0, 1.0, Ours((40.0, 41.0))),
        Cell("B", "c", 60.0, 1.0, Ours((45.0, 46.0))),
        Cell("Ideal", "c", 90.0, 1.0, None),
        Cell("C", "c", 70.0, 1.0, Ours((30.0, 31.0))),
    ]
    claims = table_claims(["c"], ["A", "B", "Ideal", "C"], [("A", "B")], "Ideal")
    verdicts = {v.cell.row: v.verdict for v in judge_cells(cells, judge_claims(cells, claims))}
    assert verdicts == {"A": SAME_DIRECTION, "B": SAME_DIRECTION, "Ideal": MISSING, "C": DIFFERS}


def test_sweep_time_counts_overlapping_sweeps_once() -> None:
    from datetime import datetime, timedelta

    from cfl_bench.reproduce.provenance import covered_seconds

    t0 = datetime(2026, 1, 1)
    minutes = [(0, 10), (5, 12), (20, 25), (21, 22)]  # 0-12 and 20-25: 17 minutes
    spans = [(t0 + timedelta(minutes=a), t0 + timedelta(minutes=b)) for a, b in minutes]
    assert covered_seconds(spans) == 17 * 60
    assert covered_seconds([]) == 0.0


def test_the_parallelism_is_read_from_the_sweep_log_not_the_last_calls_manifest(
    tmp_path: Path,
) -> None:
    """A table run two at a time, then a ``--ship`` call with the default ``--jobs 1`` that
    rewrote the manifest and only skipped finished runs: two runs were running at once.
    A run whose sweep was killed counts until that sweep's last event; a log that started
    nothing falls back to the manifest."""
    import json

    from cfl_bench.reproduce.provenance import _jobs

    def log(*lines: str) -> None:
        stamped = [f"2026-11-30T08:{line}" for line in lines]
        (tmp_path / "sweep.log").write_text("\n".join(stamped) + "\n", encoding="utf-8")

    (tmp_path / "sweep.json").write_text(json.dumps({"sweep": {"jobs": 1}}), encoding="utf-8")
    log(
        "00:00+00:00\t7\tstart\ta\tchild=1 threads=1",
        "00:00+00:00\t7\tstart\tb\tchild=2 threads=1",
        "05:00+00:00\t7\tfinish\ta\tstatus=finished rc=0",
        "05:00+00:00\t7\tstart\tc\tchild=3 threads=1",
        "09:00+00:00\t7\tfinish\tb\tstatus=finished rc=0",
        "12:00+00:00\t7\tfinish\tc\tstatus=finished rc=0",
        "30:00+00:00\t9\tskip\ta\tstatus=finished",
    )
    assert _jobs(tmp_path) == 2
    # a third run started while two ran, in a sweep killed before it logged their ends
    log(
        "00:00+00:00\t7\tstart\ta\tchild=1 threads=1",
        "01:00+00:00\t7\tstart\tb\tchild=2 threads=1",
        "02:00+00:00\t8\tstart\tc\tchild=3 threads=1",
        "03:00+00:00\t8\tfail\tc\trc=1",
        "04:00+00:00\t7\tfinish\ta\tstatus=finished rc=0",
    )
    assert _jobs(tmp_path) == 3
    log("30:00+00:00\t9\tskip\ta\tstatus=finished")
    assert _jobs(tmp_path) == 1
