"""Client-side FL components under the vectorized executor: per-step hooks batched over the
chunk's clients, per-round hooks run client by client.

The sequential client update of a component runs (``LocalTrainer``; ``strategies.base``)

    start     on_client_start(client, local)          once per client, model at θ_g
    per step  penalty → (refine_grad) → transform_grad  on the one working model
    finish    after_local(client, upload, local)       once per client, model at θ_k

The vectorized executor keeps ``start`` and ``finish`` as they are: it calls
``LocalTrainer.start`` for each client of a chunk before the first lock-step (the working
model then holds θ_g, as sequentially) and ``LocalTrainer.finish`` for each after the last
(with that client's row loaded into the working model, ``local.steps`` its step count).
They are cheap next to the steps, and per client by nature (SCAFFOLD's c_k update,
FedCurv's Fisher on the client's own examples from its own generator, FedDyn's h_k update,
FedNova's τ_k). Whatever a component keeps for the client training *now* (SCAFFOLD's
c − c_k, FedCurv's U − u_k) lives in one attribute that the next client's start
overwrites, so each ``BatchedHooks`` captures its rows right after that client's start.

The per-step hooks are batched over the client axis of θ ∈ R^{C×P} and ∇ ∈ R^{C×P}, in the
sequential order (output terms inside the loss, then penalties, both in
``Strategy.loss_terms`` order, then the transforms in ``compose.TRANSFORM_CHAIN`` order),
each the closed form of the component's own code:

- FedNTD:   loss += β·τ²·KL(softmax(z̃_g/τ) ‖ softmax(z̃/τ)) on the not-true classes, a
  term of the vmapped loss (masked mean over the client's real rows = batchmean), with
  the teacher logits z_g (θ_g, eval mode, no gradient) of every client's batch computed
  once per lock-step outside the vmap
- MOON:     loss += μ·ℓ_con(z, z_glob, z_prev) (``moon.model_contrastive_loss``, masked
  mean), z from the vmapped forward (``Representation``), z_glob and z_prev from batched
  forwards without gradient at θ_g and at the clients' stacked previous models; weight 0
  for a client without a previous model
- FedProx:  ∇ += μ(θ − θ_g);               loss += (μ/2)‖θ − θ_g‖²
- FedDyn:   ∇ += α(θ − θ_g) − h_k;         loss += (α/2)‖θ − θ_g‖² − ⟨h_k, θ⟩
- FedCurv:  ∇ += 2λ(θ⊙U'_k − V'_k);        loss += λ(⟨θ, θ⊙U'_k − V'_k⟩ − ⟨θ, V'_k⟩)
  with U'_k = U − u_k, V'_k = V − v_k when the client's own u_k is in the broadcast sums
- FedProj:  ∇ ← ∇ − coef_k·g_glob_k, g_glob_k = ∇ KL(σ(Z_ens/τ) ‖ σ(f(x_m; θ_k)/τ)) at the
  client's row (one more vmapped backward) on its memory batch, coef_k as FedGP's with ε
- SCAFFOLD: ∇ += c − c_k
- FedGP:    ∇ ← ∇ − coef_k·g_ref, coef_k = (∇_k·g_ref)/‖g_ref‖² where ∇_k·g_ref < 0, else 0
  (``projection.conflict_coefficients``: one matrix-vector product and a ``torch.where``,
  no host read of a tensor value)

θ_g is the same for every client of a round, so it is one broadcast row, not C copies.
Per-client vectors (h_k, c − c_k, U'_k and V'_k) are stacked (C, P) tensors: SCAFFOLD and
FedDyn and MOON add one C×P tensor to a chunk's memory, FedCurv two. Rows of clients whose steps
are done get any value: the batched optimizer keeps their parameters (``masked``).

FedGP's reference gradient (``client_request`` → the executor's ``answer``) is batched by
``VectorizedExecutor.answer`` (the request's ``gradient_data``).
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import torch
from torch import nn

from cfl_bench.host_values import device_tensor
from strategies.base import Component
from strategies.fedcurv import FedCurv
from strategies.feddyn import FedDyn
from strategies.fedgp import FedGP
from strategies.fednova import FedNova
from strategies.fedntd import FedNTD, drop_true_class
from strategies.fedproj import FedProj, memory_batch
from strategies.fedprox import FedProx
from strategies.moon import MOON
from strategies.projection import conflict_coefficients
from strategies.scaffold import Scaffold

if TYPE_CHECKING:
    from cfl_bench.engine.context import ClientState, LocalRound


class BatchedHooks:
    """One component's per-step client hooks over a chunk's clients (default: none).

    ``capture`` runs right after each client's ``on_client_start`` (in chunk order);
    ``penalty`` and ``transform`` run at every lock-step on the whole chunk.
    """

    def __init__(self, component: Component) -> None:
        self.component = component

    def capture(self, client: ClientState, local: LocalRound) -> None:
        """Keep what the component set up for ``client`` (its row of per-client state)."""

    def penalty(
        self, params: torch.Tensor, grads: torch.Tensor, losses: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(∇, loss) after the component's penalty for every client."""
        return grads, losses

    def transform(self, grads: torch.Tensor, step: LockStep) -> torch.Tensor:
        """∇ after the component's gradient transform for every client."""
        return grads


# Representations (C, batch, F) of every client's batch at its row of (C, P) parameters.
Represent = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
# Every client's flat gradient (C, P) of loss(outputs, *per-client inputs) at its row of
# (C, P) parameters, the model forwarding the first input: (loss, params, x, *inputs).
LossGradients = Callable[..., torch.Tensor]


@dataclass(frozen=True)
class LockStep:
    """What a gradient transform may read at one lock-step besides ∇: the parameters, the
    chunk's clients (None: no step this lock-step, so no draws from its generators), the
    step's buffer batch size and the executor's batched gradient of a loss."""

    params: torch.Tensor
    stepping: list[ClientState | None]
    buffer_batch_size: int
    gradients: LossGradients


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


@dataclass
class ChunkHooks:
    """A chunk's batched hooks in the sequential step order: ``losses`` (the loss terms,
    written order: output terms join the loss, penalties follow the backward) and the
    ``transforms`` (``TRANSFORM_CHAIN`` order)."""

    losses: list[BatchedHooks]
    transforms: list[BatchedHooks]

    @property
    def outputs(self) -> list[BatchedLossTerm]:
        return [h for h in self.losses if isinstance(h, BatchedLossTerm) and h.has_batch_term]


class ProxHooks(BatchedHooks):
    """FedProx: ∇ += μ(θ − θ_g); loss += (μ/2)‖θ − θ_g‖² (``fedprox.proximal_penalty_``)."""

    anchor: torch.Tensor | None = None

    def capture(self, client: ClientState, local: LocalRound) -> None:
        self.anchor = local.broadcast.params

    def penalty(
        self, params: torch.Tensor, grads: torch.Tensor, losses: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        assert self.anchor is not None
        mu = cast(FedProx, self.component).mu
        diff = params - self.anchor
        return grads.add(diff, alpha=mu), losses + 0.5 * mu * (diff * diff).sum(dim=1)


class DynHooks(BatchedHooks):
    """FedDyn: ∇ += α(θ − θ_g) − h_k; loss += (α/2)‖θ − θ_g‖² − ⟨h_k, θ⟩
    (``feddyn.dynamic_penalty_``), with h_k the client's state at its start."""

    def __init__(self, component: Component) -> None:
        super().__init__(component)
        self.rows: list[torch.Tensor] = []
        self.anchor: torch.Tensor | None = None
        self.h: torch.Tensor | None = None

    def capture(self, client: ClientState, local: LocalRound) -> None:
        self.anchor = local.broadcast.params
        self.rows.append(cast(torch.Tensor, client.state_for(self.component.name)["h"]))

    def penalty(
        self, params: torch.Tensor, grads: torch.Tensor, losses: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        assert self.anchor is not None
        if self.h is None:  # a copy: after_local updates each h_k in place
            self.h = torch.stack(self.rows)
        alpha = cast(FedDyn, self.component).alpha
        diff = params - self.anchor
        grads = grads.add(diff, alpha=alpha).sub_(self.h)
        value = 0.5 * alpha * (diff * diff).sum(dim=1) - (self.h * params).sum(dim=1)
        return grads, losses + value


class CurvHooks(BatchedHooks):
    """FedCurv: ∇ += 2λ(θ⊙U' − V'); loss += λ(⟨θ, θ⊙U' − V'⟩ − ⟨θ, V'⟩)
    (``fedcurv.curvature_penalty_``), U', V' the client's sums less its own u_k, v_k."""

    def __init__(self, component: Component) -> None:
        super().__init__(component)
        self.rows: list[tuple[torch.Tensor, torch.Tensor] | None] = []
        self.others: tuple[torch.Tensor, torch.Tensor] | None = None

    def capture(self, client: ClientState, local: LocalRound) -> None:
        self.rows.append(cast(FedCurv, self.component)._others)

    def penalty(
        self, params: torch.Tensor, grads: torch.Tensor, losses: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        lam = cast(FedCurv, self.component).lam
        # Either every client of a round has the broadcast sums or none has (first round).
        if lam == 0 or any(row is None for row in self.rows):
            return grads, losses
        if self.others is None:
            rows = cast(list[tuple[torch.Tensor, torch.Tensor]], self.rows)
            self.others = (torch.stack([u for u, _ in rows]), torch.stack([v for _, v in rows]))
        others_u, others_v = self.others
        inner = params * others_u - others_v
        value = lam * ((params * inner).sum(dim=1) - (params * others_v).sum(dim=1))
        return grads.add(inner, alpha=2.0 * lam), losses + value


class ScaffoldHooks(BatchedHooks):
    """SCAFFOLD: ∇ += c − c_k (the correction ``on_client_start`` set for each client)."""

    def __init__(self, component: Component) -> None:
        super().__init__(component)
        self.rows: list[torch.Tensor] = []
        self.correction: torch.Tensor | None = None

    def capture(self, client: ClientState, local: LocalRound) -> None:
        correction = cast(Scaffold, self.component)._correction
        assert correction is not None, "on_client_start sets the correction"
        self.rows.append(correction)

    def transform(self, grads: torch.Tensor, step: LockStep) -> torch.Tensor:
        if self.correction is None:
            self.correction = torch.stack(self.rows)
        return grads.add(self.correction)


class GPHooks(BatchedHooks):
    """FedGP: each client's gradient projected against the g_ref of its broadcast (what
    ``on_client_start`` kept: the same for every client of a round) where they conflict
    (``projection.project_conflicting_`` row by row)."""

    gref: torch.Tensor | None = None
    gref_sq: torch.Tensor | None = None

    def capture(self, client: ClientState, local: LocalRound) -> None:
        fedgp = cast(FedGP, self.component)
        self.gref, self.gref_sq = fedgp.client_gref, fedgp.client_gref_sq

    def transform(self, grads: torch.Tensor, step: LockStep) -> torch.Tensor:
        if self.gref is None:
            return grads
        coef = conflict_coefficients(grads, self.gref, self.gref_sq)
        return grads.addcmul(coef[:, None], self.gref[None, :], value=-1.0)


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


class ProjHooks(BatchedHooks):
    """FedProj's client side: g_glob = ∇ KL(σ(Z_ens/τ) ‖ σ(f(x_m; θ_k)/τ)) at each client's
    row (one vmapped backward), on its memory batch (``fedproj.memory_batch``: the client's
    own generator, drawn only when it steps) or the whole memory, then g ← g − coef·g_glob
    where g·g_glob < 0 and ‖g_glob‖² > ε (``projection.conflict_coefficients`` per row)."""

    received: torch.Tensor | None = None

    def capture(self, client: ClientState, local: LocalRound) -> None:
        self.received = cast(FedProj, self.component)._received  # the same for every client

    def transform(self, grads: torch.Tensor, step: LockStep) -> torch.Tensor:
        from strategies.distillation import kl_to_teacher

        proj = cast(FedProj, self.component)
        public = proj.public_x
        if self.received is None or public is None:
            return grads
        n, count = self.received.shape[0], grads.shape[0]
        if proj.memory == "all":
            x = public[:n].expand(count, *public[:n].shape)
            teacher = self.received.expand(count, *self.received.shape)
        else:
            size = min(step.buffer_batch_size, n)
            idle = torch.arange(size, device=grads.device)  # rows that take no step
            rows = [
                idle if c is None else memory_batch(c, n, size, proj.seed, proj.device)
                for c in step.stepping
            ]
            idx = torch.stack(rows)
            x, teacher = public[idx], self.received[idx]
        tau = proj.client_temperature

        def loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
            return kl_to_teacher(logits, target, tau)

        g_glob = step.gradients(loss, step.params, x, teacher)
        coef = conflict_coefficients(grads, g_glob, min_norm_sq=proj.eps)
        return grads.addcmul(g_glob, coef[:, None], value=-1.0)


# Client-side components the vectorized executor implements (exact classes: a subclass may
# override a hook), and the batched form of their per-step hooks. FedNova's one client hook
# is ``after_local`` (τ_k), which runs per client unchanged.
BATCHED: dict[type[Component], type[BatchedHooks]] = {
    FedProx: ProxHooks,
    FedDyn: DynHooks,
    FedCurv: CurvHooks,
    Scaffold: ScaffoldHooks,
    FedGP: GPHooks,
    FedNova: BatchedHooks,
    FedNTD: NTDHooks,
    MOON: MoonHooks,
    FedProj: ProjHooks,
}
