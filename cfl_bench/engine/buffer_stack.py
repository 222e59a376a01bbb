"""Every client's reservoir in one stacked storage, for batched draws and inserts over clients.

Why: the vectorized executor trains a chunk of C clients in lock-step; with one
``ReservoirBuffer`` per client, every lock-step pays C small reservoir inserts (a dozen
tensor ops each) and C gathers of replay rows. Stacked as x (K, M+1, …), y, logits and task
(K clients, capacity M, the trash row last), a lock-step's inserts for the whole chunk are
one slot computation over (C, b) and one ``index_copy_`` per field, and its replay draws one
gather per field.

Each client's ``ReservoirBuffer`` keeps working unchanged: its tensors become views of its
row (``ReservoirBuffer.adopt``), so the sequential code paths (A-GEM's task-end fill, FedGP's
reference draws, checkpoints, which copy views) read and write the same storage.

What stays per client is what must: the random draws. Client k's reservoir draws
u ~ U[0, 1)^b and its sample permutations come from its own buffer generator, in the order
the sequential executor draws them, so the batched insert is *exactly* C sequential
``ReservoirBuffer.add`` calls (algorithm R, a later duplicate slot winning; tested against
them on the same draws).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from cfl_bench.core.buffer import ReservoirBuffer
from cfl_bench.engine.host_values import device_tensor


class ReservoirStack:
    """K clients' reservoirs (same capacity, shapes and device) in one storage."""

    def __init__(self, buffers: Sequence[ReservoirBuffer]) -> None:
        first = buffers[0]
        self.capacity, self.device = first.capacity, first.device
        count = len(buffers)
        self.x = first.x.new_zeros((count, *first.x.shape))
        self.y = first.y.new_zeros((count, *first.y.shape))
        self.logits = first.logits.new_zeros((count, *first.logits.shape))
        self.task = first.task.new_zeros((count, *first.task.shape))
        for k, buffer in enumerate(buffers):
            if buffer.capacity != self.capacity or buffer.x.shape != first.x.shape:
                raise ValueError("stacked buffers must share capacity and input shape")
            buffer.adopt(self.x[k], self.y[k], self.logits[k], self.task[k])
            buffer.stack, buffer.row = self, k

    @property
    def rows(self) -> int:
        """Rows per client in the storage (capacity + the trash row)."""
        return self.capacity + 1

    def flat(self, name: str) -> torch.Tensor:
        """Field ``name`` with the client and row axes merged: (K·(M+1), …)."""
        field = getattr(self, name)
        return field.view(-1, *field.shape[2:])

    def slots(self, buffers: Sequence[ReservoirBuffer], counts: Sequence[int]) -> torch.Tensor:
        """Flat destination index of each of the next ``counts[i]`` examples offered to
        ``buffers[i]``, as (C, b) with b = max(counts); padded columns (and the examples
        the reservoir rejects or a later duplicate overwrites) point at the client's trash
        row. Draws each client's u from its generator and advances its counter, exactly as
        ``ReservoirBuffer.slots_for``."""
        width, capacity = max(counts), self.capacity
        u = torch.zeros(len(buffers), width, dtype=torch.float64, device=self.device)
        for i, (buffer, b) in enumerate(zip(buffers, counts, strict=True)):
            if b:
                u[i, :b] = torch.rand(
                    b, device=self.device, dtype=torch.float64, generator=buffer.generator
                )
        seen = device_tensor([b.num_seen for b in buffers], self.device, torch.float64)
        n = seen[:, None] + torch.arange(width, device=self.device, dtype=torch.float64)
        j = torch.floor(u * (n + 1)).to(torch.long)
        slots = torch.where(n < capacity, n.to(torch.long), j)
        real = (
            torch.arange(width, device=self.device)[None, :]
            < device_tensor(counts, self.device)[:, None]
        )
        slots = torch.where(real & (slots < capacity), slots, capacity)
        later = torch.ones(width, width, dtype=torch.bool, device=self.device).triu(1)
        overwritten = ((slots[:, :, None] == slots[:, None, :]) & later).any(dim=2)
        slots = torch.where(overwritten, capacity, slots)
        for buffer, b in zip(buffers, counts, strict=True):
            buffer.num_seen += b
        rows = device_tensor([b.row for b in buffers], self.device)
        return rows[:, None] * self.rows + slots

    def add(
        self,
        buffers: Sequence[ReservoirBuffer],
        counts: Sequence[int],
        x: torch.Tensor,
        y: torch.Tensor,
        logits: torch.Tensor,
        tasks: Sequence[int],
    ) -> None:
        """Offer client i's first ``counts[i]`` rows of x (C, b, …), y, logits to
        ``buffers[i]`` (stored under task ``tasks[i]``): C reservoir inserts in one."""
        index = self.slots(buffers, counts)
        width = index.shape[1]
        flat_index = index.reshape(-1)
        task = device_tensor(tasks, self.device)[:, None].expand(-1, width)
        stored = (x[:, :width], y[:, :width], logits[:, :width].to(self.logits.dtype), task)
        for name, values in zip(("x", "y", "logits", "task"), stored, strict=True):
            self.flat(name).index_copy_(0, flat_index, values.reshape(-1, *values.shape[2:]))

    def draw_index(
        self, buffers: Sequence[ReservoirBuffer | None], draws: int, size: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``draws`` independent samples of min(size, filled) distinct rows per listed
        client (None or an empty buffer: no draw), each ``ReservoirBuffer.sample``'s
        permutation from the client's generator: flat indices (C, draws, size) and the row
        mask (C, draws, size). Per client only the permutation is drawn; padding, offsets
        and the mask are a few ops for all clients."""
        from torch.nn.utils.rnn import pad_sequence

        empty = torch.zeros(0, dtype=torch.long, device=self.device)
        picks, lengths, bases = [], [], []
        for buffer in buffers:
            filled = 0 if buffer is None else buffer.filled
            m = min(size, filled)
            for _ in range(draws):
                if buffer is None or not filled:
                    picks.append(empty)
                    continue
                perm = torch.randperm(filled, device=self.device, generator=buffer.generator)
                picks.append(perm[:m])
            lengths += [m] * draws
            bases += [0 if buffer is None else buffer.row * self.rows] * draws
        picks.append(torch.zeros(size, dtype=torch.long, device=self.device))  # width = size
        padded = pad_sequence(picks, batch_first=True)[:-1]
        index = padded + device_tensor(bases, self.device)[:, None]
        columns = torch.arange(size, device=self.device)[None, :]
        mask = columns < device_tensor(lengths, self.device)[:, None]
        shape = (len(buffers), draws, size)
        return index.view(shape), mask.to(self.x.dtype).view(shape)

    def gather(self, name: str, index: torch.Tensor) -> torch.Tensor:
        """Field ``name``'s rows at flat ``index`` (any shape): index.shape + row shape."""
        return self.flat(name)[index]
