"""Batched crop + flip against a per-sample reference with the same random draws."""

from __future__ import annotations

import torch
from torch.nn import functional as F

from cfl_bench.streams.augment import crop_flip, normalize


def reference(x: torch.Tensor, seed: int, padding: int = 4) -> torch.Tensor:
    """Per-sample crop and flip with the draws crop_flip makes from the same seed."""
    gen = torch.Generator().manual_seed(seed)
    n, _, h, w = x.shape
    top = torch.randint(0, 2 * padding + 1, (n,), generator=gen)
    left = torch.randint(0, 2 * padding + 1, (n,), generator=gen)
    mirror = torch.rand(n, generator=gen) < 0.5
    out = []
    for i in range(n):
        img = F.pad(x[i], (padding,) * 4)[:, top[i] : top[i] + h, left[i] : left[i] + w]
        out.append(img.flip(2) if mirror[i] else img)
    return torch.stack(out)


def test_batched_equals_per_sample_crop_and_flip() -> None:
    x = torch.rand(64, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    got = crop_flip(x, torch.Generator().manual_seed(7))
    assert torch.equal(got, reference(x, 7))


def test_draws_are_seeded_and_cover_offsets_and_flips() -> None:
    x = torch.arange(16.0).view(1, 1, 4, 4).repeat(400, 1, 1, 1)
    a = crop_flip(x, torch.Generator().manual_seed(1), padding=1)
    b = crop_flip(x, torch.Generator().manual_seed(1), padding=1)
    assert torch.equal(a, b)
    distinct = {tuple(img.flatten().tolist()) for img in a}
    assert len(distinct) == 18  # 3 × 3 offsets × 2 flips, all reached in 400 draws
    unchanged = (a == x).flatten(1).all(1).float().mean()
    assert 0.02 < float(unchanged) < 0.1  # centre crop without flip: 1/18 ≈ 0.056


def test_normalize_per_channel() -> None:
    x = torch.ones(2, 3, 1, 1) * torch.tensor([1.0, 2.0, 3.0])[None, :, None, None]
    out = normalize(x, (1.0, 1.0, 1.0), (1.0, 2.0, 4.0))
    assert torch.equal(out[0].flatten(), torch.tensor([0.0, 0.5, 0.5]))


def test_fill_makes_normalise_then_crop_equal_crop_then_normalise() -> None:
    mean, std = (0.5, 0.4, 0.3), (0.2, 0.25, 0.3)
    raw = torch.rand(16, 3, 8, 8, generator=torch.Generator().manual_seed(2))
    black = normalize(torch.zeros(1, 3, 1, 1), mean, std).flatten()
    first = normalize(crop_flip(raw, torch.Generator().manual_seed(4)), mean, std)
    second = crop_flip(normalize(raw, mean, std), torch.Generator().manual_seed(4), fill=black)
    assert torch.allclose(first, second, atol=1e-6)
