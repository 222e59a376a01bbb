"""Batched, deterministic image transforms that define domain-IL tasks.

Why batched tensor ops: a task's transform is fixed, so it runs once per task over the whole
split on the device, instead of per sample through PIL inside the training loop.

``rotate_batch`` reproduces ``torchvision.transforms.v2.functional.rotate`` on tensors
(nearest interpolation, zero fill, no expand, rotation about the image centre,
counter-clockwise for positive degrees), including its exact shortcuts for multiples of 90
degrees; the tests check pixel-exact equality.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

# Half precision is excluded: pixel numbers above 2048 (fp16) are not exact there.
SUPPORTED_DTYPES = (torch.float32, torch.float64, torch.uint8)


def rotate_batch(x: torch.Tensor, degrees: float, chunk: int = 8192) -> torch.Tensor:
    """Rotate every image of an (N, C, H, W) batch by ``degrees``, counter-clockwise.

    Accepts float32, float64 and uint8 pixels and returns the same dtype. Nearest-neighbour
    rotation only moves pixels, and which source pixel lands where depends only on the
    angle and the image size. So the sampling grid is evaluated once (``grid_sample`` on an
    image of pixel numbers) and the batch is rearranged with one gather per ``chunk``
    images, writing straight into the output. The result equals ``grid_sample`` applied to
    every image (and torchvision's rotate) exactly, several times faster, and rotating
    uint8 pixels before converting them gives the same floats as rotating after.
    """
    _check_batch(x)
    if chunk < 1:
        raise ValueError(f"chunk must be positive, got {chunk}")
    angle = float(degrees) % 360.0
    height, width = x.shape[-2:]
    # Exact pixel moves, as torchvision does them: cheaper and free of rounding.
    if angle == 0.0 or x.shape[0] == 0:
        return x.clone()
    if angle == 180.0:
        return torch.rot90(x, k=2, dims=(-2, -1)).contiguous()
    if height == width and angle in (90.0, 270.0):
        return torch.rot90(x, k=1 if angle == 90.0 else 3, dims=(-2, -1)).contiguous()
    # torchvision evaluates the grid in the image dtype, or float32 for integer images. We
    # evaluate it on the CPU whatever the device, so a task is bit-identical on CPU and GPU.
    grid_dtype = x.dtype if x.dtype.is_floating_point else torch.float32
    source = _rotation_sources(angle, height, width, grid_dtype).to(x.device)
    outside = torch.nonzero(source < 0).view(-1)
    inside_source = source.clamp(min=0)
    flat = x.flatten(2)
    out = torch.empty_like(flat, memory_format=torch.contiguous_format)
    for start in range(0, flat.shape[0], chunk):
        part = flat[start : start + chunk]
        index = inside_source.expand(part.shape[0], part.shape[1], -1)
        torch.gather(part, 2, index, out=out[start : start + chunk])
    return out.index_fill_(2, outside, 0).view(x.shape)


def permute_pixels(x: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
    """Apply one pixel permutation (over the H*W positions) to every channel of every image.

    Output pixel ``i`` (in row-major order) is input pixel ``perm[i]``.
    """
    _check_batch(x)
    pixels = x.shape[-2] * x.shape[-1]
    if perm.dim() != 1 or perm.shape[0] != pixels or perm.dtype != torch.int64:
        raise ValueError(f"perm must be int64 of shape ({pixels},), got {perm.dtype} {perm.shape}")
    if not torch.equal(torch.sort(perm.cpu()).values, torch.arange(pixels)):
        raise ValueError("perm must be a permutation of 0..H*W-1")
    return x.flatten(2)[:, :, perm.to(x.device)].reshape(x.shape)


def _rotation_sources(angle: float, height: int, width: int, dtype: torch.dtype) -> torch.Tensor:
    """For each output pixel (row-major), the flat index of its source pixel, or -1 where
    the rotated image shows the zero fill.

    Pixel numbers 1..H*W are exact in float32/float64 and zero padding yields 0 outside,
    hence the -1.
    """
    numbers = torch.arange(1, height * width + 1, dtype=dtype)
    picked = F.grid_sample(
        numbers.view(1, 1, height, width),
        _rotation_grid(angle, height, width, dtype),
        mode="nearest",
        padding_mode="zeros",
        align_corners=False,
    )
    return picked.view(-1).to(torch.int64) - 1


def _rotation_grid(angle: float, height: int, width: int, dtype: torch.dtype) -> torch.Tensor:
    """Sampling grid (1, H, W, 2) in ``grid_sample``'s normalised coordinates.

    With y pointing down, a visual counter-clockwise turn by ``a`` sends a source point p
    to R(-a) p, so each output pixel p samples its source at R(a) p = [[c, -s], [s, c]] p,
    in pixel units about the image centre, then normalised by half the width and height.

    Why not ``F.affine_grid``: it normalises *before* applying the matrix. That is the same
    map mathematically, but at angles such as 30 or 45 degrees many sample points fall
    exactly halfway between pixels, and the different rounding then picks other neighbours
    than torchvision does (about 1-4% of pixels). Evaluating the map in the same order as
    ``torchvision.transforms.v2.functional.rotate`` (pixel-centred coordinates times the
    matrix divided by the half-size, one batched matmul) makes the result pixel-exact.
    """
    radians = math.radians(angle)
    cos, sin = math.cos(radians), math.sin(radians)
    matrix = torch.tensor([[[cos, -sin, 0.0], [sin, cos, 0.0]]], dtype=dtype)
    half_size = torch.tensor([0.5 * width, 0.5 * height], dtype=dtype)
    scaled = matrix.transpose(1, 2).div_(half_size)  # (1, 3, 2): rows x, y, 1
    xs = torch.arange(width, dtype=dtype) - (width - 1) * 0.5
    ys = torch.arange(height, dtype=dtype) - (height - 1) * 0.5
    points = torch.stack(
        [
            xs.expand(height, width),
            ys.unsqueeze(1).expand(height, width),
            torch.ones(height, width, dtype=dtype),
        ],
        dim=-1,
    )
    return points.view(1, height * width, 3).bmm(scaled).view(1, height, width, 2)


def _check_batch(x: torch.Tensor) -> None:
    """Both transforms take whole batches of images in the dtypes streams use."""
    if x.dim() != 4 or x.dtype not in SUPPORTED_DTYPES:
        raise ValueError(
            f"expected a float32, float64 or uint8 (N, C, H, W) tensor, "
            f"got {x.dtype} {tuple(x.shape)}"
        )
