"""Every client's loss and flat gradient in one vmapped call: the part of the vectorized
executor that differentiates (``cfl_bench.engine.vectorized``). A chunk's stacked
parameters (C, P) become per-parameter (C, …) views, ``functional_call`` runs the one
working module at each client's row inside ``vmap``, and the per-parameter gradients are
joined into flat (C, P) rows. The loss of one client is the objective's loss over its real
rows (``Objective.masked_loss``), plus the replay terms of the learner's plan and the
components' output terms (FedNTD, MOON), exactly as the sequential step builds it.
Dropout (``engine.vectorized_dropout``): each forward of the loss runs with the clients'
masks (vmapped inputs, one per probed dropout call, rows matching the forward's) in place
of the dropout calls; the frozen forwards (MOON's z_glob and z_prev) run the working
module in eval mode, drawing none, as the sequential executor's eval-mode copies do.

``--amp`` (``engine.amp``): the lock-step's gradient (``gradients(..., amp=True)``) runs its
forwards under ``torch.autocast`` *inside* the vmapped function (autocast is a dispatch
key: it applies to the batched operations ``vmap`` issues, which ``test_amp`` checks by the
forward's dtype) and casts outputs and representations to fp32 before any loss; under fp16
each client's loss is multiplied by its own scale (a vmapped input) and the flat gradient
rows divided by it. A-GEM's reference gradients, FedProj's memory gradients and FedGP's
answers are taken with ``amp`` False: fp32, as the projections that use them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import cast

import torch
from torch import nn

from cfl_bench.core.flat import FlatModel
from cfl_bench.core.objective import Objective
from cfl_bench.engine.amp import Precision
from cfl_bench.engine.one_client import FeatureModel
from cfl_bench.engine.vectorized_dropout import DropoutLayer, apply_masks, probe
from cfl_bench.engine.vectorized_replay import ReplayBatch, replay_loss
from cfl_bench.strategies.base import ClientInputs
from cfl_bench.strategies.replay import ReplayPlan
from cfl_bench.strategies.roles import LossTerm


@dataclass(frozen=True)
class ChunkTerm:
    """A component's loss term over a chunk: the component, its chunk inputs and which of
    their keys are stacked per client (the others are the round's, shared)."""

    component: LossTerm
    inputs: ClientInputs
    stacked: frozenset[str]


class Representation(nn.Module):
    """``module`` returning (representation, outputs): ``forward(x) ==
    classify(representation(x))``, the operations of the sequential learner's forward when
    a component keeps the representation. Its parameters are ``inner.<name>``."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.inner = module

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        features = cast(FeatureModel, self.inner)
        z = features.representation(x)
        return z, features.classify(z)


def scaled(loss: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
    """``loss`` times the fp16 loss ``scale`` (``loss`` itself when not scaling)."""
    return loss if scale is None else loss * scale


def param_views(model: FlatModel, params: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per-parameter views of one flat parameter vector ``params`` (P,)."""
    return {s.name: params[s.start : s.start + s.numel].view(s.shape) for s in model.slices}


def row_views(model: FlatModel, params: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per-parameter (C, …) views of the rows of ``params`` (C, P)."""
    count = params.shape[0]
    return {
        s.name: params[:, s.start : s.start + s.numel].view(count, *s.shape) for s in model.slices
    }


def flat_rows(model: FlatModel, grads: dict[str, torch.Tensor], count: int) -> torch.Tensor:
    """Per-parameter (C, …) gradients joined into flat (C, P) rows, in parameter order."""
    return torch.cat([grads[s.name].reshape(count, -1) for s in model.slices], dim=1)


@contextlib.contextmanager
def eval_mode(module: torch.nn.Module) -> Iterator[None]:
    """``module`` in eval mode (no dropout draws), its mode restored after."""
    training = module.training
    module.eval()
    try:
        yield
    finally:
        module.train(training)


class FrozenForwards:
    """The loss terms' forwards without gradient (``FrozenForward``: FedNTD's teacher,
    MOON's global and previous models) on a chunk's batch, at shared or per-client
    parameters of the working model."""

    def __init__(self, model: FlatModel, split: Representation | None) -> None:
        from torch.func import vmap

        self.model = model
        self.split = split  # the working model's ``Representation`` wrapper, if one is kept
        self.rows = vmap(self.one, in_dims=(0, 0, None))

    def one(self, params: dict[str, torch.Tensor], x: torch.Tensor, output: str) -> torch.Tensor:
        """The model's ``output`` ("outputs" or "representation") of ``x`` at ``params``,
        fp32 (the caller holds eval mode and no gradient)."""
        from torch.func import functional_call

        if output != "representation":
            return functional_call(self.model.module, params, (x,)).float()
        split = self.split or Representation(self.model.module)
        named = {f"inner.{name}": value for name, value in params.items()}
        return functional_call(split, named, (x,))[0].float()

    def __call__(self, params: torch.Tensor, x: torch.Tensor, output: str) -> torch.Tensor:
        """``output`` on every client's batch of ``x`` (C, batch, …): at one shared
        parameter vector (P,) as one forward of all C×batch rows (θ_g), or at each client's
        row of ``params`` (C, P), vmapped; eval mode, as the sequential executor's frozen
        copy (no dropout draws)."""
        with torch.no_grad(), eval_mode(self.model.module):
            if params.dim() == 1:
                rows = x.flatten(0, 1)
                out = self.one(param_views(self.model, params), rows, output)
                return out.unflatten(0, x.shape[:2])
            return self.rows(row_views(self.model, params), x, output)


class ClientLosses:
    """One client's loss at its parameter views (batch, replay rows, the components' output
    terms, dropout masks), vmapped with its gradient over the clients: what
    :class:`ClientGradients` differentiates, kept apart from how a request is assembled."""

    def __init__(
        self,
        model: FlatModel,
        keep_representation: bool,
        plan: ReplayPlan,
        objective: Objective | None = None,
    ) -> None:
        from torch.func import grad_and_value, vmap

        from cfl_bench.core.objective import Classification

        self.model = model
        self.plan = plan
        # The stream's objective: its masked loss is each client's loss on its padded batch.
        self.objective: Objective = objective or Classification()
        self.terms: list[LossTerm] = []  # the loss terms of the gradient being taken
        self.precision = Precision()
        self.autocasting = False  # whether the gradient being taken autocasts its forwards
        # Whether the forward of the gradient being taken replaces dropout by masks.
        self.intercept = False
        self.probed: dict[tuple[tuple[int, ...], bool], tuple[DropoutLayer, ...] | None] = {}
        self.split = Representation(model.module) if keep_representation else None
        self.frozen = FrozenForwards(model, self.split)
        self.loss_and_grad = vmap(grad_and_value(self._client_loss, has_aux=True))
        self.replay_loss_and_grad = vmap(grad_and_value(self._replay_client_loss, has_aux=True))

    def compile(self) -> None:
        """``torch.compile`` the vmapped loss-and-gradient calls (``--compile``).

        Why only these: they are where the step's arithmetic is (forward, backward and the
        loss terms of every client); the optimizer update and the components' batched
        hooks are a few large elementwise ops each. Shapes are fixed within a run (batches
        and replay draws are padded), so a run compiles each call once, plus once more when
        a chunk or a gradient request has another number of clients (torch then marks that
        dimension dynamic). ``bench/compile_step.py`` measures what it gains.
        """
        self.loss_and_grad = torch.compile(self.loss_and_grad)
        self.replay_loss_and_grad = torch.compile(self.replay_loss_and_grad)

    def _client_loss(
        self,
        params: dict[str, torch.Tensor],
        x: torch.Tensor,
        y: torch.Tensor,
        mask: torch.Tensor,
        aux: tuple[dict[str, torch.Tensor], ...] = (),
        masks: tuple[torch.Tensor, ...] = (),
        scale: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One client's objective loss over its real (mask 1) examples at ``params``
        plus the output terms (``aux``: their per-client inputs), and the batch's outputs
        (what a replay buffer stores); ``masks``: its dropout masks; times the client's
        loss ``scale`` under fp16."""
        outputs, z = self._forward(params, x, masks)
        extra = self._output_terms(outputs, z, y, mask, aux)
        return scaled(self.objective.masked_loss(outputs, y, mask) + extra, scale), outputs

    def _forward(
        self, params: dict[str, torch.Tensor], x: torch.Tensor, masks: tuple = ()
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The model's outputs at ``params`` and, when a component wants it (MOON), the
        representation the classifier read (``classify(representation(x))``, the same
        operations as the sequential learner's forward); with ``intercept`` set, the
        dropout calls multiply by ``masks`` in order."""
        from torch.func import functional_call

        autocast = self.precision.autocast() if self.autocasting else contextlib.nullcontext()
        dropout = apply_masks(masks) if self.intercept else contextlib.nullcontext()
        with autocast, dropout:
            if self.split is None:
                return functional_call(self.model.module, params, (x,)).float(), None
            named = {f"inner.{name}": value for name, value in params.items()}
            z, outputs = functional_call(self.split, named, (x,))
        return outputs.float(), z.float()

    def dropout_layers(self, shape: Sequence[int]) -> tuple[DropoutLayer, ...] | None:
        """The dropout calls of one forward on inputs of per-example ``shape`` in the
        working module's current mode (``vectorized_dropout.probe``, once per shape and
        mode); None: the model calls no dropout."""
        key = (tuple(int(d) for d in shape), self.model.module.training)
        if key not in self.probed:
            example = self.model.params.new_zeros((2, *key[0]))
            forward = self.model.module if self.split is None else self.split
            self.probed[key] = probe(forward, example)
        return self.probed[key]

    def _output_terms(
        self,
        outputs: torch.Tensor,
        z: torch.Tensor | None,
        y: torch.Tensor,
        mask: torch.Tensor,
        aux: tuple[dict[str, torch.Tensor], ...],
    ) -> torch.Tensor | float:
        """The components' loss terms on one client's batch outputs and representation
        (FedNTD's, MOON's), in order: each component's own ``loss_term`` on this client's
        slice of its values."""
        total: torch.Tensor | float = 0.0
        for component, values in zip(self.terms, aux, strict=True):
            term = component.loss_term(outputs, z, y, mask, values)
            if term is not None:
                total = total + term
        return total

    def _replay_client_loss(
        self,
        params: dict[str, torch.Tensor],
        x: torch.Tensor,
        y: torch.Tensor,
        mask: torch.Tensor,
        replay: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
        aux: tuple[dict[str, torch.Tensor], ...] = (),
        masks: tuple[torch.Tensor, ...] = (),
        scale: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``_client_loss`` plus the replay terms of the learner's plan: the batch and the
        replay rows (``ReplayBatch``'s tensors, sliced to this client) in one forward
        (``masks``: its dropout masks over the joined rows, batch first)."""
        rx = replay[0]
        joint = torch.cat([x, rx.flatten(0, 1)])
        out, z = self._forward(params, joint, masks)
        outputs, replayed = out[: x.shape[0]], out[x.shape[0] :].unflatten(0, rx.shape[:2])
        extra = replay_loss(replayed, ReplayBatch(*replay), self.plan.terms, self.objective)
        z = None if z is None else z[: x.shape[0]]
        extra = extra + self._output_terms(outputs, z, y, mask, aux)
        return scaled(self.objective.masked_loss(outputs, y, mask) + extra, scale), outputs


class ClientGradients(ClientLosses):
    """Vmapped losses and gradients at stacked parameter rows of one working model."""

    def term_values(self, term: ChunkTerm, x: torch.Tensor) -> dict[str, torch.Tensor]:
        """What ``term``'s ``loss_term`` reads, each with a leading client axis: its frozen
        forwards on the chunk's batch ``x`` and its term inputs (shared ones expanded)."""
        component, inputs = term.component, term.inputs
        count = x.shape[0]
        values = {}
        for key in component.term_inputs():
            value = inputs[key]
            values[key] = value if key in term.stacked else value.expand(count, *value.shape)
        for forward in component.frozen_forwards():
            values[forward.name] = self.frozen(inputs[forward.params], x, forward.output)
        return values

    def gradients(
        self,
        params: torch.Tensor,
        x: torch.Tensor,
        y: torch.Tensor,
        mask: torch.Tensor,
        replay: ReplayBatch | None = None,
        terms: Sequence[ChunkTerm] = (),
        amp: bool = False,
        scale: torch.Tensor | None = None,
        masks: tuple[torch.Tensor, ...] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Every client's flat gradient (C, P), loss (C,) and batch outputs (C, batch, K)
        at its row of ``params``, with the components' output ``terms`` in the loss;
        ``amp``: the forwards (the terms' frozen ones too) autocast to ``self.precision``;
        ``scale`` (C,): each client's fp16 loss scale, the gradient returned still scaled
        (the loss not: the scales are powers of two, the division exact); ``masks`` (per
        dropout call (C, rows, …); None: the model calls no dropout) in place of the
        forward's dropout.

        Why per-parameter views and not the flat row: differentiating through slices of one
        flat vector makes autograd build a zero (C, P) tensor per parameter and add them up
        (six full-size passes for the MLP); per-parameter gradients are joined by one ``cat``.
        """
        count = params.shape[0]
        views = row_views(self.model, params)
        self.terms = [term.component for term in terms]
        self.autocasting = amp and self.precision.enabled
        try:
            with self.precision.autocast() if self.autocasting else contextlib.nullcontext():
                aux = tuple(self.term_values(term, x) for term in terms)
            scales = () if scale is None else (scale,)  # vmap takes no None argument
            self.intercept, drop = masks is not None, masks or ()
            if replay is None:
                grads, (losses, outputs) = self.loss_and_grad(views, x, y, mask, aux, drop, *scales)
            else:
                rows = (replay.x, replay.y, replay.logits, replay.mask)
                grads, (losses, outputs) = self.replay_loss_and_grad(
                    views, x, y, mask, rows, aux, drop, *scales
                )
        finally:
            self.autocasting = False
        losses = losses if scale is None else losses / scale
        return flat_rows(self.model, grads, count), losses, outputs

    def loss_gradients(
        self,
        loss: Callable[..., torch.Tensor],
        params: torch.Tensor,
        x: torch.Tensor,
        *inputs: torch.Tensor,
        masks: tuple[torch.Tensor, ...] | None = None,
    ) -> torch.Tensor:
        """Every client's flat gradient (C, P) of ``loss(f(x_k; θ_k), *inputs_k)`` at its
        row of ``params`` (one vmapped backward; FedProj's memory gradient), ``masks`` as
        in ``gradients``."""
        from torch.func import grad, vmap

        def one(
            p: dict[str, torch.Tensor], drop: tuple, xk: torch.Tensor, *rest: torch.Tensor
        ) -> torch.Tensor:
            return loss(self._forward(p, xk, drop)[0], *rest)

        self.intercept = masks is not None
        grads = vmap(grad(one))(row_views(self.model, params), masks or (), x, *inputs)
        return flat_rows(self.model, grads, params.shape[0])
