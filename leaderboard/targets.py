"""Rounds-to-target and bytes-to-target: how fast a strategy reaches an accuracy.

Why: the FL literature compares methods by the rounds (and the bytes) needed to reach a
target accuracy, not only by where they end. ``cfl-bench leaderboard --target 80`` gives,
per run, the first round whose average accuracy over the tasks trained so far (Acc_t as
measured in that round, :func:`cfl_bench.core.metrics.progress_by_round`) is ≥ 80 %, and
the bytes communicated up to and including that round; per row, mean ± std over the
finished seeds.

Accuracies are percentages everywhere in cfl-bench (records, summaries, the board), so the
target is one too: a number in (0, 100]. A run that never reaches it is counted in
``n_target_not_reached``, and the row's means are then empty rather than a mean over the
seeds that happened to reach it (which would flatter the strategy); the HTML and terminal
say "not reached". Only evaluated rounds count: without ``--eval-every-round`` a run is
evaluated at task ends only, so the answer is the first task end that reaches the target.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from cfl_bench.core.errors import UserError

if TYPE_CHECKING:
    import pandas as pd

#: The runs frame's column with each run's (round, average accuracy, cumulative bytes).
PROGRESS = "progress"


def check_target(target: float | None) -> float | None:
    """``--target`` as given, after refusing one outside (0, 100] (percent) or not finite."""
    if target is None:
        return None
    if not math.isfinite(target) or not 0.0 < target <= 100.0:
        raise UserError(
            f"--target {target:g} is not an accuracy in percent; give a number in (0, 100], "
            f"e.g. --target 80 for 80 %."
        )
    return float(target)


def progress_of(records: pd.DataFrame | None, num_tasks: int | None) -> list[Any] | None:
    """A run's progress list (see the module docstring); None without records."""
    from cfl_bench.core.metrics import progress_by_round

    if records is None or not num_tasks:
        return None
    return progress_by_round(records, num_tasks)


def target_hits(
    progress: Sequence[Sequence[Any] | None], target: float
) -> list[tuple[int, float] | None]:
    """(round, cumulative bytes) at which each run first reached ``target``, None for a run
    that never did (:func:`cfl_bench.core.metrics.first_reaching`)."""
    from cfl_bench.core.metrics import first_reaching

    return [first_reaching(p or [], target) for p in progress]


def target_text(row: Any, rounds_only: bool = False) -> str:
    """A row's rounds (and bytes) to the target for the tables: ``3 rounds · 12.0 KB``,
    ``not reached`` (every seed missed it) or ``not reached by 1 of 2 seeds``; "" without
    a target, "–" without finished seeds."""
    from cfl_bench.leaderboard.plots import human_bytes

    missed = row["n_target_not_reached"]
    if missed is None or (isinstance(missed, float) and math.isnan(missed)):
        return ""
    seeds = int(row["n_seeds"])
    if not seeds:
        return "–"
    if int(missed):
        return "not reached" if int(missed) == seeds else f"not reached by {missed} of {seeds}"
    rounds = float(row["rounds_to_target_mean"])
    shown = f"{rounds:g}" if rounds.is_integer() else f"{rounds:.1f}"
    if rounds_only:
        return shown
    spent = float(row["bytes_to_target_mean"])
    return f"{shown} rounds · {human_bytes(spent)}" if not math.isnan(spent) else shown
