"""Digitize GLFC's published result figures (the official repository's fig/*.png) into a CSV.

    python -m bench.digitize_glfc_figures cifar_result.png imagenet_subset_result.png \
        --out glfc_digitized.csv

Why: GLFC (Dong et al., CVPR 2022) publishes its Tables 1-2 only as two figures in its
repository (fig/cifar_result.png, fig/imagenet_subset_result.png; the paper text cannot be
read here). Each figure has three panels, T = 5, 10 and 20 tasks over 100 classes, with the
accuracy (%) after every task of seven methods drawn as lines with markers of distinct,
exact colours (``METHODS``). This reads every marker back from the pixels, so anyone can
re-derive reproductions/targets/glfc.csv and check it.

How, per panel:

1. **Axes.** The panel's frame is four dark (RGB 42) lines; its columns and rows are found
   as runs of mostly-dark pixels (``find_panels``).
2. **Calibration** (``calibrate_y`` / ``calibrate_x``). The figures draw no tick marks, only
   labels. The labels' values were read by eye from crops (``Y_TICKS`` / ``X_TICKS``, top to
   bottom and left to right) and the script checks it finds that many labels. Each label's
   glyph box centre (vertical for y, horizontal for x) stands for its tick, and a
   least-squares line maps pixel → value; its largest residual at a tick, in %, is the
   **calibration error** reported. Glyphs sit a few pixels off their tick vertically (the
   text box includes room below the baseline): in the panels whose lowest labelled tick is
   the axis limit (its glyph centre within ``EDGE_PX`` of the bottom frame line), the glyph
   centre is 5-6.5 px below the frame line; the mean of those offsets is subtracted from
   every y label of the figure before fitting (``glyph_offset``).
3. **Markers** (``read_marker``). The x of a step is known (k·100/T classes), so the marker
   of method m at step k is on the pixel column ``calibrate_x`` gives. Along that column
   every pixel is classified to the nearest palette colour within ``COLOUR_TOL``; m's own
   line crosses the column only at the marker, so m's pixels there are the marker's
   vertical extent. Methods are drawn in legend order (iCaRL+FL first, GLFC last: later
   markers cover earlier ones), so an end of m's run is the marker's true edge when the
   pixel beyond it is background or an earlier method. Statuses:
   ``visible`` both ends are edges and the run is the marker's height (the median of m's
   such runs; the legend marker's where it has none); ``off-centre`` the shape is
   symmetric about its horizontal axis and runs 6-24 px beside the centre column, seen
   whole, agree within 3 px on their midpoint; ``base`` / ``apex`` an up-triangle (△,
   iCaRL+FL in five panels) whose data point is its centroid, a third of its height above
   the base (the line through the markers says so), read from its base (clean on two
   columns) or its apex; ``one-edge`` one end is covered and the centre is the other end
   ± half the height; ``hidden`` neither: left out, never guessed.
4. **Uncertainty** (``pm``): the run ends are exact to about a pixel (anti-aliased edges
   leave one or two unclassified pixels), so half the p10-p90 spread of m's whole-marker
   heights + 1 px, in %, plus the panel's calibration error; at least ``STATUS_PM`` for
   the readings that depend on a height.
5. **Check** (``line_row``): the data point is also where m's line, fitted on columns
   90-130 px either side of the marker, passes its column; the CSV gives that reading
   (T = 5 and 10 only: at T = 20 the markers are too close for a clean stretch of line).

The CSV has one row per (figure, T, method, step) with the pixel row, the value (%), the
status (``visible``, ``one-edge``, ``hidden``) and the uncertainty in %.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

# Legend order = drawing order. Colours are the figures' exact marker/line fills.
METHODS: tuple[tuple[str, tuple[int, int, int]], ...] = (
    ("iCaRL+FL", (190, 84, 35)),
    ("BiC+FL", (136, 171, 62)),
    ("PODNet+FL", (138, 27, 50)),
    ("DDE+iCaRL+FL", (107, 190, 190)),
    ("GeoDL+iCaRL+FL", (64, 113, 185)),
    ("SS-IL+FL", (110, 51, 138)),
    ("GLFC", (71, 126, 30)),
)
BACKGROUND = (255, 255, 255)
FRAME = (42, 42, 42)
COLOUR_TOL = 40  # Euclidean RGB distance for a pixel to count as a palette colour
EDGE_PX = 10  # a labelled tick this close to the bottom frame line is taken as the limit
TASKS = (5, 10, 20)  # panels left to right
# Tick label values read by eye from crops of each figure, per panel (top→bottom, left→right).
Y_TICKS: dict[str, tuple[tuple[float, ...], ...]] = {
    "cifar_result.png": (
        (70, 65, 60, 55, 50, 45, 40, 35),
        (70, 60, 50, 40, 30),
        (80, 70, 60, 50, 40),
    ),
    "imagenet_subset_result.png": (
        (60, 55, 50, 45, 40, 35, 30),
        (90, 80, 70, 60, 50, 40),
        (80, 70, 60, 50, 40, 30),
    ),
}
X_TICKS: tuple[tuple[float, ...], ...] = (
    (20, 40, 60, 80, 100),
    (20, 40, 60, 80, 100),
    (0, 20, 40, 60, 80, 100),
)


@dataclass(frozen=True)
class Panel:
    left: int  # inner edge columns / rows of the frame lines
    right: int
    top: int
    bottom: int
    frame_bottom: float  # centre row of the bottom frame line


@dataclass(frozen=True)
class Line:
    """value = a + b * pixel; ``err`` is the largest residual at a tick (value units)."""

    a: float
    b: float
    err: float

    def value(self, pixel: float) -> float:
        return self.a + self.b * pixel

    def pixel(self, value: float) -> float:
        return (value - self.a) / self.b


def runs(indices: np.ndarray) -> list[tuple[int, int]]:
    """Maximal runs of consecutive integers in a sorted index array, as (first, last)."""
    out: list[tuple[int, int]] = []
    for i in indices.tolist():
        if out and i == out[-1][1] + 1:
            out[-1] = (out[-1][0], i)
        else:
            out.append((i, i))
    return out


def find_panels(dark: np.ndarray) -> list[Panel]:
    """The three axes frames: columns dark over >1/2 of the height, rows over >90 % of a panel.

    Why this way: the frame lines are the only long straight dark features (the legend box
    is found too, above the panels, and dropped by needing a frame column pair around it).
    """
    col_runs = runs(np.where(dark.mean(0) > 0.35)[0])
    if len(col_runs) != 6:
        raise ValueError(f"expected 6 frame columns, found {len(col_runs)}")
    panels = []
    for (_, l1), (r0, _) in zip(col_runs[0::2], col_runs[1::2], strict=True):
        row_runs = runs(np.where(dark[:, l1 + 6 : r0 - 6].mean(1) > 0.9)[0])
        (_, t1), (b0, b1) = row_runs[-2], row_runs[-1]
        panels.append(Panel(l1 + 1, r0 - 1, t1 + 1, b0 - 1, (b0 + b1) / 2))
    return panels


def fit(pixels: Sequence[float], values: Sequence[float]) -> Line:
    """Least-squares value = a + b·pixel, with its largest residual at the given ticks."""
    b, a = np.polyfit(np.asarray(pixels, float), np.asarray(values, float), 1)
    err = max(abs(a + b * p - v) for p, v in zip(pixels, values, strict=True))
    return Line(float(a), float(b), float(err))


def label_centres(mask: np.ndarray, axis: int, gap: int) -> list[float]:
    """Centres of text blobs along ``axis`` of a mask strip (blobs split by ``gap`` px)."""
    idx = np.where(mask.any(axis=1 - axis))[0]
    blobs: list[tuple[int, int]] = []
    for a, b in runs(idx):
        if blobs and a - blobs[-1][1] <= gap:
            blobs[-1] = (blobs[-1][0], b)
        else:
            blobs.append((a, b))
    return [(a + b) / 2 for a, b in blobs if b - a > 30]


def y_label_rows(dark: np.ndarray, panel: Panel) -> list[float]:
    """Glyph centre rows of the y tick labels: dark blobs 30-250 px left of the frame."""
    strip = dark[:, panel.left - 255 : panel.left - 35]
    rows = label_centres(strip, 0, 5)
    return [r for r in rows if panel.top - 30 <= r <= panel.bottom + 30]


def x_label_cols(dark: np.ndarray, panel: Panel) -> list[float]:
    """Glyph centre columns of the x tick labels: dark blobs 100-260 px below the frame.

    Why not nearer: the lowest y label of a panel may hang just below the frame.
    """
    strip = dark[panel.bottom + 100 : panel.bottom + 260, panel.left - 200 : panel.right + 200]
    return [c + panel.left - 200 for c in label_centres(strip, 1, 60)]


def glyph_offset(dark: np.ndarray, panels: list[Panel], ticks: Sequence[Sequence[float]]) -> float:
    """Mean (glyph centre row − frame line row) over panels whose lowest tick is the limit.

    Why: the label glyphs are not centred on their ticks (the text box keeps room below
    the baseline), which would shift every value by a constant; a label printed on the
    bottom frame line can only be at the axis limit (tick labels outside the limits are not
    drawn), so there the offset is measured directly.
    """
    offsets = []
    for panel in panels:
        lowest = y_label_rows(dark, panel)[-1]
        if abs(lowest - panel.frame_bottom) <= EDGE_PX:
            offsets.append(lowest - panel.frame_bottom)
    return statistics.mean(offsets) if offsets else 0.0


def calibrate_y(dark: np.ndarray, panel: Panel, ticks: Sequence[float], offset: float) -> Line:
    """Pixel row → accuracy (%) from the y labels' glyph centres, less the glyph offset."""
    rows = y_label_rows(dark, panel)
    if len(rows) != len(ticks):
        raise ValueError(f"found {len(rows)} y labels, expected {len(ticks)}: {rows}")
    return fit([r - offset for r in rows], ticks)


def calibrate_x(dark: np.ndarray, panel: Panel, ticks: Sequence[float]) -> Line:
    """Pixel column → number of classes from the x labels' horizontal glyph centres."""
    cols = x_label_cols(dark, panel)
    if len(cols) != len(ticks):
        raise ValueError(f"found {len(cols)} x labels, expected {len(ticks)}: {cols}")
    return fit(cols, ticks)


BG, FR = len(METHODS), len(METHODS) + 1
# Extra fills that belong to a method: iCaRL+FL's ▷ markers in one panel have a lighter face.
ALIASES: tuple[tuple[tuple[int, int, int], int], ...] = (((199, 124, 29), 0),)
PALETTE = np.array(
    [rgb for _, rgb in METHODS] + [BACKGROUND, FRAME] + [rgb for rgb, _ in ALIASES], dtype=float
)
LABEL_OF = np.array(list(range(len(METHODS) + 2)) + [m for _, m in ALIASES])
# Panels (figure, T) whose iCaRL+FL markers are up-triangles (△); elsewhere they are ▷.
UP_TRIANGLE = frozenset(
    {
        ("cifar_result.png", 5),
        ("cifar_result.png", 10),
        ("cifar_result.png", 20),
        ("imagenet_subset_result.png", 10),
        ("imagenet_subset_result.png", 20),
    }
)


def classify(pixels: np.ndarray) -> np.ndarray:
    """Palette label of each RGB pixel (methods, then background, frame), −1 if none is near."""
    dist = np.linalg.norm(pixels[:, None, :3].astype(float) - PALETTE[None], axis=2)
    best = LABEL_OF[dist.argmin(1)]
    return np.where(dist.min(1) <= COLOUR_TOL, best, -1)


@dataclass(frozen=True)
class Run:
    """Method m's pixels along one column: first/last row and whether each end is its edge."""

    first: int
    last: int
    top_clean: bool
    bottom_clean: bool


def end_is_edge(labels: np.ndarray, start: int, step: int, method: int) -> bool:
    """Whether the first classified pixel beyond a run end (up to 4 px) is under method m.

    Why: methods are drawn in legend order, so m's run ends at its marker's true edge when
    what lies beyond is background or a method drawn before m; a later method beyond the
    end may be covering part of the marker.
    """
    i = start + step
    while 0 <= i < len(labels) and abs(i - start) <= 4:
        if labels[i] != -1:
            return bool(labels[i] == BG or labels[i] < method)
        i += step
    return False


def marker_run(labels: np.ndarray, method: int, max_gap: int) -> Run | None:
    """The longest group of m's pixels whose gaps hold no background (other markers atop)."""
    idx = np.where(labels == method)[0]
    if idx.size == 0:
        return None
    groups: list[tuple[int, int]] = []
    for a, b in runs(idx):
        gap = labels[groups[-1][1] + 1 : a] if groups else None
        if gap is not None and a - groups[-1][1] <= max_gap and not (gap == BG).any():
            groups[-1] = (groups[-1][0], b)
        else:
            groups.append((a, b))
    first, last = max(groups, key=lambda g: g[1] - g[0])
    return Run(
        first,
        last,
        end_is_edge(labels, first, -1, method),
        end_is_edge(labels, last, +1, method),
    )


def sample_column(panel: Panel, col: float) -> tuple[int, bool]:
    """The pixel column to read a marker on, moved 6 px inside where a frame line covers it."""
    c = round(col)
    if c < panel.left + 2:
        return panel.left + 6, True
    if c > panel.right - 2:
        return panel.right - 6, True
    return c, False


@dataclass(frozen=True)
class Reading:
    row: float | None  # marker centre row (image pixels); None when hidden
    status: str  # visible | off-centre | base | one-edge | hidden
    height: int  # run length on the centre column (px), 0 when none


OFFSETS = (-24, -18, -12, -6, 6, 12, 18, 24)  # px beside the centre column


def column_run(rgb: np.ndarray, panel: Panel, c: int, method: int, height: float) -> Run | None:
    """Method m's marker run on pixel column c, in image rows."""
    labels = classify(rgb[panel.top : panel.bottom + 1, c])
    run = marker_run(labels, method, max_gap=int(1.2 * height))
    if run is None:
        return None
    return Run(run.first + panel.top, run.last + panel.top, run.top_clean, run.bottom_clean)


def off_centre_rows(rgb: np.ndarray, panel: Panel, c: int, method: int, height: float) -> list:
    """Midpoints of fully visible runs on columns beside the centre (symmetric shapes only).

    Why: a shape symmetric about its horizontal axis has its vertical midpoint at the data
    point on every column it covers, so a marker whose centre column is partly covered
    can still be read beside it; runs longer than the marker (a steep line leaving it) or
    under half of it are not used.
    """
    rows = []
    for d in OFFSETS:
        run = column_run(rgb, panel, c + d, method, height)
        if run is None or not (run.top_clean and run.bottom_clean):
            continue
        if height / 2 <= run.last - run.first + 1 <= height + 4:
            rows.append((run.first + run.last) / 2)
    return rows


def read_marker(
    rgb: np.ndarray, panel: Panel, col: float, method: int, height: float, symmetric: bool
) -> Reading:
    """Centre row of method m's marker on its step's column (see the module docstring).

    ``symmetric``: the shape is symmetric about its horizontal axis (all but △).
    """
    c, shifted = sample_column(panel, col)
    run = column_run(rgb, panel, c, method, height)
    size = 0 if run is None else run.last - run.first + 1
    fits = abs(size - height) <= max(4.0, 0.05 * height)
    if run is not None and run.top_clean and run.bottom_clean and fits and symmetric:
        return Reading((run.first + run.last) / 2, "visible", size)
    if symmetric:
        rows = off_centre_rows(rgb, panel, c, method, height)
        if len(rows) >= 2 and max(rows) - min(rows) <= 3:
            return Reading(float(statistics.median(rows)), "off-centre", size)
    else:  # ^: the data point is the triangle's centroid, a third of its height above the base
        runs0 = [column_run(rgb, panel, c + d, 0, height) for d in (0, *OFFSETS)]
        bases = [r.last for r in runs0 if r is not None and r.bottom_clean]
        if len(bases) >= 2 and sum(b - min(bases) <= 2 for b in bases) >= 2:
            return Reading(min(bases) - height / 3, "base", size)
        if run is not None and run.top_clean and not shifted:  # base under the frame or a marker
            return Reading(run.first + 2 * height / 3, "apex", size)
        return Reading(None, "hidden", size)
    # One end only: needs the centre-column height, which iCaRL's ▷ markers do not have
    # (its height is its legend △'s).
    if run is None or size > height + 4 or shifted or method == 0:
        return Reading(None, "hidden", size)
    if run.bottom_clean and not run.top_clean:
        return Reading(run.last - (height - 1) / 2, "one-edge", size)
    if run.top_clean and not run.bottom_clean:
        return Reading(run.first + (height - 1) / 2, "one-edge", size)
    return Reading(None, "hidden", size)


def line_row(rgb: np.ndarray, panel: Panel, col: float, method: int) -> float | None:
    """The data point's row from m's own line alone: its centreline extrapolated to ``col``.

    Why: an independent check of the marker reading (the line passes through the data point
    whatever the marker's shape). On each side, the line's centre on three columns 90-130 px
    from the marker (where it is one clean run under 120 px tall, not covered) is fitted by a
    straight line and extrapolated; the mean over the sides that qualify is returned.
    """
    found = []
    for side in (-1, 1):
        points = []
        for d in (90, 110, 130):
            c = round(col) + side * d
            if not panel.left + 2 <= c <= panel.right - 2:
                continue
            pieces = runs(np.where(classify(rgb[panel.top : panel.bottom + 1, c]) == method)[0])
            if len(pieces) == 1 and pieces[0][1] - pieces[0][0] < 120:
                points.append((c, (pieces[0][0] + pieces[0][1]) / 2 + panel.top))
        if len(points) >= 2:
            slope, icept = np.polyfit([x for x, _ in points], [y for _, y in points], 1)
            found.append(float(slope * col + icept))
    return statistics.mean(found) if found else None


def marker_heights(
    rgb: np.ndarray, panels: list[Panel], steps: list[tuple[int, int, int, float]]
) -> tuple[dict[int, float], dict[int, float]]:
    """Per method: median and half the p10-p90 spread of its fully visible centre-column runs.

    Why: the marker height sizes a marker seen from one edge only, and its spread is the
    pixel uncertainty of a run end; runs touching the frame or a later method do not count,
    and runs over 1.3x the median of the rest (a steep line leaving the marker) are dropped.
    A method with no such run (PODNet+FL's circles lie under later markers) is sized by its
    legend marker, whose tallest column is its centre column for a circle.
    """
    sizes: dict[int, list[int]] = {}
    for pi, m, _, col in steps:
        c, shifted = sample_column(panels[pi], col)
        run = column_run(rgb, panels[pi], c, m, 400.0)
        if run is not None and run.top_clean and run.bottom_clean and not shifted:
            sizes.setdefault(m, []).append(run.last - run.first + 1)
    top = min(panel.top for panel in panels) - 20
    sizes.pop(0, None)  # ^'s apex column is 1-2 px wide: measure it on its legend marker
    for m in range(len(METHODS)):
        if m not in sizes:  # legend marker: its tallest column is the centre of ^ or a circle
            mask = classify(rgb[:top].reshape(-1, 3)).reshape(top, -1) == m
            sizes[m] = [int(mask.sum(0).max())]
    heights, spread = {}, {}
    for m, found in sizes.items():
        first = statistics.median(found)
        kept = [h for h in found if h <= 1.3 * first] or found
        heights[m] = float(statistics.median(kept))
        spread[m] = (float(np.percentile(kept, 90)) - float(np.percentile(kept, 10))) / 2
    spread[0] = 2.0  # ^ is read from its base, which the columns used agree on within 2 px
    return heights, spread


# Least uncertainty (%) by status, from the spread of |marker − line| over readings with a
# line check (T = 5, 10): visible/off-centre p90 0.11 (pixel formula covers it); △ read
# from its base or apex p90 0.53; read from one edge p90 0.99.
STATUS_PM = {"base": 0.5, "apex": 0.5, "one-edge": 1.0}

FIELDS = ("figure", "tasks", "method", "step", "classes", "column", "row", "value", "status")
FIELDS += ("pm", "calibration_error", "line_row", "line_value")


def figure_rows(path: Path) -> list[dict[str, object]]:
    """Every marker of every curve of one figure, as CSV rows (see the module docstring)."""
    if path.name not in Y_TICKS:
        raise ValueError(f"no tick labels known for {path.name}; known: {sorted(Y_TICKS)}")
    rgb = np.asarray(Image.open(path).convert("RGB"))
    dark = rgb.max(axis=2) < 100
    panels = find_panels(dark)
    offset = glyph_offset(dark, panels, Y_TICKS[path.name])
    calib = [
        (calibrate_x(dark, p, xt), calibrate_y(dark, p, yt, offset))
        for p, xt, yt in zip(panels, X_TICKS, Y_TICKS[path.name], strict=True)
    ]

    steps = [
        (pi, m, k, xmap.pixel(k * 100 / TASKS[pi]))
        for pi, (xmap, _) in enumerate(calib)
        for m in range(len(METHODS))
        for k in range(1, TASKS[pi] + 1)
    ]
    heights, spread = marker_heights(rgb, panels, steps)
    xmap_of = [xmap for xmap, _ in calib]
    rows = []
    for pi, m, k, col in steps:
        up = m == 0 and (path.name, TASKS[pi]) in UP_TRIANGLE
        reading = read_marker(rgb, panels[pi], col, m, heights[m], symmetric=not up)
        _, ymap = calib[pi]
        px_err = spread[m] + 1.0
        floor = STATUS_PM.get(reading.status, 0.0)
        value = None if reading.row is None else ymap.value(reading.row)
        spacing = abs(xmap_of[pi].pixel(100) - xmap_of[pi].pixel(100 - 100 / TASKS[pi]))
        check = line_row(rgb, panels[pi], col, m) if spacing > 250 else None
        rows.append(
            {
                "figure": path.name,
                "tasks": TASKS[pi],
                "method": METHODS[m][0],
                "step": k,
                "classes": round(k * 100 / TASKS[pi]),
                "column": round(col),
                "row": "" if reading.row is None else f"{reading.row:.1f}",
                "value": "" if value is None else f"{value:.2f}",
                "status": reading.status,
                "pm": f"{max(px_err * abs(ymap.b) + ymap.err, floor):.2f}",
                "calibration_error": f"{ymap.err:.3f}",
                "line_row": "" if check is None else f"{check:.1f}",
                "line_value": "" if check is None else f"{ymap.value(check):.2f}",
            }
        )
    scales = [f"T={t} {abs(y.b):.4f}, {y.err:.3f}" for t, (_, y) in zip(TASKS, calib, strict=True)]
    print(
        f"{path.name}: glyph offset {offset:.1f} px; per panel (% per px, tick residual %): "
        + "; ".join(scales)
        + "; marker heights px (median, half p10-p90 spread): "
        + ", ".join(f"{METHODS[m][0]} {heights[m]:.0f} ±{spread[m]:.1f}" for m in heights),
        file=sys.stderr,
    )
    return rows


# Which figure holds which dataset: the README's captions (fig/imagenet_subset_result.png is
# shown under "Experiments on CIFAR100 dataset", README line 49; fig/cifar_result.png under
# Imagenet-Subset, line 53), not the file names; docs/reproductions.md weighs the evidence.
DATASET_OF = {
    "imagenet_subset_result.png": ("CIFAR-100", "Table 1", "README:47-49"),
    "cifar_result.png": ("ImageNet-Subset", "Table 2", "README:51-53"),
}
TARGET_FIELDS = ("paper", "table", "dataset", "setting", "method", "variant", "metric")
TARGET_FIELDS += ("value", "pm", "n_seeds", "source_line", "notes")
ACCEPTED = ("visible", "off-centre", "base", "apex")


def setting_of(tasks: int) -> str:
    return f"class-IL, 100 classes in {tasks} tasks of {100 // tasks}"


def target_rows(digitized: list[dict[str, object]]) -> list[dict[str, object]]:
    """The targets file's rows: every accepted marker, then per curve its mean and final.

    Why these: the paper's tables print, per method and T, the accuracy after each task and
    their mean ("Avg.", the suite's AIA); the final step is Acc_T. A one-edge reading is kept
    only where the line check agrees within its ±1 %; a curve with a step left out gets no
    mean (it would not be the paper's), a curve whose last step is left out no final.
    """
    out, curves = [], {}
    for row in digitized:
        dataset, table, source = DATASET_OF[str(row["figure"])]
        status, value = str(row["status"]), str(row["value"])
        line = str(row["line_value"])
        kept = status in ACCEPTED or (
            status == "one-edge" and line != "" and abs(float(value) - float(line)) <= 1.0
        )
        key = (table, dataset, int(str(row["tasks"])), str(row["method"]), source, row["figure"])
        curves.setdefault(key, []).append((value if kept else None, float(str(row["pm"]))))
        if not kept:
            continue
        note = f"marker {status}" + (f"; line check {line}" if line else "")
        out.append(
            target(key, f"accuracy after task {row['step']} (%)", value, str(row["pm"]), note)
        )
    for key, points in curves.items():
        values = [v for v, _ in points]
        pms = [p for _, p in points]
        if all(v is not None for v in values):
            mean = sum(float(str(v)) for v in values) / len(values)
            note = "mean of the digitized steps; pm the mean of theirs"
            out.append(target(key, "AIA (%)", f"{mean:.2f}", f"{sum(pms) / len(pms):.2f}", note))
        if values[-1] is not None:
            note = "the last step's value"
            out.append(target(key, "Acc_T (%)", str(values[-1]), f"{pms[-1]:.2f}", note))
    return out


def target(key: tuple, metric: str, value: str, pm: str, note: str) -> dict[str, object]:
    """One targets-file row (see reproductions/targets/glfc.csv's notes for the reading)."""
    table, dataset, tasks, method, source, figure = key
    return {
        "paper": "GLFC",
        "table": table,
        "dataset": dataset,
        "setting": setting_of(tasks),
        "method": method,
        "variant": "none",
        "metric": metric,
        "value": value,
        "pm": pm,
        "n_seeds": "not stated",
        "source_line": f"{source} (fig/{figure})",
        "notes": f"digitized by bench/digitize_glfc_figures.py: {note}; the paper's ± and "
        f"seeds are unknown, pm is the digitization's; dataset from the README caption above "
        f"fig/{figure}, whose file name says the other dataset: the README wins (its CIFAR-100 "
        "figure's GLFC T=10 mean is 66.9, a public leaderboard's CIFAR-100 Avg.; "
        "docs/reproductions.md)",
    }


def write_csv(path: Path, fields: Sequence[str], rows: list[dict[str, object]]) -> None:
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("figures", nargs="+", type=Path, help="the repository's fig/*.png")
    parser.add_argument("--out", type=Path, required=True, help="CSV of every marker")
    parser.add_argument("--targets", type=Path, help="also write the targets file's rows here")
    args = parser.parse_args(argv)
    rows = [row for path in args.figures for row in figure_rows(path)]
    write_csv(args.out, FIELDS, rows)
    if args.targets is not None:
        write_csv(args.targets, TARGET_FIELDS, target_rows(rows))
    hidden = sum(row["status"] == "hidden" for row in rows)
    print(f"wrote {len(rows)} markers ({hidden} hidden) to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
