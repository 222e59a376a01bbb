"""The run's image sets (``runner.image_sets``): the grid's layout by hand, the PNG and its
classes, and that each set is written once."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from PIL import Image

from cfl_bench.runner import image_sets
from cfl_bench.runner.image_sets import grid_classes, image_grid, write_image_sets, write_png


def test_the_grid_has_a_row_per_class_and_white_gaps(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(image_sets, "GRID_PER_CLASS", 2)
    # five 1-channel 1×2 images valued 10..14; classes 3, 1, 3, 3, 1
    images = torch.tensor([10, 11, 12, 13, 14], dtype=torch.uint8)[:, None, None, None]
    images = images.expand(5, 1, 1, 2).contiguous()
    labels = torch.tensor([3, 1, 3, 3, 1])
    grid = image_grid(images, labels)[:, :, 0]
    # rows: class 1 (images 11, 14), gap, class 3 (images 10, 12; 13 is past 2 columns)
    assert grid.tolist() == [
        [11, 11, 255, 14, 14],
        [255, 255, 255, 255, 255],
        [10, 10, 255, 12, 12],
    ]
    assert grid_classes(labels) == [1, 3]


def test_the_png_keeps_the_pixels_and_the_rows_classes(tmp_path: Path) -> None:
    grid = torch.randint(0, 256, (5, 7, 3), dtype=torch.uint8, generator=torch.Generator())
    path = tmp_path / "synthetic-images" / "after-task-1.png"
    write_png(path, grid, [4, 9])
    with Image.open(path) as image:
        assert torch.equal(torch.tensor(list(image.getdata())).reshape(5, 7, 3), grid.long())
        assert image.info["classes"] == "4,9"
    assert [p.name for p in path.parent.iterdir()] == ["after-task-1.png"]  # no temp left


def test_each_set_is_written_once(tmp_path: Path) -> None:
    images = torch.zeros((2, 3, 4, 4), dtype=torch.uint8)
    offered = {"after-task-1": (images, torch.tensor([0, 1]))}
    component = SimpleNamespace(images=lambda: offered)
    strategy = SimpleNamespace(all=[component])
    first = write_image_sets(tmp_path, strategy)  # type: ignore[arg-type]
    assert [p.name for p in first] == ["after-task-1.png"]
    assert write_image_sets(tmp_path, strategy) == []  # type: ignore[arg-type]
    with Image.open(first[0]) as image:  # 2 rows of 4 px + a gap; 8 columns of 4 px + gaps
        assert image.size == (8 * 4 + 7, 2 * 4 + 1)
