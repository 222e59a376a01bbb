"""One client's update for one round: the unit an executor runs (the client side of
docs/architecture.md, "One round").

    (θ_g + broadcast payloads, client state, client data, step schedule, client generator)
        → (upload: parameters and declared payloads, new client state, step losses)

Why a function of explicit inputs: it is exactly what a vectorized executor batches across
clients and what a Flower ClientApp runs on another machine. It reads nothing of the server
but the ``Broadcast``; the client's state (buffer, generator, component extras) is updated
in place on the ``ClientState`` it was given, which a remote executor ships back with
``client_state_dict``. The model is a reusable working ``FlatModel`` (one copy of the
parameters for all clients): the returned upload's tensors are views of it, valid until the
next client update starts.

The local steps themselves are ``engine.step_driver.StepDriver``'s order run on this
client's ``engine.one_client.OneClientBackend``; ``LocalTrainer`` holds the pieces and
the client update around the steps (start, finish, probes), no step logic of its own.

``--amp`` (``engine.amp``): a step's loss forwards run under autocast and hand fp32 outputs
to the losses; under fp16 the loss is scaled, the flat gradient unscaled before penalties
and transforms, and a non-finite step skipped (``OneClientBackend.backward``).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from cfl_bench.core.context import Broadcast, ClientState, LocalRound, Upload
from cfl_bench.core.evaluation import EvalSet
from cfl_bench.core.flat import FlatModel
from cfl_bench.core.objective import Objective
from cfl_bench.core.seeding import seed_torch_default
from cfl_bench.engine.amp import Precision, install
from cfl_bench.engine.fused_forward import FusedForward
from cfl_bench.engine.lr_schedule import TaskLR
from cfl_bench.engine.one_client import ClientStepFunctions, OneClientBackend, local_steps
from cfl_bench.engine.optim import LocalOptimizer
from cfl_bench.engine.step_driver import StepDriver
from cfl_bench.strategies.base import ClientInputs
from cfl_bench.strategies.compose import Strategy
from cfl_bench.strategies.roles import GradientTransform, LossTerm


@dataclass(frozen=True)
class StepSchedule:
    """How a client walks its data in one round (the local part of the run's schedule)."""

    epochs: int
    batch_size: int
    buffer_batch_size: int
    buffer_offer: str
    replay_augment: bool
    # The local learning rate is multiplied by this every round (FedNTD's 0.99): round r
    # (1-based) trains with lr · lr_decay^(r−1).
    lr_decay: float = 1.0
    # ``--lr-schedule task-*``: the rate restarts at every task (LANDER's, MFCL's codes);
    # None: ``lr_decay`` over the run.
    task_lr: TaskLR | None = None
    # The run's seed: each client update reseeds torch's default generator (dropout) from
    # (seed, round, client) — ``seeding.seed_torch_default``.
    seed: int = 0
    # ``--amp``: off, bf16 or fp16 autocast of the local steps' forwards (``engine.amp``).
    amp: str = "off"
    # Join a step's batch and replay forwards into one (``engine.fused_forward``): the plan
    # sets it for models that never mix examples, on CPU, without --amp.
    fused_forwards: bool = False


@dataclass(frozen=True)
class ClientJob:
    """One client's work in a round; ``probes`` (task ends only) asks the client to score
    its local model on the seen tasks' probes before uploading (the client spread)."""

    client: ClientState
    broadcast: Broadcast
    probes: list[EvalSet] | None = None
    # ``--diagnostics``: the current task's probe, on which the client measures its local
    # model class by class (``engine.diagnostics``).
    diagnose: EvalSet | None = None


@dataclass
class ClientResult:
    """What comes back from a client update."""

    client: ClientState
    upload: Upload
    loss_sum: torch.Tensor
    steps: int
    train_seconds: float
    probe_accuracy: torch.Tensor | None = None
    # ``--diagnostics``: the local model's per-class accuracy and ‖θ_k − θ_g‖.
    class_accuracy: torch.Tensor | None = None
    weight_divergence: torch.Tensor | None = None


Augment = Callable[[torch.Tensor, torch.Generator], torch.Tensor]


@dataclass
class LocalTrainer:
    """The pieces a client update runs with: the working model and its optimiser, the
    strategy's client-side hooks, the step schedule, the stream's train augmentation (None
    when the stream has none), its objective (for the client-spread metric) and its input
    decoder (stored compact rows → model inputs)."""

    model: FlatModel
    optimizer: LocalOptimizer
    strategy: Strategy
    steps: StepSchedule
    augment: Augment | None
    objective: Objective
    # The stream's stored rows → model inputs (probes are stored compact).
    decode: Callable[[torch.Tensor], torch.Tensor] | None = None
    loss_terms: list[LossTerm] = field(init=False)
    transforms: list[GradientTransform] = field(init=False)
    base_lr: float = field(init=False)
    keep_representation: bool = field(init=False)
    precision: Precision = field(init=False)
    # The step order (``engine.step_driver``), run on one client's backend
    # (``engine.one_client.OneClientBackend``: the working model, autograd, fp16 scale).
    driver: StepDriver = field(init=False)
    backend: OneClientBackend = field(init=False)

    def __post_init__(self) -> None:
        self.base_lr = self.optimizer.lr
        self.precision = Precision(self.steps.amp, self.model.params.device.type)
        install(self.model.module, self.precision)
        self.keep_representation = any(c.wants_representation() for c in self.strategy.all)
        # Resolved once: the strategy's role lists are computed properties, and a step
        # must not sort the transform chain again.
        self.loss_terms = self.strategy.loss_terms
        self.transforms = self.strategy.transforms
        learner = self.strategy.learner
        self.driver = StepDriver(learner, self.loss_terms, self.transforms)
        functions = ClientStepFunctions(self.model)
        self.backend = OneClientBackend(
            self.model, self.optimizer, learner, self.loss_terms, functions, self.precision
        )
        if self.steps.fused_forwards and self.steps.amp == "off":
            self.backend.fused = FusedForward(self.model.module)

    def update(self, job: ClientJob) -> ClientResult:
        """The whole client update: start, local steps (timed), probes, upload."""
        local = self.start(job)
        started = time.perf_counter()
        loss_sum, steps, first_epoch = self.local_steps(job.client, local)
        local = dataclasses.replace(local, steps=steps, first_epoch_loss=first_epoch)
        if self.model.params.device.type == "cuda":
            torch.cuda.synchronize(self.model.params.device)  # once per client: honest timing
        seconds = time.perf_counter() - started
        probe_accuracy = None if job.probes is None else self.score(job.probes)
        result = ClientResult(job.client, self.finish(job.client, local), loss_sum, steps, seconds)
        result.probe_accuracy = probe_accuracy
        if job.diagnose is not None:
            result.class_accuracy, result.weight_divergence = self.diagnose(job)
        return result

    def round_inputs(self, broadcast: Broadcast) -> dict[str, ClientInputs | None]:
        """Every component's ``round_inputs`` of ``broadcast``, by component name."""
        return {c.name: c.round_inputs(broadcast) for c in self.strategy.all}

    def start(
        self, job: ClientJob, shared: dict[str, ClientInputs | None] | None = None
    ) -> LocalRound:
        """Load θ_g into the working model; each component's inputs for this client's
        round (``shared``: the round's, computed once for a chunk of clients; None: computed
        here) joined with its ``client_inputs``, in strategy order."""
        broadcast = job.broadcast
        seed_torch_default(self.steps.seed, "dropout", broadcast.round_index, job.client.index)
        self.model.load(broadcast.params, broadcast.buffers)
        self.optimizer.lr = self.round_lr(broadcast.round_index)
        local = LocalRound(self.model, broadcast, lr=self.optimizer.lr)
        shared = self.round_inputs(broadcast) if shared is None else shared
        for component in self.strategy.all:
            common = shared[component.name]
            if common is not None:
                own = component.client_inputs(job.client, local)
                local.inputs[component.name] = {**common, **own}
        return local

    def round_lr(self, round_index: int) -> float:
        """The local learning rate of 1-based round ``round_index``: lr · decay^(r−1), or
        the per-task schedule's rate (``engine.lr_schedule``)."""
        if self.steps.task_lr is not None:
            return self.steps.task_lr.lr(self.base_lr, round_index)
        return self.base_lr * self.steps.lr_decay ** max(round_index - 1, 0)

    def finish(self, client: ClientState, local: LocalRound) -> Upload:
        """The upload: the local model plus the payloads ``after_local`` hooks add."""
        model = self.model
        upload = Upload(client.index, model.params, model.buffers, client.num_samples)
        for component in self.strategy.all:
            component.after_local(client, upload, local)
        return upload

    def diagnose(self, job: ClientJob) -> tuple[torch.Tensor, torch.Tensor]:
        """The local model's per-class accuracy on ``job.diagnose`` and its distance from
        the broadcast θ_g (``engine.diagnostics``)."""
        from cfl_bench.engine.diagnostics import class_accuracy

        assert job.diagnose is not None
        probe = job.diagnose
        logits = self.objective.predict(self.model.module, probe.x, self.decode)
        divergence = torch.linalg.vector_norm(self.model.params.detach() - job.broadcast.params)
        return class_accuracy(logits, probe.y, int(logits.shape[1])), divergence

    def score(self, probes: list[EvalSet]) -> torch.Tensor:
        """Mean headline metric (accuracy) of the local model over ``probes`` (one per seen
        task)."""
        module, objective = self.model.module, self.objective
        headline = objective.metrics[0]
        scores = [
            objective.score(objective.predict(module, p.x, self.decode), p.y, p.classes)[headline]
            for p in probes
        ]
        return torch.stack(scores).mean()

    def local_steps(
        self, client: ClientState, local: LocalRound
    ) -> tuple[torch.Tensor, int, torch.Tensor]:
        """The client's epochs over its data (``engine.one_client.local_steps``: each batch
        one ``StepDriver.step`` on this client's backend); returns the summed loss, the
        step count and the first epoch's summed loss."""
        return local_steps(self, client, local)
