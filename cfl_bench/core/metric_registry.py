"""One table of every metric cfl-bench reports: what it is called, how it is shown, where.

Why one registry: a summary metric used to be spelled out, by string literal, in the
summary, the CLI table, the leaderboard's loader, CSV columns, ranges, HTML and terminal
tables and the report page. Adding one meant touching all of them, and forgetting one gave
a column that silently stayed empty. Now every consumer reads the entries below, so a new
summary metric is one function in :mod:`cfl_bench.core.metrics` plus one :class:`MetricSpec`
line here (docs/metrics.md, "Adding a metric").

Two kinds of entries:

* :class:`RecordedMetric` — a ``metric`` value of ``records.csv`` (what the engine
  measures): its possible range, and whether it feeds the task-end matrices;
* :class:`MetricSpec` — a key of ``summary.json`` (what is reported): how it is computed
  (the name of a function of :mod:`cfl_bench.core.metrics`), its label, unit, format, direction,
  scenarios, plausible range, its leaderboard column and the tables that show it.

Order matters: :data:`METRICS` is in leaderboard column order (``leaderboard.csv``), and
the tables that group a metric with its task-IL twin use :func:`display_order`.

Core module: it imports nothing of the project (only the standard library), so the engine,
the leaderboard and analysis tools can all read it (tests/test_layers.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, TypedDict

if TYPE_CHECKING:  # typing.Unpack is Python 3.11+; only the type checker reads it here
    from typing_extensions import Unpack

__all__ = [
    "ACCURACY_METRICS",
    "AMOUNT",
    "COMPARED",
    "DIFFERENCE",
    "METRICS",
    "PERCENT",
    "RANK_BY",
    "RECORDED",
    "TASK_IL_MARKER",
    "VIEWS",
    "MetricSpec",
    "RecordedMetric",
    "board_columns",
    "display_order",
    "leaderboard_curves",
    "leaderboard_matrices",
    "metric",
    "metrics_for",
    "recorded",
    "summary_metrics",
    "task_il_twin",
    "view",
]

Direction = Literal["higher", "lower"] | None
#: ``percent``: accuracy or a difference of accuracies (%); ``nats``: a KL divergence;
#: ``bytes``; ``seconds``; ``count``: a whole number.
Unit = Literal["percent", "nats", "bytes", "seconds", "count", "norm"]
#: ``scalar``: one number; ``curve``: one value per task; ``matrix``: T × T.
Shape = Literal["scalar", "curve", "matrix"]
#: ``summary``: computed by :func:`cfl_bench.core.metrics.summarize` from records.csv; ``run``:
#: written into summary.json by the run itself (time, memory); ``leaderboard``: derived per
#: run by the leaderboard, as the sum of its ``parts`` or the mean of the curve ``mean_of``.
Origin = Literal["summary", "run", "leaderboard"]

#: The tables that show chosen metrics (a metric lists the ones it appears in):
#: ``cli`` the table after ``cfl-bench run``; ``board`` the leaderboard.html tables;
#: ``terminal`` the leaderboard's terminal tables; ``report`` the results table of
#: ``cfl-bench report``. (Every summary value is compared with the records by the reader of
#: run directories: :mod:`cfl_bench.core.run_agreement`.)
VIEWS: tuple[str, ...] = ("cli", "board", "terminal", "report")

#: Plausible ranges, checked when the leaderboard reads a summary (a value outside means a
#: damaged file). Accuracies are %; differences of two accuracies lie within ±100.
PERCENT: tuple[float, float] = (0.0, 100.0)
DIFFERENCE: tuple[float, float] = (-100.0, 100.0)
AMOUNT: tuple[float, float] = (0.0, 1e100)
INF = float("inf")


@dataclass(frozen=True)
class RecordedMetric:
    """A ``metric`` of records.csv. ``range`` is what a measurement can be (the report
    refuses a records.csv outside it); ``task_end`` metrics build the task-end matrices
    (a value measured mid-task is not a task-end evaluation); ``accuracy`` metrics are
    turned into accuracy matrices and CL metrics, and averaged over seen tasks by the
    trackers."""

    name: str
    range: tuple[float, float]
    task_end: bool = False
    accuracy: bool = False


#: Recorded metrics whose values are checked, in the order the report checks them.
RECORDED: tuple[RecordedMetric, ...] = (
    RecordedMetric("acc", PERCENT, task_end=True, accuracy=True),
    RecordedMetric("acc_task_il", PERCENT, task_end=True, accuracy=True),
    # Detection streams (CARLA): COCO mAP@0.5 and mAP@[.5:.95] in percent, per domain, and
    # on the held-out test town (``test_``, eval task -1).
    RecordedMetric("map50", PERCENT, task_end=True, accuracy=True),
    RecordedMetric("map", PERCENT, task_end=True, accuracy=True),
    RecordedMetric("test_map50", PERCENT),
    RecordedMetric("test_map", PERCENT),
    RecordedMetric("client_acc", PERCENT),
    # A method scored by its clients' own models (``Component.scored_by_clients``): client
    # k's model for task j on task j's test set, at every task end (scope client_k).
    RecordedMetric("own_acc", PERCENT, task_end=True),
    RecordedMetric("own_acc_task_il", PERCENT, task_end=True),
    # --diagnostics (cfl_bench.engine.diagnostics): per participant and per round.
    RecordedMetric("in_local_acc", PERCENT),
    RecordedMetric("out_local_acc", PERCENT),
    RecordedMetric("weight_divergence", (0.0, INF)),
    RecordedMetric("class_forgetting", (-100.0, 100.0)),
    RecordedMetric("round_forgetting", PERCENT),
    RecordedMetric("kl_drift", (0.0, INF), task_end=True),
    RecordedMetric("buffer_drift", (0.0, INF)),
    RecordedMetric("bytes_up", (0.0, INF)),
    RecordedMetric("bytes_down", (0.0, INF)),
)
#: Accuracy-like recorded metrics (class-/domain-IL, then task-IL).
ACCURACY_METRICS: tuple[str, ...] = tuple(r.name for r in RECORDED if r.accuracy)


@dataclass(frozen=True)
class MetricSpec:
    """One key of summary.json and everything the tables need to show it.

    ``compute`` names a function of :mod:`cfl_bench.core.metrics` called as
    ``fn(inputs, source)``; ``source`` is the recorded metric it reads. With
    ``when_recorded`` the key exists only if ``source`` has global rows (a domain-IL run
    has no task-IL keys); otherwise it is always present, None when unknown, so the
    leaderboard can rely on a fixed schema. ``column`` is the leaderboard's name for it
    (None: not on the board). ``family`` groups a metric with its task-IL twin in the
    tables (:func:`display_order`); ``task_il_of`` names that twin. ``short`` is the label
    of narrow terminal tables, ``tooltip`` the board's column tooltip, ``description``
    what the report says it is. ``range`` None means any number (not checked).
    ``parts`` / ``mean_of`` (``origin="leaderboard"`` only): the columns it is the per-run
    sum of, or the leaderboard curve it is the per-run mean of.
    """

    key: str
    label: str
    description: str
    unit: Unit
    direction: Direction
    family: str
    shape: Shape = "scalar"
    fmt: str = ".2f"
    scenarios: tuple[str, ...] | None = None
    range: tuple[float, float] | None = None
    origin: Origin = "summary"
    compute: str | None = None
    source: str | None = None
    when_recorded: bool = False
    column: str | None = None
    views: frozenset[str] = frozenset()
    short: str = ""
    tooltip: str = ""
    task_il_of: str | None = None
    label_names_scenario: bool = False
    parts: tuple[str, ...] = ()
    mean_of: str | None = None

    @property
    def short_label(self) -> str:
        return self.short or self.label

    @property
    def narrow_label(self) -> str:
        """The label of narrow terminal tables: short, ``%`` for percentages (``Acc_T %``)."""
        return f"{self.short_label} %" if self.unit == "percent" else self.short_label

    @property
    def column_tooltip(self) -> str:
        return self.tooltip or self.description

    def applies_to(self, scenario: str | None) -> bool:
        """Whether the metric exists on a stream of ``scenario`` (None: not known to be
        class-IL, so only the metrics of every scenario)."""
        return self.scenarios is None or scenario in self.scenarios


def _v(*names: str) -> frozenset[str]:
    unknown = set(names) - set(VIEWS)
    if unknown:
        raise ValueError(f"unknown views {sorted(unknown)}; use some of {VIEWS}")
    return frozenset(names)


_CIL = ("class-il",)
#: Keys that exist on detection streams only (CARLA: mAP by name, the test town). Those
#: streams are domain-IL; ``metrics_for("detection")`` lists these keys.
_DET = ("detection",)


class _BlockFields(TypedDict):
    """The fields every entry of one accuracy block shares (typed, so ``**common`` is
    checked against :class:`MetricSpec`'s fields)."""

    unit: Unit
    source: str
    when_recorded: bool
    scenarios: tuple[str, ...] | None


class _AliasFields(TypedDict):
    """What every headline alias states itself (:func:`_headline`, :func:`_task_il`)."""

    description: str
    direction: Direction
    family: str


class _AliasOptions(_AliasFields, total=False):
    """... and what some of them add (typed, so a misspelt field is caught by the type
    checker, not when the module is imported)."""

    short: str
    tooltip: str
    views: frozenset[str]
    label_names_scenario: bool


def _accuracy_block(
    source: str,
    task_il: bool,
    what: str = "",
    columns: bool = True,
    scenarios: tuple[str, ...] | None = None,
) -> tuple[MetricSpec, ...]:
    """The long-named keys of one accuracy metric: ``acc_T``, ``fgt_acc_T``, ... (for
    ``acc`` the leaderboard reads the short aliases instead, see :data:`METRICS`). ``what``
    names the metric in descriptions; ``columns`` False keeps it off the leaderboard."""
    m = source
    scen = _CIL if task_il else scenarios
    what = what or ("task-IL " if task_il else "")
    common: _BlockFields = {
        "unit": "percent",
        "source": m,
        "when_recorded": True,
        "scenarios": scen,
    }
    return (
        MetricSpec(f"{m}_matrix", "accuracy matrix", f"{what}a[t][i] at each task end",
                   direction=None, family="accuracy", shape="matrix", range=PERCENT,
                   compute="accuracy_matrix", column=f"{m}_matrix" if columns else None,
                   **common),
        MetricSpec(f"{m}_t", "Acc_t", f"{what}average accuracy after each task",
                   direction="higher", family="accuracy", shape="curve", range=PERCENT,
                   compute="accuracy_curve", column=f"{m}_t" if columns else None, **common),
        MetricSpec(f"fgt_{m}_t", "Fgt_t", f"{what}Chaudhry forgetting after each task",
                   direction="lower", family="forgetting", shape="curve", range=DIFFERENCE,
                   compute="forgetting_curve",
                   column=None if not columns else "fgt_task_il_t" if task_il else "fgt_t",
                   **common),
        MetricSpec(f"{m}_T", f"Acc_T {what}".strip(), f"{what}final average accuracy",
                   direction="higher", family="accuracy", range=PERCENT,
                   compute="final_accuracy", **common),
        MetricSpec(f"fgt_{m}_T", "Fgt_T", f"{what}Chaudhry forgetting", direction="lower",
                   family="forgetting", range=DIFFERENCE, compute="final_forgetting", **common),
        MetricSpec(f"fgt_clipped_{m}_T", "Fgt_T clipped", f"{what}Mammoth / FedGP forgetting",
                   direction="lower", family="forgetting", range=DIFFERENCE,
                   compute="final_forgetting_clipped", **common),
        MetricSpec(f"bwt_{m}", "BWT", f"{what}backward transfer", direction="higher",
                   family="transfer", range=DIFFERENCE, compute="backward_transfer_of",
                   **common),
        MetricSpec(f"fwt_{m}", "FWT", f"{what}forward transfer", direction="higher",
                   family="transfer", range=DIFFERENCE, compute="forward_transfer_of",
                   **common),
    )  # fmt: skip


def _headline(
    key: str,
    column: str,
    label: str,
    compute: str,
    range: tuple[float, float] = DIFFERENCE,
    **kw: Unpack[_AliasOptions],
) -> MetricSpec:
    """A class-/domain-IL headline alias (``Acc_T`` = ``acc_T``, ...): a leaderboard column."""
    return MetricSpec(key, label, unit="percent", source="acc", when_recorded=True,
                      range=range, column=column, compute=compute, **kw)  # fmt: skip


def _task_il(
    key: str,
    column: str,
    label: str,
    compute: str,
    twin: str,
    range: tuple[float, float] = DIFFERENCE,
    **kw: Unpack[_AliasOptions],
) -> MetricSpec:
    """The task-IL twin of a headline: class-IL streams only, same runs, masked logits."""
    return MetricSpec(key, label, unit="percent", source="acc_task_il", when_recorded=True,
                      range=range, column=column, compute=compute, scenarios=_CIL,
                      task_il_of=twin, **kw)  # fmt: skip


_COMM = "all rounds recorded, all clients"

#: --diagnostics (FedNTD): what local training forgets, at the last round — key, label,
#: description, unit, direction, range, compute, source of each entry.
_DIAGNOSTICS: tuple[tuple[str, str, str, Unit, Direction, tuple[float, float], str, str], ...] = (
    ("in_local_acc_final", "in-local acc", "local models' accuracy on the classes "
     "their client holds, weighted by its class shares (FedNTD), last round",
     "percent", "higher", PERCENT, "client_mean_final", "in_local_acc"),
    ("out_local_acc_final", "out-local acc", "local models' accuracy on the classes "
     "their client lacks (FedNTD), last round", "percent", "higher", PERCENT,
     "client_mean_final", "out_local_acc"),
    ("weight_divergence_final", "weight divergence", "mean ‖θ_k − θ_g‖ of the last "
     "round's local models", "norm", "lower", (0.0, INF), "client_mean_final",
     "weight_divergence"),
    ("class_forgetting_final", "class forgetting", "global model's class-wise "
     "forgetting over rounds, FedNTD eq. 5, after the last round", "percent",
     "lower", (-100.0, 100.0), "final_global_value", "class_forgetting"),
)  # fmt: skip

#: Every metric. Entries with a ``column`` are in leaderboard.csv column order; the others
#: (long-named keys, per-round means, client spread) may sit anywhere.
METRICS: tuple[MetricSpec, ...] = (
    MetricSpec("num_tasks", "tasks", "number of tasks of the stream", unit="count",
               direction=None, family="run", fmt="d", compute="task_count"),
    # The headline of the stream's own scenario (class-IL or domain-IL).
    _headline("Acc_T", "Acc_T", "Acc_T", "final_accuracy",
              description="mean accuracy over all tasks after the last one",
              tooltip="final average accuracy", direction="higher", family="accuracy",
              range=PERCENT, label_names_scenario=True,
              views=_v("cli", "board", "terminal", "report")),
    _headline("Fgt_T", "Fgt_T", "Fgt_T", "final_forgetting",
              description="Chaudhry forgetting (max after each task's training)",
              tooltip="Chaudhry forgetting: max over evaluations after each old task was "
              "trained", direction="lower", family="forgetting",
              views=_v("cli", "board", "terminal", "report")),
    _headline("Fgt_T_clipped", "Fgt_T_clipped", "Fgt_T clipped", "final_forgetting_clipped",
              description="Mammoth / FedGP rule (≥ 0)", direction="lower",
              family="forgetting", views=_v("report")),
    _headline("BWT", "BWT", "BWT", "backward_transfer_of",
              description="backward transfer (negative: forgetting)",
              tooltip="backward transfer", direction="higher", family="transfer",
              views=_v("cli", "board", "report")),
    _headline("FWT", "FWT", "FWT", "forward_transfer_of",
              description="forward transfer (task before its training vs. start)",
              tooltip="forward transfer", direction="higher", family="transfer",
              views=_v("cli", "board", "report")),
    # Average incremental accuracy: the mean of the Acc_t curve (every Acc_t is in the
    # summary, so old runs get it too without a new summary key).
    MetricSpec("AIA", "AIA", "average incremental accuracy: mean of Acc_t over tasks",
               tooltip="average incremental accuracy: mean over t of Acc_t", unit="percent",
               direction="higher", family="accuracy", range=PERCENT, origin="leaderboard",
               source="acc", column="AIA", mean_of="acc_t", views=_v("board")),
    *_accuracy_block("acc", task_il=False),
    # Task-IL: the same class-IL runs with logits masked to the evaluated task's classes.
    _task_il("acc_task_il_T", "Acc_T_task_il", "Acc_T task-IL", "final_accuracy", "Acc_T",
             description="same, logits masked to each task", tooltip="same runs, logits "
             "masked", short="task-IL", direction="higher", family="accuracy", range=PERCENT,
             views=_v("board", "terminal", "report")),
    _task_il("fgt_acc_task_il_T", "Fgt_T_task_il", "Fgt_T task-IL", "final_forgetting",
             "Fgt_T", description="task-IL forgetting", direction="lower",
             family="forgetting", views=_v("board", "report")),
    _task_il("fgt_clipped_acc_task_il_T", "Fgt_T_clipped_task_il", "Fgt_T clipped task-IL",
             "final_forgetting_clipped", "Fgt_T_clipped",
             description="task-IL forgetting, Mammoth / FedGP rule (≥ 0)", direction="lower",
             family="forgetting"),
    _task_il("bwt_acc_task_il", "BWT_task_il", "BWT task-IL", "backward_transfer_of", "BWT",
             description="task-IL backward transfer", direction="higher", family="transfer",
             views=_v("report")),
    _task_il("fwt_acc_task_il", "FWT_task_il", "FWT task-IL", "forward_transfer_of", "FWT",
             description="task-IL forward transfer", direction="higher", family="transfer",
             views=_v("report")),
    MetricSpec("AIA_task_il", "AIA task-IL", "task-IL average incremental accuracy",
               tooltip="same runs, logits masked", unit="percent", direction="higher",
               family="accuracy", range=PERCENT, origin="leaderboard", source="acc_task_il",
               column="AIA_task_il", mean_of="acc_task_il_t", scenarios=_CIL, task_il_of="AIA",
               views=_v("board")),
    # ... and its curves and matrix (its final values are the leaderboard columns above).
    *(s for s in _accuracy_block("acc_task_il", task_il=True) if s.shape != "scalar"),
    # Detection streams: the same keys for mAP@0.5 and mAP@[.5:.95] by name (the accuracy
    # aliases above then read mAP@0.5, the stream's headline: SummaryInputs.headline).
    *_accuracy_block("map50", False, "mAP@0.5 ", columns=False, scenarios=_DET),
    *_accuracy_block("map", False, "mAP@[.5:.95] ", columns=False, scenarios=_DET),
    MetricSpec("test_map50_final", "test-town mAP@0.5", "mAP@0.5 (%) on the held-out test "
               "town after the last round", unit="percent", direction="higher",
               family="test town", range=PERCENT, compute="final_global_value",
               source="test_map50", when_recorded=True, scenarios=_DET,
               views=_v("cli", "report")),
    # Memory drift (KL on old tasks' probes). No range check: none was ever applied.
    MetricSpec("MD_T", "MD_T", "memory drift: mean KL on old tasks' probes (nats)",
               tooltip="memory drift (mean KL, nats)", unit="nats", direction="lower",
               family="drift", fmt=".4f", compute="final_drift", source="kl_drift",
               column="MD_T", views=_v("cli", "board", "report")),
    MetricSpec("md_t", "MD_t", "memory drift after each task (nats)", unit="nats",
               direction="lower", family="drift", shape="curve", fmt=".4f",
               compute="drift_curve", source="kl_drift", column="md_t"),
    # Communication: bytes_total exists on the board only (per run, up + down).
    MetricSpec("bytes_total", "bytes", "total bytes up + down", unit="bytes",
               tooltip="total bytes up + down (mean)", direction="lower",
               family="communication", range=AMOUNT, origin="leaderboard",
               column="bytes_total", parts=("bytes_up_total", "bytes_down_total"),
               views=_v("board", "terminal")),
    MetricSpec("bytes_up_total", "bytes up", _COMM, unit="bytes", direction="lower",
               family="communication", range=AMOUNT, compute="bytes_total_of",
               source="bytes_up", column="bytes_up",
               views=_v("cli", "report")),
    MetricSpec("bytes_down_total", "bytes down", _COMM, unit="bytes", direction="lower",
               family="communication", range=AMOUNT, compute="bytes_total_of",
               source="bytes_down", column="bytes_down",
               views=_v("cli", "report")),
    MetricSpec("bytes_up_per_round_mean", "bytes up per round", "mean bytes up per round",
               unit="bytes", direction="lower", family="communication", range=AMOUNT,
               compute="bytes_per_round_mean", source="bytes_up"),
    MetricSpec("bytes_down_per_round_mean", "bytes down per round",
               "mean bytes down per round", unit="bytes", direction="lower",
               family="communication", range=AMOUNT, compute="bytes_per_round_mean",
               source="bytes_down"),
    # Client spread of local-model accuracy after the final task (LEAF-style).
    *(MetricSpec(f"client_acc_{p}", f"clients {p}", f"{p} of the local models' accuracy "
                 "after the final task", unit="percent", direction="higher",
                 family="clients", range=PERCENT, compute=f"client_{p}", source="client_acc")
      for p in ("p10", "p50", "p90")),
    # --diagnostics (FedNTD): what local training forgets, at the last round.
    *(MetricSpec(key, label, description, unit=unit, direction=direction,
                 family="diagnostics", range=bounds, compute=compute, source=source,
                 when_recorded=True, column=key, views=_v("report"))
      for key, label, description, unit, direction, bounds, compute, source in _DIAGNOSTICS),
    # Cost, written by the run (only summary.json knows it).
    MetricSpec("wall_time_s", "wall time", "wall-clock time per run", unit="seconds",
               short="time", direction="lower", family="cost", fmt=".1f", range=AMOUNT,
               origin="run", column="wall_time_s", views=_v("cli", "board", "report")),
)  # fmt: skip

#: The metric that ranks strategies within a protocol (by its ``direction``).
RANK_BY = "Acc_T"
#: Metrics whose rows the leaderboard compares with the best row of their protocol (a
#: 95 % confidence interval, a t-test by seed, Holm's correction): the headline numbers.
COMPARED: tuple[str, ...] = ("Acc_T", "AIA", "Fgt_T", "BWT", "FWT", "Acc_T_task_il")
#: The key whose presence marks a run with task-IL evaluations (a class-IL stream).
TASK_IL_MARKER = "acc_task_il_T"

_RECORDED: dict[str, RecordedMetric] = {r.name: r for r in RECORDED}


def metric(key: str) -> MetricSpec:
    """The entry of summary key ``key`` (or of leaderboard column ``key``). A scan rather
    than a dict built at import, so a test that swaps :data:`METRICS` sees its entries."""
    found = next((s for s in METRICS if s.key == key), None)
    found = found or next((s for s in METRICS if s.column == key), None)
    if found is None:
        raise KeyError(f"'{key}' is not a registered metric; add it to METRICS")
    return found


def recorded(name: str) -> RecordedMetric | None:
    """The entry of a records.csv metric; None for one not range-checked (train_loss)."""
    return _RECORDED.get(name)


def summary_metrics() -> tuple[MetricSpec, ...]:
    """The entries :func:`cfl_bench.core.metrics.summarize` computes, in order."""
    return tuple(s for s in METRICS if s.origin == "summary")


def metrics_for(scenario: str | None, view_name: str | None = None) -> tuple[MetricSpec, ...]:
    """The entries that exist on a stream of ``scenario`` (task-IL ones on class-IL only),
    optionally only those shown in one table, in registry order."""
    return tuple(
        s for s in METRICS if s.applies_to(scenario) and (view_name is None or view_name in s.views)
    )


def view(view_name: str) -> tuple[MetricSpec, ...]:
    """Every entry shown in one table (all scenarios), in registry order."""
    if view_name not in VIEWS:
        raise ValueError(f"unknown view {view_name!r}; use one of {VIEWS}")
    return tuple(s for s in METRICS if view_name in s.views)


def display_order(specs: tuple[MetricSpec, ...]) -> tuple[MetricSpec, ...]:
    """``specs`` grouped by family (accuracy, forgetting, transfer, ...), class-/domain-IL
    before task-IL within a family: how the report and HTML tables read (each metric beside
    its task-IL twin), while the CSV keeps registry order."""
    rank: dict[str, int] = {}
    for s in METRICS:
        rank.setdefault(s.family, len(rank))
    return tuple(sorted(specs, key=lambda s: (rank[s.family], s.task_il_of is not None)))


def task_il_twin(key: str) -> MetricSpec | None:
    """The task-IL twin of a class-/domain-IL entry (``Acc_T`` → ``acc_task_il_T``)."""
    return next((s for s in METRICS if s.task_il_of == key), None)


def board_columns() -> tuple[MetricSpec, ...]:
    """The per-run scalar metrics of the leaderboard, in CSV column order."""
    return tuple(s for s in METRICS if s.column and s.shape == "scalar")


def leaderboard_curves() -> dict[str, str]:
    """Leaderboard curve name → summary key (per-task curves kept for the plots)."""
    return {s.column: s.key for s in METRICS if s.column and s.shape == "curve"}


def leaderboard_matrices() -> dict[str, str]:
    """Leaderboard matrix name → summary key."""
    return {s.column: s.key for s in METRICS if s.column and s.shape == "matrix"}
