"""The embedded default dataset: scikit-learn's 8x8 handwritten digits (1,797 images).

Why: a stream that needs no download and no data folder lets the CLI, CI and new users run
a real continual-FL experiment in seconds. The data ships inside scikit-learn. Pixels are
counts 0..16 (a 4x4 block of the original 32x32 bitmap), so ``levels`` is 16. The split is
fixed and seed-free (every 5th sample is test) so every run, on every machine, sees the
same 1,437 train and 360 test images.
"""

from __future__ import annotations

import numpy as np
import torch

from cfl_bench.streams.images import ImageSplits

LEVELS = 16
TEST_EVERY = 5


def digits_images() -> ImageSplits:
    """The digits as compact uint8 counts (N, 1, 8, 8) in 0..16, split train/test."""
    # Imported here, not at module level: scikit-learn (with scipy) costs ~2 s and ~75 MiB of
    # resident memory, which every MNIST or CIFAR run would pay for nothing.
    from sklearn.datasets import load_digits as sklearn_digits

    bunch = sklearn_digits()
    counts = torch.from_numpy(np.asarray(bunch.images, dtype=np.uint8)).unsqueeze(1)
    labels = torch.from_numpy(np.asarray(bunch.target, dtype=np.int64))
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


def load_digits() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Train images, train labels, test images, test labels; images float32 in [0, 1]."""
    splits = digits_images()
    return (
        splits.train_x.to(torch.float32) / LEVELS,
        splits.train_y,
        splits.test_x.to(torch.float32) / LEVELS,
        splits.test_y,
    )
