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
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
    from matplotlib.typing import RcKeyType

    from cfl_bench.leaderboard.aggregate import StrategySeries

#: rcParams for every report figure (applied with rc_context, never globally).
STYLE: dict[RcKeyType, Any] = {
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
def figure_style(figure_id: str) -> Iterator[None]:
    import matplotlib

    with matplotlib.rc_context({**STYLE, "svg.hashsalt": f"cfl-bench-{figure_id}"}):
        yield


def color(index: int) -> tuple[float, float, float]:
    """The index-th colour of matplotlib's tab10 cycle (a strategy keeps its colour in every
    figure of a protocol because series come in leaderboard order)."""
    import matplotlib

    # tab10 is a ListedColormap, but the registry returns the base Colormap (no ``colors``)
    colors = matplotlib.colormaps["tab10"].colors  # type: ignore[attr-defined]
    red, green, blue = colors[index % len(colors)]
    return (red, green, blue)


#: Marker and line style cycles: with colour they give every strategy of a protocol a look of
#: its own, so two series with (nearly) equal values stay distinguishable where they overlap
#: (and for readers who cannot tell the tab10 colours apart).
MARKERS: tuple[str, ...] = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "*")
LINESTYLES: tuple[str, ...] = ("-", "--", "-.", ":")
#: Largest sideways shift of a series on a per-task axis (in task units), and the step
#: between neighbours: enough to separate equal points, far from the next task's tick.
DODGE_SPREAD = 0.24
DODGE_STEP = 0.08


def series_style(index: int) -> dict[str, Any]:
    """Colour, marker and line style of the index-th series (the same in every figure)."""
    return {
        "color": color(index),
        "marker": MARKERS[index % len(MARKERS)],
        "linestyle": LINESTYLES[index % len(LINESTYLES)],
    }


def dodge(index: int, count: int) -> float:
    """Sideways offset of the index-th of ``count`` series on a per-task axis. Why: with
    equal values (two strategies with the same memory drift, one seed each) the later line
    would hide the earlier one completely; a small offset keeps every marker in view."""
    if count <= 1:
        return 0.0
    step = min(DODGE_STEP, DODGE_SPREAD / (count - 1))
    return (index - (count - 1) / 2) * step


def padded_limits(
    values: Iterable[float],
    *,
    min_span: float,
    bounds: tuple[float, float] = (-math.inf, math.inf),
    include: Sequence[float] = (),
) -> tuple[float, float] | None:
    """Y limits covering the finite ``values`` (and ``include``) with a 6 % margin, at least
    ``min_span`` wide (a single point gets a span of its own size, at least 1) and inside
    ``bounds``; None when there is nothing to cover.

    Why: matplotlib's autoscaling zooms in on whatever range the data has, so one seed with
    values 9.9, 10.0, 10.1 gets an axis 9.6–10.4 that makes noise look like a trend. A
    minimum span (20 points for accuracies, 10 for forgetting) and the metric's possible
    range keep axes honest and comparable between figures.
    """
    points = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    points += [float(v) for v in include]
    if not points:
        return None
    low, high = min(points), max(points)
    margin = 0.06 * (high - low)
    low, high = low - margin, high + margin
    # a single value (or none but ``include``) still gets a range around it
    span = min_span if min_span > 0 or high > low else max(abs(high), 1.0)
    if high - low < span:
        middle = (low + high) / 2
        low, high = middle - span / 2, middle + span / 2
    if low < bounds[0]:
        low, high = bounds[0], min(bounds[1], high + bounds[0] - low)
    if high > bounds[1]:
        low, high = max(bounds[0], low - (high - bounds[1])), bounds[1]
    return low, high


def set_ylimits(
    ax: Axes,
    values: Iterable[float],
    *,
    min_span: float,
    bounds: tuple[float, float] = (-math.inf, math.inf),
    include: Sequence[float] = (),
) -> None:
    """Apply :func:`padded_limits` to ``ax`` (left to matplotlib when nothing is finite)."""
    limits = padded_limits(values, min_span=min_span, bounds=bounds, include=include)
    if limits is not None:
        ax.set_ylim(*limits)


#: Possible ranges of the plotted metrics (accuracies are %, forgetting a difference of two).
PERCENT_RANGE = (0.0, 100.0)
DIFFERENCE_RANGE = (-100.0, 100.0)
#: Minimum y span of accuracy and forgetting axes, in percentage points.
ACC_MIN_SPAN = 20.0
FGT_MIN_SPAN = 10.0


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
    with figure_style(figure_id):
        FigureCanvasSVG(fig).print_svg(buffer, metadata={"Date": None})
    text = buffer.getvalue()
    text = text[text.index("<svg") :]
    text = re.sub(r"<metadata>.*?</metadata>\s*", "", text, flags=re.S)
    text = _TAG.sub(lambda m: _rewrite_tag(m.group(0), figure_id), text)
    return text.replace(
        "<svg ", f'<svg class="plot" role="img" aria-labelledby="{figure_id}-t" ', 1
    )


def new_figure(
    width: float, height: float, layout: Literal["constrained", "compressed"] = "constrained"
) -> Figure:
    """A pyplot-free figure. ``layout="compressed"`` is for grids of fixed-aspect panels
    (heat maps): the constrained layout sizes such panels before their aspect shrinks them,
    which pushed the panel titles and the top row out of the figure."""
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout=layout)


def tasks_1based(n: int) -> list[int]:
    """Task numbers as shown to readers: 1..n."""
    return list(range(1, n + 1))


def task_axis(ax: Axes, tasks: int) -> None:
    """Integer task ticks 1..T with a little room, whatever points happen to be drawn (a
    one-point curve would otherwise get fractional autoscaled ticks)."""
    if tasks:
        ax.set_xticks(tasks_1based(tasks))
        ax.set_xlim(0.6, tasks + 0.4)


def draw_band(
    ax: Axes, x: Sequence[float], stats: Any, index: int, label: str, shift: float = 0.0
) -> None:
    """Mean line with markers and a ±1 std band where the std exists (the std kind of the
    leaderboard, sample or population, already applied in ``stats``), in the index-th
    series style, shifted sideways by ``shift`` task units (see :func:`dodge`)."""
    import numpy as np

    mean, std = stats
    xs = np.asarray(x, dtype=float) + shift
    style = series_style(index)
    ax.plot(xs, mean, markersize=4, linewidth=1.4, label=label, **style)
    if np.isfinite(std).any():
        ax.fill_between(xs, mean - std, mean + std, color=style["color"], alpha=0.15, linewidth=0)


def band_values(stats: Any) -> list[float]:
    """Every value a band plot reaches (mean ± std where the std exists), for the limits."""
    import numpy as np

    mean, std = (np.asarray(v, dtype=float) for v in stats)
    spread = np.where(np.isfinite(std), std, 0.0)
    return [*(mean - spread).tolist(), *(mean + spread).tolist()]


def no_value(ax: Axes, text: str) -> None:
    """Say in an empty panel why it is empty (instead of bare axes that look broken)."""
    ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center", color="#5b6570")


#: Width of one legend character and of a legend entry's handle and gaps (inches, at the
#: legend's 8 pt): generous, so an estimate never lets a legend outgrow its figure.
LEGEND_CHAR_IN = 0.072
LEGEND_ENTRY_IN = 0.6


def legend_columns(labels: Sequence[str], width: float, most: int = 3) -> int:
    """How many legend columns fit ``width`` inches: long strategy names (a composition
    with options easily has 60 characters) get one column, short ones up to ``most``.
    Why: a legend wider than its figure is cut off at the figure's edge."""
    if not labels:
        return 1
    longest = max(len(line) for label in labels for line in label.split("\n"))
    column = longest * LEGEND_CHAR_IN + LEGEND_ENTRY_IN
    return max(1, min(len(labels), most, int(0.95 * width // column)))


def figure_legend(fig: Figure, count: int) -> None:
    """One legend below all panels, with as many columns as fit the figure's width."""
    if not count:
        return
    labels: list[str] = []
    for ax in fig.axes:
        labels += [label for label in ax.get_legend_handles_labels()[1] if label not in labels]
    ncols = legend_columns(labels, fig.get_figwidth())
    fig.legend(loc="outside lower center", ncols=ncols, frameon=False)


def curves_svg(
    series: Sequence[StrategySeries], figure_id: str, *, task_il: bool = False
) -> str | None:
    """Acc_t and Fgt_t over tasks, one line per strategy (mean over seeds, ±1 std band of
    the leaderboard's std kind) — the two panels of FedGP's figures. ``task_il`` draws the
    task-IL versions; None when no strategy has the curve. Series are dodged sideways and
    styled apart so equal curves stay visible; the y ranges have a minimum span."""
    acc_key, fgt_key = ("acc_task_il_t", "fgt_task_il_t") if task_il else ("acc_t", "fgt_t")
    drawn = [(i, s) for i, s in enumerate(series) if getattr(s, acc_key) is not None]
    if not drawn:
        return None
    with figure_style(figure_id):
        fig = new_figure(8.0, 3.4)
        acc_ax, fgt_ax = fig.subplots(1, 2)
        acc_values: list[float] = []
        fgt_values: list[float] = []
        for order, (index, s) in enumerate(drawn):
            acc, fgt = getattr(s, acc_key), getattr(s, fgt_key)
            shift = dodge(order, len(drawn))
            label = plain_label(s.strategy, 40)
            draw_band(acc_ax, tasks_1based(len(acc[0])), acc, index, label, shift)
            acc_values += band_values(acc)
            if fgt is not None:
                x = tasks_1based(len(fgt[0]))
                tail = (fgt[0][1:], fgt[1][1:])
                draw_band(fgt_ax, x[1:], tail, index, "_nolegend_", shift)
                fgt_values += band_values(tail)
        kind = "task-IL " if task_il else ""
        acc_ax.set(xlabel="task t", ylabel=f"{kind}Acc_t (%)", title=f"{kind}average accuracy")
        fgt_ax.set(xlabel="task t", ylabel=f"{kind}Fgt_t (%)", title=f"{kind}forgetting")
        set_ylimits(acc_ax, acc_values, min_span=ACC_MIN_SPAN, bounds=PERCENT_RANGE)
        set_ylimits(
            fgt_ax, fgt_values, min_span=FGT_MIN_SPAN, bounds=DIFFERENCE_RANGE, include=(0.0,)
        )
        if not any(math.isfinite(v) for v in fgt_values):
            no_value(fgt_ax, "no value yet: forgetting starts at task 2")
        tasks = max(len(getattr(s, acc_key)[0]) for _, s in drawn)
        for ax in (acc_ax, fgt_ax):
            task_axis(ax, tasks)
        figure_legend(fig, len(drawn))
        return to_svg(fig, figure_id)


def drift_svg(series: Sequence[StrategySeries], figure_id: str) -> str | None:
    """Memory drift MD_t over tasks t ≥ 2 per strategy; None when no run recorded it.
    Strategies with (nearly) equal drift — der and der+fedgp often are — are told apart by
    marker, line style and a small sideways offset; the axis starts at 0 (KL ≥ 0)."""
    import numpy as np

    drawn = [
        (i, s)
        for i, s in enumerate(series)
        if s.md_t is not None and np.isfinite(s.md_t[0][1:]).any()
    ]
    if not drawn:
        return None
    with figure_style(figure_id):
        fig = new_figure(5.6, 3.4)
        ax = fig.subplots()
        values: list[float] = []
        for order, (index, s) in enumerate(drawn):
            assert s.md_t is not None
            x = tasks_1based(len(s.md_t[0]))
            tail = (s.md_t[0][1:], s.md_t[1][1:])
            label = plain_label(s.strategy, 40)
            draw_band(ax, x[1:], tail, index, label, dodge(order, len(drawn)))
            values += band_values(tail)
        ax.set(xlabel="task t", ylabel="MD_t (mean KL, nats)", title="memory drift")
        set_ylimits(ax, values, min_span=0.0, bounds=(0.0, math.inf), include=(0.0,))
        task_axis(ax, max(len(s.md_t[0]) for _, s in drawn if s.md_t is not None))
        figure_legend(fig, len(drawn))
        return to_svg(fig, figure_id)


def heatmaps_svg(
    series: Sequence[StrategySeries], figure_id: str, *, key: str = "acc_matrix"
) -> str | None:
    """The mean accuracy matrix a[t][i] of each strategy as a heat map (rows: after
    training task t; columns: evaluated task i; blank = not measured)."""
    panels = [(s.strategy, getattr(s, key)) for s in series if getattr(s, key) is not None]
    return matrix_panels_svg(panels, figure_id)


def matrix_panels_svg(panels: Sequence[tuple[str, Any]], figure_id: str) -> str | None:
    """Accuracy matrices as titled heat-map panels, three per row, one shared colour bar
    (0–100 %); None without panels. Cells are vector quads (pcolormesh), not ``imshow``'s
    embedded PNG, so the page holds no image data. The compressed layout keeps titles and
    the top row inside the figure (see :func:`new_figure`)."""
    import numpy as np

    if not panels:
        return None
    with figure_style(figure_id):
        ncols = min(3, len(panels))
        nrows = math.ceil(len(panels) / ncols)
        fig = new_figure(2.9 * ncols + 0.8, 2.9 * nrows + 0.3, layout="compressed")
        axes = np.atleast_1d(fig.subplots(nrows, ncols, squeeze=False)).ravel()
        image = None
        for ax, (name, matrix) in zip(axes, panels, strict=False):
            size = matrix.shape[0]
            edges = np.arange(size + 1) - 0.5
            image = ax.pcolormesh(
                edges, edges, np.ma.masked_invalid(matrix), vmin=0, vmax=100, cmap="viridis"
            )
            ax.set_aspect("equal")
            ax.invert_yaxis()
            ax.set_title(plain_label(name, 28))
            ticks = range(size) if size <= 12 else range(0, size, max(1, size // 10))
            ax.set_xticks(list(ticks), [str(t + 1) for t in ticks])
            ax.set_yticks(list(ticks), [str(t + 1) for t in ticks])
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
        for ax in axes[len(panels) :]:
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


#: Sideways distance (points) between scatter markers that share the same byte count.
SCATTER_DODGE_PT = 7.0


def scatter_svg(series: Sequence[StrategySeries], figure_id: str) -> str | None:
    """Final accuracy Acc_T (± std of the leaderboard's kind) against total bytes
    communicated, one point per strategy; log-scaled bytes when they span more than a
    factor of 20.

    Names go in a legend below the axes rather than next to the points: labels beside the
    markers collided with the error bars and with each other (strategies without extra
    payloads send exactly the same bytes). Such points are shifted a few points sideways
    (a display offset, so the byte axis stays exact) and differ in marker and colour."""
    points = [
        (index, s)
        for index, s in enumerate(series)
        if math.isfinite(s.acc_final[0])
        and math.isfinite(s.bytes_total[0])
        and s.bytes_total[0] > 0
    ]
    if not points:
        return None
    with figure_style(figure_id):
        names = [plain_label(s.strategy, 40) for _, s in points]
        rows = sum(n.count("\n") + 1 for n in names) / legend_columns(names, 5.6)
        fig = new_figure(5.6, 3.4 + 0.2 * math.ceil(rows))
        ax = fig.subplots()
        sizes = [s.bytes_total[0] for _, s in points]
        reach = _scatter_points(ax, fig, points)
        _bytes_axis(ax, sizes)
        ax.set(
            xlabel="bytes communicated (up + down, total)",
            ylabel="Acc_T (%)",
            title="accuracy vs communication",
        )
        set_ylimits(ax, reach, min_span=ACC_MIN_SPAN, bounds=PERCENT_RANGE)
        figure_legend(fig, len(points))
        return to_svg(fig, figure_id)


def _scatter_points(
    ax: Axes, fig: Figure, points: Sequence[tuple[int, StrategySeries]]
) -> list[float]:
    """One marker with error bar per strategy, points sending the same bytes dodged
    sideways by a display offset (the byte axis stays exact); returns the accuracies the
    error bars reach, which the y limits must show."""
    from matplotlib.transforms import offset_copy

    same: dict[float, list[int]] = {}
    for index, s in points:
        same.setdefault(s.bytes_total[0], []).append(index)
    reach: list[float] = []
    for index, s in points:
        group = same[s.bytes_total[0]]
        shift = (group.index(index) - (len(group) - 1) / 2) * SCATTER_DODGE_PT
        err = s.acc_final[1] if math.isfinite(s.acc_final[1]) else None
        style = series_style(index)
        ax.errorbar(
            s.bytes_total[0],
            s.acc_final[0],
            yerr=err,
            fmt=style["marker"],
            color=style["color"],
            capsize=3,
            markersize=5,
            label=plain_label(s.strategy, 40),
            transform=offset_copy(ax.transData, fig=fig, x=shift, units="points"),
        )
        reach += [s.acc_final[0] - (err or 0.0), s.acc_final[0] + (err or 0.0)]
    return reach


def _bytes_axis(ax: Axes, sizes: list[float]) -> None:
    """The byte axis: logarithmic when the sizes span more than a factor of 20, else linear
    from zero; ticks in human units."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    if max(sizes) / min(sizes) > 20:
        ax.set_xscale("log")
        ax.margins(x=0.25)
    else:  # from zero: ratios of byte counts stay readable, nothing zooms on noise
        ax.set_xlim(0, max(sizes) * 1.15)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: human_bytes(v)))
    ax.xaxis.set_minor_formatter(NullFormatter())
