"""CINIC-10 from its standard image-folder layout: ``CINIC-10/{train,valid,test}/<class>/*.png``.

CINIC-10 (Darlow et al., 2018) is CIFAR-10's ten classes at 32×32, drawn from CIFAR-10 and
down-sampled ImageNet: 90,000 images in each of train, valid and test. The FL papers (FedNTD)
train on ``train`` and test on ``test``; ``valid`` is not read. The classes are the ten
folder names, which must be CIFAR-10's (their alphabetical order is CIFAR-10's label order,
so label c means the same class in ``cifar10`` and ``cinic10``).

Why our own reader: torchvision's ``ImageFolder`` decodes per sample at every epoch; here
every PNG is decoded once into one uint8 tensor, and every problem (a missing split, a class
folder missing or extra, an image that is not 32×32 RGB, a file PIL cannot read) is one
:class:`UserError` naming the file and the fix. CINIC-10 cannot be downloaded from here;
there is no ``--download`` for it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from cfl_bench.core.errors import UserError
from cfl_bench.streams.datafiles import check_data_root, one_line
from cfl_bench.streams.images import ImageSplits

FOLDER = "CINIC-10"
CLASSES = (
    "airplane",
    "automobile",
    "bird",
    "cat",
    "deer",
    "dog",
    "frog",
    "horse",
    "ship",
    "truck",
)
SIZE = (32, 32)
LAYOUT = f"{FOLDER}/train/<class>/*.png and {FOLDER}/test/<class>/*.png (the CINIC-10 layout)"
# Channel statistics published with CINIC-10 (its repository's README).
CINIC10_MEAN = (0.47889522, 0.47227842, 0.43047404)
CINIC10_STD = (0.24205776, 0.23828046, 0.25874835)


def load_cinic10(root: str | Path) -> ImageSplits:
    """Train and test splits of CINIC-10 under ``root`` as uint8 (N, 3, 32, 32) tensors."""
    base = check_data_root(root, holds=LAYOUT) / FOLDER
    train_x, train_y = _read_split(base / "train")
    test_x, test_y = _read_split(base / "test")
    return ImageSplits(
        name="cinic10",
        train_x=train_x,
        train_y=train_y,
        test_x=test_x,
        test_y=test_y,
        levels=255,
        num_classes=len(CLASSES),
    )


def _read_split(folder: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """Every image of one split, class by class in label order, files in name order."""
    if not folder.is_dir():
        raise UserError(
            f"CINIC-10 split folder {folder} is missing; pass a --data-root that holds {LAYOUT}"
        )
    found = sorted(p.name for p in folder.iterdir() if p.is_dir())
    if tuple(found) != CLASSES:
        raise UserError(
            f"CINIC-10 folder {folder} must hold exactly the class folders "
            f"{', '.join(CLASSES)}; it holds {', '.join(found) or 'none'}"
        )
    images: list[np.ndarray] = []
    labels: list[int] = []
    for label, name in enumerate(CLASSES):
        files = sorted(p for p in (folder / name).iterdir() if p.suffix.lower() == ".png")
        if not files:
            raise UserError(f"CINIC-10 class folder {folder / name} holds no .png image")
        images.extend(_read_image(path) for path in files)
        labels.extend([label] * len(files))
    x = torch.from_numpy(np.stack(images)).permute(0, 3, 1, 2).contiguous()
    return x, torch.tensor(labels, dtype=torch.int64)


def _read_image(path: Path) -> np.ndarray:
    """One image as uint8 (32, 32, 3); grey-scale images (CINIC-10 has a few) become RGB."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as image:
            rgb = np.asarray(image.convert("RGB"), dtype=np.uint8)
    except (OSError, UnidentifiedImageError) as exc:
        raise UserError(
            f"CINIC-10 image {path} cannot be read ({one_line(exc)}); replace it with the "
            "dataset's file"
        ) from exc
    if rgb.shape[:2] != SIZE:
        raise UserError(
            f"CINIC-10 image {path} is {rgb.shape[1]}x{rgb.shape[0]} pixels, not 32x32; "
            "CINIC-10 images are 32x32"
        )
    return rgb
