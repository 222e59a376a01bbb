"""The vectorized executor: a round's clients trained in lock-step with ``torch.func``.

The participating clients' parameters are stacked along a leading client axis, θ ∈ R^{C×P}
(every row starts at the broadcast θ_g), and every local step is one call of

    vmap(grad_and_value(ℓ)) over clients,   ℓ(θ_k; x_k, y_k, m_k) = Σ_i m_ki·CE_i / max(Σ_i m_ki, 1)

(``functional_call`` of the one working module with views of client k's row as its
parameters),
followed by one batched optimizer update of all rows. It reproduces the sequential
executor's client update, not an approximation of it:

- **Same batches.** Client k draws from its own seeded generator in the sequential order:
  ``randperm(n_k)`` at the start of each epoch, then the stream's train augmentation of each
  batch. Generators are per client, so drawing client by client within a lock-step keeps
  every client's sequence intact.
- **Unequal shards and last partial batches.** A client's batch at a lock-step has
  b ≤ batch_size examples; it is padded to batch_size with mask m = 0, and the loss is the
  mean over its real examples only. A client whose steps are done (or that holds no data)
  has ``active`` = 0: its row and optimizer state are kept by ``torch.where`` — a true no-op,
  even with momentum and weight decay, so each row equals training that client alone.
- **Same optimizer**, the same functions (``optim.sgd_update``, ``optim.adam_update``) on
  the chunk's rows: SGD g ← ∇ + λθ; v ← μv + g (v₁ = g); θ ← θ − η·v. Adam: g ← ∇ + λθ;
  m ← β₁m + (1−β₁)g; s ← β₂s + (1−β₂)g²; θ ← θ − η/(1−β₁^t) · m / (√(s/(1−β₂^t)) + ε),
  with t the client's own step count. State starts afresh every round, as
  ``LocalOptimizer.reset`` does.
- **Client-side components** (``engine.lock_step``): each client's
  ``LocalTrainer.start`` (its inputs) runs before the first lock-step, the round's inputs
  computed once for the chunk, and its ``LocalTrainer.finish`` (``after_local``, with the
  client's row loaded) after the last, per client as sequentially. The step functions are
  the components' own: ``penalty`` and ``transform`` (parameter axis last) called once on
  the chunk's rows with the chunk's inputs (``lock_step.chunk_inputs``), in the
  sequential order (loss terms, penalties, then ``TRANSFORM_CHAIN``); ``loss_term``
  (FedNTD's, MOON's) called inside the vmapped loss on each client's slice, its frozen
  forwards (``vectorized_grad.FrozenForwards``) run for the chunk first.
- **Replay learners** (ER, DER, DER++; ``engine.vectorized_replay``): the clients'
  buffers are rows of one stacked storage (``buffer_stack.ReservoirStack``); the random
  draws (sample permutations, reservoir u's, replay augmentations) are taken client by
  client from the clients' own generators in the sequential order, the gathers and the
  reservoir inserts are batched over clients; the replay forward and backward are part of
  the vmapped per-client loss (padded and masked: an empty buffer adds no term), and
  insertion stores the outputs of that same vmapped forward, taken before the step.

- **A-GEM**: its ``refine`` is the sequential one, run on the chunk's (C, P) gradient; the
  ``LockStep`` view gives it g_b: each client's buffer draw per step (client by client, as
  the replay draws) and the gradients in one more vmapped backward at the clients' rows.

- **Dropout** (``engine.vectorized_dropout``): each client's masks drawn from its own
  default-generator state (reseeded per client update, ``seeding.seed_torch_default``) in
  the order and shapes of its sequential forwards, and multiplied in place of the dropout
  calls of the vmapped forward: bit-identical masks on CPU; on CUDA equal in
  distribution only (the sequential executor's fused kernel draws differently).

Supported: every learner whose step is its declared plans (``LEARNER_HOOKS``: fedavg,
er, der, derpp, agem), with every component (their client sides are step functions); any
objective (``Objective.masked_loss``); models whose parameters are all they hold (no
BatchNorm statistics), with or without dropout (not alpha dropout: its noise is affine,
not a mask). Why the refusals: BatchNorm's running statistics are buffers updated inside
the forward, which ``vmap`` over a shared module cannot keep per client; a learner
overriding its loss or its data (the joint learner's growing history) computes its step
on the one working model. The client spread (task-end probes)
and ``--diagnostics`` load each client's final row into the working model and run the
sequential code, once per client per round.
``answer`` batches gradient requests (FedGP's g_ref_k: one vmapped backward at θ_g over
the requested clients' draws); other requests and ``end_tasks`` are the sequential
executor's.

``--amp`` (``engine.amp``): the lock-step's forwards autocast inside the vmapped loss,
its losses in fp32; under fp16 each client has its own loss scale (``LossScaler``, rows
(C,)): the flat gradient rows are unscaled, a client whose row is not finite takes no
optimizer step (``masked``, as a finished client) and halves its scale, all with
``torch.where`` — no host read per step.

Uploads are streamed: after a chunk of clients is trained, each client's row is handed to
the sink as its upload (valid until the sink returns), so the server code is unchanged.
``clients_per_chunk`` bounds memory: a chunk of C clients holds C×P parameters, gradients
and optimizer state, and a C×batch_size batch. Unset on CUDA, chunks are sized from the
memory the first chunk was measured to take per client (``engine.vectorized_memory``).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from cfl_bench.engine.amp import LossScaler
from cfl_bench.engine.batches import ClientBatches, offers, start_visit
from cfl_bench.engine.client_update import ClientJob, ClientResult, LocalTrainer
from cfl_bench.engine.context import ClientState, LocalRound, Upload
from cfl_bench.engine.executor import AnswerSink, ResultSink, SequentialExecutor
from cfl_bench.engine.lock_step import LockStep, chunk_inputs
from cfl_bench.engine.optim import (
    FlatAdam,
    FlatSGD,
    adam_update,
    sgd_update,
    with_weight_decay,
)
from cfl_bench.engine.payloads import ClientRequest
from cfl_bench.engine.vectorized_dropout import ChunkDropout
from cfl_bench.engine.vectorized_grad import ChunkTerm, ClientGradients
from cfl_bench.engine.vectorized_memory import planner_for
from cfl_bench.engine.vectorized_replay import draw_replay, observe_all
from cfl_bench.engine.vectorized_requests import BatchedRequests
from cfl_bench.errors import UserError
from cfl_bench.host_values import device_tensor
from strategies.base import ClientInputs, Component, Learner
from strategies.compose import Strategy
from strategies.replay import ReplayPlan, ReplayTerm

# Models built from the catalogue that hold nothing but parameters (no BatchNorm), dropout
# allowed (``engine.vectorized_dropout``).
VECTORIZABLE_MODELS = ("centernet", "fedavg-cnn", "linear", "mlp", "mnist-cnn")
# A learner's step is its declared plan (``replay_plan``, ``offers_batches``) and its pure
# ``refine``: one that overrides these hooks computes something else, on the one working
# model.
LEARNER_HOOKS = ("loss", "batch_loss", "observe", "training_data")
# The one buffer draw ``LockStep.buffer_gradient`` takes per stepping client (its term: the
# objective's loss on the stored labels).
BUFFER_DRAW = ReplayPlan(1, (ReplayTerm(0, "ce", 1.0),))
FALLBACK = "use --executor sequential"


def learner_hooks(learner: Learner) -> list[str]:
    """The learner hooks beyond its declared plan that ``learner``'s class overrides."""
    cls = type(learner)
    return [h for h in LEARNER_HOOKS if getattr(cls, h) is not getattr(Learner, h)]


def check_strategy(strategy: Strategy) -> None:
    """Refuse compositions the vectorized executor does not implement (one sentence each)."""
    learner = strategy.learner
    hooks = learner_hooks(learner)
    if hooks or learner.needs_history:
        why = (
            f"its {', '.join(hooks)} are written for one working model"
            if hooks
            else "its training data grows with the task history"
        )
        raise UserError(
            f"the vectorized executor runs learners declared by their replay plans, not "
            f"'{learner.name}' ({why}); {FALLBACK}."
        )


def check_model(module: nn.Module, name: str | None = None) -> None:
    """Refuse models with BatchNorm statistics or alpha dropout (and, by name, any
    catalogue model not known to be vectorizable)."""
    batch_norm = any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in module.modules())
    if batch_norm or any(b.is_floating_point() for b in module.buffers()):
        shown = f"model '{name}'" if name else "the model"
        raise UserError(
            f"the vectorized executor cannot train {shown}: its BatchNorm running statistics "
            f"are updated inside the forward and cannot be kept per client under vmap; "
            f"{FALLBACK} (or a model without BatchNorm: {', '.join(VECTORIZABLE_MODELS)})."
        )
    alpha = (nn.AlphaDropout, nn.FeatureAlphaDropout)
    if any(isinstance(m, alpha) for m in module.modules()):
        shown = f"model '{name}'" if name else "the model"
        raise UserError(
            f"the vectorized executor cannot train {shown}: its alpha dropout's affine noise "
            f"is not a multiplicative mask it reproduces; {FALLBACK}."
        )
    if name is not None and name not in VECTORIZABLE_MODELS:
        raise UserError(
            f"the vectorized executor cannot train model '{name}': it is not one of the "
            f"models checked to hold parameters only; {FALLBACK} "
            f"(or --model {' or '.join(VECTORIZABLE_MODELS)})."
        )


def check_vectorizable(
    strategy: Strategy, module: nn.Module, model_name: str | None = None
) -> None:
    """Everything the vectorized executor refuses, checked before a run starts (any
    objective: each client's loss is its ``masked_loss``)."""
    check_strategy(strategy)
    check_model(module, model_name)


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


def stacked_starts(jobs: Sequence[ClientJob]) -> torch.Tensor:
    """The chunk's starting rows (C, P): each client's broadcast θ. When every client
    starts from the same θ_g tensor (the usual round) the rows are one expanded view of it
    rather than C copies: the first optimizer step writes new rows out of place anyway, and
    at 1000 clients of a 100k-parameter model the copy alone is 0.4 GB of memory traffic."""
    first = jobs[0].broadcast.params
    if all(job.broadcast.params is first for job in jobs):
        return first.expand(len(jobs), -1)
    return torch.stack([job.broadcast.params for job in jobs])


def pad_lock_step(
    drawn: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None],
    batch_size: int,
    augmented: bool,
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


def client_result(
    trainer: LocalTrainer,
    job: ClientJob,
    local: LocalRound,
    trained: tuple[torch.Tensor, torch.Tensor],
    finishing: bool,
    seconds: float,
) -> ClientResult:
    """Client ``job``'s result with its trained row (``trained``: the row and the client's
    loss sum) as the upload. Probes, diagnostics and (``finishing``) the components'
    ``after_local`` hooks run on the working model loaded with the row (the sequential
    code, in its order: probes, upload, diagnostics)."""
    row, loss_sum = trained
    client = job.client
    upload = Upload(client.index, row, job.broadcast.buffers, client.num_samples)
    result = ClientResult(client, upload, loss_sum, local.steps, seconds)
    if job.probes is None and job.diagnose is None and not finishing:
        return result
    trainer.model.load(row, job.broadcast.buffers)
    if job.probes is not None:
        result.probe_accuracy = trainer.score(job.probes)
    if finishing:
        result.upload = trainer.finish(client, local)
    if job.diagnose is not None:
        result.class_accuracy, result.weight_divergence = trainer.diagnose(job)
    return result


@dataclass(frozen=True)
class ChunkRound:
    """A chunk's side of the round: each component's inputs for the whole chunk
    (``lock_step.chunk_inputs``; absent: nothing on its steps this round) and the loss
    terms on the batch's outputs this round (the components overriding ``loss_term``)."""

    inputs: dict[str, ClientInputs]
    outputs: list[ChunkTerm]


class VectorizedExecutor:
    """Clients trained in lock-step, ``clients_per_chunk`` at a time (None: all at once)."""

    def __init__(
        self,
        trainer: LocalTrainer,
        clients_per_chunk: int | None = None,
        compile_step: bool = False,
    ) -> None:
        check_vectorizable(trainer.strategy, trainer.model.module)
        self.trainer = trainer
        self.sequential = SequentialExecutor(trainer)
        self.clients_per_chunk = clients_per_chunk
        self.chunks = planner_for(trainer.model.params.device, clients_per_chunk)
        # Whether any component uploads or updates client state after training (its
        # ``after_local`` needs the client's row in the working model).
        self.finishing = any(
            type(c).after_local is not Component.after_local for c in trainer.strategy.all
        )
        learner = trainer.strategy.learner
        self.plan = learner.replay_plan()
        self.grads = ClientGradients(
            trainer.model, trainer.keep_representation, self.plan, trainer.objective
        )
        self.grads.precision = trainer.precision
        if compile_step:
            self.grads.compile()
        self.scaler: LossScaler | None = None  # fp16: the chunk's clients' loss scales
        self.observes = learner.offers_batches()
        self.dropout: ChunkDropout | None = None  # the chunk being trained's dropout draws
        self.requests = BatchedRequests(trainer, self.grads, self.chunks, self.sequential)

    def train(self, jobs: Sequence[ClientJob], sink: ResultSink) -> None:
        """Train ``jobs`` chunk by chunk (``engine.vectorized_memory``: fixed sizes, or on
        CUDA sizes fitted to the memory each client was measured to need)."""
        first = 0
        while first < len(jobs):
            chunk = jobs[first : first + self.chunks.next_size(len(jobs) - first)]
            self.chunks.start()
            self._train_chunk(chunk, sink)
            self.chunks.record(len(chunk))
            first += len(chunk)

    def _train_chunk(self, jobs: Sequence[ClientJob], sink: ResultSink) -> None:
        """Train ``jobs`` in lock-step, then hand each client's row to ``sink``."""
        trainer = self.trainer
        rounds = {job.broadcast.round_index for job in jobs}
        if len(rounds) != 1:
            raise RuntimeError("a chunk of client jobs must belong to one round")
        lr = trainer.round_lr(rounds.pop())
        device = trainer.model.params.device
        trainer.model.module.train()  # as ``local_steps``: dropout active
        self.dropout = ChunkDropout(self.grads.dropout_layers, trainer.model.params.dtype, device)
        locals_, chunk = self._start(jobs)
        trainer.optimizer.lr = lr
        started = time.perf_counter()
        steps = trainer.steps
        batches = [
            ClientBatches(j.client, steps.epochs, steps.batch_size, trainer.augment, device)
            for j in jobs
        ]
        first_visit = [start_visit(job.client) for job in jobs]  # the buffer's first pass
        clients = [job.client for job in jobs]
        params = stacked_starts(jobs)
        optimizer = BatchedOptimizer(trainer.optimizer, lr, params)
        loss_sums = torch.zeros(len(jobs), device=device, dtype=params.dtype)
        if trainer.precision.scaled:
            self.scaler = LossScaler.of(clients, device)
        with torch.no_grad():
            for s in range(max((b.total for b in batches), default=0)):
                drawn = [b.next() if s < b.total else None for b in batches]
                pairs = zip(first_visit, batches, strict=True)
                offered = [offers(steps.buffer_offer, first, b.epoch) for first, b in pairs]
                params, losses = self._lock_step(
                    params, chunk, optimizer, clients, drawn, offered, s
                )
                loss_sums += losses
        if self.scaler is not None:
            self.scaler.save(clients, [b.total > 0 for b in batches])
            self.scaler = None
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        seconds = (time.perf_counter() - started) / max(len(jobs), 1)
        for i, job in enumerate(jobs):
            local = dataclasses.replace(locals_[i], steps=batches[i].total)
            self.dropout.rngs.restore(i)  # the default generator as its steps left it
            sink(
                client_result(
                    trainer, job, local, (params[i], loss_sums[i]), self.finishing, seconds
                )
            )
        if jobs:  # the working model ends where the sequential executor leaves it
            trainer.model.load(params[-1], jobs[-1].broadcast.buffers)

    def _start(self, jobs: Sequence[ClientJob]) -> tuple[list[LocalRound], ChunkRound]:
        """Each client's ``LocalTrainer.start`` (θ_g loaded, its inputs) in chunk order, with
        the round's inputs computed once, each followed by the capture of its
        default-generator state (its dropout draws start there).
        Returns the clients' local rounds and the chunk's inputs and loss terms."""
        assert self.dropout is not None
        if len({id(job.broadcast) for job in jobs}) != 1:
            raise RuntimeError("a chunk of client jobs must share one broadcast")
        trainer = self.trainer
        shared = trainer.round_inputs(jobs[0].broadcast)
        locals_ = []
        for job in jobs:
            locals_.append(trainer.start(job, shared))
            self.dropout.rngs.capture()
        inputs = {
            name: chunk_inputs(common, [local.inputs[name] for local in locals_])
            for name, common in shared.items()
            if common is not None
        }
        terms = [
            ChunkTerm(c, inputs[c.name], frozenset(inputs[c.name].keys() - shared[c.name].keys()))
            for c in trainer.loss_terms
            if c.name in inputs and type(c).loss_term is not Component.loss_term
        ]
        return locals_, ChunkRound(inputs, terms)

    def _lock_step(
        self,
        params: torch.Tensor,
        chunk: ChunkRound,
        optimizer: BatchedOptimizer,
        clients: list[ClientState],
        drawn: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None],
        offers: list[bool],
        s: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Lock-step ``s`` (0-based) in the sequential step order: loss (batch and replay),
        gradient, penalties, A-GEM's refinement, gradient transforms, optimizer step, then
        buffer insertion of the batch with its outputs before the step. Returns the
        parameters after it and each client's step loss (0 for clients that took no
        step)."""
        trainer = self.trainer
        x, y, mask, active, raw = pad_lock_step(
            drawn, trainer.steps.batch_size, trainer.augment is not None
        )
        stepping = [c if d is not None else None for c, d in zip(clients, drawn, strict=True)]
        replay_augment = trainer.augment if trainer.steps.replay_augment else None
        size = trainer.steps.buffer_batch_size
        replay = draw_replay(stepping, self.plan, size, replay_augment)
        scale = None if self.scaler is None else self.scaler.scale
        assert self.dropout is not None
        counts = [None if d is None else d[1].shape[0] for d in drawn]
        masks = self.dropout.step_masks(x, counts, replay)
        grads, losses, outputs = self.grads.gradients(
            params, x, y, mask, replay, chunk.outputs, amp=True, scale=scale, masks=masks
        )
        stepping_rows = active
        if self.scaler is not None:  # fp16: unscale; a non-finite row takes no step
            grads, finite = self.scaler.unscale(grads)
            self.scaler.update(finite, active)
            stepping_rows = active & finite
        for term in trainer.loss_terms:  # the components' own penalty functions
            inputs = chunk.inputs.get(term.name)
            penalized = None if inputs is None else term.penalty(params, grads, inputs)
            if penalized is not None:
                grads, value = penalized
                losses = losses + value
        gradients = self.dropout.with_masks(self.grads.loss_gradients, stepping)

        def buffer_gradients(clients: list[ClientState | None]) -> torch.Tensor | None:
            return self._buffer_gradients(params, clients, replay_augment)

        lock_step = LockStep(params, stepping, size, gradients, buffer_gradients)
        grads = trainer.strategy.learner.refine(grads, lock_step)
        for transform in trainer.transforms:  # the components' own transform functions
            inputs = chunk.inputs.get(transform.name)
            if inputs is not None:
                grads = transform.transform(grads, inputs, lock_step)
        every = all(d is not None for d in drawn)  # from the host: no device sync
        keep_all = every and self.scaler is None
        params = optimizer.step(params, grads, None if keep_all else stepping_rows, s + 1)
        if self.observes:
            pairs = zip(drawn, offers, strict=True)
            counts = [0 if d is None or not offer else d[1].shape[0] for d, offer in pairs]
            observe_all(trainer.strategy.learner, clients, counts, raw, y, outputs)
        return params, losses if every else torch.where(active, losses, 0.0)

    def _buffer_gradients(
        self,
        params: torch.Tensor,
        stepping: list[ClientState | None],
        augment: Callable[[torch.Tensor, torch.Generator], torch.Tensor] | None,
    ) -> torch.Tensor | None:
        """``LockStep.buffer_gradient``: each stepping client's buffer draw (its buffer's
        generator, then the replay augmentation from its generator, as sequentially) and the
        gradient of the objective's mean loss on it at the client's row (one vmapped
        backward, padded rows masked). A client with an empty buffer (or no step) gets a
        zero row; None when nobody draws anything."""
        size = self.trainer.steps.buffer_batch_size
        draw = draw_replay(stepping, BUFFER_DRAW, size, augment)
        if draw is None:
            return None
        assert self.dropout is not None
        masks = self.dropout.forward_masks(draw.x[:, 0], draw.rows)
        ref, _, _ = self.grads.gradients(
            params, draw.x[:, 0], draw.y[:, 0], draw.mask[:, 0], masks=masks
        )
        return ref

    def answer(
        self,
        request: ClientRequest,
        global_state: tuple[torch.Tensor, torch.Tensor],
        sink: AnswerSink,
    ) -> None:
        """Gradient requests batched (``vectorized_requests``), others the sequential
        executor's."""
        self.requests.answer(request, global_state, sink)

    def end_tasks(
        self, ending: list[tuple[ClientState, int]], global_state: tuple[torch.Tensor, torch.Tensor]
    ) -> None:
        self.sequential.end_tasks(ending, global_state)
