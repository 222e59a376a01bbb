"""The local step's order, written once for both executors (issue 40, "one step driver").

Every local step of every client runs, in this order (``StepDriver.step``)::

    zero grad → loss (the learner's batch loss, its declared replay plan's terms, the
    components' loss terms; forwards under --amp's autocast) → backward (fp16: scaled,
    then unscaled) → penalties → learner refine → transforms in chain order → optimizer
    step (skipped where the gradient is not finite) → learner observe (buffer insertion)

The driver owns the order and the parts that are the same for one client and for a chunk
(the components' ``penalty``, the learner's ``refine`` and the ``transform`` chain are pure
functions of θ and g with the parameter axis last, so one call serves (P,) and (C, P)).
What differs is behind ``StepBackend``, with two implementations:

- ``engine.one_client.OneClientBackend``: one client, the working model, autograd (the
  sequential executor, the Flower ClientApp);
- ``engine.vectorized_step.ChunkBackend``: a chunk of clients in lock-step, ``torch.func``
  (the vectorized executor).

Why a protocol and not a base class: the two backends share no state, only the shape of a
step; and a stand-in (``tests/test_step_driver.py``'s recording backend) checks the order
without a model. ``tests/test_step_driver.py`` also fails if another module calls the
penalty → refine → transform → optimizer sequence itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch

if TYPE_CHECKING:
    from cfl_bench.strategies.base import ClientInputs, Learner, StepView
    from cfl_bench.strategies.roles import GradientTransform, LossTerm


class StepBackend(Protocol):
    """One step's executor side: a client's (P,) or a chunk's (C, P) parameters and
    gradient, and how its loss is built, differentiated, stepped and observed."""

    @property
    def params(self) -> torch.Tensor:
        """θ before the step ((P,) or (C, P)): what penalties and the view read."""
        ...

    def zero_grad(self) -> None:
        """Clear the flat gradient the backward writes."""

    def loss(self) -> torch.Tensor:
        """The step's loss ((), or (C,) per client): the learner's batch loss plus the
        terms of its ``replay_plan`` plus the components' ``loss_term``s, forwards under
        the run's autocast."""
        ...

    def backward(self, loss: torch.Tensor) -> torch.Tensor | bool:
        """The gradient of ``loss`` (fp16: of the scaled loss, then unscaled, the scale
        updated); returns where the optimizer may step (bool, or (C,) rows)."""
        ...

    def gradient(self) -> torch.Tensor:
        """The flat gradient the backward produced."""
        ...

    def inputs(self, name: str) -> ClientInputs | None:
        """Component ``name``'s inputs this round (None: nothing on its steps)."""
        ...

    def view(self) -> StepView:
        """The step's ``strategies.base.StepView`` (for ``refine`` and ``transform``)."""
        ...

    def optimizer_step(self, grads: torch.Tensor, finite: torch.Tensor | bool) -> None:
        """Take the optimizer step with ``grads`` where ``finite`` allows."""

    def observe(self) -> None:
        """The learner's buffer insertion of the step's batch (outputs before the step)."""

    def reported(self, loss: torch.Tensor) -> torch.Tensor:
        """The step's loss as the executor sums it (detached; 0 for idle rows)."""
        ...


@dataclass(frozen=True)
class StepDriver:
    """The strategy's client-side step functions, run in the documented order on a
    ``StepBackend``: the learner (``refine``), the loss terms (``penalty``) and the
    gradient transforms in chain order (``Strategy.transforms``)."""

    learner: Learner
    loss_terms: Sequence[LossTerm]
    transforms: Sequence[GradientTransform]

    def step(self, backend: StepBackend) -> torch.Tensor:
        """One local step (the order in the module docstring); returns the reported loss."""
        backend.zero_grad()
        loss = backend.loss()
        finite = backend.backward(loss)
        grads, loss = self.penalize(backend, backend.gradient(), loss)
        view = backend.view()
        grads = self.learner.refine(grads, view)
        grads = self.transform(backend, grads, view)
        backend.optimizer_step(grads, finite)
        backend.observe()
        return backend.reported(loss)

    def penalize(
        self, backend: StepBackend, grads: torch.Tensor, loss: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The loss terms' closed-form penalties (``Component.penalty``) in order: each
        one's gradient added to ``grads``, its value to the reported ``loss``."""
        for term in self.loss_terms:
            inputs = backend.inputs(term.name)
            penalized = None if inputs is None else term.penalty(backend.params, grads, inputs)
            if penalized is not None:
                grads, value = penalized
                loss = loss + value
        return grads, loss

    def transform(self, backend: StepBackend, grads: torch.Tensor, view: StepView) -> torch.Tensor:
        """The gradient transforms (``Component.transform``) in ``TRANSFORM_CHAIN`` order."""
        for transform in self.transforms:
            inputs = backend.inputs(transform.name)
            if inputs is not None:
                grads = transform.transform(grads, inputs, view)
        return grads
