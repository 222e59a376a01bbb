"""Host numbers as device tensors without stalling the device.

Why: ``torch.tensor(values, device="cuda")`` copies from pageable host memory, and CUDA
synchronises the stream before such a copy: the host waits until every queued kernel has
run. The vectorized executor builds a few small index tensors from host bookkeeping at
every lock-step (which clients step, buffer counters and rows); each would otherwise stall
the GPU pipeline once per step. Staged through pinned memory the copy is asynchronous
(torch's caching host allocator keeps the pinned block until the copy has completed).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def device_tensor(
    values: Sequence[int] | Sequence[float] | Sequence[bool],
    device: torch.device,
    dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """``values`` as a 1-D tensor on ``device``; on CUDA copied asynchronously."""
    host = torch.tensor(list(values), dtype=dtype)
    if device.type != "cuda":
        return host if device.type == "cpu" else host.to(device)
    return host.pin_memory().to(device, non_blocking=True)
