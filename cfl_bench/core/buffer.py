"""Per-client reservoir replay buffer (Vitter's algorithm R) in preallocated tensors.

Why tensors and a host-side counter: the number of examples offered so far is known on the
host without reading the device (every offered example increments it), so a whole batch is
inserted with a handful of tensor ops and no host-device synchronisation. The batch insert
is *exactly* the sequential algorithm R: example k of the batch sees n = n0 + k, draws
j ~ U{0..n}, and a later example of the same batch that picks the same slot wins.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class BufferDraw:
    """m examples drawn from the buffer: inputs, labels, stored outputs, task ids."""

    x: torch.Tensor
    y: torch.Tensor
    logits: torch.Tensor
    task: torch.Tensor


@dataclass(frozen=True)
class StoredInputs:
    """How a buffer keeps its inputs when the stream's own stored form is more compact than
    the model's floats (CARLA frames: uint8 pixels, 4× smaller than float32).

    ``encode`` must invert ``decode`` exactly on every model input the stream produces, so a
    drawn input is bit for bit the one that was offered: ``decode(encode(x)) == x``. Why the
    buffer and not the learner: the learners offer model inputs (after the stream's
    ``as_model_input``), and every draw goes through :meth:`ReservoirBuffer.sample` /
    :meth:`ReservoirBuffer.all`, so one place converts both ways.
    """

    dtype: torch.dtype
    encode: Callable[[torch.Tensor], torch.Tensor]
    decode: Callable[[torch.Tensor], torch.Tensor]


class ReservoirBuffer:
    """Capacity-M reservoir storing (x, y, logits at storage time, task id)."""

    def __init__(
        self,
        capacity: int,
        input_shape: tuple[int, ...],
        num_outputs: int | tuple[int, ...],
        *,
        device: torch.device,
        generator: torch.Generator,
        target_shape: tuple[int, ...] = (),
        target_dtype: torch.dtype = torch.long,
        stored_inputs: StoredInputs | None = None,
    ) -> None:
        """``num_outputs`` is the width of a row of stored outputs (class logits) or the
        shape of one (a detector's dense maps); ``target_shape`` / ``target_dtype`` describe
        one example's target (a class id by default, padded boxes for detection);
        ``stored_inputs`` keeps inputs in a compact exact form (float32 model inputs when
        None)."""
        if capacity <= 0:
            raise ValueError("buffer capacity must be positive")
        self.capacity = capacity
        self.device = device
        self.generator = generator
        # One extra "trash" row receives the examples the reservoir rejects, so an insert
        # never needs a data-dependent branch.
        rows = capacity + 1
        self.stored_inputs = stored_inputs
        x_dtype = torch.float32 if stored_inputs is None else stored_inputs.dtype
        self.x = torch.zeros((rows, *input_shape), dtype=x_dtype, device=device)
        self.y = torch.zeros((rows, *target_shape), dtype=target_dtype, device=device)
        outputs = (num_outputs,) if isinstance(num_outputs, int) else tuple(num_outputs)
        self.logits = torch.zeros((rows, *outputs), device=device)
        self.task = torch.zeros(rows, dtype=torch.long, device=device)
        self.num_seen = 0
        # Set when the tensors are a row of a ``ReservoirStack`` (the vectorized executor's
        # stacked storage): the stack and this buffer's row in it.
        self.stack: object | None = None
        self.row = 0

    def adopt(
        self, x: torch.Tensor, y: torch.Tensor, logits: torch.Tensor, task: torch.Tensor
    ) -> None:
        """Move the contents into the given tensors (views into a stacked storage, same
        shapes) and keep them there: later inserts and draws read and write the views."""
        for name, target in (("x", x), ("y", y), ("logits", logits), ("task", task)):
            target.copy_(getattr(self, name))
            setattr(self, name, target)

    @property
    def filled(self) -> int:
        return min(self.num_seen, self.capacity)

    def __len__(self) -> int:
        return self.filled

    @property
    def nbytes(self) -> int:
        """Memory of the stored examples (capacity rows, without the trash row)."""
        per_row = sum(
            t[0].numel() * t.element_size() for t in (self.x, self.y, self.logits, self.task)
        )
        return per_row * self.capacity

    def slots_for(self, batch_size: int) -> torch.Tensor:
        """Destination slot of each of the next ``batch_size`` offered examples.

        Slot ``capacity`` (the trash row) means "not stored". Advances the counter.
        """
        n = self.num_seen + torch.arange(batch_size, device=self.device, dtype=torch.float64)
        u = torch.rand(
            batch_size, device=self.device, dtype=torch.float64, generator=self.generator
        )
        j = torch.floor(u * (n + 1)).to(torch.long)
        slots = torch.where(n < self.capacity, n.to(torch.long), j)
        slots = torch.where(slots < self.capacity, slots, torch.full_like(slots, self.capacity))
        # Algorithm R is sequential: when two examples of the batch hit the same slot the later
        # one wins, so earlier duplicates are sent to the trash row.
        same = slots.unsqueeze(0) == slots.unsqueeze(1)
        later = torch.ones(batch_size, batch_size, dtype=torch.bool, device=self.device).triu(1)
        overwritten = (same & later).any(dim=1)
        slots = torch.where(overwritten, torch.full_like(slots, self.capacity), slots)
        self.num_seen += batch_size
        return slots

    def add(self, x: torch.Tensor, y: torch.Tensor, logits: torch.Tensor, task: int) -> None:
        """Offer a batch to the reservoir (every example counts as offered)."""
        slots = self.slots_for(x.shape[0])
        self.x.index_copy_(0, slots, self._store(x.detach()))
        self.y.index_copy_(0, slots, y)
        self.logits.index_copy_(0, slots, logits.detach().to(self.logits.dtype))
        self.task.index_fill_(0, slots, task)

    def append(self, x: torch.Tensor, y: torch.Tensor, logits: torch.Tensor, task: int) -> None:
        """Write a batch into the next free slots (episodic memory, e.g. A-GEM task_end fill).

        Not part of the reservoir: the caller guarantees it fits. Counts the examples as seen
        so ``filled`` grows by the batch size.
        """
        start = self.filled
        if start + x.shape[0] > self.capacity:
            raise ValueError("append would overflow the buffer")
        end = start + x.shape[0]
        self.x[start:end] = self._store(x.detach())
        self.y[start:end] = y
        self.logits[start:end] = logits.detach().to(self.logits.dtype)
        self.task[start:end] = task
        self.num_seen = end

    def state_dict(self) -> dict[str, object]:
        """Contents, counter and generator (for checkpoints)."""
        return {
            "x": self.x,
            "y": self.y,
            "logits": self.logits,
            "task": self.task,
            "num_seen": self.num_seen,
            "generator": self.generator,
        }

    def load_state_dict(self, state: dict[str, object]) -> None:
        """Copy a saved state into the preallocated tensors (shapes must match)."""
        for name in ("x", "y", "logits", "task"):
            saved = state[name]
            assert isinstance(saved, torch.Tensor)
            target = getattr(self, name)
            if saved.shape != target.shape:
                raise ValueError(
                    f"buffer {name} has shape {tuple(saved.shape)}, expected {tuple(target.shape)}"
                )
            target.copy_(saved)
        num_seen = state["num_seen"]
        if not isinstance(num_seen, int):  # state_dict saves a Python int
            raise ValueError(f"buffer num_seen is {num_seen!r}, expected an int")
        self.num_seen = num_seen
        gen = state["generator"]
        assert isinstance(gen, torch.Generator)
        self.generator.set_state(gen.get_state())

    def sample(self, m: int) -> BufferDraw | None:
        """m distinct filled slots drawn uniformly (m = min(m, filled)); None when empty."""
        filled = self.filled
        if filled == 0:
            return None
        m = min(m, filled)
        idx = torch.randperm(filled, device=self.device, generator=self.generator)[:m]
        return BufferDraw(self._load(self.x[idx]), self.y[idx], self.logits[idx], self.task[idx])

    def all(self) -> BufferDraw | None:
        """The whole filled buffer, in slot order."""
        filled = self.filled
        if filled == 0:
            return None
        return BufferDraw(
            self._load(self.x[:filled]), self.y[:filled], self.logits[:filled], self.task[:filled]
        )

    def _store(self, x: torch.Tensor) -> torch.Tensor:
        """Model inputs in the buffer's storage form."""
        return x if self.stored_inputs is None else self.stored_inputs.encode(x)

    def _load(self, x: torch.Tensor) -> torch.Tensor:
        """Stored rows as the model inputs they were offered as."""
        return x if self.stored_inputs is None else self.stored_inputs.decode(x)
