"""Image sets a component offers for a person to look at (``Component.images``: TARGET's
synthetic images after each task), written into the run folder as PNG grids.

Why files in the run folder and not only in the report: a person can open them without
building a report, the report of an unfinished run shows the tasks that ended, and a
resumed run finds the grids of the tasks before its checkpoint already written (each set
is written once, when it first appears; the synthesis is seeded, so a rerun of the same
round would write the same grid). The folder is a run file (``core.run_dir.RUN_FILES``):
a restart removes it with the records.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch

from cfl_bench.core.atomic import atomic_write
from cfl_bench.core.run_dir import IMAGE_SETS

if TYPE_CHECKING:
    from cfl_bench.strategies.compose import Strategy

#: The grid's layout: one row per class (the first ``GRID_CLASSES`` classes the set holds,
#: ascending), its first ``GRID_PER_CLASS`` images in the set's order, ``GRID_GAP`` white
#: pixels between images.
GRID_CLASSES = 10
GRID_PER_CLASS = 8
GRID_GAP = 1


def image_grid(images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """uint8 (H, W, C) grid of ``images`` (uint8 (N, C, h, w)) by class (``labels``): row r
    holds the first ``GRID_PER_CLASS`` images of the r-th smallest class present, on a white
    background (a class with fewer images leaves its row's end white)."""
    n, channels, h, w = images.shape
    classes = grid_classes(labels) if n else []
    rows, cols = max(1, len(classes)), GRID_PER_CLASS
    height = rows * h + (rows - 1) * GRID_GAP
    width = cols * w + (cols - 1) * GRID_GAP
    grid = torch.full((channels, height, width), 255, dtype=torch.uint8)
    for r, cls in enumerate(classes):
        chosen = images[labels == cls][:cols]
        for c, image in enumerate(chosen):
            top, left = r * (h + GRID_GAP), c * (w + GRID_GAP)
            grid[:, top : top + h, left : left + w] = image
    return grid.permute(1, 2, 0).contiguous()


def grid_classes(labels: torch.Tensor) -> list[int]:
    """The classes ``image_grid`` shows, one per row, top to bottom."""
    return [int(c) for c in torch.unique(labels)[:GRID_CLASSES].tolist()]


def write_png(path: Path, grid: torch.Tensor, classes: list[int] | None = None) -> None:
    """``grid`` (H, W, C uint8; C 1 or 3) as a PNG, atomically (temp file + rename); the rows'
    ``classes`` go into its text chunk "classes" (the report's caption reads them)."""
    from PIL import Image
    from PIL.PngImagePlugin import PngInfo

    pixels = grid.numpy()
    image = Image.fromarray(pixels[:, :, 0] if pixels.shape[2] == 1 else pixels)
    info = PngInfo()
    if classes is not None:
        info.add_text("classes", ",".join(str(c) for c in classes))
    atomic_write(path, lambda f: image.save(f, format="PNG", pnginfo=info))


def write_image_sets(run_path: Path, strategy: Strategy) -> list[Path]:
    """Write each component's image sets not yet in ``<run>/synthetic-images/`` as
    ``<name>.png``; returns the files written."""
    written = []
    for component in strategy.all:
        for name, (images, labels) in component.images().items():
            path = run_path / IMAGE_SETS / f"{name}.png"
            if not path.exists():
                grid = image_grid(images.cpu(), labels.cpu())
                write_png(path, grid, grid_classes(labels.cpu()))
                written.append(path)
    return written
