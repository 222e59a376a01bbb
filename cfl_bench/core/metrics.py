"""Continual-learning metrics as pure functions of the accuracy matrix and of the records table.

Why pure functions: docs/metrics.md makes every reported number (Acc_t, forgetting, BWT, FWT,
memory drift, client spread, bytes) a function of the tidy ``records`` table alone, so a
summary can be recomputed, audited or re-derived under another convention from
``records.csv`` without re-running anything. Definitions, with the exact matrix entries each
metric reads, are in ``docs/metrics.md``; the formulas there are 1-based, the code here is
0-based.

Conventions:

* ``a`` is a float array of shape ``(T, T)`` in percent; ``a[t, i]`` is the accuracy of the
  global model on task ``i``'s test split after training task ``t``. Unmeasured entries are
  NaN. The engine also measures ``a[t, t+1]`` at every task end, i.e. task t+1 *before* it
  is trained; that entry exists for FWT only. Every other metric reads the lower triangle
  (``i <= t``) alone, and forgetting's max reads rows ``s >= i`` only, so a pre-training
  evaluation can never pose as an accuracy the model once had.
* ``b`` is a length-``T`` array: accuracy of the untrained initial model on each task.
* Missing *required* entries propagate as NaN instead of being skipped: averaging over only
  the entries that happen to exist would silently turn an incomplete evaluation into a
  different (usually flattering) number.

Only numpy and pandas are used, so the module can be imported by analysis tools that do not
have torch installed.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from cfl_bench.core.metric_registry import ACCURACY_METRICS, summary_metrics

__all__ = [
    "ACCURACY_METRICS",
    "RECORD_COLUMNS",
    "average_accuracy",
    "backward_transfer",
    "client_spread",
    "first_reaching",
    "forgetting",
    "forward_transfer",
    "initial_from_records",
    "matrix_from_records",
    "memory_drift",
    "progress_by_round",
    "summarize",
]

#: Columns every records table must have (tidy long format, docs/metrics.md).
RECORD_COLUMNS: tuple[str, ...] = (
    "round",
    "trained_task",
    "eval_task",
    "scope",
    "metric",
    "value",
)


# --------------------------------------------------------------------------------------------
# Matrix metrics
# --------------------------------------------------------------------------------------------


def _square(a: Any, name: str = "a") -> np.ndarray:
    """Return ``a`` as a float (T, T) array; fail loudly so a transposed or ragged input
    is caught here rather than producing a plausible-looking wrong number."""
    arr = np.asarray(a, dtype=float)
    if arr.ndim != 2 or arr.shape[0] != arr.shape[1]:
        raise ValueError(
            f"{name} must be a square (T, T) matrix, got shape {arr.shape}; "
            "pass one row per trained task and one column per evaluated task"
        )
    return arr


def average_accuracy(a: Any) -> np.ndarray:
    """Acc_t = mean of ``a[t, :t+1]`` for every t (FedGP's "average accuracy").

    Returns a length-T array; Acc_t is NaN if any task seen by t was not evaluated, because
    averaging only the measured tasks would change what the number means.
    """
    arr = _square(a)
    T = arr.shape[0]
    return np.array([arr[t, : t + 1].mean() for t in range(T)], dtype=float)


def forgetting(a: Any, *, include_current: bool = False) -> np.ndarray:
    """Fgt_t for every t: mean over old tasks i < t of (best accuracy since i was trained −
    accuracy now).

    The best accuracy of task i is the max of ``a[s, i]`` over rows ``i <= s < t``
    (default, Chaudhry et al.), so forgetting can be negative when an old task *improves*
    (backward transfer shows up as negative forgetting). With ``include_current=True`` the
    max runs over ``i <= s <= t``, as in the Mammoth / FedGP code; this clips every term at 0.
    Tables must say which rule they use.

    Why the lower bound ``s >= i``: rows ``s < i`` hold evaluations of task i made *before*
    it was trained (the engine measures ``a[i-1, i]`` for FWT). Such a number is not an
    accuracy the model ever had on a learned task; letting it into the max inflated
    forgetting whenever an untrained model happened to score higher than the trained one
    (e.g. a domain-IL stream whose next task resembles the current one). Within that range
    every entry is required: a missing ``a[s, i]`` or ``a[t, i]`` gives NaN, because a max
    over fewer evaluations would silently report less forgetting.

    Returns a length-T array with NaN at t = 0 (nothing can have been forgotten yet).
    """
    arr = _square(a)
    T = arr.shape[0]
    out = np.full(T, np.nan)
    for t in range(1, T):
        stop = t + 1 if include_current else t
        # arr[i:stop, i] is never empty: i < t <= stop. np.max propagates NaN.
        terms = [float(np.max(arr[i:stop, i])) - arr[t, i] for i in range(t)]
        out[t] = float(np.mean(terms))
    return out


def backward_transfer(a: Any) -> float:
    """BWT = mean over i < T−1 of (a[T−1, i] − a[i, i]) (Lopez-Paz & Ranzato).

    Negative means forgetting. NaN when T = 1: with a single task there is no "later" to
    compare against, and 0 would wrongly claim a measurement.
    """
    arr = _square(a)
    T = arr.shape[0]
    if T < 2:
        return math.nan
    idx = np.arange(T - 1)
    return float(np.mean(arr[T - 1, idx] - arr[idx, idx]))


def forward_transfer(a: Any, b: Any) -> float:
    """FWT = mean over i ≥ 1 of (a[i−1, i] − b[i]): accuracy on a task *before* training it,
    relative to the untrained initial model.

    It needs the above-diagonal entries a[i−1, i], which are only measured if the suite
    evaluates future tasks; NaN when T = 1 or when any needed entry is missing, so an absent
    measurement is never reported as zero transfer.
    """
    arr = _square(a)
    T = arr.shape[0]
    base = np.asarray(b, dtype=float).reshape(-1)
    if base.shape[0] != T:
        raise ValueError(
            f"b must have one entry per task (T = {T}), got {base.shape[0]}; "
            "pass the initial-model accuracy for every task (NaN where unknown)"
        )
    if T < 2:
        return math.nan
    idx = np.arange(1, T)
    return float(np.mean(arr[idx - 1, idx] - base[idx]))


def client_matrix(a: Any, order: Sequence[int]) -> np.ndarray:
    """Client k's own matrix under per-client task orders: ``A_k[t, i] = a[t, π_k(i)]``,
    column i being the task the client trains at step i (``order[i]`` = π_k(i)).

    Why a column permutation is all it takes: step t's row of ``a`` scores the global model
    on *every* task, so the client's i-th task's accuracy after step t is the entry of
    column π_k(i); every matrix metric above (Acc_t, forgetting, BWT, FWT) then reads
    ``A_k`` exactly as it reads ``a`` under the shared order, where π_k is the identity and
    ``A_k = a``.
    """
    arr = _square(a)
    index = np.asarray(order, dtype=int)
    if sorted(index.tolist()) != list(range(arr.shape[0])):
        raise ValueError(
            f"a task order must be a permutation of the {arr.shape[0]} tasks, got {list(order)}"
        )
    return arr[:, index]


def client_mean(values: Sequence[Any]) -> Any:
    """The mean over clients of per-client values (scalars or per-step curves); NaN in any
    client's value propagates, as a missing entry does in every metric here."""
    stacked = np.stack([np.asarray(v, dtype=float) for v in values])
    mean = stacked.mean(axis=0)
    return float(mean) if mean.ndim == 0 else mean


def task_orders_from_records(records: pd.DataFrame) -> list[list[int]] | None:
    """π_k for every client from the round-0 ``task_order`` rows (``scope`` client_k,
    ``trained_task`` = step, ``eval_task`` = the stream task trained then); None under the
    shared order, which records none."""
    rows = records[records["metric"] == "task_order"]
    if rows.empty:
        return None
    orders: dict[int, list[int]] = {}
    for scope, group in rows.groupby("scope"):
        steps = group.sort_values("trained_task")
        orders[int(str(scope).removeprefix("client_"))] = [int(t) for t in steps["eval_task"]]
    return [orders[k] for k in sorted(orders)]


def memory_drift(kl: Any) -> np.ndarray:
    """MD_t = mean over i < t of ``kl[t, i]`` for every t (NaN at t = 0).

    ``kl[t, i]`` is the mean over task i's probe of KL(p_i ‖ p_t), p_t being the global
    model's softmax right after task t. Unlike forgetting it sees changes in the model's
    *function* on old data even where the argmax (hence accuracy) did not move.
    """
    arr = _square(kl, "kl")
    T = arr.shape[0]
    out = np.full(T, np.nan)
    for t in range(1, T):
        out[t] = float(np.mean(arr[t, :t]))
    return out


def client_spread(values: Any) -> dict[str, float]:
    """10th / 50th / 90th percentile (numpy "linear") of per-client accuracies, LEAF-style.

    The mean alone hides clients the global model serves badly; the spread shows them.
    NaN entries (clients without a measurement) are dropped; an empty input gives NaNs.
    """
    arr = np.asarray(values, dtype=float).reshape(-1)
    arr = arr[~np.isnan(arr)]
    if arr.size == 0:
        return {"p10": math.nan, "p50": math.nan, "p90": math.nan}
    p10, p50, p90 = np.percentile(arr, [10, 50, 90], method="linear")
    return {"p10": float(p10), "p50": float(p50), "p90": float(p90)}


# --------------------------------------------------------------------------------------------
# Records → matrices
# --------------------------------------------------------------------------------------------


def _check_records(records: pd.DataFrame) -> None:
    """Fail with the list of missing columns instead of a bare KeyError deep in pandas."""
    missing = [c for c in RECORD_COLUMNS if c not in records.columns]
    if missing:
        raise ValueError(
            f"records table lacks columns {missing}; it must have {list(RECORD_COLUMNS)}"
        )


def _select(records: pd.DataFrame, metric: str, scope: str) -> pd.DataFrame:
    """Rows of one metric and scope, with integer task/round columns."""
    _check_records(records)
    rows = records[(records["metric"] == metric) & (records["scope"] == scope)]
    return rows.astype({"round": int, "trained_task": int, "eval_task": int})


def _last_round(rows: pd.DataFrame, by: Sequence[str]) -> pd.DataFrame:
    """Keep, for each group in ``by``, only the rows of that group's latest round.

    Why the latest round: the task-end evaluation is the one the matrix is defined on, and
    the design forbids reporting the best round. Rows are stably sorted by round, and among
    duplicates of the same (round, trained_task, eval_task) the last row in table order wins,
    so a round re-recorded after resuming from a checkpoint supersedes the earlier copy.
    """
    if rows.empty:
        return rows
    last = rows.groupby(list(by))["round"].transform("max")
    rows = rows[rows["round"] == last]
    return rows.drop_duplicates(subset=[*by, "round", "eval_task"], keep="last")


def _infer_size(rows: pd.DataFrame, num_tasks: int | None) -> int:
    """T from the rows (1 + largest task index) unless fixed by ``num_tasks``."""
    largest = -1
    if not rows.empty:
        largest = int(max(rows["trained_task"].max(), rows["eval_task"].max()))
    if num_tasks is None:
        return largest + 1
    if num_tasks < 0:
        raise ValueError(f"num_tasks must be >= 0, got {num_tasks}")
    if largest >= num_tasks:
        raise ValueError(
            f"records mention task index {largest} but num_tasks = {num_tasks}; "
            "pass the stream's real number of tasks (or None to infer it)"
        )
    return num_tasks


def matrix_from_records(
    records: pd.DataFrame,
    metric: str,
    scope: str = "global",
    num_tasks: int | None = None,
) -> np.ndarray:
    """The (T, T) matrix ``m[trained_task, eval_task]`` of ``metric`` at each task's end.

    Uses the rows with the given metric and scope, ``trained_task >= 0`` and
    ``eval_task >= 0``; for each trained task only its last recorded round (the task-end
    evaluation) is used, so per-round evaluations during a task never leak into the matrix.
    An eval task that was not measured at that last round stays NaN rather than being filled
    from an earlier round. T is inferred as 1 + the largest task index unless ``num_tasks``
    fixes it (e.g. for a run that stopped early, whose missing rows then stay NaN).
    """
    rows = _select(records, metric, scope)
    rows = rows[(rows["trained_task"] >= 0) & (rows["eval_task"] >= 0)]
    T = _infer_size(rows, num_tasks)
    out = np.full((T, T), np.nan)
    rows = _last_round(rows, ["trained_task"])
    out[rows["trained_task"].to_numpy(), rows["eval_task"].to_numpy()] = rows["value"].to_numpy(
        dtype=float
    )
    return out


def initial_from_records(
    records: pd.DataFrame,
    metric: str,
    num_tasks: int,
    scope: str = "global",
) -> np.ndarray:
    """b: the untrained initial model's ``metric`` per task, from rows with trained_task = −1.

    Needed for FWT; NaN for tasks that were not evaluated before training.
    """
    rows = _select(records, metric, scope)
    rows = rows[(rows["trained_task"] == -1) & (rows["eval_task"] >= 0)]
    if num_tasks < 0:
        raise ValueError(f"num_tasks must be >= 0, got {num_tasks}")
    if not rows.empty and int(rows["eval_task"].max()) >= num_tasks:
        raise ValueError(
            f"records mention task index {int(rows['eval_task'].max())} but "
            f"num_tasks = {num_tasks}; pass the stream's real number of tasks"
        )
    out = np.full(num_tasks, np.nan)
    rows = _last_round(rows, ["trained_task"])
    out[rows["eval_task"].to_numpy()] = rows["value"].to_numpy(dtype=float)
    return out


# --------------------------------------------------------------------------------------------
# Summary
# --------------------------------------------------------------------------------------------


def _jsonable(x: Any) -> Any:
    """Python scalars/lists with NaN → None, so ``json.dumps(allow_nan=False)`` succeeds and
    a missing measurement reads as ``null`` rather than as a number."""
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple, np.ndarray)):
        return [_jsonable(v) for v in x]
    if isinstance(x, (bool, np.bool_)):
        return bool(x)
    if isinstance(x, (int, np.integer)):
        return int(x)
    if isinstance(x, (float, np.floating)):
        f = float(x)
        return None if math.isnan(f) or math.isinf(f) else f
    return x


def _last(values: np.ndarray) -> float:
    """The final-task entry (the headline "_T" value); NaN for an empty stream."""
    return float(values[-1]) if values.size else math.nan


class SummaryInputs:
    """The records of one run and the matrices derived from them, each built once.

    Why a cache: several summary keys read the same matrix (``acc_T``, ``Acc_T``,
    ``fgt_acc_T`` ... all read the ``acc`` matrix); building it once per metric keeps
    :func:`summarize` as cheap as when it was one hand-written block.
    """

    def __init__(self, records: pd.DataFrame, num_tasks: int) -> None:
        self.records = records
        self.num_tasks = num_tasks
        self._cache: dict[tuple[str, str], Any] = {}
        # The stream's headline metric: accuracy, or mAP@0.5 on a detection stream (which
        # records no accuracy). The accuracy-named keys (Acc_T, Fgt_T, BWT, acc_matrix …)
        # read it, so a detection run ranks and plots like any other.
        self.headline = "acc"
        if not self._has_global("acc") and self._has_global("map50"):
            self.headline = "map50"

    def _has_global(self, metric: str) -> bool:
        rows = (self.records["scope"] == "global") & (self.records["metric"] == metric)
        return bool(rows.any())

    def _alias(self, metric: str) -> str:
        return self.headline if metric == "acc" else metric

    def _cached(self, kind: str, metric: str, make: Any) -> Any:
        if (kind, metric) not in self._cache:
            self._cache[(kind, metric)] = make()
        return self._cache[(kind, metric)]

    def matrix(self, metric: str) -> np.ndarray:
        """The global task-end matrix of ``metric`` (:func:`matrix_from_records`)."""
        metric = self._alias(metric)
        return self._cached(
            "matrix",
            metric,
            lambda: matrix_from_records(self.records, metric, "global", self.num_tasks),
        )

    def initial(self, metric: str) -> np.ndarray:
        """b: the initial model's ``metric`` per task (:func:`initial_from_records`)."""
        metric = self._alias(metric)
        return self._cached(
            "initial", metric, lambda: initial_from_records(self.records, metric, self.num_tasks)
        )

    def spread(self, metric: str) -> dict[str, float]:
        """The client spread after the final task (:func:`_client_spread_of`)."""
        return self._cached("spread", metric, lambda: _client_spread_of(self, metric))

    def recorded(self, metric: str) -> bool:
        """Whether the run has global rows of ``metric``, or client rows of a metric only
        clients record (the diagnostics' in-local accuracy)."""
        metric = self._alias(metric)
        return self._cached(
            "recorded",
            metric,
            lambda: self._has_global(metric) or bool((self.records["metric"] == metric).any()),
        )


class ClientInputs(SummaryInputs):
    """One client's view of a run under per-client task orders: its matrix ``A_k`` and its
    initial accuracies ``b[π_k(i)]``, so every matrix entry of the summary is computed for
    it by the same function as for the shared order (:func:`client_matrix`)."""

    def __init__(self, run: SummaryInputs, order: Sequence[int]) -> None:
        super().__init__(run.records, run.num_tasks)
        self.run = run
        self.order = list(order)

    def matrix(self, metric: str) -> np.ndarray:
        return client_matrix(self.run.matrix(metric), self.order)

    def initial(self, metric: str) -> np.ndarray:
        return np.asarray(self.run.initial(metric), dtype=float)[self.order]


class OwnInputs(SummaryInputs):
    """Client k's own matrix for a method scored by its clients' own models: ``A_k[t, i]``
    is its model for its i-th task scored on that task after step t (``own_<metric>`` rows
    of scope ``client_k``, the stream task's column moved to the client's position i by
    :func:`client_matrix`). Nothing is measured above the diagonal (no model exists for a
    task not trained yet) nor before training, so FWT is NaN."""

    def __init__(self, run: SummaryInputs, client: int, order: Sequence[int]) -> None:
        super().__init__(run.records, run.num_tasks)
        self.run = run
        self.client = client
        self.order = list(order)

    def matrix(self, metric: str) -> np.ndarray:
        own = f"own_{self.run._alias(metric)}"
        scope = f"client_{self.client}"
        return self._cached(
            "own",
            metric,
            lambda: client_matrix(
                matrix_from_records(self.records, own, scope, self.num_tasks), self.order
            ),
        )

    def initial(self, metric: str) -> np.ndarray:
        return np.full(self.num_tasks, np.nan)


def own_inputs(inputs: SummaryInputs, orders: list[list[int]] | None) -> list[OwnInputs]:
    """One :class:`OwnInputs` per client with ``own_`` rows, in client order (the stream's
    order for every client unless ``orders`` gives each its own)."""
    records = inputs.records
    rows = records[records["metric"].astype(str).str.startswith("own_")]
    clients = sorted({int(str(s).removeprefix("client_")) for s in rows["scope"]})
    shared = list(range(inputs.num_tasks))
    return [OwnInputs(inputs, k, shared if orders is None else orders[k]) for k in clients]


# --------------------------------------------------------------------------------------------
# Summary entries: the ``compute`` functions named in cfl_bench.core.metric_registry.METRICS, each
# called as fn(inputs, source) with ``source`` the entry's recorded metric.
# --------------------------------------------------------------------------------------------


def task_count(inputs: SummaryInputs, source: str | None) -> int:
    """The stream's number of tasks, so a summary says what its curves are indexed by."""
    return inputs.num_tasks


def accuracy_matrix(inputs: SummaryInputs, source: str) -> np.ndarray:
    """a[t, i] of ``source`` (stored at full precision so forgetting can be re-derived)."""
    return inputs.matrix(source)


def accuracy_curve(inputs: SummaryInputs, source: str) -> np.ndarray:
    """Acc_t for every t."""
    return average_accuracy(inputs.matrix(source))


def final_accuracy(inputs: SummaryInputs, source: str) -> float:
    """Acc_T, the headline number."""
    return _last(accuracy_curve(inputs, source))


def forgetting_curve(inputs: SummaryInputs, source: str) -> np.ndarray:
    """Fgt_t (Chaudhry rule) for every t."""
    return forgetting(inputs.matrix(source))


def final_forgetting(inputs: SummaryInputs, source: str) -> float:
    """Fgt_T, Chaudhry rule (max over rows after the task was trained, before now)."""
    return _last(forgetting_curve(inputs, source))


def final_forgetting_clipped(inputs: SummaryInputs, source: str) -> float:
    """Fgt_T, Mammoth / FedGP rule (the max includes the current row, so it is >= 0)."""
    return _last(forgetting(inputs.matrix(source), include_current=True))


def backward_transfer_of(inputs: SummaryInputs, source: str) -> float:
    """BWT of the ``source`` matrix."""
    return backward_transfer(inputs.matrix(source))


def forward_transfer_of(inputs: SummaryInputs, source: str) -> float:
    """FWT of the ``source`` matrix against the initial model's accuracies."""
    return forward_transfer(inputs.matrix(source), inputs.initial(source))


def drift_curve(inputs: SummaryInputs, source: str) -> np.ndarray:
    """MD_t for every t, from the ``kl_drift`` matrix."""
    return memory_drift(inputs.matrix(source))


def final_global_value(inputs: SummaryInputs, source: str) -> float | None:
    """The last round's global value of ``source`` (a per-round measurement such as the
    held-out test town's mAP); None when never recorded."""
    rows = _select(inputs.records, source, "global")
    if rows.empty:
        return None
    return float(rows.sort_values("round", kind="stable")["value"].astype(float).iloc[-1])


def client_mean_final(inputs: SummaryInputs, source: str) -> float | None:
    """Mean over the last round's participants of a per-client measurement (the
    diagnostics' in-local accuracy, weight divergence); None when never recorded."""
    records = inputs.records
    rows = records[
        (records["metric"] == source) & records["scope"].astype(str).str.startswith("client_")
    ]
    if rows.empty:
        return None
    rows = rows.astype({"round": int})
    return float(rows[rows["round"] == rows["round"].max()]["value"].astype(float).mean())


def final_drift(inputs: SummaryInputs, source: str) -> float:
    """MD_T."""
    return _last(drift_curve(inputs, source))


def _per_round(inputs: SummaryInputs, metric: str) -> pd.Series | None:
    """One byte counter summed per round; None when it was never recorded (unknown is not
    the same as zero bytes)."""
    rows = _select(inputs.records, metric, "global")
    return None if rows.empty else rows.groupby("round")["value"].sum()


def bytes_total_of(inputs: SummaryInputs, source: str) -> int | None:
    """Total bytes of one counter over all rounds, as an integer."""
    per_round = _per_round(inputs, source)
    return None if per_round is None else round(float(per_round.sum()))


def bytes_per_round_mean(inputs: SummaryInputs, source: str) -> float | None:
    """Mean bytes of one counter per round."""
    per_round = _per_round(inputs, source)
    return None if per_round is None else float(per_round.mean())


def _client_spread_of(inputs: SummaryInputs, metric: str) -> dict[str, float]:
    """Client spread of local-model accuracy at the end of the final task (T−1).

    The final task, not the latest one present, so that an unfinished run reports None here
    just as it does for Acc_T, instead of a spread from an earlier point in the stream.
    """
    records = inputs.records
    _check_records(records)
    rows = records[
        (records["metric"] == metric) & records["scope"].astype(str).str.startswith("client_")
    ].astype({"round": int, "trained_task": int})
    rows = rows[rows["trained_task"] == inputs.num_tasks - 1]
    if rows.empty:
        return client_spread([])
    last = rows.groupby("scope")["round"].transform("max")
    rows = rows[rows["round"] == last].drop_duplicates(subset=["scope"], keep="last")
    return client_spread(rows["value"].to_numpy(dtype=float))


def client_p10(inputs: SummaryInputs, source: str) -> float:
    """10th percentile over clients of local-model accuracy after the final task."""
    return inputs.spread(source)["p10"]


def client_p50(inputs: SummaryInputs, source: str) -> float:
    """Median over clients of local-model accuracy after the final task."""
    return inputs.spread(source)["p50"]


def client_p90(inputs: SummaryInputs, source: str) -> float:
    """90th percentile over clients of local-model accuracy after the final task."""
    return inputs.spread(source)["p90"]


# --------------------------------------------------------------------------------------------
# Progress over rounds (what rounds-to-target and bytes-to-target read)
# --------------------------------------------------------------------------------------------


def progress_by_round(records: pd.DataFrame, num_tasks: int) -> list[tuple[int, float, float]]:
    """(round, average accuracy, cumulative bytes) for every round with a complete evaluation.

    The average accuracy of round r is the mean of the headline metric (accuracy, mAP@0.5 on
    a detection stream) of the global model over the tasks trained so far, 0 ≤ i ≤ t, t the
    round's task: Acc_t measured at round r (the task-t+1 evaluation that exists for FWT is
    left out, as in Acc_t). A round is listed only when every one of those tasks was
    evaluated in it, so a partial evaluation never passes for a complete one; without
    ``--eval-every-round`` only task ends are evaluated. The cumulative bytes are
    ``bytes_up + bytes_down`` summed over rounds 1..r, NaN when neither was recorded.
    """
    _check_records(records)
    headline = SummaryInputs(records, num_tasks).headline
    rows = _select(records, headline, "global")
    rows = rows[(rows["trained_task"] >= 0) & rows["eval_task"].between(0, rows["trained_task"])]
    rows = rows.drop_duplicates(subset=["round", "eval_task"], keep="last")
    counters = records[
        (records["scope"] == "global") & records["metric"].isin(("bytes_up", "bytes_down"))
    ]
    per_round = counters.groupby("round")["value"].sum().sort_index()
    cumulative = per_round.cumsum()
    out: list[tuple[int, float, float]] = []
    for round_, group in rows.groupby("round", sort=True):
        task = int(group["trained_task"].max())
        if sorted(int(i) for i in group["eval_task"]) != list(range(task + 1)):
            continue
        reached = cumulative[cumulative.index <= round_]
        spent = float(reached.iloc[-1]) if len(reached) else math.nan
        accuracy = math.fsum(float(v) for v in group["value"]) / (task + 1)
        out.append((int(round_), accuracy, spent))
    return out


def first_reaching(
    progress: Sequence[tuple[int, float, float]], target: float
) -> tuple[int, float] | None:
    """(round, cumulative bytes) of the first round whose average accuracy is ≥ ``target``
    (in %); None when no evaluated round reaches it."""
    for round_, accuracy, spent in progress:
        if accuracy >= target:
            return round_, spent
    return None


# The summary entries that are functions of one accuracy matrix (and of b): under per-client
# task orders each is computed on every client's own matrix (``ClientInputs``) and averaged
# over the clients (FedWeIT's mean over clients of each client's accuracy on its own tasks);
# the global matrix itself (``accuracy_matrix``) stays the stream-task-indexed one.
PER_CLIENT_COMPUTES = frozenset(
    {
        "accuracy_curve",
        "final_accuracy",
        "forgetting_curve",
        "final_forgetting",
        "final_forgetting_clipped",
        "backward_transfer_of",
        "forward_transfer_of",
    }
)


# The summary entries read from the global model's task-end matrices (accuracy and memory
# drift): none of them is reported for a run whose global model is not what the method is
# scored by (``summarize``'s ``not_scored``).
GLOBAL_MODEL_COMPUTES = PER_CLIENT_COMPUTES | {"accuracy_matrix", "drift_curve", "final_drift"}


@dataclass(frozen=True)
class MetricSources:
    """Which inputs each summary entry is computed from: ``clients`` (per-client views of
    the records, empty under the shared order), the computes averaged over them
    (``computes``) and those withheld as None (``withheld``)."""

    clients: Sequence[SummaryInputs]
    computes: frozenset[str]
    withheld: frozenset[str]


def metric_sources(
    inputs: SummaryInputs, orders: list[list[int]] | None, not_scored: str
) -> MetricSources:
    """Per-client views under per-client task orders (their matrices are in each client's
    own order, so a metric is the mean of theirs); the clients' own models when the global
    model is not scored, never the global one's matrices."""
    clients: Sequence[SummaryInputs] = []
    if orders is not None:
        clients = [ClientInputs(inputs, order) for order in orders]
    if not_scored:  # the clients' own models, never the global one's matrices
        clients, computes = own_inputs(inputs, orders), PER_CLIENT_COMPUTES
        withheld = GLOBAL_MODEL_COMPUTES - PER_CLIENT_COMPUTES
    else:
        computes, withheld = (PER_CLIENT_COMPUTES if clients else frozenset()), frozenset()
    return MetricSources(clients, computes, withheld)


def computed_metrics(
    inputs: SummaryInputs, sources: MetricSources, not_scored: str
) -> dict[str, Any]:
    """Every registered summary entry (:func:`summary_metrics`) in registry order, each by
    the function its ``compute`` names in this module, from ``sources``."""
    clients, computes, withheld = sources.clients, sources.computes, sources.withheld
    module = sys.modules[__name__]
    out: dict[str, Any] = {}
    for spec in summary_metrics():
        if spec.when_recorded and not inputs.recorded(str(spec.source)):
            continue
        compute = getattr(module, str(spec.compute))
        if spec.compute in withheld or (not_scored and not clients and spec.compute in computes):
            out[spec.key] = None
        elif spec.compute in computes:
            out[spec.key] = client_mean([compute(c, spec.source) for c in clients])
        else:
            out[spec.key] = compute(inputs, spec.source)
    return out


def summarize(records: pd.DataFrame, num_tasks: int, not_scored: str = "") -> dict[str, object]:
    """The headline metrics of one run as a JSON-able dict (NaN → None, full precision).

    A pure function of ``records`` so ``summary.json`` can always be regenerated from
    ``records.csv``. The keys are the entries of
    :func:`cfl_bench.core.metric_registry.summary_metrics`, each computed by the function its
    ``compute`` names in this module. Among them:

    * for each accuracy metric ``m`` in :data:`ACCURACY_METRICS` that has global
      rows: ``m_matrix``, ``m_t``, ``m_T``, ``fgt_m_t``, ``fgt_m_T`` (Chaudhry rule),
      ``fgt_clipped_m_T`` (max including the current row), ``bwt_m``, ``fwt_m``;
      for ``acc`` also the aliases ``Acc_T``, ``Fgt_T``, ``Fgt_T_clipped``, ``BWT``, ``FWT``;
    * ``md_t`` (length-T list) and ``MD_T`` from metric ``kl_drift``;
    * ``bytes_up_total``, ``bytes_down_total`` (ints), ``bytes_up_per_round_mean``,
      ``bytes_down_per_round_mean``;
    * ``client_acc_p10``, ``client_acc_p50``, ``client_acc_p90`` for the final task.

    Memory-drift, byte and client keys are always present (None when not recorded), so
    leaderboard code can rely on a fixed schema; an entry marked ``when_recorded`` is left
    out when its source was not recorded (no task-IL keys on a domain-IL run).

    ``not_scored``: why the global model is not what the run's method is scored by (a
    component's ``scored_by_clients``, e.g. FedWeIT's private per-task models). The global
    model's accuracy would then be reported as the method's, so no entry is read from its
    task-end matrices (:data:`GLOBAL_MODEL_COMPUTES`) and ``global_not_scored`` holds the
    reason; records.csv keeps its global rows. The matrix metrics are instead the mean over
    clients of each client's own matrix (:class:`OwnInputs`, the ``own_`` rows), and None
    where no client has one; ``acc_matrix`` and memory drift stay None.
    """
    _check_records(records)
    if num_tasks < 1:
        raise ValueError(f"num_tasks must be >= 1, got {num_tasks}")
    inputs = SummaryInputs(records, num_tasks)
    orders = task_orders_from_records(records)
    sources = metric_sources(inputs, orders, not_scored)
    out = computed_metrics(inputs, sources, not_scored)
    clients = sources.clients
    if orders is not None:
        out["task_orders"] = orders
    if clients:
        out["client_Acc_T"] = [final_accuracy(c, "acc") for c in clients]
        out["client_Fgt_T"] = [final_forgetting(c, "acc") for c in clients]
    if not_scored:
        out["global_not_scored"] = not_scored
    return _jsonable(out)
