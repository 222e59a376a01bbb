"""Verdicts: how each reproduced cell stands against the paper's printed cell.

Pure functions of numbers, so the rules can be checked on hand-made tables. Per cell:

* **within noise** — |ours − paper| ≤ the combined spread √(pm² + sd²), where pm is the
  paper's printed ± (0 when none is printed) and sd the sample standard deviation of our
  seeds (0 with one seed). The papers do not say whether ± is a standard deviation or an
  error; reading it as one standard deviation of the seeds is the common convention and is
  what our own spread is.
* **same direction** — outside the noise, but every claim the paper makes with this cell
  holds in ours. A claim is an ordered pair of cells of one column (without → with FedGP,
  or a row → the upper bound): it holds when our difference has the sign of the paper's.
  A claim whose other cell has no run yet is not judged and counts neither way.
* **differs** — outside the noise and some claim with this cell fails (or none of its
  claims can be judged).
* **missing** — no finished run of the cell.

A column's ranking agreement is Kendall's τ between the paper's values and our means over
the rows both have (1: the same order; −1: reversed); it is reported, not a verdict.
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
    """Our values of one cell, one per seed."""

    values: tuple[float, ...]

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


@dataclass(frozen=True)
class ClaimResult:
    claim: Claim
    paper_difference: float
    ours_difference: float | None

    @property
    def holds(self) -> bool | None:
        """None when a cell of the claim has no run."""
        if self.ours_difference is None:
            return None
        return _sign(self.ours_difference) == _sign(self.paper_difference)


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
        ours = None
        if low.ours is not None and high.ours is not None:
            ours = high.ours.mean - low.ours.mean
        results.append(ClaimResult(claim, high.paper - low.paper, ours))
    return results


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
        failed = tuple(r.claim.shown() for r in mine if r.holds is False)
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
