"""Avalanche benchmark factories for the adapter's tests, importable by spec string.

Why a module: the CLI names a benchmark as ``avalanche:package.module:factory``, so the
end-to-end test needs a real importable factory. Every benchmark here is built by
Avalanche's own generators from real data (never synthetic): a slice of the handwritten digits
embedded in the package, small enough to train in seconds and present on every checkout.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from avalanche.benchmarks import class_incremental_benchmark
from avalanche.benchmarks.utils import as_classification_dataset
from torch.utils.data import TensorDataset

from cfl_bench.streams.digits import load_digits
from cfl_bench.streams.mnist import load_mnist

# The slice the end-to-end factory uses: the first examples of each digits split.
TINY_TRAIN, TINY_TEST = 600, 200


class LabelledTensors(TensorDataset):
    """A TensorDataset with the ``targets`` list Avalanche reads class labels from.

    Why: Avalanche's ``as_classification_dataset`` takes any dataset with a ``targets``
    field; torch's TensorDataset has none.
    """

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        super().__init__(x, y)
        self.targets = y.tolist()


def classification(x: torch.Tensor, y: torch.Tensor) -> Any:
    """Input and label tensors as an Avalanche classification dataset (no transforms)."""
    return as_classification_dataset(LabelledTensors(x, y))


def mnist_floats(root: str | Path, train: int, test: int) -> tuple[torch.Tensor, ...]:
    """The first ``train`` / ``test`` MNIST images as (N, 1, 28, 28) floats in [0, 1]."""
    train_x, train_y, test_x, test_y = load_mnist(root, download=False)
    return (
        train_x[:train].unsqueeze(1).float().div_(255),
        train_y[:train].clone(),
        test_x[:test].unsqueeze(1).float().div_(255),
        test_y[:test].clone(),
    )


def digits_floats(train: int, test: int) -> tuple[torch.Tensor, ...]:
    """The first ``train`` / ``test`` embedded 8×8 digits as (N, 1, 8, 8) floats in [0, 1]."""
    train_x, train_y, test_x, test_y = load_digits()
    return train_x[:train], train_y[:train], test_x[:test], test_y[:test]


def tiny_split_digits(n_experiences: int = 2) -> Any:
    """Split digits on a 600/200 slice with Avalanche's ``class_incremental_benchmark``.

    Natural class order, ``n_experiences`` experiences of 10 / n classes each (a divisor
    of 10: Avalanche drops the remainder classes otherwise). Needs no ``--data-root``.
    """
    train_x, train_y, test_x, test_y = digits_floats(TINY_TRAIN, TINY_TEST)
    return class_incremental_benchmark(
        {"train": classification(train_x, train_y), "test": classification(test_x, test_y)},
        class_order=list(range(10)),
        num_experiences=n_experiences,
    )
