"""Public (unlabelled) datasets that a strategy may use, read here on the strategy's behalf.

Why in ``streams``: reading dataset files is what streams do, and strategies never import
streams (the layers point one way, tests/test_layers.py). The run hands a strategy this
reader through ``StrategyEnv.public_images``, bound to the run's ``--data-root``, and the
stream's own ``as_model_input`` through ``StrategyEnv.public_inputs``, so public images are
scaled and normalised exactly like the stream's.

The sets: ``fashion-mnist`` (the Fashion-MNIST test split, 1×28×28: FedProj's proxy for the
MNIST streams) and ``cifar100`` (the CIFAR-100 train split, 3×32×32: FedDF's proxy for
CIFAR-10).
"""

from __future__ import annotations

from pathlib import Path

import torch

from cfl_bench.streams.cifar import cifar_train_present, load_cifar_train_images
from cfl_bench.streams.mnist import load_idx_split, split_present

# public set name → image shape (C, H, W); the stream's inputs must have the same.
PUBLIC_SHAPES: dict[str, tuple[int, int, int]] = {
    "fashion-mnist": (1, 28, 28),
    "cifar100": (3, 32, 32),
}


def public_images(data_root: str | Path | None, name: str) -> torch.Tensor | None:
    """uint8 images (N, C, H, W) of the public set ``name`` (C, H, W as ``PUBLIC_SHAPES``),
    or None when there is no data root or it lacks the set's files (the caller says what to
    do about it). Damaged files are refused by the loaders with their own one-line error.

    Only one split is read: Fashion-MNIST's test split (the shared offline copy has nothing
    else) and CIFAR-100's train split (FedDF's choice); a public set never needs labels.
    """
    if name not in PUBLIC_SHAPES:
        raise ValueError(f"unknown public set {name!r}; known: {', '.join(PUBLIC_SHAPES)}")
    if data_root is None:
        return None
    if name == "fashion-mnist":
        if not split_present(data_root, "FashionMNIST", "test"):
            return None
        images, _ = load_idx_split(data_root, "FashionMNIST", "test")
        return images.unsqueeze(1)
    if not cifar_train_present(data_root, "cifar100"):
        return None
    return load_cifar_train_images(data_root, "cifar100")
