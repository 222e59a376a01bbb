"""Which leaderboard rows are statistically indistinguishable from the best one.

Why: a board that ranks 81.5 ± 9.7 above 67.2 ± 17.2 over two seeds invites a reader to
call the first strategy better, and with that spread it may well not be. So for each
headline metric (:data:`cfl_bench.core.metric_registry.COMPARED`) and each protocol the
leaderboard reports, per row:

* a **95 % confidence interval** of the mean over seeds: half-width
  t₀.₉₇₅(n − 1) · s / √n, s the *sample* standard deviation whatever ``--std`` shows (the
  interval is a statement about the mean, and only the sample deviation estimates it);
* a **two-sided t-test against the best row** (the best mean in the metric's direction):
  *paired by seed* when the two rows have at least two seeds in common — seed k of one
  protocol draws the same task sequence (rotation angles, permutations, class order) and
  the same client split for every strategy (``streams/domain_il.py`` and
  ``streams/partition.py`` derive them from the seed alone), so the per-seed difference
  removes that shared part of the noise, as the reproduction verdicts do
  (:mod:`cfl_bench.reproduce.verdict`) — over the shared seeds only; otherwise *Welch's*
  unequal-variance t-test on the two samples;
* **Holm–Bonferroni**: the p values of the m rows tested against the best in one protocol
  and metric are adjusted (step-down: the k-th smallest times m − k + 1, made monotone,
  capped at 1), so the chance of calling *any* of them different by luck stays at 5 %;
* a row is **indistinguishable from the best** when its adjusted p ≥ α = 0.05. The best
  row is marked best (and counts as tied with itself). A row with one seed, or any row
  when the best has one seed, is not tested: one seed has no spread to test against.

A test whose differences have no spread at all (every seed differs by the same amount,
e.g. deterministic metrics) has no t statistic: equal values give p = 1, different ones
p = 0, which is what the limit of the test gives and what a reader expects.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

#: Significance level of the Holm-corrected tests, and the confidence of the intervals.
ALPHA = 0.05
CONFIDENCE = 0.95

#: The ``<metric>_test`` cell of the best row, of rows tested paired or with Welch's test,
#: and of rows that cannot be tested.
BEST = "best"
WELCH = "Welch t"
ONE_SEED = "one seed"
BEST_ONE_SEED = "best has one seed"


def paired_name(seeds: int) -> str:
    """The ``<metric>_test`` cell of a paired test over ``seeds`` shared seeds."""
    return f"paired t, {seeds} seeds"


def t_quantile(probability: float, df: float) -> float:
    """The Student-t quantile (scipy: it has no closed form)."""
    from scipy.stats import t

    return float(t.ppf(probability, df))


def two_sided_p(statistic: float, df: float) -> float:
    """P(|T| ≥ |statistic|) under Student's t with ``df`` degrees of freedom."""
    from scipy.stats import t

    return float(min(1.0, 2.0 * t.sf(abs(statistic), df)))


def ci95_half_width(values: Sequence[float]) -> float:
    """t₀.₉₇₅(n − 1) · s / √n with the sample std s; NaN below two values or with a NaN
    value (no interval can be given)."""
    if len(values) < 2 or any(math.isnan(v) for v in values):
        return math.nan
    sd = statistics.stdev(values)
    return t_quantile(0.5 + CONFIDENCE / 2, len(values) - 1) * sd / math.sqrt(len(values))


@dataclass(frozen=True)
class TTest:
    """One t-test of a row against the best: its name, statistic, df and raw p."""

    name: str
    statistic: float
    df: float
    p: float


def _no_spread(se: float, values: Sequence[float]) -> bool:
    """A standard error that is float noise on the values' scale (1e-12 relative): equal
    per-seed gaps computed in floating point may differ in the last bit, which would turn
    "no spread" into a t statistic of 10¹⁵."""
    return se <= 1e-12 * max(1.0, *(abs(v) for v in values))


def _degenerate(difference: float) -> tuple[float, float]:
    """(t, p) when the standard error is 0: no spread, so equal means are p = 1 and any
    difference is certain (p = 0)."""
    if difference == 0.0:
        return 0.0, 1.0
    return math.copysign(math.inf, difference), 0.0


def paired_t(best: Mapping[int, float], other: Mapping[int, float]) -> TTest:
    """Paired t-test of ``other − best`` over the seeds both have (at least two)."""
    shared = sorted(set(best) & set(other))
    if len(shared) < 2:
        raise ValueError(f"a paired test needs two shared seeds, not {len(shared)}")
    differences = [other[s] - best[s] for s in shared]
    n = len(differences)
    mean = math.fsum(differences) / n
    se = statistics.stdev(differences) / math.sqrt(n)
    if _no_spread(se, [*best.values(), *other.values()]):
        statistic, p = _degenerate(mean)
    else:
        statistic = mean / se
        p = two_sided_p(statistic, n - 1)
    return TTest(paired_name(n), statistic, float(n - 1), p)


def welch_t(best: Sequence[float], other: Sequence[float]) -> TTest:
    """Welch's t-test of mean(other) − mean(best); both samples need two values. Degrees of
    freedom by Welch–Satterthwaite."""
    if len(best) < 2 or len(other) < 2:
        raise ValueError("Welch's test needs two values in each sample")
    va = statistics.variance(best) / len(best)
    vb = statistics.variance(other) / len(other)
    difference = statistics.fmean(other) - statistics.fmean(best)
    if _no_spread(math.sqrt(va + vb), [*best, *other]):
        statistic, p = _degenerate(difference)
        return TTest(WELCH, statistic, float(len(best) + len(other) - 2), p)
    df = (va + vb) ** 2 / (va**2 / (len(best) - 1) + vb**2 / (len(other) - 1))
    statistic = difference / math.sqrt(va + vb)
    return TTest(WELCH, statistic, df, two_sided_p(statistic, df))


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm–Bonferroni adjusted p values, in the order given: the k-th smallest (k = 1..m)
    times m − k + 1, then the running maximum in that order, capped at 1. Ties keep their
    given order (the adjusted values of tied p's come out equal anyway)."""
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: pvalues[i])
    adjusted = [math.nan] * m
    running = 0.0
    for rank, index in enumerate(order):
        running = max(running, min(1.0, (m - rank) * pvalues[index]))
        adjusted[index] = running
    return adjusted


@dataclass(frozen=True)
class Comparison:
    """One row's standing against the best row of its protocol for one metric.

    ``test``: :data:`BEST`, the test's name, :data:`ONE_SEED`, :data:`BEST_ONE_SEED`, or ""
    (no mean to compare). ``p``: Holm-adjusted p (NaN when not tested). ``tied``: True for
    the best and for rows with adjusted p ≥ α, False below, None when not tested.
    """

    test: str
    p: float = math.nan
    tied: bool | None = None


def best_index(means: Sequence[float], direction: str) -> int | None:
    """The position of the best finite mean (the first of equal ones); None when none is."""
    finite = [i for i, m in enumerate(means) if not math.isnan(m)]
    if not finite:
        return None
    sign = -1.0 if direction == "higher" else 1.0
    return min(finite, key=lambda i: (sign * means[i], i))


def _test(best: Mapping[int, float], other: Mapping[int, float]) -> TTest:
    """Paired when at least two seeds are shared, Welch's test otherwise."""
    if len(set(best) & set(other)) >= 2:
        return paired_t(best, other)
    return welch_t(list(best.values()), list(other.values()))


def compare_with_best(rows: Sequence[Mapping[int, float]], direction: str) -> list[Comparison]:
    """The :class:`Comparison` of every row of one protocol for one metric. ``rows``: each
    row's values by seed (its finished seeds; a row with a NaN value, or none, has no mean
    and is left out). ``direction``: ``higher`` or ``lower`` is better."""
    means = [
        statistics.fmean(r.values()) if r and not any(math.isnan(v) for v in r.values())
        else math.nan
        for r in rows
    ]  # fmt: skip
    best = best_index(means, direction)
    out = [Comparison("") for _ in rows]
    if best is None:
        return out
    out[best] = Comparison(BEST, tied=True)
    tested: list[tuple[int, TTest]] = []
    for i, values in enumerate(rows):
        if i == best or math.isnan(means[i]):
            continue
        if len(rows[best]) < 2:
            out[i] = Comparison(BEST_ONE_SEED)
        elif len(values) < 2:
            out[i] = Comparison(ONE_SEED)
        else:
            tested.append((i, _test(rows[best], values)))
    for (i, test), p in zip(tested, holm([t.p for _, t in tested]), strict=True):
        out[i] = Comparison(test.name, p, p >= ALPHA)
    return out


# --------------------------------------------------------------------------------------------
# How the tables show it
# --------------------------------------------------------------------------------------------

#: Marks beside the ranked metric in the terminal and the HTML: the best row, and rows
#: statistically indistinguishable from it.
BEST_MARK = "▲"
TIED_MARK = "≈"
#: ... and rows that differ from it significantly (terminal only: narrow).
DIFFERS_MARK = "≠"


def comparison_mark(row: Any, metric: str) -> str:
    """The terminal's ``vs best`` cell: ``▲ best``, ``≈ tied`` (statistically
    indistinguishable from the best), ``≠ best`` (Holm-adjusted p < α), ``one seed`` (no
    test: this row or the best has one seed), or "" (no mean)."""
    test, tied = row[f"{metric}_test"], row[f"{metric}_tied_best"]
    if test == BEST:
        return f"{BEST_MARK} best"
    if test in (ONE_SEED, BEST_ONE_SEED):
        return "one seed"
    return {"true": f"{TIED_MARK} tied", "false": f"{DIFFERS_MARK} best"}.get(tied, "")


def ci_text(row: Any, metric: str, spec: str = ".2f") -> str:
    """``±24.84`` (the 95 % CI half-width), ``one seed``, or "–" without a mean."""
    if math.isnan(float(row[f"{metric}_mean"])):
        return "–"
    if int(row["n_seeds"]) < 2:
        return "one seed"
    half = float(row[f"{metric}_ci95"])
    return "–" if math.isnan(half) else f"±{half:{spec}}"
