"""How a client walks its data in a round: one implementation for every executor.

A client's local steps draw, from its own generator and in this order: ``randperm`` of its
examples at the start of each epoch, then for each batch its rows' inputs and (when the
stream augments) the augmentation. The sequential executor draws a client's batches one
after another; the vectorized one draws every client's next batch at each lock-step, client
by client. Both go through ``ClientBatches``, so the draws, and whatever else the step takes
from the same generator in between (replay augmentation), stay in one order.

The buffer's offer policy (``--buffer-offer``) is ``offers``: ``every_step``, or
``first_pass``: the first epoch of the client's first round on a task.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from cfl_bench.core.context import ClientState


def start_visit(client: ClientState) -> bool:
    """Whether this round is the client's first on its task (and mark the task started)."""
    first = client.task not in client.tasks_started
    client.tasks_started.add(client.task)
    return first


def offers(buffer_offer: str, first_visit: bool, epoch: int) -> bool:
    """Whether a batch of ``epoch`` is offered to the buffer under ``buffer_offer``."""
    return buffer_offer == "every_step" or (first_visit and epoch == 0)


class ClientBatches:
    """One client's batches in the sequential executor's order, drawn one at a time.

    ``randperm`` at the start of each epoch, then for each batch its rows' inputs and (when
    the stream augments) the augmentation, all from the client's own generator. ``epoch``
    is the epoch of the batch drawn last (the buffer's first-pass policy reads it).
    """

    def __init__(
        self,
        client: ClientState,
        epochs: int,
        batch_size: int,
        augment: Callable[[torch.Tensor, torch.Generator], torch.Tensor] | None,
        device: torch.device,
        epoch_steps: int = 0,
    ) -> None:
        """``epoch_steps``: at most this many batches an epoch (0: every batch; the
        learner's ``epoch_steps``, TARGET's zip with its synthetic loader)."""
        self.client, self.batch_size, self.augment, self.device = (
            client,
            batch_size,
            augment,
            device,
        )
        n = client.num_samples
        has_data = n > 0 and client.train_x is not None and client.train_y is not None
        self.n = n if has_data else 0
        per_epoch = math.ceil(self.n / self.batch_size)
        # The rows an epoch covers before it ends (all n unless capped).
        self.end = self.n if epoch_steps <= 0 else min(self.n, epoch_steps * batch_size)
        self.total = epochs * (per_epoch if epoch_steps <= 0 else min(per_epoch, epoch_steps))
        self.order: torch.Tensor | None = None
        self.start = self.n  # the first draw starts an epoch
        self.epoch = -1

    def next(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The client's next batch: inputs as the model sees them, labels, and the inputs
        before augmentation (what a replay buffer stores)."""
        client, gen = self.client, self.client.generator
        if self.start >= self.end:
            self.order = torch.randperm(self.n, device=self.device, generator=gen)
            self.start = 0
            self.epoch += 1
        assert self.order is not None and client.train_y is not None
        rows = self.order[self.start : self.start + self.batch_size]
        self.start += self.batch_size
        raw = client.inputs(rows)
        x = raw if self.augment is None else self.augment(raw, gen)
        return x, client.train_y[rows], raw
