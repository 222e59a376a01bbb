"""Parser for the IDX file format (the format MNIST and Fashion-MNIST ship in).

Why our own parser: it is twenty lines of numpy, and unlike a generic loader it checks the
structure (magic number, dimensions, exact byte count, label range) so that a truncated or
wrong file fails loudly instead of training on garbage. Paths and advice live in the caller;
this module only says *what* is wrong with the bytes.
"""

from __future__ import annotations

import numpy as np

IMAGES_MAGIC = 2051  # 0x00000803: unsigned bytes, 3 dimensions
LABELS_MAGIC = 2049  # 0x00000801: unsigned bytes, 1 dimension


class IdxFormatError(ValueError):
    """The bytes are not a well-formed IDX file of the expected kind."""


def parse_images(data: bytes, *, shape: tuple[int, int]) -> np.ndarray:
    """Decode an IDX image file into a uint8 array of shape (N, *shape)."""
    count, rows, cols = _header(data, IMAGES_MAGIC, ndim=3)
    if (rows, cols) != shape:
        raise IdxFormatError(f"images are {rows}x{cols}, expected {shape[0]}x{shape[1]}")
    offset = 4 * 4
    _check_length(data, offset + count * rows * cols)
    return np.frombuffer(data, dtype=np.uint8, offset=offset).reshape(count, rows, cols).copy()


def parse_labels(data: bytes, *, num_classes: int) -> np.ndarray:
    """Decode an IDX label file into an int64 array, checking labels are < ``num_classes``."""
    (count,) = _header(data, LABELS_MAGIC, ndim=1)
    offset = 2 * 4
    _check_length(data, offset + count)
    labels = np.frombuffer(data, dtype=np.uint8, offset=offset).astype(np.int64)
    if count and int(labels.max()) >= num_classes:
        raise IdxFormatError(f"label {int(labels.max())} is outside 0..{num_classes - 1}")
    return labels


def _header(data: bytes, magic: int, *, ndim: int) -> tuple[int, ...]:
    """Read the big-endian magic number and dimension sizes."""
    header_len = 4 * (1 + ndim)
    if len(data) < header_len:
        raise IdxFormatError(f"only {len(data)} bytes, shorter than the {header_len}-byte header")
    fields = np.frombuffer(data, dtype=">u4", count=1 + ndim)
    if int(fields[0]) != magic:
        raise IdxFormatError(f"magic number {int(fields[0])}, expected {magic}")
    return tuple(int(v) for v in fields[1:])


def _check_length(data: bytes, expected: int) -> None:
    """Demand the exact size the header promises: shorter is truncated, longer is wrong."""
    if len(data) != expected:
        raise IdxFormatError(f"{len(data)} bytes, the header promises {expected}")
