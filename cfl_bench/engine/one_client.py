"""One client's backend of the step driver (``engine.step_driver``): the sequential
executor's (and the Flower ClientApp's) local steps, on the working model with autograd.

The driver runs the step order; here is what one client adds to it: the learner's loss as
its declared plan states it (``plan_loss``: the batch's forward and the ``replay_plan``'s
terms; the one reading of a plan on one client, as ``engine.vectorized_grad`` is on a
chunk), the loss terms with their frozen forwards on a private copy of the module
(``ClientStepFunctions``), the backward with fp16 scaling, this client's ``StepView``
(``OneClientStep``: gradients by autograd) and the buffer insertion (``offer_batch``).
The vectorized executor's backend is ``engine.vectorized_step.ChunkBackend``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, cast

import torch

from cfl_bench.core.buffer import BufferDraw
from cfl_bench.core.context import ClientState, LocalRound, StepContext
from cfl_bench.core.flat import FlatModel
from cfl_bench.core.objective import Objective
from cfl_bench.engine.amp import LossScaler, Precision
from cfl_bench.engine.batches import ClientBatches, offers, start_visit
from cfl_bench.engine.fused_forward import FusedForward
from cfl_bench.engine.optim import LocalOptimizer
from cfl_bench.strategies.base import ClientInputs, Learner
from cfl_bench.strategies.replay import (
    ReplayTerm,
    embedding_mse,
    head_cross_entropy,
    head_distillation,
    replay_term_loss,
)
from cfl_bench.strategies.roles import LossTerm

if TYPE_CHECKING:
    from cfl_bench.engine.client_update import LocalTrainer


#: ``ClientStepFunctions.frozen_forward``: (params, buffers, x, output) ↦ outputs.
FrozenForwardFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, str], torch.Tensor]


class FeatureModel(Protocol):
    """A model with the ``features`` capability (``runner.models``; MOON requires it):
    ``forward(x) == classify(representation(x))``. Why a protocol: ``nn.Module``'s
    ``__getattr__`` types these methods as tensors or modules."""

    def representation(self, x: torch.Tensor) -> torch.Tensor: ...

    def classify(self, z: torch.Tensor) -> torch.Tensor: ...


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
    """The components' loss terms run on one client's step of the working ``model``."""

    model: FlatModel
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
        under ``--amp``'s autocast. ``output`` "classify": its classifier on features ``x``
        with their gradient kept (its own parameters have none: a "head_kd" term)."""
        if self.frozen is None:
            self.frozen = FlatModel(copy.deepcopy(self.model.module))
            self.frozen.module.eval()
            self.frozen.module.requires_grad_(False)
        frozen = self.frozen
        frozen.load(params, buffers)
        if output == "classify":
            return cast(FeatureModel, frozen.module).classify(x).float()
        with torch.no_grad():
            if output == "representation":
                return cast(FeatureModel, frozen.module).representation(x).float()
            return frozen.module(x).float()


def batch_loss(learner: Learner, step: StepContext) -> torch.Tensor:
    """Forward the batch, keep its outputs in ``step.outputs`` (and its representation when
    a component wants it), return the objective's loss."""
    module = step.model.module
    if step.keep_representation:  # the same operations as module(x), z kept on the way
        # ``.float()``: fp32 z and outputs under ``--amp`` autocast (``engine.amp``); the
        # identity on fp32 tensors.
        features = cast(FeatureModel, module)
        step.representation = features.representation(step.x).float()
        step.outputs = features.classify(step.representation).float()
    else:
        step.outputs = module(step.x)
    return weighted_batch_loss(learner, learner.objective.loss(step.outputs, step.y))


def weighted_batch_loss(learner: Learner, loss: torch.Tensor) -> torch.Tensor:
    """The batch loss times the plan's ``batch_weight`` (left untouched at 1, so every other
    learner's loss is the very same tensor)."""
    weight = learner.replay_plan().batch_weight
    return loss if weight == 1.0 else weight * loss


def plan_loss(
    learner: Learner,
    step: StepContext,
    fused: FusedForward | None = None,
    frozen: FrozenForwardFn | None = None,
) -> torch.Tensor:
    """The learner's loss as its ``replay_plan`` declares it: the batch loss plus each
    replay term, each draw sampled from the learner's ``replay_source`` (when it holds
    anything), each term its own forward of its draw's (augmented) inputs, as in Mammoth.

    ``fused``: the batch's and the terms' forwards as one (``engine.fused_forward``), where
    the plan allows it and no component needs the batch's representation. The order of
    every generator's draws is the same either way: the buffer's and the client's
    generators serve the draws and their augmentation, torch's default one the forwards'
    dropout, each in the order of the separate forwards. ``frozen``: the teacher's forward
    a "kd" term distils (``ClientStepFunctions.frozen_forward``).
    """
    plan = learner.replay_plan()
    source = learner.replay_source(step.client, step.epoch)
    if not plan.draws or source is None or source.filled == 0:
        return batch_loss(learner, step)
    size = plan.draw_size or step.buffer_batch_size
    draws = [source.sample(size) for _ in range(plan.draws)]
    if plan.joint:
        return joint_loss(learner, step, replay_draw(draws, 0), frozen)
    inputs: list[torch.Tensor] = []
    features: list[torch.Tensor | None] = [None] * len(plan.terms)
    if fused is None or step.keep_representation or wants_features(plan.terms):
        loss = batch_loss(learner, step)
        replays = []
        for i, term in enumerate(plan.terms):
            inputs.append(step.replay_input(replay_draw(draws, term.draw).x))
            out, features[i] = replay_forward(step.model.module, inputs[-1], term)
            replays.append(out)
    else:
        inputs = [step.replay_input(replay_draw(draws, t.draw).x) for t in plan.terms]
        step.outputs, *replays = fused([step.x, *inputs])
        loss = weighted_batch_loss(learner, learner.objective.loss(step.outputs, step.y))
    for term, x, replay, z in zip(plan.terms, inputs, replays, features, strict=True):
        draw = replay_draw(draws, term.draw)
        stored, teacher_z = draw.logits, None
        if z is not None:
            teacher_z = teacher_outputs(learner, step, term, x, frozen, "representation")
        if term.kind == "kd":
            stored = kd_target(learner, step, term, x, frozen, teacher_z)
        value = replay_term_loss(term, replay, draw.y, stored, learner.objective)
        if z is not None:
            assert teacher_z is not None
            value = value + embedding_mse(z, teacher_z, term.features_from)
        loss = loss + term.weight * value
    return loss


def joint_loss(
    learner: Learner, step: StepContext, draw: BufferDraw, frozen: FrozenForwardFn | None
) -> torch.Tensor:
    """A ``joint`` plan's loss (MFCL's ``train_cl``): the batch and the draw as one forward
    x̂ = [x; draw] (no replay augmentation), the batch loss on the batch's rows, each term
    on every row with the labels ŷ = [y; draw's]. "head_ce" forwards x̂ a second time
    without gradient, in the step's mode (BatchNorm's running statistics move again, as in
    the code), and reads the classifier's outputs on those features; "head_kd" reads the
    teacher's classifier on the student's features and on the teacher's own."""
    model = cast(FeatureModel, step.model.module)
    x, y = torch.cat([step.x, draw.x]), torch.cat([step.y, draw.y])
    z = model.representation(x).float()
    outputs = model.classify(z).float()
    rows = step.x.shape[0]
    step.representation, step.outputs = z[:rows], outputs[:rows]
    loss = weighted_batch_loss(learner, learner.objective.loss(step.outputs, step.y))
    for term in learner.replay_plan().terms:
        if term.kind == "head_ce":
            with torch.no_grad():
                detached = model.representation(x).float()
            value = head_cross_entropy(model.classify(detached).float(), y, term.outputs)
        else:
            assert term.kind == "head_kd", f"a joint plan's terms are head terms, not {term.kind}"
            teacher_z = teacher_outputs(learner, step, term, x, frozen, "representation")
            student_old = teacher_outputs(learner, step, term, z, frozen, "classify")
            teacher_old = teacher_outputs(learner, step, term, teacher_z, frozen, "classify")
            width = term.outputs or student_old.shape[1]
            value = head_distillation(student_old[:, :width], teacher_old[:, :width])
        loss = loss + term.weight * value
    return loss


def wants_features(terms: tuple[ReplayTerm, ...]) -> bool:
    """Whether a term reads its draw's representation (then no forward is fused)."""
    return any(term.features_from >= 0 for term in terms)


def replay_forward(
    module: torch.nn.Module, x: torch.Tensor, term: ReplayTerm
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A term's forward of its draw: the outputs, and the representation they were
    classified from where the term reads it (the same operations as ``module(x)``)."""
    if term.features_from < 0:
        return module(x), None
    model = cast(FeatureModel, module)
    z = model.representation(x).float()
    return model.classify(z).float(), z


def teacher_outputs(
    learner: Learner,
    step: StepContext,
    term: ReplayTerm,
    x: torch.Tensor,
    frozen: FrozenForwardFn | None,
    output: str = "outputs",
) -> torch.Tensor:
    """A "kd" term's target: the teacher held in the learner's client inputs (the keys
    ``term.teacher``) on the draw's inputs ``x`` as the student saw them (its
    ``output``: "outputs", or "representation" for a term's embeddings)."""
    inputs = step.inputs.get(learner.name)
    assert frozen is not None and inputs is not None, "a kd term needs its teacher"
    params, buffers = (inputs[key] for key in term.teacher)
    return frozen(params, buffers, x, output)


def kd_target(
    learner: Learner,
    step: StepContext,
    term: ReplayTerm,
    x: torch.Tensor,
    frozen: FrozenForwardFn | None,
    teacher_z: torch.Tensor | None,
) -> torch.Tensor:
    """A "kd" term's target outputs: the teacher's classifier on its representation when
    the term already forwarded it for its embeddings (one teacher forward, not two: a
    feature model's forward is ``classify(representation(x))``, the same operations),
    else the teacher's forward of ``x``."""
    if teacher_z is None:
        return teacher_outputs(learner, step, term, x, frozen)
    return teacher_outputs(learner, step, term, teacher_z, frozen, "classify")


def replay_draw(draws: list[BufferDraw | None], index: int) -> BufferDraw:
    """Draw ``index`` of a step (never None: the buffer holds something)."""
    draw = draws[index]
    assert draw is not None  # filled > 0
    return draw


def offer_batch(learner: Learner, step: StepContext) -> None:
    """The learner's buffer insertion: the batch (as stored), its labels and its outputs
    before the step, when the learner ``offers_batches`` and the buffer policy offers it."""
    buffer = step.client.buffer
    if buffer is None or not learner.offers_batches():
        return
    if step.offer_to_buffer:
        assert step.outputs is not None  # the step's loss forwarded the batch
        outputs = learner.objective.buffer_outputs(step.outputs)
        buffer.add(step.stored_input, step.y, outputs, step.task)


@dataclass
class OneClientBackend:
    """The ``engine.step_driver.StepBackend`` of one client: the working model and its
    optimiser, autograd, and (fp16) the client's loss scale; ``current`` is the step
    being taken."""

    model: FlatModel
    optimizer: LocalOptimizer
    learner: Learner
    loss_terms: list[LossTerm]
    functions: ClientStepFunctions
    precision: Precision
    scaler: LossScaler | None = None
    current: StepContext | None = None
    # The batch's and replay draws' forwards as one (``engine.fused_forward``), when the
    # plan allows it (``StepSchedule.fused_forwards``).
    fused: FusedForward | None = None

    @property
    def step(self) -> StepContext:
        assert self.current is not None, "no step is being taken"
        return self.current

    @property
    def params(self) -> torch.Tensor:
        return self.model.params

    def zero_grad(self) -> None:
        self.model.zero_grad()

    def loss(self) -> torch.Tensor:
        """The plan's loss plus the components' loss terms, forwards autocast (outputs come
        back fp32)."""
        step = self.step
        with self.precision.autocast():
            loss = plan_loss(self.learner, step, self.fused, self.functions.frozen_forward)
            for term in self.loss_terms:
                extra = self.functions.loss_term(term, step)
                if extra is not None:
                    loss = loss + extra
        return loss

    def backward(self, loss: torch.Tensor) -> bool:
        """The loss's gradient into the flat gradient; under fp16, of the scaled loss, then
        unscaled. Returns whether the step may be taken (False: a non-finite fp16 gradient,
        zeroed, its step skipped and the scale halved — one host read per step, which the
        sequential executor's Python control flow needs anyway)."""
        if self.scaler is None:
            loss.backward()
            return True
        (loss * self.scaler.scale[0]).backward()
        grads = self.model.grads
        unscaled, finite = self.scaler.unscale(grads[None])
        grads.copy_(unscaled[0])
        self.scaler.update(finite)
        return bool(finite[0])

    def gradient(self) -> torch.Tensor:
        return self.model.grads

    def inputs(self, name: str) -> ClientInputs | None:
        return self.step.inputs.get(name)

    def view(self) -> OneClientStep:
        step = self.step
        objective = self.learner.objective
        return OneClientStep(
            self.model, step.client, step.buffer_batch_size, objective, step.replay_input
        )

    def optimizer_step(self, grads: torch.Tensor, finite: torch.Tensor | bool) -> None:
        """``grads`` into the flat gradient (the optimizer reads it there), then the step
        unless the fp16 gradient was not finite."""
        if grads is not self.model.grads:
            self.model.grads.copy_(grads)
        if finite:
            self.optimizer.step()

    def observe(self) -> None:
        offer_batch(self.learner, self.step)

    def reported(self, loss: torch.Tensor) -> torch.Tensor:
        return loss.detach()


def local_steps(
    trainer: LocalTrainer, client: ClientState, local: LocalRound
) -> tuple[torch.Tensor, int, torch.Tensor]:
    """The client's epochs over its data, each batch one ``StepDriver.step`` on
    ``trainer.backend``; returns the summed loss, the step count and the first epoch's
    summed loss (``LocalRound.first_epoch_loss``)."""
    s, backend = trainer.steps, trainer.backend
    trainer.model.module.train()
    trainer.optimizer.reset()
    trainer.optimizer.lr = trainer.round_lr(local.broadcast.round_index)
    first_visit = start_visit(client)
    loss_sum = torch.zeros((), device=trainer.model.params.device)
    first_epoch = torch.zeros((), device=loss_sum.device)
    cap = trainer.driver.learner.epoch_steps(client)
    batches = ClientBatches(client, s.epochs, s.batch_size, trainer.augment, loss_sum.device, cap)
    if batches.total == 0:
        return loss_sum, 0, first_epoch
    augment, gen = trainer.augment, client.generator

    def augmented(x: torch.Tensor) -> torch.Tensor:
        assert augment is not None
        return augment(x, gen)

    replay_augment = augmented if augment is not None and s.replay_augment else None
    if trainer.precision.scaled:
        backend.scaler = LossScaler.of([client], loss_sum.device)
    for _ in range(batches.total):
        x, y, raw = batches.next()
        backend.current = StepContext(
            model=trainer.model,
            client=client,
            broadcast=local.broadcast,
            x=x,
            y=y,
            task=client.task,
            epoch=batches.epoch,
            offer_to_buffer=offers(s.buffer_offer, first_visit, batches.epoch),
            buffer_batch_size=s.buffer_batch_size,
            raw_x=None if augment is None else raw,
            replay_augment=replay_augment,
            keep_representation=trainer.keep_representation,
            inputs=local.inputs,
        )
        step_loss = trainer.driver.step(backend)
        loss_sum += step_loss
        if batches.epoch == 0:
            first_epoch += step_loss
    backend.current = None
    if backend.scaler is not None:
        backend.scaler.save([client])
        backend.scaler = None
    return loss_sum, batches.total, first_epoch
