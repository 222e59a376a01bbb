"""One client's side of the components' step functions (``strategies.base``): the
sequential executor's driver of ``loss_term``, ``penalty`` and ``transform``.

The vectorized executor drives the same functions on a chunk (``engine.vectorized``,
``engine.vectorized_grad``); here they run on one client's (P,) vectors and the working
model: frozen forwards on a private copy of the module, gradients by autograd
(``OneClientStep``, this client's ``StepView``), the results written into the flat gradient.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from cfl_bench.engine.context import ClientState, StepContext
from cfl_bench.flat import FlatModel
from cfl_bench.objective import Objective
from strategies.base import Learner
from strategies.roles import GradientTransform, LossTerm


@dataclass(frozen=True)
class OneClientStep:
    """The ``strategies.base.StepView`` of one client's local step: its θ (P,), its own
    draws, and gradients taken with autograd on the working model (which is in the step's
    mode, so dropout draws as in the step)."""

    model: FlatModel
    client: ClientState
    buffer_batch_size: int
    # What ``buffer_gradient`` differentiates, and the step's replay augmentation.
    objective: Objective | None = None
    replay_input: Callable[[torch.Tensor], torch.Tensor] | None = None

    @property
    def params(self) -> torch.Tensor:
        return self.model.params

    def per_client(
        self, draw: Callable[[ClientState], torch.Tensor], idle: torch.Tensor
    ) -> torch.Tensor:
        return draw(self.client)

    def shared(self, value: torch.Tensor) -> torch.Tensor:
        return value

    def gradient(
        self, loss: Callable[..., torch.Tensor], x: torch.Tensor, *inputs: torch.Tensor
    ) -> torch.Tensor:
        """∇θ loss(f(x; θ), *inputs) as a new flat vector; the flat gradient the step is
        building is left as it is (``torch.autograd.grad``, not ``backward``)."""
        module = self.model.module
        parameters = [p for p in module.parameters() if p.requires_grad]
        value = loss(module(x), *inputs)
        grads = torch.autograd.grad(value, parameters, materialize_grads=True)
        return torch.cat([g.reshape(-1) for g in grads])

    def buffer_gradient(self) -> torch.Tensor | None:
        """∇θ of the objective's loss on ``buffer.sample(buffer_batch_size)`` (the buffer's
        generator), replayed as the step's replay draws are; None while the buffer is
        empty."""
        buffer = self.client.buffer
        if buffer is None or buffer.filled == 0:
            return None
        assert self.objective is not None, "a view without an objective takes no buffer draws"
        draw = buffer.sample(self.buffer_batch_size)
        assert draw is not None  # filled > 0
        x = draw.x if self.replay_input is None else self.replay_input(draw.x)
        return self.gradient(self.objective.loss, x, draw.y)


@dataclass
class ClientStepFunctions:
    """The strategy's loss terms and gradient transforms (in chain order) run on one
    client's step of the working ``model``."""

    model: FlatModel
    loss_terms: list[LossTerm]
    transforms: list[GradientTransform]
    learner: Learner
    # A copy of the module for the loss terms' forwards without gradient (made on first use).
    frozen: FlatModel | None = field(default=None)

    def loss_term(self, term: LossTerm, step: StepContext) -> torch.Tensor | None:
        """``term``'s ``loss_term`` on the batch's outputs, with its frozen forwards run on
        the batch (``frozen_forward``) and its term inputs; None when it has no inputs this
        round or no term."""
        inputs = step.inputs.get(term.name)
        if inputs is None or step.outputs is None:
            return None
        values = {key: inputs[key] for key in term.term_inputs()}
        for forward in term.frozen_forwards():
            params, buffers = inputs[forward.params], inputs[forward.buffers]
            values[forward.name] = self.frozen_forward(params, buffers, step.x, forward.output)
        return term.loss_term(step.outputs, step.representation, step.y, None, values)

    def frozen_forward(
        self, params: torch.Tensor, buffers: torch.Tensor, x: torch.Tensor, output: str
    ) -> torch.Tensor:
        """The model at ``params`` (and ``buffers``) on ``x``: eval mode, no gradient, on a
        private copy of the module made once (the working model is never touched); fp32
        under ``--amp``'s autocast."""
        if self.frozen is None:
            self.frozen = FlatModel(copy.deepcopy(self.model.module))
            self.frozen.module.eval()
            self.frozen.module.requires_grad_(False)
        frozen = self.frozen
        frozen.load(params, buffers)
        with torch.no_grad():
            if output == "representation":
                return frozen.module.representation(x).float()
            return frozen.module(x).float()

    def penalize(self, step: StepContext, loss: torch.Tensor) -> torch.Tensor:
        """The loss terms' closed-form penalties (``Component.penalty``) in order: their
        gradients into the flat gradient, their values added to the reported ``loss``."""
        grads = self.model.grads
        g = grads
        for term in self.loss_terms:
            inputs = step.inputs.get(term.name)
            penalized = None if inputs is None else term.penalty(self.model.params, g, inputs)
            if penalized is not None:
                g, value = penalized
                loss = loss + value
        if g is not grads:
            grads.copy_(g)
        return loss

    def view(self, step: StepContext) -> OneClientStep:
        """The ``StepView`` of ``step``."""
        objective = self.learner.objective
        return OneClientStep(
            self.model, step.client, step.buffer_batch_size, objective, step.replay_input
        )

    def refine(self, step: StepContext) -> None:
        """The learner's ``refine`` of the flat gradient (A-GEM), written back into it."""
        grads = self.model.grads
        g = self.learner.refine(grads, self.view(step))
        if g is not grads:
            grads.copy_(g)

    def transform(self, step: StepContext) -> None:
        """The gradient transforms (``Component.transform``) in ``TRANSFORM_CHAIN`` order,
        the result written into the flat gradient."""
        grads = self.model.grads
        g = grads
        view = self.view(step)
        for transform in self.transforms:
            inputs = step.inputs.get(transform.name)
            if inputs is not None:
                g = transform.transform(g, inputs, view)
        if g is not grads:
            grads.copy_(g)
