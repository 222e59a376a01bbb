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

The step order itself is not written here: each lock-step is the trainer's
``engine.step_driver.StepDriver.step`` (the sequential executor's too) on the chunk's
backend, ``engine.vectorized_step.ChunkBackend``.

Supported: every learner whose data is the current task's (fedavg, er, der, derpp, agem: a
learner states its step only by its declared plan), with every component (their client
sides are step functions); any objective (``Objective.masked_loss``); models whose
parameters are all they hold (no BatchNorm statistics), with or without dropout (not alpha
dropout: its noise is affine, not a mask). Why the refusals: BatchNorm's running
statistics are buffers updated inside the forward, which ``vmap`` over a shared module
cannot keep per client; a learner whose data grows with the task history
(``needs_history``: the joint learner) trains on the one working model.
The client spread (task-end probes)
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
from collections.abc import Sequence

import torch
from torch import nn

from cfl_bench.core.context import ClientState, LocalRound, Upload
from cfl_bench.core.errors import UserError
from cfl_bench.core.payloads import ClientRequest
from cfl_bench.engine.amp import LossScaler
from cfl_bench.engine.batches import ClientBatches, offers, start_visit
from cfl_bench.engine.client_update import ClientJob, ClientResult, LocalTrainer
from cfl_bench.engine.executor import AnswerSink, ResultSink, SequentialExecutor
from cfl_bench.engine.lock_step import chunk_inputs
from cfl_bench.engine.vectorized_dropout import ChunkDropout
from cfl_bench.engine.vectorized_grad import ChunkTerm, ClientGradients
from cfl_bench.engine.vectorized_memory import planner_for
from cfl_bench.engine.vectorized_requests import BatchedRequests
from cfl_bench.engine.vectorized_step import (
    BatchedOptimizer,
    ChunkBackend,
    ChunkRound,
    ChunkTraining,
    Drawn,
    pad_lock_step,
)
from cfl_bench.strategies.base import Learner
from cfl_bench.strategies.compose import Strategy

__all__ = [  # ``BatchedOptimizer`` and ``pad_lock_step`` live in ``vectorized_step``
    "BatchedOptimizer",
    "VectorizedExecutor",
    "check_model",
    "check_strategy",
    "check_vectorizable",
    "pad_lock_step",
]

# Models built from the catalogue that hold nothing but parameters (no BatchNorm), dropout
# allowed (``engine.vectorized_dropout``).
VECTORIZABLE_MODELS = ("centernet", "fedavg-cnn", "fot-mlp", "linear", "mlp", "mnist-cnn")
FALLBACK = "use --executor sequential"


def check_strategy(strategy: Strategy) -> None:
    """Refuse compositions the vectorized executor does not implement (one sentence each)."""
    learner = strategy.learner
    for component in strategy.all:
        if component.sequential_only:
            raise UserError(
                f"the vectorized executor cannot run '{component.name}': "
                f"{component.sequential_only}; {FALLBACK}."
            )
    if learner.needs_history:
        raise UserError(
            f"the vectorized executor runs learners declared by their replay plans, not "
            f"'{learner.name}' (its training data grows with the task history); {FALLBACK}."
        )
    if learner.replaces_batch_loss():
        raise UserError(
            f"the vectorized executor adds the objective's loss on the batch at weight 1, "
            f"which '{learner.name}' replaces with its own loss; {FALLBACK}."
        )
    own_walk = type(learner).replay_source is not Learner.replay_source
    if own_walk or type(learner).epoch_steps is not Learner.epoch_steps:
        raise UserError(
            f"the vectorized executor draws replay rows from the stacked buffers and walks "
            f"every epoch whole, not '{learner.name}''s own draws and epochs; {FALLBACK}."
        )
    if learner.keeps_exemplars:
        raise UserError(
            f"the vectorized executor trains each client on its shard, not on the exemplars "
            f"'{learner.name}' adds to it from earlier tasks; {FALLBACK}."
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


def stacked_starts(jobs: Sequence[ClientJob]) -> torch.Tensor:
    """The chunk's starting rows (C, P): each client's broadcast θ. When every client
    starts from the same θ_g tensor (the usual round) the rows are one expanded view of it
    rather than C copies: the first optimizer step writes new rows out of place anyway, and
    at 1000 clients of a 100k-parameter model the copy alone is 0.4 GB of memory traffic."""
    first = jobs[0].broadcast.params
    if all(job.broadcast.params is first for job in jobs):
        return first.expand(len(jobs), -1)
    return torch.stack([job.broadcast.params for job in jobs])


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
        self.finishing = any(c.uses_after_local for c in trainer.strategy.all)
        learner = trainer.strategy.learner
        self.plan = learner.replay_plan()
        self.grads = ClientGradients(
            trainer.model, trainer.keep_representation, self.plan, trainer.objective
        )
        self.grads.precision = trainer.precision
        if compile_step:
            self.grads.compile()
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
        params, loss_sums, totals = self._lock_steps(jobs, chunk, lr)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        seconds = (time.perf_counter() - started) / max(len(jobs), 1)
        for i, job in enumerate(jobs):
            local = dataclasses.replace(locals_[i], steps=totals[i])
            self.dropout.rngs.restore(i)  # the default generator as its steps left it
            sink(
                client_result(
                    trainer, job, local, (params[i], loss_sums[i]), self.finishing, seconds
                )
            )
        if jobs:  # the working model ends where the sequential executor leaves it
            trainer.model.load(params[-1], jobs[-1].broadcast.buffers)

    def _lock_steps(
        self, jobs: Sequence[ClientJob], chunk: ChunkRound, lr: float
    ) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
        """Every lock-step of the chunk (``_lock_step``), each client drawing its batches in
        its sequential order. Returns the trained rows (C, P), each client's loss sum and
        its step count."""
        trainer, steps = self.trainer, self.trainer.steps
        device = trainer.model.params.device
        batches = [
            ClientBatches(j.client, steps.epochs, steps.batch_size, trainer.augment, device)
            for j in jobs
        ]
        first_visit = [start_visit(job.client) for job in jobs]  # the buffer's first pass
        clients = [job.client for job in jobs]
        params = stacked_starts(jobs)
        scaler = LossScaler.of(clients, device) if trainer.precision.scaled else None
        assert self.dropout is not None
        training = ChunkTraining(
            steps,
            trainer.augment,
            trainer.strategy.learner,
            self.grads,
            self.plan,
            self.observes,
            self.dropout,
            scaler,
            chunk,
            BatchedOptimizer(trainer.optimizer, lr, params),
            clients,
        )
        loss_sums = torch.zeros(len(jobs), device=device, dtype=params.dtype)
        with torch.no_grad():
            for s in range(max((b.total for b in batches), default=0)):
                drawn = [b.next() if s < b.total else None for b in batches]
                pairs = zip(first_visit, batches, strict=True)
                offered = [offers(steps.buffer_offer, first, b.epoch) for first, b in pairs]
                params, losses = self._lock_step(params, training, drawn, offered, s)
                loss_sums += losses
        if scaler is not None:
            scaler.save(clients, [b.total > 0 for b in batches])
        return params, loss_sums, [b.total for b in batches]

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
            ChunkTerm(c, inputs[c.name], frozenset(inputs[c.name].keys() - common.keys()))
            for c in trainer.loss_terms
            if (common := shared.get(c.name)) is not None
        ]
        return locals_, ChunkRound(inputs, terms)

    def _lock_step(
        self,
        params: torch.Tensor,
        training: ChunkTraining,
        drawn: Drawn,
        offers: list[bool],
        s: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Lock-step ``s`` (0-based): the trainer's ``StepDriver.step`` on the chunk's
        backend (``vectorized_step.ChunkBackend``). Returns the parameters after it and
        each client's step loss (0 for clients that took no step)."""
        backend = ChunkBackend(training, params, drawn, offers, s)
        losses = self.trainer.driver.step(backend)
        assert backend.stepped is not None
        return backend.stepped, losses

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
