"""One lock-step of a chunk under the vectorized executor: the components' own step
functions run on the whole chunk, through the chunk's ``StepView`` (``LockStep``) and
inputs (``chunk_inputs``). No component is implemented here a second time.

The sequential client update of a component runs (``LocalTrainer``; ``strategies.base``)

    start     round_inputs(broadcast) | client_inputs(client, local)
    per step  loss_term(outputs, z, y, mask, values) in the loss → penalty(θ, g, inputs)
              → learner.refine(g, view) → transform(g, inputs, view)
              (the order is ``engine.step_driver``'s, the same for a chunk)
    finish    after_local(client, upload, local)       once per client, model at θ_k

The vectorized executor keeps ``start`` and ``finish`` as they are: it calls
``LocalTrainer.start`` for each client of a chunk before the first lock-step (with the
round's inputs computed once for the chunk) and ``LocalTrainer.finish`` for each after the
last (with that client's row loaded into the working model, ``local.steps`` its step
count). They are cheap next to the steps, and per client by nature (SCAFFOLD's c_k update,
FedCurv's Fisher on the client's own examples from its own generator, FedDyn's h_k update,
FedNova's τ_k, MOON's previous model).

The step functions themselves are the components' own: ``penalty`` and ``transform`` take
θ and ∇ with the parameter axis last, so they run once on the chunk's (C, P) rows;
``loss_term`` is one client's term, which the vmapped loss calls on each client's slice
(``vectorized_grad``), its frozen forwards run for the whole chunk first. The chunk's
inputs (``chunk_inputs``) are the round's, shared ((P,) θ_g, g_ref: one row, not C copies),
joined with every client's ``client_inputs`` stacked along the client axis (h_k, c − c_k,
U'_k, MOON's previous model: one C×P tensor each). ``LockStep`` is the chunk's
``StepView``: the stepping clients' own draws (a client that takes no step draws nothing)
and gradients of a loss at every client's row in one vmapped backward (FedProj's memory
gradient).

FedGP's reference gradient (``client_request`` → the executor's ``answer``) is batched by
``VectorizedExecutor.answer`` (the request's ``gradient_data``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from cfl_bench.strategies.base import ClientInputs

if TYPE_CHECKING:
    from cfl_bench.core.context import ClientState

# Every client's flat gradient (C, P) of loss(outputs, *per-client inputs) at its row of
# (C, P) parameters, the model forwarding the first input: (loss, params, x, *inputs).
LossGradients = Callable[..., torch.Tensor]


@dataclass(frozen=True)
class LockStep:
    """The chunk's ``strategies.base.StepView`` at one lock-step: the parameters (C, P),
    the chunk's clients (None: no step this lock-step, so no draws from its generators),
    the step's buffer batch size, the executor's batched gradient of a loss and its
    gradients on the stepping clients' buffer draws."""

    params: torch.Tensor
    stepping: list[ClientState | None]
    buffer_batch_size: int
    gradients: LossGradients
    buffer_gradients: Callable[[list[ClientState | None]], torch.Tensor | None]

    def per_client(
        self, draw: Callable[[ClientState], torch.Tensor], idle: torch.Tensor
    ) -> torch.Tensor:
        return torch.stack([idle if c is None else draw(c) for c in self.stepping])

    def shared(self, value: torch.Tensor) -> torch.Tensor:
        return value.expand(len(self.stepping), *value.shape)

    def gradient(
        self, loss: Callable[..., torch.Tensor], x: torch.Tensor, *inputs: torch.Tensor
    ) -> torch.Tensor:
        return self.gradients(loss, self.params, x, *inputs)

    def buffer_gradient(self) -> torch.Tensor | None:
        return self.buffer_gradients(self.stepping)


def chunk_inputs(shared: ClientInputs, rows: Sequence[ClientInputs]) -> ClientInputs:
    """One component's inputs for a chunk: the round's ``shared`` values as they are (one
    copy for every client), and each key the clients' ``rows`` add (their ``client_inputs``)
    stacked along a leading client axis."""
    merged = dict(shared)
    for key in rows[0].keys() - shared.keys():
        merged[key] = torch.stack([row[key] for row in rows])
    return merged
