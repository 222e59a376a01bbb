"""Client-side FL components under the vectorized executor: their step functions run on the
whole chunk; loss terms that need frozen models keep a batched form here.

The sequential client update of a component runs (``LocalTrainer``; ``strategies.base``)

    start     round_inputs(broadcast) | client_inputs(client, local), on_client_start
    per step  penalty(θ, g, inputs) → (refine_grad) → transform(g, inputs, view)
    finish    after_local(client, upload, local)       once per client, model at θ_k

The vectorized executor keeps ``start`` and ``finish`` as they are: it calls
``LocalTrainer.start`` for each client of a chunk before the first lock-step (with the
round's inputs computed once for the chunk) and ``LocalTrainer.finish`` for each after the
last (with that client's row loaded into the working model, ``local.steps`` its step
count). They are cheap next to the steps, and per client by nature (SCAFFOLD's c_k update,
FedCurv's Fisher on the client's own examples from its own generator, FedDyn's h_k update,
FedNova's τ_k).

The step functions themselves are the components' own: ``penalty`` and ``transform`` take
θ and ∇ with the parameter axis last, so they run once on the chunk's (C, P) rows. The
chunk's inputs (``chunk_inputs``) are the round's, shared ((P,) θ_g, g_ref: one row, not C
copies), joined with every client's ``client_inputs`` stacked along the client axis (h_k,
c − c_k, U'_k: one C×P tensor each). ``LockStep`` is the chunk's ``StepView``: the stepping
clients' own draws (a client that takes no step draws nothing) and gradients of a loss at
every client's row in one vmapped backward (FedProj's memory gradient).

Two loss terms still have a batched form of their own (``BATCHED_LOSS_TERMS``), because
their sequential code forwards frozen model copies inside the step:

- FedNTD:   loss += β·τ²·KL(softmax(z̃_g/τ) ‖ softmax(z̃/τ)) on the not-true classes, a
  term of the vmapped loss (masked mean over the client's real rows = batchmean), with
  the teacher logits z_g (θ_g, eval mode, no gradient) of every client's batch computed
  once per lock-step outside the vmap
- MOON:     loss += μ·ℓ_con(z, z_glob, z_prev) (``moon.model_contrastive_loss``, masked
  mean), z from the vmapped forward (``Representation``), z_glob and z_prev from batched
  forwards without gradient at θ_g and at the clients' stacked previous models; weight 0
  for a client without a previous model

FedGP's reference gradient (``client_request`` → the executor's ``answer``) is batched by
``VectorizedExecutor.answer`` (the request's ``gradient_data``).
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import torch
from torch import nn

from cfl_bench.host_values import device_tensor
from strategies.base import ClientInputs, Component
from strategies.fedntd import FedNTD, drop_true_class
from strategies.moon import MOON

if TYPE_CHECKING:
    from cfl_bench.engine.context import ClientState, LocalRound


class BatchedHooks:
    """One loss-term component's batched form over a chunk's clients: ``capture`` runs
    right after each client's start (in chunk order) and keeps that client's row."""

    def __init__(self, component: Component) -> None:
        self.component = component

    def capture(self, client: ClientState, local: LocalRound) -> None:
        """Keep what the component set up for ``client`` (its row of per-client state)."""


# Representations (C, batch, F) of every client's batch at its row of (C, P) parameters.
Represent = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
# Every client's flat gradient (C, P) of loss(outputs, *per-client inputs) at its row of
# (C, P) parameters, the model forwarding the first input: (loss, params, x, *inputs).
LossGradients = Callable[..., torch.Tensor]


@dataclass(frozen=True)
class LockStep:
    """The chunk's ``strategies.base.StepView`` at one lock-step: the parameters (C, P),
    the chunk's clients (None: no step this lock-step, so no draws from its generators),
    the step's buffer batch size and the executor's batched gradient of a loss."""

    params: torch.Tensor
    stepping: list[ClientState | None]
    buffer_batch_size: int
    gradients: LossGradients

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


def chunk_inputs(shared: ClientInputs, rows: Sequence[ClientInputs]) -> ClientInputs:
    """One component's inputs for a chunk: the round's ``shared`` values as they are, and
    each key the clients' ``rows`` add (their ``client_inputs``) stacked along a leading
    client axis — kept as one value when every client holds the very same tensor (a
    one-client chunk; U of FedCurv before any client's own u_k is in it)."""
    merged = dict(shared)
    for key in rows[0].keys() - shared.keys():
        values = [row[key] for row in rows]
        first = values[0]
        if all(v is first for v in values):
            merged[key] = first
        else:
            merged[key] = torch.stack(values)
    return merged


class Representation(nn.Module):
    """``module`` returning (representation, outputs): ``forward(x) ==
    classify(representation(x))``, the operations of the sequential learner's forward when
    a component keeps the representation. Its parameters are ``inner.<name>``."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.inner = module

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        z = self.inner.representation(x)  # type: ignore[operator]
        return z, self.inner.classify(z)  # type: ignore[operator]


class BatchedLossTerm(BatchedHooks, abc.ABC):
    """A component's loss term on the batch's outputs (``loss_term``), in two halves:
    ``batch_inputs`` (C, batch, …) computed outside the vmapped loss (no gradient: FedNTD's
    teacher logits), then ``batch_term`` inside it, per client, on its outputs, labels and
    mask. ``has_batch_term`` says whether the term is non-zero this round (it is skipped
    otherwise, as the sequential ``loss_term`` returns None)."""

    @property
    @abc.abstractmethod
    def has_batch_term(self) -> bool: ...

    @abc.abstractmethod
    def batch_inputs(self, x: torch.Tensor, represent: Represent) -> object:
        """What ``batch_term`` needs beyond the outputs, for every client's batch ``x``
        (tensors with a leading client axis); ``represent`` gives representations at
        stacked parameter rows."""

    @abc.abstractmethod
    def batch_term(
        self,
        outputs: torch.Tensor,
        z: torch.Tensor | None,
        y: torch.Tensor,
        mask: torch.Tensor,
        inputs: object,
    ) -> torch.Tensor:
        """The term for one client (inside ``vmap``; ``z`` its representation when the
        executor keeps it), a mean over its real rows."""


class NTDHooks(BatchedLossTerm):
    """FedNTD: β·τ²·KL(softmax(z̃_g/τ) ‖ softmax(z̃/τ)) on the not-true classes, the mean
    over the client's real rows (``fedntd.not_true_distillation``'s batchmean), with z_g
    the teacher's (θ_g, eval mode, no gradient) logits on the same batch."""

    @property
    def has_batch_term(self) -> bool:
        return cast(FedNTD, self.component).beta != 0

    def batch_inputs(self, x: torch.Tensor, represent: Represent) -> torch.Tensor:
        teacher = cast(FedNTD, self.component).teacher
        assert teacher is not None, "on_client_start loads the teacher"
        with torch.no_grad():
            return teacher.module(x.flatten(0, 1)).unflatten(0, x.shape[:2])

    def batch_term(
        self,
        outputs: torch.Tensor,
        z: torch.Tensor | None,
        y: torch.Tensor,
        mask: torch.Tensor,
        inputs: object,
    ) -> torch.Tensor:
        from torch.nn import functional as F

        assert isinstance(inputs, torch.Tensor)
        ntd = cast(FedNTD, self.component)
        tau = ntd.tau
        student = F.log_softmax(drop_true_class(outputs, y) / tau, dim=1)
        teacher = F.log_softmax(drop_true_class(inputs, y) / tau, dim=1)
        per_row = (teacher.exp() * (teacher - student)).sum(dim=1)
        return ntd.beta * tau * tau * (per_row * mask).sum() / mask.sum().clamp(min=1)


class MoonHooks(BatchedLossTerm):
    """MOON: μ·mean over the client's real rows of −log softmax([sim(z, z_glob),
    sim(z, z_prev)]/τ)[0] (``moon.model_contrastive_loss``), z the client's representation
    from the vmapped forward, z_glob at θ_g and z_prev at the client's previous local model
    (its row of stacked previous parameters), both without gradient. A client without a
    previous model (its first round) gets no term (weight 0), as sequentially."""

    def __init__(self, component: Component) -> None:
        super().__init__(component)
        self.rows: list[torch.Tensor] = []
        self.flags: list[bool] = []
        self.anchor: torch.Tensor | None = None
        self.previous: torch.Tensor | None = None

    def capture(self, client: ClientState, local: LocalRound) -> None:
        moon = cast(MOON, self.component)
        self.anchor = local.broadcast.params
        self.flags.append(moon.active)
        state = client.state_for(moon.name)
        self.rows.append(cast(torch.Tensor, state["params"]) if moon.active else self.anchor)

    @property
    def has_batch_term(self) -> bool:
        return cast(MOON, self.component).mu > 0 and any(self.flags)

    def batch_inputs(
        self, x: torch.Tensor, represent: Represent
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        assert self.anchor is not None
        if self.previous is None:  # a copy: after_local overwrites the stored models
            self.previous = torch.stack(self.rows)
        count = x.shape[0]
        z_glob = represent(self.anchor.expand(count, -1), x)
        z_prev = represent(self.previous, x)
        weight = device_tensor(self.flags, z_glob.device, z_glob.dtype)
        return z_glob, z_prev, weight

    def batch_term(
        self,
        outputs: torch.Tensor,
        z: torch.Tensor | None,
        y: torch.Tensor,
        mask: torch.Tensor,
        inputs: object,
    ) -> torch.Tensor:
        from torch.nn import functional as F

        assert z is not None, "the executor keeps the representation for moon"
        z_glob, z_prev, weight = cast(tuple[torch.Tensor, torch.Tensor, torch.Tensor], inputs)
        moon = cast(MOON, self.component)
        z = z.flatten(1)
        positive = F.cosine_similarity(z, z_glob.flatten(1), dim=1) / moon.tau
        negative = F.cosine_similarity(z, z_prev.flatten(1), dim=1) / moon.tau
        per_row = torch.logsumexp(torch.stack((positive, negative), dim=1), dim=1) - positive
        mean = (per_row * mask).sum() / mask.sum().clamp(min=1)
        return moon.mu * weight * mean


# The loss terms the vectorized executor batches by a form of their own (exact classes: a
# subclass may override a hook); every other component runs its own step functions.
BATCHED_LOSS_TERMS: dict[type[Component], type[BatchedLossTerm]] = {
    FedNTD: NTDHooks,
    MOON: MoonHooks,
}
