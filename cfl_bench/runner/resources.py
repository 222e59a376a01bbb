"""Peak memory of the process (RSS) and of the CUDA allocator, for the cost columns."""

from __future__ import annotations

import sys

import torch


def peak_rss_bytes() -> int:
    """Peak resident set size of this process so far."""
    try:
        import resource
    except ImportError:  # not on Unix
        import psutil

        return int(psutil.Process().memory_info().rss)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # Linux reports KiB, macOS bytes.
    return int(peak if sys.platform == "darwin" else peak * 1024)


def cuda_peak_bytes(device: torch.device) -> int | None:
    if device.type != "cuda":
        return None
    return int(torch.cuda.max_memory_allocated(device))
