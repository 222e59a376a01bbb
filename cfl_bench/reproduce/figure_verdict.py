"""Verdicts on a figure's claims: does the curve fall, does one fall less than another?

Pure functions of per-seed numbers, tested on hand-made values. The claims are those of
:class:`cfl_bench.reproduce.figures.FigureClaims`, each judged like a table's claim
(:mod:`cfl_bench.reproduce.verdict`): a one-sided paired t-test at the 5 % level over the
seeds both sides ran, in the direction the paper states.

* **drops** row Y: before − end of Y, seed by seed, is positive and resolved.
* **holds** row X, for every drops row Y: fall(Y) − fall(X) is positive and resolved. Why
  "falls less than Y" and not "does not fall": with three seeds an unresolved fall is not
  evidence of no fall, while a fall resolved smaller than FedAvg's is what the figure shows.
  X's own fall is reported beside it.
* **close** (X, B): the end difference B − X with its standard error, reported only: the
  paper gives no threshold for "close", and an unresolved difference proves no closeness.
"""

from __future__ import annotations

from dataclasses import dataclass

from cfl_bench.reproduce.figures import BEFORE, END
from cfl_bench.reproduce.verdict import Claim, ClaimResult, Ours, paired_difference

# The paper states a direction, not a number: every claim's printed difference is "+".
STATED = 1.0


@dataclass(frozen=True)
class RowHeadlines:
    """One row's per-seed headlines (None: the row has no counted run)."""

    before: Ours | None
    end: Ours | None
    fall: Ours | None


@dataclass(frozen=True)
class CloseResult:
    row: str
    bound: str
    # bound − row at the end, mean over shared seeds, its standard error and n.
    difference: float | None
    se: float | None
    seeds: int


def judge(
    headlines: dict[str, RowHeadlines],
    drops: tuple[str, ...],
    holds: tuple[str, ...],
) -> list[ClaimResult]:
    """Every drops and holds claim, in the figure's order."""
    results = []
    for row in drops:
        own = headlines[row]
        claim = Claim(row, f"{row} {END}", f"{row} {BEFORE}", "falls after the shift")
        results.append(_result(claim, own.end, own.before))
    for row in holds:
        for dropping in drops:
            claim = Claim("fall", row, dropping, f"falls less than {dropping}")
            results.append(_result(claim, headlines[row].fall, headlines[dropping].fall))
    return results


def _result(claim: Claim, low: Ours | None, high: Ours | None) -> ClaimResult:
    if low is None or high is None:
        return ClaimResult(claim, STATED, None)
    difference, se, seeds = paired_difference(low, high)
    return ClaimResult(claim, STATED, difference, se, seeds)


def close(
    headlines: dict[str, RowHeadlines], pairs: tuple[tuple[str, str], ...]
) -> list[CloseResult]:
    results = []
    for row, bound in pairs:
        low, high = headlines[row].end, headlines[bound].end
        if low is None or high is None:
            results.append(CloseResult(row, bound, None, None, 0))
            continue
        difference, se, seeds = paired_difference(low, high)
        results.append(CloseResult(row, bound, difference, se, seeds))
    return results
