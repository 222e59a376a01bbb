"""Per-round accuracy curves of one run: the headline of a static (FL) run.

Why a figure of its own: a continual run is read at its task ends (the accuracy matrix),
but a static federated run has one task, and what the FL papers plot is the global model's
test accuracy after every round (``--eval-every-round``). With ``--diagnostics`` a second
panel shows what local training forgets round by round: the participants' mean accuracy on
the classes they hold (in-local) and on those they lack (out-local), and the global model's
class-wise forgetting (FedNTD eq. 5).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from cfl_bench.leaderboard.plots import (
    ACC_MIN_SPAN,
    PERCENT_RANGE,
    figure_style,
    new_figure,
    series_style,
    set_ylimits,
    to_svg,
)

if TYPE_CHECKING:
    import pandas as pd


def accuracy_by_round(records: pd.DataFrame) -> pd.DataFrame:
    """Round × evaluated task → the global model's headline accuracy (NaN where not
    evaluated); empty when no accuracy was recorded."""
    rows = records[(records["metric"] == "acc") & (records["scope"] == "global")]
    return rows.pivot_table(index="round", columns="eval_task", values="value", aggfunc="last")


def diagnostics_by_round(records: pd.DataFrame) -> pd.DataFrame:
    """Round → mean in-local / out-local accuracy over the round's participants and the
    global class-wise forgetting; empty without ``--diagnostics``."""
    import pandas as pd

    clients = records[records["scope"].astype(str).str.startswith("client_")]
    columns = {
        name: clients[clients["metric"] == name].groupby("round")["value"].mean()
        for name in ("in_local_acc", "out_local_acc")
    }
    forgetting = records[(records["metric"] == "class_forgetting") & (records["scope"] == "global")]
    columns["class_forgetting"] = forgetting.groupby("round")["value"].last()
    return pd.DataFrame({k: v for k, v in columns.items() if not v.empty})


def round_accuracy_svg(records: pd.DataFrame, ends: Sequence[int], figure_id: str) -> str | None:
    """The per-round curves, or None when accuracy was measured at task ends only."""
    acc = accuracy_by_round(records)
    if acc.empty or len(acc.index) <= len(ends) + 1:
        return None
    diagnostics = diagnostics_by_round(records)
    with figure_style(figure_id):
        fig = new_figure(8.0 if not diagnostics.empty else 4.6, 3.3)
        axes = fig.subplots(1, 2 if not diagnostics.empty else 1, squeeze=False)[0]
        _accuracy_panel(axes[0], acc, ends)
        if not diagnostics.empty:
            _diagnostics_panel(axes[1], diagnostics)
        return to_svg(fig, figure_id)


def _accuracy_panel(ax: Any, acc: pd.DataFrame, ends: Sequence[int]) -> None:
    for i, task in enumerate(acc.columns):
        series = acc[task].dropna()
        label = f"task {int(task) + 1}" if len(acc.columns) > 1 else "global model"
        ax.plot(series.index, series.to_numpy(), linewidth=1.4, label=label, **series_style(i))
    for end in ends:
        ax.axvline(end, color="#9aa3ad", linestyle=":", linewidth=0.9, zorder=0)
    set_ylimits(ax, acc.to_numpy().ravel(), min_span=ACC_MIN_SPAN, bounds=PERCENT_RANGE)
    ax.set(xlabel="round", ylabel="test accuracy (%)", title="accuracy after every round")
    if len(acc.columns) > 1:
        ax.legend(loc="lower right", frameon=False)


def _diagnostics_panel(ax: Any, diagnostics: pd.DataFrame) -> None:
    labels = {
        "in_local_acc": "in-local acc (participants)",
        "out_local_acc": "out-local acc (participants)",
        "class_forgetting": "class forgetting (global, eq. 5)",
    }
    for i, column in enumerate(diagnostics.columns):
        series = diagnostics[column].dropna()
        ax.plot(series.index, series.to_numpy(), linewidth=1.4, label=labels[column],
                **series_style(i))  # fmt: skip
    ax.set(xlabel="round", ylabel="%", title="what local training forgets")
    ax.legend(loc="best", frameon=False, fontsize="small")
