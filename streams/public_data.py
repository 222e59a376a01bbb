"""Public (unlabelled) datasets that a strategy may use, read here on the strategy's behalf.

Why in ``streams``: reading dataset files is what streams do, and strategies never import
streams (the layers point one way, tests/test_layers.py). The run hands a strategy this
reader through ``StrategyEnv.public_images``, bound to the run's ``--data-root``; FedProj's
Fashion-MNIST proxy is the one public set today.
"""

from __future__ import annotations

from pathlib import Path

import torch

from streams.mnist import load_idx_split, split_present

# public set name → (torchvision folder, split): only the test split is read, since the
# shared offline copy has nothing else and a public set never needs labels.
PUBLIC_SETS: dict[str, tuple[str, str]] = {"fashion-mnist": ("FashionMNIST", "test")}


def public_images(data_root: str | Path | None, name: str) -> torch.Tensor | None:
    """uint8 images (N, 28, 28) of the public set ``name``, or None when there is no data
    root or it lacks the set's files (the caller says what to do about it). Damaged files
    are refused by the loader with their own one-line error."""
    if name not in PUBLIC_SETS:
        raise ValueError(f"unknown public set {name!r}; known: {', '.join(PUBLIC_SETS)}")
    folder, split = PUBLIC_SETS[name]
    if data_root is None or not split_present(data_root, folder, split):
        return None
    images, _ = load_idx_split(data_root, folder, split)
    return images
