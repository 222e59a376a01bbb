"""The boundary pilot's figure: one row per (initialisation, strategy), four panels a row.

Column 1 is the global model the clients received in the last round, with every point (public
points hollow); columns 2–4 are the clients' models after their local training in that round,
each with its own points and, dashed, the boundary of the global model it started from — the
area between the dashed line and the coloured regions is what the client forgot. Panel titles
give that round's disagreement; the row label gives the run's forgetting number (mean over
clients and rounds).

matplotlib is imported inside ``draw_figure`` (never at start-up), and through its
object-oriented API with the Agg canvas: no pyplot, no global backend switch in the caller's
process.
"""

from __future__ import annotations

import io
import textwrap
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from cfl_bench.pilot.boundary import Measured, PilotResult

CLASS_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c")
REGION_COLOURS = ("#c6dbef", "#fdd0a2", "#c7e9c0")
PANEL_INCHES = 2.5


def draw_figure(result: PilotResult) -> Figure:
    """The grid of panels for every run of ``result``."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    rows, cols = len(result.runs), 1 + len(result.split.parts)
    fig = Figure(figsize=(PANEL_INCHES * cols, PANEL_INCHES * rows + 0.6), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows, cols, squeeze=False, sharex=True, sharey=True)
    for row, run in zip(axes, result.runs, strict=True):
        draw_row(row, run, result)
    # The key to the numbers sits in the legend's title, so the layout makes room for both.
    fig.legend(
        handles=legend_handles(result),
        loc="outside lower center",
        ncols=5,
        frameon=False,
        fontsize=8,
        title=textwrap.fill(KEY, 40 * cols),
        title_fontsize=8,
    )
    fig.suptitle(
        "Iris (2-D PCA), 3 non-IID clients: global model vs. each client after local "
        f"training, round {result.config.rounds}"
    )
    return fig


#: What the numbers in the titles and row labels mean (below the legend).
KEY = (
    '"area": share of the plotted area whose class the client\'s local training changed '
    'from the global model it started from; "data": the same share of the 150 Iris points; '
    "row label: their mean over clients and rounds (the run's forgetting)."
)


def legend_handles(result: PilotResult) -> list[object]:
    """One entry per class, then the dashed boundary and the hollow points explained."""
    from matplotlib.lines import Line2D

    classes = [
        Line2D([], [], linestyle="", marker="o", markersize=5, color=c, label=name)
        for c, name in zip(CLASS_COLOURS, result.points.class_names, strict=True)
    ]
    return [
        *classes,
        Line2D(
            [], [], color="black", linestyle="dashed", linewidth=0.8,
            label="global model's boundary (client panels)",
        ),
        Line2D(
            [], [], linestyle="", marker="o", markersize=5, markerfacecolor="none",
            markeredgecolor="grey", label="public points (no client holds them)",
        ),
    ]  # fmt: skip


def draw_row(row: list[Axes], run: Measured, result: PilotResult) -> None:
    """One run: the global panel, then one panel per client."""
    x, y = result.points.x, result.points.y
    public = result.split.held
    draw_regions(row[0], run.last_global, result)
    draw_points(row[0], x, y, public)
    row[0].set_title("global (start of last round)", fontsize=9)
    row[0].set_ylabel(
        f"{run.init} · {run.strategy}\nforgetting {run.forgetting_area:.1%} area, "
        f"{run.forgetting_points:.1%} data",
        fontsize=8,
    )
    last_area, last_points = run.area[-1], run.points[-1]
    for k, (ax, labels) in enumerate(zip(row[1:], run.last_clients, strict=True)):
        draw_regions(ax, labels, result)
        ax.contour(
            run.last_global.numpy(),
            levels=[0.5, 1.5],
            extent=result.box.extent,
            origin="lower",
            colors="black",
            linestyles="dashed",
            linewidths=0.8,
        )
        part = result.split.parts[k]
        draw_points(ax, x[part], y[part], None)
        ax.set_title(
            f"client {k + 1}: {last_area[k]:.0%} area, {last_points[k]:.0%} data", fontsize=9
        )


def draw_regions(ax: Axes, labels: torch.Tensor, result: PilotResult) -> None:
    """The class regions of an n × n label map over the plotting box."""
    from matplotlib.colors import ListedColormap

    ax.imshow(
        labels.numpy(),
        extent=result.box.extent,
        origin="lower",
        cmap=ListedColormap(REGION_COLOURS),
        vmin=-0.5,
        vmax=len(REGION_COLOURS) - 0.5,
        interpolation="nearest",
        aspect="auto",
    )
    ax.tick_params(labelsize=7)


def draw_points(ax: Axes, x: torch.Tensor, y: torch.Tensor, hollow: torch.Tensor | None) -> None:
    """Points coloured by class; the indices in ``hollow`` (public points) drawn hollow."""
    import torch

    mask = torch.zeros(y.shape[0], dtype=torch.bool)
    if hollow is not None:
        mask[hollow] = True
    for c, colour in enumerate(CLASS_COLOURS):
        solid = (y == c) & ~mask
        ax.scatter(x[solid, 0], x[solid, 1], s=9, color=colour, edgecolors="black", linewidths=0.3)
        open_ = (y == c) & mask
        if bool(open_.any()):
            ax.scatter(
                x[open_, 0], x[open_, 1], s=14, facecolors="none", edgecolors=colour, linewidths=1
            )


def figure_files(fig: Figure) -> tuple[bytes, bytes]:
    """The figure as PNG and as SVG bytes, the same bytes for the same numbers: no creation
    date, no version stamp, and a fixed salt for the SVG's element ids (random otherwise)."""
    import matplotlib

    png, svg = io.BytesIO(), io.BytesIO()
    fig.savefig(png, format="png", dpi=110, metadata={"Software": None})
    with matplotlib.rc_context({"svg.hashsalt": "cfl-bench-pilot"}):
        fig.savefig(svg, format="svg", metadata={"Date": None, "Creator": None})
    return png.getvalue(), svg.getvalue()
