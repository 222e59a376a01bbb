"""The report's figures: matplotlib (object API, no pyplot) rendered to inline SVG strings.

Why these choices:

* ``Figure`` + ``FigureCanvasSVG`` and ``matplotlib.rc_context`` only: no pyplot state and
  no global rcParams mutation, so rendering a report cannot change another caller's plots
  and needs no display backend.
* SVG is text inside the one HTML file: no image files, no data URLs, works offline.
  ``svg.fonttype: none`` keeps labels as real text (selectable, searchable, small).
* Deterministic bytes: a fixed ``svg.hashsalt`` per figure, no date metadata (the
  ``<metadata>`` block is dropped), so the same run records give byte-identical HTML.
* Every id in a figure is prefixed with the figure's own id: matplotlib numbers its groups
  ``figure_1``, ``axes_1``… in every file, and many figures inlined into one page would
  otherwise repeat ids (invalid HTML, and ``url(#…)`` references could resolve to another
  figure's clip path).
* Text from the data (strategy names) goes through matplotlib's XML escaping (``<`` →
  ``&lt;``); mathtext parsing is switched off for those texts so a ``$`` in a name is shown
  as written instead of being typeset or raising a parse error.
"""

from __future__ import annotations

import io
import math
import re
import textwrap
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from leaderboard.aggregate import StrategySeries

#: rcParams for every report figure (applied with rc_context, never globally).
STYLE: dict[str, Any] = {
    "svg.fonttype": "none",
    "font.size": 8.5,
    "axes.titlesize": 9,
    "axes.labelsize": 8.5,
    "legend.fontsize": 8,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
}

_TAG = re.compile(r"<[^<>]*>")


@contextmanager
def _style(figure_id: str) -> Iterator[None]:
    import matplotlib

    with matplotlib.rc_context({**STYLE, "svg.hashsalt": f"cfl-bench-{figure_id}"}):
        yield


def color(index: int) -> tuple[float, float, float]:
    """The index-th colour of matplotlib's tab10 cycle (a strategy keeps its colour in every
    figure of a protocol because series come in leaderboard order)."""
    import matplotlib

    colors = matplotlib.colormaps["tab10"].colors  # type: ignore[attr-defined]
    return tuple(colors[index % len(colors)])  # type: ignore[return-value]


def plain_label(text: str, width: int = 0) -> str:
    """A data string made safe for matplotlib labels: legend entries starting with ``_`` are
    silently dropped by matplotlib, so such names get a leading space; long names wrap."""
    label = f" {text}" if text.startswith("_") else text
    return textwrap.fill(label, width, break_on_hyphens=False) if width else label


def _no_math(fig: Figure) -> None:
    """Show every text set so far literally (no mathtext): titles, legend entries and
    annotations carry strategy names. Tick labels are made at draw time and keep
    matplotlib's own formatting."""
    from matplotlib.text import Text

    for artist in fig.findobj(Text):
        artist.set_parse_math(False)


def _rewrite_tag(tag: str, prefix: str) -> str:
    tag = re.sub(r'\sxmlns(:\w+)?="[^"]*"', "", tag)
    tag = tag.replace("xlink:href=", "href=")
    tag = re.sub(r'\bid="([^"]*)"', rf'id="{prefix}-\1"', tag)
    tag = re.sub(r'href="#([^"]*)"', rf'href="#{prefix}-\1"', tag)
    return re.sub(r"url\(#([^)]*)\)", rf"url(#{prefix}-\1)", tag)


def to_svg(fig: Figure, figure_id: str) -> str:
    """The figure as an ``<svg>`` element ready to inline in HTML (see module docstring)."""
    from matplotlib.backends.backend_svg import FigureCanvasSVG

    _no_math(fig)
    buffer = io.StringIO()
    with _style(figure_id):
        FigureCanvasSVG(fig).print_svg(buffer, metadata={"Date": None})
    text = buffer.getvalue()
    text = text[text.index("<svg") :]
    text = re.sub(r"<metadata>.*?</metadata>\s*", "", text, flags=re.S)
    text = _TAG.sub(lambda m: _rewrite_tag(m.group(0), figure_id), text)
    return text.replace(
        "<svg ", f'<svg class="plot" role="img" aria-labelledby="{figure_id}-t" ', 1
    )


def _new_figure(width: float, height: float) -> Figure:
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout="constrained")


def _tasks(n: int) -> list[int]:
    return list(range(1, n + 1))


def _task_axis(ax: Axes, tasks: int) -> None:
    """Integer task ticks 1..T with a little room, whatever points happen to be drawn (a
    one-point curve would otherwise get fractional autoscaled ticks)."""
    if tasks:
        ax.set_xticks(_tasks(tasks))
        ax.set_xlim(0.7, tasks + 0.3)


def _draw_band(ax: Axes, x: Sequence[int], stats: Any, index: int, label: str) -> None:
    """Mean line with markers and a ±1 std band where the std exists (the std kind of the
    leaderboard, sample or population, already applied in ``stats``)."""
    import numpy as np

    mean, std = stats
    ax.plot(x, mean, marker="o", markersize=3.5, linewidth=1.4, color=color(index), label=label)
    if np.isfinite(std).any():
        ax.fill_between(x, mean - std, mean + std, color=color(index), alpha=0.15, linewidth=0)


def _legend(fig: Figure, count: int) -> None:
    if count:
        fig.legend(loc="outside lower center", ncols=min(count, 3), frameon=False)


def curves_svg(
    series: Sequence[StrategySeries], figure_id: str, *, task_il: bool = False
) -> str | None:
    """Acc_t and Fgt_t over tasks, one line per strategy (mean over seeds, ±1 std band of
    the leaderboard's std kind) — the two panels of FedGP's figures. ``task_il`` draws the
    task-IL versions; None when no strategy has the curve."""
    acc_key, fgt_key = ("acc_task_il_t", "fgt_task_il_t") if task_il else ("acc_t", "fgt_t")
    with _style(figure_id):
        fig = _new_figure(8.0, 3.4)
        acc_ax, fgt_ax = fig.subplots(1, 2)
        drawn = 0
        for index, s in enumerate(series):
            acc, fgt = getattr(s, acc_key), getattr(s, fgt_key)
            if acc is None:
                continue
            label = plain_label(s.strategy, 40)
            _draw_band(acc_ax, _tasks(len(acc[0])), acc, index, label)
            if fgt is not None:
                x = _tasks(len(fgt[0]))
                _draw_band(fgt_ax, x[1:], (fgt[0][1:], fgt[1][1:]), index, "_nolegend_")
            drawn += 1
        if not drawn:
            return None
        kind = "task-IL " if task_il else ""
        acc_ax.set(xlabel="task t", ylabel=f"{kind}Acc_t (%)", title=f"{kind}average accuracy")
        fgt_ax.set(xlabel="task t", ylabel=f"{kind}Fgt_t (%)", title=f"{kind}forgetting")
        tasks = max(len(getattr(s, acc_key)[0]) for s in series if getattr(s, acc_key))
        for ax in (acc_ax, fgt_ax):
            _task_axis(ax, tasks)
        _legend(fig, drawn)
        return to_svg(fig, figure_id)


def drift_svg(series: Sequence[StrategySeries], figure_id: str) -> str | None:
    """Memory drift MD_t over tasks t ≥ 2 per strategy; None when no run recorded it."""
    import numpy as np

    with _style(figure_id):
        fig = _new_figure(5.6, 3.4)
        ax = fig.subplots()
        drawn = 0
        for index, s in enumerate(series):
            if s.md_t is None or not np.isfinite(s.md_t[0][1:]).any():
                continue
            x = _tasks(len(s.md_t[0]))
            _draw_band(ax, x[1:], (s.md_t[0][1:], s.md_t[1][1:]), index, plain_label(s.strategy))
            drawn += 1
        if not drawn:
            return None
        ax.set(xlabel="task t", ylabel="MD_t (mean KL, nats)", title="memory drift")
        _task_axis(ax, max(len(s.md_t[0]) for s in series if s.md_t is not None))
        _legend(fig, drawn)
        return to_svg(fig, figure_id)


def heatmaps_svg(
    series: Sequence[StrategySeries], figure_id: str, *, key: str = "acc_matrix"
) -> str | None:
    """The mean accuracy matrix a[t][i] of each strategy as a heat map (rows: after
    training task t; columns: evaluated task i; blank = not measured). Cells are vector
    quads (pcolormesh), not ``imshow``'s embedded PNG, so the page holds no image data."""
    import numpy as np

    matrices = [(s.strategy, getattr(s, key)) for s in series if getattr(s, key) is not None]
    if not matrices:
        return None
    with _style(figure_id):
        ncols = min(3, len(matrices))
        nrows = math.ceil(len(matrices) / ncols)
        fig = _new_figure(2.9 * ncols + 0.8, 2.7 * nrows + 0.2)
        axes = np.atleast_1d(fig.subplots(nrows, ncols, squeeze=False)).ravel()
        image = None
        for ax, (name, matrix) in zip(axes, matrices, strict=False):
            size = matrix.shape[0]
            edges = np.arange(size + 1) - 0.5
            image = ax.pcolormesh(
                edges, edges, np.ma.masked_invalid(matrix), vmin=0, vmax=100, cmap="viridis"
            )
            ax.set_aspect("equal")
            ax.invert_yaxis()
            ax.set_title(plain_label(name, 28))
            ax.set_xticks(range(size), [str(t) for t in _tasks(size)])
            ax.set_yticks(range(size), [str(t) for t in _tasks(size)])
            ax.set_xlabel("evaluated task i")
            ax.set_ylabel("after task t")
            ax.grid(False)
            if size <= 8:
                for (t, i), value in np.ndenumerate(matrix):
                    if np.isfinite(value):
                        ax.text(
                            i,
                            t,
                            f"{value:.0f}",
                            ha="center",
                            va="center",
                            fontsize=7,
                            color="black" if value > 60 else "white",
                        )
        for ax in axes[len(matrices) :]:
            ax.set_axis_off()
        if image is not None:
            bar = fig.colorbar(image, ax=list(axes), shrink=0.8, label="accuracy (%)")
            if bar.solids is not None:  # colorbars rasterize many-colour fills into a PNG
                bar.solids.set_rasterized(False)
        return to_svg(fig, figure_id)


def human_bytes(value: float) -> str:
    """1.2 MB-style text (decimal units), used for the scatter's axis ticks."""
    size = float(value)
    for unit in ("B", "KB", "MB", "GB"):
        if abs(size) < 1000:
            return f"{size:.3g} {unit}"
        size /= 1000
    return f"{size:.3g} TB"


def scatter_svg(series: Sequence[StrategySeries], figure_id: str) -> str | None:
    """Final accuracy Acc_T (± std of the leaderboard's kind) against total bytes
    communicated, one point per strategy; log-scaled bytes when they span more than a
    factor of 20."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    points = [
        (index, s)
        for index, s in enumerate(series)
        if math.isfinite(s.acc_final[0])
        and math.isfinite(s.bytes_total[0])
        and s.bytes_total[0] > 0
    ]
    if not points:
        return None
    with _style(figure_id):
        fig = _new_figure(5.6, 3.6)
        ax = fig.subplots()
        for index, s in points:
            err = s.acc_final[1] if math.isfinite(s.acc_final[1]) else None
            ax.errorbar(
                s.bytes_total[0],
                s.acc_final[0],
                yerr=err,
                fmt="o",
                color=color(index),
                capsize=3,
                markersize=5,
            )
            ax.annotate(
                plain_label(s.strategy, 30),
                (s.bytes_total[0], s.acc_final[0]),
                textcoords="offset points",
                xytext=(5, 4),
                fontsize=7.5,
            )
        sizes = [s.bytes_total[0] for _, s in points]
        if max(sizes) / min(sizes) > 20:
            ax.set_xscale("log")
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: human_bytes(v)))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set(
            xlabel="bytes communicated (up + down, total)",
            ylabel="Acc_T (%)",
            title="accuracy vs communication",
        )
        ax.margins(x=0.25, y=0.15)
        return to_svg(fig, figure_id)
