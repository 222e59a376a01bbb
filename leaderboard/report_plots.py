"""The figures only a single-run report has: per-round loss and bytes, client spread, buffer
drift and the client × class tables.

Why a module beside :mod:`leaderboard.plots`: the leaderboard's figures compare strategies
(one line per strategy, averaged over seeds); these look inside one run (one line per
round, one dot per client). They use the same machinery — object-API figures rendered to
deterministic inline SVG by :func:`leaderboard.plots.to_svg`, the same styles and the same
axis rules (accuracy axes inside 0–100 % with a minimum span, counts and drifts from 0) —
so both pages look alike and stay free of external requests. Scales, and why:

* rounds run along the x axis, with a dotted line at every task end (the rounds at which
  the accuracy matrix is measured), so a jump in loss can be placed in the stream;
* per-client values are dots, spread sideways by client index (deterministically: the same
  run gives the same bytes), with the p10 / p50 / p90 percentiles over them; that stays
  readable for 10 clients and for 100;
* the client × class tables are heat maps (one panel per task, only the classes present in
  that task) with the counts written in the cells while they fit (≤ 12 clients, ≤ 16
  classes); the exact numbers are always in the page's tables as well.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from cfl_bench.leaderboard.plots import (
    ACC_MIN_SPAN,
    PERCENT_RANGE,
    figure_legend,
    figure_style,
    human_bytes,
    new_figure,
    series_style,
    set_ylimits,
    task_axis,
    to_svg,
)

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd
    from matplotlib.axes import Axes
    from numpy.typing import ArrayLike

#: Grey of individual clients (drawn under the percentile lines).
CLIENT_GREY = (0.45, 0.48, 0.52)
#: Largest number of clients whose buffer drift is drawn as one line each.
MAX_CLIENT_LINES = 20
#: Largest table whose counts are written into the heat-map cells.
MAX_ANNOTATED_CLIENTS = 12
MAX_ANNOTATED_CLASSES = 16


def _task_ends(ax: Axes, ends: Sequence[int]) -> None:
    """A dotted vertical line at every task end (rounds are 1-based, as in records.csv)."""
    for end in ends:
        ax.axvline(end, color="#9aa3ad", linestyle=":", linewidth=0.9, zorder=0)


def _round_axis(ax: Axes, last_round: int) -> None:
    """Rounds 1..R with integer ticks (matplotlib would offer 2.5 for a short run)."""
    from matplotlib.ticker import MaxNLocator

    ax.set_xlim(0.5, max(last_round, 1) + 0.5)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True, nbins=10))


def rounds_svg(
    loss: pd.Series,
    bytes_up: pd.Series,
    bytes_down: pd.Series,
    ends: Sequence[int],
    last_round: int,
    figure_id: str,
) -> str | None:
    """Training loss (mean over the round's local steps) and bytes sent up and down per
    round, each series indexed by round; None when no round was recorded. A loss that is
    not finite (a diverged run) is marked by a red cross at the top of the axis."""
    if loss.empty and bytes_up.empty and bytes_down.empty:
        return None
    marker = "o" if last_round <= 40 else None
    with figure_style(figure_id):
        fig = new_figure(8.0, 3.3)
        loss_ax, bytes_ax = fig.subplots(1, 2)
        _loss_panel(loss_ax, loss, marker)
        _bytes_panel(bytes_ax, bytes_up, bytes_down, marker)
        for ax in (loss_ax, bytes_ax):
            _round_axis(ax, last_round)
            _task_ends(ax, ends)
        handles, _labels = bytes_ax.get_legend_handles_labels()
        if handles:
            bytes_ax.legend(loc="lower right", frameon=False)
        return to_svg(fig, figure_id)


def _loss_panel(ax: Any, loss: pd.Series, marker: str | None) -> None:
    """The loss per round; rounds whose loss is not finite get a red cross at the top."""
    import numpy as np

    values = loss.to_numpy(dtype=float)
    finite = np.isfinite(values)
    ax.plot(
        loss.index,
        np.where(finite, values, np.nan),
        marker=marker,
        markersize=3.5,
        linewidth=1.4,
        color=series_style(0)["color"],
    )
    if finite.any():
        set_ylimits(ax, values[finite], min_span=0.0, include=(0.0,))
    else:  # nothing finite to scale to: a plain 0–1 axis carries the divergence marks
        ax.set_ylim(0.0, 1.0)
    if (~finite).any():
        top = ax.get_ylim()[1]
        ax.plot(
            loss.index[~finite],
            [top] * int((~finite).sum()),
            "x",
            color="#a4262c",
            markersize=7,
            clip_on=False,
            label="loss not finite (diverged)",
        )
        ax.legend(loc="lower left", frameon=False)
    ax.set(xlabel="round", ylabel="train loss", title="training loss per round")


def _bytes_panel(ax: Any, bytes_up: pd.Series, bytes_down: pd.Series, marker: str | None) -> None:
    """Bytes up and down per round. They are often equal (FedAvg sends the model both
    ways): a wide hollow line under a thin filled one keeps both visible where they
    coincide."""
    from matplotlib.ticker import FuncFormatter

    reach: list[float] = []
    looks = (
        {"marker": "o", "markersize": 6.5, "markerfacecolor": "none", "linewidth": 2.6},
        {"marker": "s", "markersize": 3.0, "linestyle": "--", "linewidth": 1.2},
    )
    for order, (name, series) in enumerate((("up", bytes_up), ("down", bytes_down))):
        if series.empty:
            continue
        look = dict(looks[order])
        if marker is None:
            look["marker"] = ""
        ax.plot(
            series.index,
            series.to_numpy(dtype=float),
            color=series_style(order)["color"],
            label=f"bytes {name}",
            alpha=0.85 if order == 0 else 1.0,
            **look,
        )
        reach += series.to_numpy(dtype=float).tolist()
    # Headroom: bytes are often the same every round, and a flat line of wide markers on
    # the axis' top edge reads as clipped; 20 % above the highest keeps it inside.
    headroom = (1.2 * max(reach),) if reach else ()
    set_ylimits(ax, reach, min_span=0.0, include=(0.0, *headroom))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: human_bytes(v)))
    ax.set(xlabel="round", ylabel="bytes per round", title="communication per round")


def _spread_offsets(count: int, width: float = 0.36) -> np.ndarray:
    """Sideways positions of ``count`` client dots around a task tick (by client order)."""
    import numpy as np

    if count <= 1:
        return np.zeros(max(count, 0))
    return (np.arange(count) / (count - 1) - 0.5) * width


def _percentile_band(
    ax: Any,
    x: Sequence[float],
    low: ArrayLike,
    mid: ArrayLike,
    high: ArrayLike,
    median_label: str,
    median_style: dict[str, Any],
) -> None:
    """The p10–p90 band over clients and its median line, in the first series colour
    (the client-spread and buffer-drift figures draw the same summary of clients)."""
    color = series_style(0)["color"]
    ax.fill_between(x, low, high, color=color, alpha=0.15, linewidth=0, label="p10–p90")
    ax.plot(x, mid, color=color, label=median_label, **median_style)


def client_spread_svg(
    per_task: Mapping[int, Mapping[int, float]], num_tasks: int, figure_id: str
) -> str | None:
    """Accuracy (%) of every client's local model, averaged over the tasks seen so far, at
    each task end (one dot per client), with the p10 / p50 / p90 percentiles over clients
    (numpy's linear method, as the summary's client_acc_p10/p50/p90); None without data."""
    import numpy as np

    from cfl_bench.core.metrics import client_spread

    tasks = [t for t in sorted(per_task) if per_task[t]]
    if not tasks:
        return None
    with figure_style(figure_id):
        fig = new_figure(5.6, 3.5)
        ax = fig.subplots()
        reach: list[float] = []
        for n, t in enumerate(tasks):
            values = np.array(list(per_task[t].values()), dtype=float)
            ax.scatter(
                t + 1 + _spread_offsets(len(values)),
                values,
                s=9,
                color=CLIENT_GREY,
                alpha=0.7,
                linewidths=0,
                label="one client" if n == 0 else "_nolegend_",
                zorder=2,
            )
            reach += values.tolist()
        spread = [client_spread(list(per_task[t].values())) for t in tasks]
        x = [t + 1 for t in tasks]
        low, mid, high = ([s[key] for s in spread] for key in ("p10", "p50", "p90"))
        median = {"marker": "o", "markersize": 4, "linewidth": 1.4, "zorder": 3}
        _percentile_band(ax, x, low, mid, high, "median (p50)", median)
        for edge in (low, high):
            ax.plot(
                x,
                edge,
                linestyle="--",
                linewidth=0.9,
                color=series_style(0)["color"],
                label="_nolegend_",
                zorder=3,
            )
        ax.set(xlabel="task t", ylabel="client accuracy (%)", title="client spread")
        set_ylimits(ax, reach, min_span=ACC_MIN_SPAN, bounds=PERCENT_RANGE)
        task_axis(ax, num_tasks)
        figure_legend(fig, 3)
        return to_svg(fig, figure_id)


def buffer_drift_svg(
    drift: tuple[list[int], list[int], np.ndarray] | None,
    ends: Sequence[int],
    last_round: int,
    figure_id: str,
) -> str | None:
    """Per-client buffer drift (mean KL between each replay buffer's stored logits and the
    global model) per round: the median and p10–p90 over clients, and one thin line per
    client while there are at most :data:`MAX_CLIENT_LINES`; None when not recorded."""
    import numpy as np

    if drift is None:
        return None
    rounds, clients, values = drift
    with figure_style(figure_id):
        fig = new_figure(5.6, 3.5)
        ax = fig.subplots()
        if len(clients) <= MAX_CLIENT_LINES:
            for k in range(len(clients)):
                ax.plot(
                    rounds,
                    values[k],
                    color=CLIENT_GREY,
                    linewidth=0.7,
                    alpha=0.5,
                    label="one client" if k == 0 else "_nolegend_",
                )
        with np.errstate(all="ignore"):
            present = np.isfinite(values).any(axis=0)
            filled = np.where(np.isfinite(values), values, np.nan)[:, present]
            shown = [r for r, p in zip(rounds, present, strict=True) if p]
            bands: list[ArrayLike] = [
                np.nanpercentile(filled, q, axis=0, method="linear") if filled.size else []
                for q in (10, 50, 90)
            ]
            low, mid, high = bands
        if len(shown):
            median = {"linewidth": 1.5, "marker": "o" if len(shown) <= 40 else None}
            _percentile_band(ax, shown, low, mid, high, "median", {**median, "markersize": 3})
        finite = values[np.isfinite(values)]
        set_ylimits(ax, finite.tolist(), min_span=0.0, include=(0.0,))
        ax.set(xlabel="round", ylabel="buffer drift (mean KL, nats)", title="buffer drift")
        _round_axis(ax, last_round)
        _task_ends(ax, ends)
        figure_legend(fig, 3)
        return to_svg(fig, figure_id)


def present_classes(table: Sequence[Sequence[int]]) -> list[int]:
    """The classes some client holds in this task (a class-IL task has only its own)."""
    return [c for c in range(len(table[0])) if any(row[c] for row in table)]


def _ticks(count: int) -> list[int]:
    """Tick positions for ``count`` rows or columns: all of them, or about ten."""
    if count <= 20:
        return list(range(count))
    step = 10 if count <= 200 else math.ceil(count / 20)
    return list(range(0, count, step))


def class_tables_svg(
    tables: Sequence[tuple[int, Sequence[Sequence[int]]]], figure_id: str
) -> str | None:
    """One heat map per task: rows = clients, columns = the classes present in the task,
    colour = samples the client holds; one shared colour bar. None without tables."""
    import numpy as np

    panels = [(task, np.array(table, dtype=float)) for task, table in tables if table]
    if not panels:
        return None
    clients = max(p.shape[0] for _, p in panels)
    widest = max(len(present_classes(p.tolist())) for _, p in panels)
    panel_w = max(2.0, 0.24 * widest + 0.9)
    ncols = max(1, min(len(panels), int(10.5 // panel_w)))
    nrows = math.ceil(len(panels) / ncols)
    # ~0.2 in per client row while counts are written in the cells, ~0.04 in for 100
    row_h = max(1.6, min(0.24 * clients, 0.04 * clients + 1.55)) + 0.8
    top = max(float(p.max()) for _, p in panels) or 1.0
    with figure_style(figure_id):
        fig = new_figure(panel_w * ncols + 0.9, row_h * nrows + 0.2)
        axes = np.atleast_1d(fig.subplots(nrows, ncols, squeeze=False)).ravel()
        image = None
        for ax, (task, table) in zip(axes, panels, strict=False):
            shown = present_classes(table.tolist()) or list(range(table.shape[1]))
            counts = table[:, shown]
            rows, cols = counts.shape
            image = ax.pcolormesh(
                np.arange(cols + 1) - 0.5,
                np.arange(rows + 1) - 0.5,
                np.ma.masked_equal(counts, 0),
                vmin=0,
                vmax=top,
                cmap="Blues",
            )
            ax.set_xlim(-0.5, cols - 0.5)
            ax.set_ylim(rows - 0.5, -0.5)
            xt, yt = _ticks(cols), _ticks(rows)
            ax.set_xticks(xt, [str(shown[i]) for i in xt])
            ax.set_yticks(yt, [str(i) for i in yt])
            ax.set(title=f"task {task}", xlabel="class", ylabel="client")
            ax.grid(False)
            if rows <= MAX_ANNOTATED_CLIENTS and cols <= MAX_ANNOTATED_CLASSES:
                for (k, c), value in np.ndenumerate(counts):
                    if value:
                        ax.text(
                            c,
                            k,
                            f"{value:.0f}",
                            ha="center",
                            va="center",
                            fontsize=6.5,
                            color="white" if value > 0.6 * top else "black",
                        )
        for ax in axes[len(panels) :]:
            ax.set_axis_off()
        if image is not None:
            bar = fig.colorbar(image, ax=list(axes), shrink=0.8, label="samples (blank: none)")
            if bar.solids is not None:  # keep the colour bar vector, not an embedded PNG
                bar.solids.set_rasterized(False)
        return to_svg(fig, figure_id)


def payload_rows(by_payload: Any) -> list[dict[str, Any]]:
    """``bytes_by_payload`` of summary.json (``"up:model": 1000``) as table rows, sorted;
    entries that are not a count are left out (they cannot come from cfl-bench)."""
    if not isinstance(by_payload, dict):
        return []
    rows = []
    for key, value in sorted(by_payload.items()):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if not math.isfinite(value) or value < 0:
            continue
        direction, _, payload = str(key).partition(":")
        rows.append(
            {
                "direction": direction if payload else "",
                "payload": payload or str(key),
                "bytes": human_bytes(value),
                "sort": repr(float(value)),
                "exact": f"{int(value):,}" if float(value).is_integer() else repr(value),
            }
        )
    return rows
