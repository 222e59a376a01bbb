"""How many clients the vectorized executor trains at once: automatic chunks from measured
memory on CUDA.

Why measured, not predicted: a chunk's memory is C × (parameters, gradients, optimizer
state, the components' per-client vectors such as FedGP's reference gradient or FedProx's
anchor) plus C × the activations of a batch and its replay rows under ``vmap`` and
backward, whose size depends on the model, the learner and the kernels torch picks. The
peak allocated by the first chunk, divided by its clients, is the per-client cost the
later chunks will have (every chunk runs the same steps); chunked training equals
unchunked training (tested), so choosing chunk sizes from memory never changes results.

Policy (``--clients-per-chunk`` unset, CUDA): the first chunk of a run has
``PROBE_CLIENTS`` clients (or fewer, if the round has fewer); afterwards every chunk has
as many clients as fit in ``HEADROOM`` of the memory available to torch (free on the
device plus what its allocator holds unused), at the largest per-client peak measured so
far. On the CPU every participant trains at once unless ``--clients-per-chunk`` says
otherwise (the host's memory is not the limit this guards against).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import torch

PROBE_CLIENTS = 16
HEADROOM = 0.8


class DeviceMemory(Protocol):
    """What the chunk planner needs of a device: a peak measurement around a chunk and the
    bytes available now."""

    def start(self) -> None:
        """Reset the peak counter at the current allocation."""

    def peak_since_start(self) -> int:
        """Bytes allocated above the allocation at ``start`` at the peak since."""

    def available(self) -> int:
        """Bytes a new allocation can use now."""


class CudaMemory:
    """``DeviceMemory`` of one CUDA device, from torch's caching allocator."""

    def __init__(self, device: torch.device) -> None:
        self.device, self.base = device, 0

    def start(self) -> None:
        torch.cuda.reset_peak_memory_stats(self.device)
        self.base = torch.cuda.memory_allocated(self.device)

    def peak_since_start(self) -> int:
        return max(torch.cuda.max_memory_allocated(self.device) - self.base, 0)

    def available(self) -> int:
        free, _ = torch.cuda.mem_get_info(self.device)
        cached = torch.cuda.memory_reserved(self.device) - torch.cuda.memory_allocated(self.device)
        return free + cached


@dataclass
class ChunkPlanner:
    """Chunk sizes for the vectorized executor: ``fixed`` when given, else from ``memory``
    (None: every client at once) and the per-client peak measured so far."""

    fixed: int | None
    memory: DeviceMemory | None
    per_client_bytes: int = 0  # the largest measured peak per client (0: none yet)

    def next_size(self, remaining: int) -> int:
        """How many of the ``remaining`` clients the next chunk trains."""
        if self.fixed is not None:
            return min(self.fixed, remaining)
        if self.memory is None:
            return remaining
        if not self.per_client_bytes:
            return min(PROBE_CLIENTS, remaining)
        fits = math.floor(HEADROOM * self.memory.available() / self.per_client_bytes)
        return max(1, min(fits, remaining))

    def start(self) -> None:
        if self.memory is not None:
            self.memory.start()

    def record(self, clients: int) -> None:
        """After a chunk of ``clients``: keep the largest peak per client seen."""
        if self.memory is not None and clients:
            peak = self.memory.peak_since_start() // clients
            self.per_client_bytes = max(self.per_client_bytes, peak)


def planner_for(device: torch.device, clients_per_chunk: int | None) -> ChunkPlanner:
    """Fixed chunks when asked; automatic from CUDA memory on a CUDA device; else all."""
    memory = CudaMemory(device) if device.type == "cuda" and clients_per_chunk is None else None
    return ChunkPlanner(clients_per_chunk, memory)
