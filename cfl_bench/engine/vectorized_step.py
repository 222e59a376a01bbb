"""The vectorized executor's backend of the step driver (``engine.step_driver``): one
lock-step of a chunk of C clients with ``torch.func``.

The driver runs the step order; here is what a chunk adds to it (``engine.vectorized``
explains the executor): the clients' batches padded with an example mask, their replay
draws and dropout masks drawn client by client, the loss and gradient of every client in
one vmapped call (``vectorized_grad.ClientGradients``: the learner's declared plan and the
components' loss terms inside it; zero grad and backward are part of that functional
call), fp16 unscaling per row, the chunk's ``StepView`` (``lock_step.LockStep``), the
batched optimizer update of the rows that step, and the batched buffer insertion.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from cfl_bench.core.context import ClientState
from cfl_bench.engine.amp import LossScaler
from cfl_bench.engine.client_update import Augment, StepSchedule
from cfl_bench.engine.host_values import device_tensor
from cfl_bench.engine.lock_step import LockStep
from cfl_bench.engine.optim import FlatAdam, FlatSGD, adam_update, sgd_update, with_weight_decay
from cfl_bench.engine.vectorized_dropout import ChunkDropout
from cfl_bench.engine.vectorized_grad import ChunkTerm, ClientGradients
from cfl_bench.engine.vectorized_replay import draw_replay, observe_all
from cfl_bench.strategies.base import ClientInputs, Learner
from cfl_bench.strategies.replay import ReplayPlan, ReplayTerm

# The one buffer draw ``LockStep.buffer_gradient`` takes per stepping client (its term: the
# objective's loss on the stored labels).
BUFFER_DRAW = ReplayPlan(1, (ReplayTerm(0, "ce", 1.0),))
# One lock-step's batches: each client's (inputs, labels, inputs before augmentation), None
# for a client that takes no step.
Drawn = list[tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None]


class BatchedOptimizer:
    """The clients' optimizer (``FlatSGD`` / ``FlatAdam``'s own functional update,
    ``optim.sgd_update`` / ``optim.adam_update``) on every row of θ ∈ R^{C×P} at once;
    rows whose client is not ``active`` keep their parameters and state exactly.

    A client takes real steps on lock-steps 0 … S_k − 1 and none after, so at lock-step s
    every active client is at its own step t = s + 1: Adam's bias corrections are the same
    Python floats ``FlatAdam`` computes.
    """

    def __init__(self, template: FlatSGD | FlatAdam, lr: float, params: torch.Tensor) -> None:
        self.lr, self.weight_decay = lr, template.weight_decay
        self.momentum = template.momentum if isinstance(template, FlatSGD) else 0.0
        self.velocity: torch.Tensor | None = None  # SGD momentum, made at the first step
        self.moments: tuple[torch.Tensor, torch.Tensor] | None = None
        if isinstance(template, FlatAdam):
            self.hyper = (lr, *template.betas, template.eps)
            self.moments = (torch.zeros_like(params), torch.zeros_like(params))

    def step(
        self, params: torch.Tensor, grads: torch.Tensor, active: torch.Tensor | None, t: int
    ) -> torch.Tensor:
        """The parameters after step ``t`` (1-based) of the ``active`` ((C,) bool) rows;
        ``active`` None: every row steps (no masking pass over C×P)."""
        keep = None if active is None else active[:, None]
        g = with_weight_decay(grads, params, self.weight_decay)
        if self.moments is not None:
            params, self.moments = adam_update(params, g, self.moments, t, self.hyper, keep)
            return params
        params, self.velocity = sgd_update(
            params, g, self.velocity, self.lr, float(self.momentum), keep
        )
        return params


def pad_lock_step(
    drawn: Drawn, batch_size: int, augmented: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every client's batch (``drawn``; None: no step) padded to ``batch_size``, the example
    mask, which clients take a real step, and the padded inputs before augmentation (what
    the buffer stores; the same tensor as the inputs when nothing ``augmented`` them)."""
    real = [d for d in drawn if d is not None]
    x0, y0, _ = real[0]
    count = len(drawn)
    x = x0.new_zeros((count, batch_size, *x0.shape[1:]))
    y = y0.new_zeros((count, batch_size, *y0.shape[1:]))
    raw = x0.new_zeros((count, batch_size, *x0.shape[1:])) if augmented else x
    mask = torch.zeros(count, batch_size, dtype=x0.dtype, device=x0.device)
    for i, d in enumerate(drawn):
        if d is not None:
            b = d[1].shape[0]
            x[i, :b], y[i, :b], mask[i, :b] = d[0], d[1], 1
            if augmented:
                raw[i, :b] = d[2]
    active = device_tensor([d is not None for d in drawn], x0.device)
    return x, y, mask, active, raw


@dataclass(frozen=True)
class ChunkRound:
    """A chunk's side of the round: each component's inputs for the whole chunk
    (``lock_step.chunk_inputs``; absent: nothing on its steps this round) and the loss
    terms on the batch's outputs this round (every loss term with inputs; one without an
    autograd term returns None from ``loss_term``, as on one client)."""

    inputs: dict[str, ClientInputs]
    outputs: list[ChunkTerm]


@dataclass(frozen=True)
class ChunkTraining:
    """What a chunk's lock-steps share: the step schedule, the stream's train augmentation,
    the learner, the vmapped gradients, the learner's plan, the chunk's dropout draws, fp16
    scales, inputs and optimizer."""

    steps: StepSchedule
    augment: Augment | None
    learner: Learner
    grads: ClientGradients
    plan: ReplayPlan
    observes: bool
    dropout: ChunkDropout
    scaler: LossScaler | None
    chunk: ChunkRound
    optimizer: BatchedOptimizer
    clients: list[ClientState]


@dataclass
class ChunkBackend:
    """The ``engine.step_driver.StepBackend`` of lock-step ``s`` (0-based) of a chunk:
    ``params`` (C, P) before the step, ``drawn`` its batches, ``offered`` which clients'
    buffer policy offers the batch; ``stepped`` holds the rows after the step."""

    training: ChunkTraining
    params: torch.Tensor
    drawn: Drawn
    offered: list[bool]
    s: int
    stepped: torch.Tensor | None = None
    grads: torch.Tensor | None = None
    outputs: torch.Tensor | None = None
    batch: tuple[torch.Tensor, ...] = field(default=())  # (y, mask, active, raw)
    stepping: list[ClientState | None] = field(init=False)

    def __post_init__(self) -> None:
        pairs = zip(self.training.clients, self.drawn, strict=True)
        self.stepping = [c if d is not None else None for c, d in pairs]

    @property
    def every(self) -> bool:
        """Whether every client of the chunk steps (known on the host: no device sync)."""
        return all(d is not None for d in self.drawn)

    def zero_grad(self) -> None:
        """Nothing to clear: each lock-step's gradient is a new tensor of ``loss``'s
        functional call."""

    def loss(self) -> torch.Tensor:
        """Every client's loss (C,) and, in the same vmapped call, its gradient: the batch
        padded, the replay draws and dropout masks drawn client by client (the sequential
        order of each client's generators), the forwards autocast inside ``vmap``."""
        t = self.training
        x, y, mask, active, raw = pad_lock_step(
            self.drawn, t.steps.batch_size, t.augment is not None
        )
        replay_augment = t.augment if t.steps.replay_augment else None
        size = t.steps.buffer_batch_size
        replay = draw_replay(self.stepping, t.plan, size, replay_augment)
        scale = None if t.scaler is None else t.scaler.scale
        counts = [None if d is None else d[1].shape[0] for d in self.drawn]
        masks = t.dropout.step_masks(x, counts, replay)
        self.grads, losses, self.outputs = t.grads.gradients(
            self.params, x, y, mask, replay, t.chunk.outputs, amp=True, scale=scale, masks=masks
        )
        self.batch = (y, mask, active, raw)
        return losses

    def backward(self, loss: torch.Tensor) -> torch.Tensor:
        """The rows that may step: the active ones, and under fp16 those whose unscaled
        gradient is finite (the gradient rows unscaled here, the scales updated)."""
        scaler, active = self.training.scaler, self.batch[2]
        if scaler is None:
            return active
        assert self.grads is not None
        self.grads, finite = scaler.unscale(self.grads)
        scaler.update(finite, active)
        return active & finite

    def gradient(self) -> torch.Tensor:
        assert self.grads is not None, "loss() takes the gradient"
        return self.grads

    def inputs(self, name: str) -> ClientInputs | None:
        return self.training.chunk.inputs.get(name)

    def view(self) -> LockStep:
        """The chunk's ``StepView``: gradients at every row with the stepping clients'
        dropout masks, and their buffer draws' gradients (A-GEM's g_b)."""
        t = self.training
        gradients = t.dropout.with_masks(t.grads.loss_gradients, self.stepping)
        size = t.steps.buffer_batch_size
        return LockStep(self.params, self.stepping, size, gradients, self.buffer_gradients)

    def buffer_gradients(self, stepping: list[ClientState | None]) -> torch.Tensor | None:
        """``LockStep.buffer_gradient``: each stepping client's buffer draw (its buffer's
        generator, then the replay augmentation from its generator, as sequentially) and the
        gradient of the objective's mean loss on it at the client's row (one vmapped
        backward, padded rows masked). A client with an empty buffer (or no step) gets a
        zero row; None when nobody draws anything."""
        t = self.training
        steps = t.steps
        augment = t.augment if steps.replay_augment else None
        draw = draw_replay(stepping, BUFFER_DRAW, steps.buffer_batch_size, augment)
        if draw is None:
            return None
        masks = t.dropout.forward_masks(draw.x[:, 0], draw.rows)
        ref, _, _ = t.grads.gradients(
            self.params, draw.x[:, 0], draw.y[:, 0], draw.mask[:, 0], masks=masks
        )
        return ref

    def optimizer_step(self, grads: torch.Tensor, finite: torch.Tensor | bool) -> None:
        """The batched update of the rows ``finite`` allows (every row, unmasked, when all
        step and nothing is scaled)."""
        assert isinstance(finite, torch.Tensor)
        keep_all = self.every and self.training.scaler is None
        rows = None if keep_all else finite
        self.stepped = self.training.optimizer.step(self.params, grads, rows, self.s + 1)

    def observe(self) -> None:
        """The offering clients' batches into their buffers, one batched insert, with the
        outputs of the vmapped forward before the step."""
        t = self.training
        if not t.observes:
            return
        y, _, _, raw = self.batch
        assert self.outputs is not None
        pairs = zip(self.drawn, self.offered, strict=True)
        counts = [0 if d is None or not offer else d[1].shape[0] for d, offer in pairs]
        observe_all(t.learner, t.clients, counts, raw, y, self.outputs)

    def reported(self, loss: torch.Tensor) -> torch.Tensor:
        """Each client's step loss, 0 for the clients that took no step."""
        return loss if self.every else torch.where(self.batch[2], loss, 0.0)
