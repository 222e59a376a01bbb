"""Whether a run's files agree: the numbers in ``summary.json`` are the ones ``records.csv``
gives.

Why: the engine computes every metric of ``summary.json`` with
:func:`cfl_bench.core.metrics.summarize` from the records it has just written (see
``cfl_bench.runner.run_summary``), so in a run cfl-bench wrote the two agree exactly. A summary
edited by hand (an Acc_T of 99 where the records give 20), or one copied next to another run's
records, does not — and before this check the leaderboard ranked the edited number while
``report``, which recomputes from the records, showed the real one. A run whose files disagree
is damaged in every command (:func:`cfl_bench.core.run_reader.read_run`).

The forgetting keys are left out: the reader re-derives them from the accuracy matrices
(which are compared), so a summary written before the forgetting fix, whose stored
forgetting differs, is still read right and is not damaged.

The comparison covers every key ``summarize`` computes, in both directions: a key the records
give that the summary lacks, or a key the summary holds that the records cannot give (task-IL
accuracies of a run with no task-IL rows), is a disagreement too. Values are compared with a
relative tolerance of 1e-9, so a summary computed on another machine's numpy (a different
summation order in the last bit) still agrees; any edit a person makes does not. All 177
shipped reproduction runs agree exactly.

Only numpy and pandas are used (through :mod:`cfl_bench.core.metrics`), never torch.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from cfl_bench.core import metric_registry as registry

if TYPE_CHECKING:
    import pandas as pd

#: Relative and absolute tolerance of the comparison (see the module docstring).
TOLERANCE = 1e-9


def summary_keys() -> frozenset[str]:
    """Every key :func:`cfl_bench.core.metrics.summarize` may write."""
    return frozenset(s.key for s in registry.summary_metrics())


def disagreement(
    summary: dict[str, Any],
    records: pd.DataFrame,
    num_tasks: int,
    exempt: frozenset[str] = frozenset(),
) -> str | None:
    """None when ``summary`` holds exactly what ``records`` give; otherwise one clause naming
    the first key that differs and both values, e.g. ``summary.json says Acc_T is 99.0 but
    records.csv gives 20.0``. ``exempt``: keys no reader takes from the summary (forgetting,
    which the reader re-derives from the checked matrices: summaries written before the
    forgetting fix hold other values there, and their runs are still sound)."""
    from cfl_bench.core.metrics import summarize

    # A run whose global model is not what its method is scored by says so itself; its
    # records then give no global accuracy-derived numbers either.
    not_scored = summary.get("global_not_scored")
    try:
        computed = summarize(records, num_tasks, not_scored if isinstance(not_scored, str) else "")
    except ValueError as exc:
        return f"records.csv does not fit the run ({exc})"
    for key in sorted(summary_keys() - exempt):
        in_summary, in_records = key in summary, key in computed
        if not in_summary and not in_records:
            continue
        if not in_summary:
            return f"summary.json lacks '{key}', which records.csv gives"
        if not in_records:
            return f"summary.json holds '{key}', which records.csv does not give"
        if not same(summary[key], computed[key]):
            return differs(key, summary[key], computed[key])
    return None


def differs(key: str, stored: object, computed: object) -> str:
    """The clause for one key that differs: both values when they are short, else the key."""
    if isinstance(stored, (list, dict)) or isinstance(computed, (list, dict)):
        return f"summary.json's {key} differs from the one records.csv gives"
    return f"summary.json says {key} is {brief(stored)} but records.csv gives {brief(computed)}"


def same(stored: object, computed: object) -> bool:
    """JSON values equal up to :data:`TOLERANCE` (numbers), recursively (lists, objects)."""
    if isinstance(stored, bool) or isinstance(computed, bool):
        return stored is computed
    if isinstance(stored, (int, float)) and isinstance(computed, (int, float)):
        return math.isclose(stored, computed, rel_tol=TOLERANCE, abs_tol=TOLERANCE)
    if isinstance(stored, list) and isinstance(computed, list):
        return len(stored) == len(computed) and all(
            same(a, b) for a, b in zip(stored, computed, strict=True)
        )
    if isinstance(stored, dict) and isinstance(computed, dict):
        return stored.keys() == computed.keys() and all(
            same(stored[k], computed[k]) for k in stored
        )
    return stored == computed


def brief(value: object) -> str:
    """A value in a few characters, for the reason line (a matrix is not printed whole)."""
    if value is None:
        return "null"
    if isinstance(value, float):
        return f"{value:.6g}"
    return repr(value)
