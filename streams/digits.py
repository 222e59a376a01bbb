"""The embedded default dataset: scikit-learn's 8x8 handwritten digits (1,797 images).

Why: a stream that needs no download and no data folder lets the CLI, CI and new users run
a real continual-FL experiment in seconds. The data ships inside scikit-learn. Pixels are
counts 0..16 (a 4x4 block of the original 32x32 bitmap), so ``levels`` is 16. The split is
fixed and seed-free (every 5th sample is test) so every run, on every machine, sees the
same 1,437 train and 360 test images.
"""

from __future__ import annotations

import gzip
import importlib.util
from pathlib import Path

import numpy as np
import torch

from cfl_bench.streams.images import ImageSplits

LEVELS = 16
TEST_EVERY = 5


def digits_images() -> ImageSplits:
    """The digits as compact uint8 counts (N, 1, 8, 8) in 0..16, split train/test."""
    images, target = digits_arrays()
    counts = torch.from_numpy(np.asarray(images, dtype=np.uint8)).unsqueeze(1)
    labels = torch.from_numpy(np.asarray(target, dtype=np.int64))
    is_test = torch.arange(labels.shape[0]) % TEST_EVERY == 0
    return ImageSplits(
        name="digits",
        train_x=counts[~is_test].contiguous(),
        train_y=labels[~is_test].contiguous(),
        test_x=counts[is_test].contiguous(),
        test_y=labels[is_test].contiguous(),
        levels=LEVELS,
        num_classes=10,
    )


def digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits: images (1797, 8, 8) of counts 0..16 and their labels.

    Why the file is read here: ``sklearn.datasets.load_digits`` only parses the gzipped CSV
    that scikit-learn ships (64 counts and the label per row), but importing scikit-learn
    (with scipy) costs ~1.5 s of CPU and ~75 MiB of resident memory in every process that
    builds a digits stream, each sweep point included. The same parse (``np.loadtxt``,
    delimiter ``,``) gives the same arrays. Where the file is not where this release of
    scikit-learn keeps it, ``load_digits`` itself is called."""
    path = sklearn_digits_file()
    if path is None:
        from sklearn.datasets import load_digits as sklearn_digits

        bunch = sklearn_digits()
        return bunch.images, bunch.target
    with gzip.open(path, mode="rt", encoding="utf-8") as rows:
        data = np.loadtxt(rows, delimiter=",")
    return data[:, :-1].reshape(-1, 8, 8), data[:, -1].astype(int)


def sklearn_digits_file() -> Path | None:
    """Where the installed scikit-learn keeps ``digits.csv.gz``, found without importing
    scikit-learn (its package spec only); None where that file is absent."""
    spec = importlib.util.find_spec("sklearn")
    for folder in (spec.submodule_search_locations or []) if spec is not None else []:
        path = Path(folder) / "datasets" / "data" / "digits.csv.gz"
        if path.is_file():
            return path
    return None


def load_digits() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Train images, train labels, test images, test labels; images float32 in [0, 1]."""
    splits = digits_images()
    return (
        splits.train_x.to(torch.float32) / LEVELS,
        splits.train_y,
        splits.test_x.to(torch.float32) / LEVELS,
        splits.test_y,
    )
