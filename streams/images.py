"""In-memory labelled image splits that streams are built from.

Why a separate type: base datasets (MNIST, the embedded 8x8 digits, later CIFAR) arrive in
different files and value ranges, but every stream wants the same thing: compact uint8
pixels that stay on the device and become float32 in [0, 1] only when a task is
materialised. ``levels`` records the value that means "white" (255 for MNIST, 16 for the
digits), so the conversion is exact and explicit rather than guessed from the data.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from cfl_bench.core.errors import UserError


@dataclass(frozen=True)
class ImageSplits:
    """Train and test images (uint8, N x C x H x W) with int64 labels."""

    name: str
    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    levels: int
    num_classes: int

    def __post_init__(self) -> None:
        """Catch wiring mistakes early; these are bugs, not user errors."""
        for split in ("train", "test"):
            x = getattr(self, f"{split}_x")
            y = getattr(self, f"{split}_y")
            if x.dtype != torch.uint8 or x.dim() != 4:
                raise ValueError(f"{split}_x must be uint8 (N, C, H, W), got {x.dtype} {x.shape}")
            if y.dtype != torch.int64 or y.shape != (x.shape[0],):
                raise ValueError(f"{split}_y must be int64 (N,), got {y.dtype} {y.shape}")
        if self.train_x.shape[1:] != self.test_x.shape[1:]:
            raise ValueError("train and test images must share (C, H, W)")
        if self.levels < 1:
            raise ValueError("levels must be positive")

    @property
    def input_shape(self) -> tuple[int, ...]:
        """(C, H, W) of every image."""
        return tuple(self.train_x.shape[1:])

    def head(self, train_size: int | None, test_size: int | None) -> ImageSplits:
        """Keep the first ``train_size`` / ``test_size`` examples (None keeps all).

        Why a prefix and not a sample: fast tests and smoke runs need a subset that is
        identical on every machine and for every seed, so it can be part of the protocol.
        """
        train_n = checked_size("train_size", train_size, self.train_x.shape[0], self.name)
        test_n = checked_size("test_size", test_size, self.test_x.shape[0], self.name)
        # Copies, so a small prefix does not keep the whole base split alive.
        return dataclasses.replace(
            self,
            train_x=self.train_x[:train_n].clone(),
            train_y=self.train_y[:train_n].clone(),
            test_x=self.test_x[:test_n].clone(),
            test_y=self.test_y[:test_n].clone(),
        )

    def to(self, device: torch.device) -> ImageSplits:
        """The same splits on ``device`` (uint8 keeps the copy four times smaller)."""
        return dataclasses.replace(
            self,
            train_x=self.train_x.to(device),
            train_y=self.train_y.to(device),
            test_x=self.test_x.to(device),
            test_y=self.test_y.to(device),
        )


def checked_size(option: str, value: int | None, available: int, dataset: str) -> int:
    """Resolve an optional prefix size, rejecting impossible values with a clear message.

    Public because the text streams cut their prefixes with the same rule and wording.
    """
    if value is None:
        return available
    flag = "--" + option.replace("_", "-")  # the option as the user typed it
    if isinstance(value, bool) or not isinstance(value, int):
        raise UserError(f"{flag} must be a positive integer or unset, got {value!r}")
    split = option.removesuffix("_size")
    if not 1 <= value <= available:
        raise UserError(
            f"{flag} {value} does not fit the {dataset} {split} split of {available} "
            f"examples; pass a value between 1 and {available} or leave it unset"
        )
    return value
