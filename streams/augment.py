"""Batched train-time augmentation for image streams: random crop with padding + flip, Cutout.

Why batched on the device: the CIFAR protocol (Mammoth, FedGP) augments every training batch
with ``RandomCrop(32, padding=4)`` and ``RandomHorizontalFlip()``; done per sample through
PIL in a DataLoader this dominates a small model's step time. Here the whole batch is padded
once and every sample's crop is one advanced-indexing gather, the flip one ``torch.where``,
with offsets and coin flips drawn from the caller's generator on the batch's device — no host
round trip. The result for sample i equals cropping the zero-padded image at
(top_i, left_i) and mirroring it when flip_i, which is what the per-sample transforms do.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F


def crop_flip(
    x: torch.Tensor,
    generator: torch.Generator,
    padding: int = 4,
    flip: bool = True,
    fill: torch.Tensor | None = None,
) -> torch.Tensor:
    """Random ``padding``-pixel crop and horizontal flip of an (N, C, H, W) batch.

    ``fill`` (one value per channel, default 0) is what the padding shows. Streams keep
    their images already normalised, so they pass the normalised value of black,
    (0 − mean)/std: then crop-then-normalise (torchvision's order) and normalise-then-crop
    give identical tensors, and the buffer can store normalised, un-augmented inputs.
    """
    n, c, h, w = x.shape
    device = x.device
    top = torch.randint(0, 2 * padding + 1, (n,), generator=generator, device=device)
    left = torch.randint(0, 2 * padding + 1, (n,), generator=generator, device=device)
    if fill is None:
        padded = F.pad(x, (padding, padding, padding, padding))
    else:
        size = (n, c, h + 2 * padding, w + 2 * padding)
        padded = fill.to(x).view(1, c, 1, 1).expand(size).clone()
        padded[:, :, padding : padding + h, padding : padding + w] = x
    rows = (top[:, None] + torch.arange(h, device=device))[:, None, :, None]
    cols = (left[:, None] + torch.arange(w, device=device))[:, None, None, :]
    samples = torch.arange(n, device=device)[:, None, None, None]
    channels = torch.arange(c, device=device)[None, :, None, None]
    out = padded[samples, channels, rows, cols]
    if flip:
        mirror = torch.rand(n, generator=generator, device=device) < 0.5
        out = torch.where(mirror[:, None, None, None], out.flip(3), out)
    return out


def cutout(x: torch.Tensor, generator: torch.Generator, length: int) -> torch.Tensor:
    """Cutout (DeVries & Taylor, 2017) as FedNTD's code applies it, for a whole batch.

    Per sample, a centre (y, x) uniform over the image and the square rows
    [y − length//2, y + length//2) × columns [x − length//2, x + length//2), clipped to the
    image (a hole near the border is partly outside), set to 0. Applied after normalisation,
    as in the authors' transform, so the hole shows the dataset mean. One mask per sample
    from the caller's generator on the batch's device; no host round trip.
    """
    n, _, h, w = x.shape
    device = x.device
    half = length // 2
    y = torch.randint(0, h, (n, 1), generator=generator, device=device)
    c = torch.randint(0, w, (n, 1), generator=generator, device=device)
    rows, cols = torch.arange(h, device=device), torch.arange(w, device=device)
    in_rows = (rows >= y - half) & (rows < y + half)
    in_cols = (cols >= c - half) & (cols < c + half)
    hole = in_rows[:, :, None] & in_cols[:, None, :]
    return torch.where(hole[:, None], torch.zeros((), dtype=x.dtype, device=device), x)


def normalize(x: torch.Tensor, mean: tuple[float, ...], std: tuple[float, ...]) -> torch.Tensor:
    """Per-channel (x − mean) / std for an (N, C, H, W) batch."""
    m = torch.tensor(mean, device=x.device, dtype=x.dtype)[None, :, None, None]
    s = torch.tensor(std, device=x.device, dtype=x.dtype)[None, :, None, None]
    return (x - m) / s
