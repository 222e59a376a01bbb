"""Verdicts: how each reproduced cell stands against the paper's printed cell.

Pure functions of numbers, so the rules can be checked on hand-made tables. Per cell:

* **within noise** — |ours − paper| ≤ the combined spread √(pm² + sd²), where pm is the
  paper's printed ± (0 when none is printed) and sd the sample standard deviation of our
  seeds (0 with one seed). The papers do not say whether ± is a standard deviation or an
  error; reading it as one standard deviation of the seeds is the common convention and is
  what our own spread is.
* **same direction** — outside the noise, but every claim the paper makes with this cell
  holds in ours. A claim is an ordered pair of cells of one column (without → with FedGP,
  or a row → the upper bound). It **holds** when our difference has the sign of the
  paper's and is resolved: a one-sided paired t-test at the 5 % level, in the direction
  of our difference, over the per-seed differences of the seeds both cells ran
  (|mean| > t₀.₉₅(n − 1) · SE; seed s of both rows shares its tasks, split and initial
  model, so pairing removes that shared part of the noise). A claim fails as *reversed*
  (resolved, opposite sign), *inside noise* (not resolved) or *one seed* (no noise
  estimate). Why not the sign alone: at chance-level accuracy the sign of a 0.5-point
  difference is a coin flip, and a report must not call that a reproduced claim. Why a
  t quantile rather than a fixed 2 SE: with 3 seeds, 2 SE passes about one pure-noise
  difference in eleven in the paper's direction; t₀.₉₅(2) = 2.92 passes one in twenty.
  A claim whose other cell has no run yet is not judged and counts neither way.
* **differs** — outside the noise and some claim with this cell fails (or none of its
  claims can be judged).
* **missing** — no finished run of the cell.

A column's ranking agreement is Kendall's τ-a between the paper's values and our means over
the rows both have (1: the same order; −1: reversed); it is reported, not a verdict. τ-a,
not τ-b: a tied pair counts as neither order and stays in the denominator, so ties pull it
towards 0; the report names it τ-a so that no reader takes it for τ-b.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

WITHIN = "within noise"
SAME_DIRECTION = "same direction"
DIFFERS = "differs"
MISSING = "missing"
VERDICTS = (WITHIN, SAME_DIRECTION, DIFFERS, MISSING)


@dataclass(frozen=True)
class Ours:
    """Our values of one cell, one per seed (``seeds[i]`` gave ``values[i]``; when no seeds
    are given, the values are seeds 0, 1, … in order)."""

    values: tuple[float, ...]
    seeds: tuple[int, ...] = ()

    def by_seed(self) -> dict[int, float]:
        seeds = self.seeds or tuple(range(len(self.values)))
        return dict(zip(seeds, self.values, strict=True))

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def mean(self) -> float:
        return statistics.fmean(self.values)

    @property
    def sd(self) -> float | None:
        """Sample standard deviation (n − 1), None with one seed."""
        return statistics.stdev(self.values) if self.n > 1 else None


@dataclass(frozen=True)
class Cell:
    """One cell: the paper's number and ours (None when no run finished)."""

    row: str
    column: str
    paper: float
    pm: float | None
    ours: Ours | None


@dataclass(frozen=True)
class Claim:
    """The paper says ``upper`` − ``lower`` has the sign of its printed difference."""

    column: str
    lower: str
    upper: str
    kind: str

    def shown(self) -> str:
        return f"{self.lower} → {self.upper}"


HOLDS = "holds"
REVERSED = "reversed"
INSIDE_NOISE = "inside noise"
ONE_SEED = "one seed"
# One-sided level of the paired t-test that resolves a claim.
CLAIM_LEVEL = 0.95


def resolving_t(seeds: int) -> float:
    """The t quantile a difference over ``seeds`` paired seeds must exceed, in standard
    errors (scipy's Student t: the quantile has no closed form)."""
    from scipy.stats import t

    return float(t.ppf(CLAIM_LEVEL, seeds - 1))


@dataclass(frozen=True)
class ClaimResult:
    claim: Claim
    paper_difference: float
    # The mean of the per-seed differences over the seeds both cells ran (the difference
    # of the means when they share none); None when a cell has no run.
    ours_difference: float | None
    # The standard error of that mean; None with fewer than two shared seeds.
    ours_se: float | None = None
    # How many seeds both cells ran (the t-test's n).
    seeds: int = 0

    @property
    def status(self) -> str | None:
        """holds, reversed, inside noise or one seed; None when a cell has no run."""
        if self.ours_difference is None:
            return None
        if self.ours_se is None:
            return ONE_SEED
        if abs(self.ours_difference) <= resolving_t(self.seeds) * self.ours_se:
            return INSIDE_NOISE
        same = _sign(self.ours_difference) == _sign(self.paper_difference)
        return HOLDS if same else REVERSED

    @property
    def holds(self) -> bool | None:
        """None when a cell of the claim has no run."""
        status = self.status
        return None if status is None else status == HOLDS


@dataclass(frozen=True)
class CellVerdict:
    cell: Cell
    difference: float | None
    spread: float
    verdict: str
    failed_claims: tuple[str, ...]


def _sign(value: float) -> int:
    return (value > 0) - (value < 0)


def combined_spread(pm: float | None, sd: float | None) -> float:
    return math.hypot(pm or 0.0, sd or 0.0)


def table_claims(
    columns: Sequence[str],
    rows: Sequence[str],
    pairs: Sequence[tuple[str, str]],
    upper_bound: str | None,
) -> list[Claim]:
    """Every claim of a table: each pair in each column, and the bound above every row."""
    claims = []
    for column in columns:
        claims += [Claim(column, low, high, "with vs without") for low, high in pairs]
        if upper_bound is not None:
            claims += [
                Claim(column, row, upper_bound, "upper bound") for row in rows if row != upper_bound
            ]
    return claims


def judge_claims(cells: Sequence[Cell], claims: Sequence[Claim]) -> list[ClaimResult]:
    by_place = {(c.row, c.column): c for c in cells}
    results = []
    for claim in claims:
        low, high = by_place[(claim.lower, claim.column)], by_place[(claim.upper, claim.column)]
        difference, se, seeds = None, None, 0
        if low.ours is not None and high.ours is not None:
            difference, se, seeds = paired_difference(low.ours, high.ours)
        results.append(ClaimResult(claim, high.paper - low.paper, difference, se, seeds))
    return results


def paired_difference(low: Ours, high: Ours) -> tuple[float, float | None, int]:
    """Mean and standard error of ``high − low`` over the seeds both ran, and how many
    they are; without shared seeds, the difference of the means and no standard error."""
    lows, highs = low.by_seed(), high.by_seed()
    shared = sorted(set(lows) & set(highs))
    if not shared:
        return high.mean - low.mean, None, 0
    differences = [highs[s] - lows[s] for s in shared]
    mean = statistics.fmean(differences)
    if len(differences) < 2:
        return mean, None, 1
    se = statistics.stdev(differences) / math.sqrt(len(differences))
    return mean, se, len(differences)


def judge_cells(cells: Sequence[Cell], claim_results: Sequence[ClaimResult]) -> list[CellVerdict]:
    """The verdict of every cell (see the module docstring)."""
    verdicts = []
    for cell in cells:
        if cell.ours is None:
            verdicts.append(CellVerdict(cell, None, combined_spread(cell.pm, None), MISSING, ()))
            continue
        difference = cell.ours.mean - cell.paper
        spread = combined_spread(cell.pm, cell.ours.sd)
        mine = [
            r
            for r in claim_results
            if r.claim.column == cell.column and cell.row in (r.claim.lower, r.claim.upper)
        ]
        failed = tuple(f"{r.claim.shown()} ({r.status})" for r in mine if r.holds is False)
        judged = [r for r in mine if r.holds is not None]
        if abs(difference) <= spread:
            verdict = WITHIN
        elif judged and not failed:
            verdict = SAME_DIRECTION
        else:
            verdict = DIFFERS
        verdicts.append(CellVerdict(cell, difference, spread, verdict, failed))
    return verdicts


def kendall_tau(paper: Sequence[float], ours: Sequence[float]) -> float | None:
    """Kendall's τ-a of two equally long sequences (ties count as neither order); None
    with fewer than two values."""
    n = len(paper)
    if n < 2:
        return None
    score = 0
    for i in range(n):
        for j in range(i + 1, n):
            score += _sign(paper[j] - paper[i]) * _sign(ours[j] - ours[i])
    return score / (n * (n - 1) / 2)


def counts(verdicts: Sequence[CellVerdict]) -> dict[str, int]:
    return {name: sum(v.verdict == name for v in verdicts) for name in VERDICTS}
