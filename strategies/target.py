"""TARGET: federated class-incremental learning without stored data, through server-side
synthesis of the old classes (Zhang et al., ICCV 2023), as its official code runs it.

Code: zj-jayzhang/Federated-Class-Continual-Learning, ``methods/target.py`` (line numbers
below are of that file). The round of task t is FedAvg's; what TARGET adds:

- **Server, at every task end but the last** (``incremental_train``, 672–673, after the
  task's last aggregation): the engine of ``strategies.synthesis`` inverts the global model
  (the teacher) into a generator and makes the synthetic pool of the classes seen so far
  (``data_generation``, 574–614). The pool is the component's checkpointed state, with the
  engine's state (generator, optimisers, hooks' momentum, random stream), so a run killed
  after the synthesis resumes to the same records.
- **Broadcast**: the pool travels to the clients as uint8 images (``target.pool``), once a
  task: in the rounds of task t > 0 while a participant has not received task t's pool
  (every client takes part in every round in the code, so once a task), counted as bytes
  down. Each client keeps its copy in its state (the checkpoint holds one per client).
  Labels do not travel: the code's synthetic loader is unlabelled.
- **Clients**: task 0 is CE (``_local_update``); in task t > 0 the loss of
  ``_local_finetune`` (``strategies.target_loss.finetune_loss``): CE over the task's own
  classes on its data, plus kd · KD_T of the old model (the global model the client received
  when it entered task t, kept as the teacher: nothing extra travels) on synthetic images,
  over the old classes.

**How a client step runs (the code's, ``_local_finetune`` 691–723).** The new-class CE on
the task batch is the component's ``loss_term`` (it replaces the objective's loss); the
synthetic batch is the learner's replay draw (``replay_plan``): one draw of syn_bs images per
step (``target_loss.synthetic_batch_size``: 500 at the code's defaults) from a walk over the
client's pool (``PoolWalk``: a fresh permutation each epoch, as the code's shuffled loader
restarted by its zip), its own forward of the working model in training mode (BatchNorm sees
the synthetic batch apart from the real one, as in the code), and a "kd" term: the teacher's
outputs on the same augmented draw, distilled over the old classes at T with weight kd. The
epoch ends with the shorter of the two loaders (``epoch_steps``: min(⌈n_k/128⌉,
⌈pool/syn_bs⌉) steps). What still differs: the draws' randomness is the suite's generators,
not the code's; the synthetic images get the stream's replay augmentation (the code's
``train_transform``: the same random crop with 4 pixels of padding and horizontal flip on
CIFAR); under ``--weighting samples`` FedAvg weights clients by their shard rows
(``uniform`` is the code's unweighted mean). The vectorized and Flower executors are refused
(the pool walk and the capped epochs are the sequential executor's).

Evaluation scores the outputs of the classes seen so far (the code's head grows with the
tasks, so its argmax never sees a future class).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Protocol

import torch
from torch import nn

from cfl_bench.core.buffer import BufferDraw
from cfl_bench.core.errors import UserError
from cfl_bench.core.seeding import derive_seed
from cfl_bench.strategies import declarations
from cfl_bench.strategies.base import (
    Classifier,
    ClientInputs,
    Declaration,
    ExtraWork,
    Learner,
    StrategyEnv,
    TaskEndWork,
)
from cfl_bench.strategies.declarations import TARGETOptions
from cfl_bench.strategies.replay import ReplayPlan, ReplayTerm
from cfl_bench.strategies.synthesis import SynthesisOptions, Synthesizer, kept_indices, price
from cfl_bench.strategies.target_loss import new_class_ce, synthetic_batch_size

if TYPE_CHECKING:
    from cfl_bench.core.context import ClientState, LocalRound, ServerState

#: ``get_syn_data_loader``'s dataset_size for CIFAR-100 (target.py:617–618), a constant of
#: the code whatever the run's data; CIFAR-10's training split has as many images.
CODE_DATASET_SIZE = 50_000


@dataclass
class PoolWalk:
    """The code's synthetic loader over one client's pool in one round: a ``DataLoader``
    with ``shuffle=True`` that the code's zip starts afresh every epoch, so each epoch walks
    a new permutation in consecutive batches (the last one short). The permutation comes
    from the client's generator. The draws carry no labels (the code's loader is
    unlabelled): label 0 and no stored outputs, which the "kd" term does not read."""

    images: torch.Tensor
    decode: Callable[[torch.Tensor], torch.Tensor]
    generator: torch.Generator
    device: torch.device
    epoch: int = -1
    order: torch.Tensor | None = None
    start: int = 0
    # LANDER's walk: one ``DataIter`` over the pool for the client's whole round, which
    # reshuffles when a pass is through, not at each epoch (and never runs dry).
    cycle: bool = False

    @property
    def filled(self) -> int:
        return int(self.images.shape[0])

    def at(self, epoch: int) -> PoolWalk:
        """The walk positioned in ``epoch``: a new permutation when the epoch is new (a
        cycling walk: only at its first epoch)."""
        if epoch != self.epoch and not (self.cycle and self.order is not None):
            self.reshuffle()
        self.epoch = epoch
        return self

    def reshuffle(self) -> None:
        """A new permutation of the pool from the client's generator, walked from its start."""
        gen_device = self.generator.device
        self.order = torch.randperm(self.filled, generator=self.generator, device=gen_device)
        self.start = 0

    def sample(self, m: int) -> BufferDraw | None:
        """The epoch's next batch of at most m images (None once the epoch's walk is
        through: the step's epoch cap keeps it from happening)."""
        assert self.order is not None, "a walk is positioned with at() before it is drawn"
        if self.cycle and self.start >= self.filled:
            self.reshuffle()
        rows = self.order[self.start : self.start + m]
        self.start += m
        if rows.numel() == 0:
            return None
        x = self.decode(self.images[rows.to(self.images.device)].to(self.device))
        n = int(rows.numel())
        zeros = torch.zeros(n, dtype=torch.long, device=self.device)
        return BufferDraw(x, zeros, torch.zeros((n, 0), device=self.device), zeros)


class TaskSynthesis(Protocol):
    """One task end's synthesis as the learner drives it (TARGET's ``Synthesizer``,
    LANDER's ``NayerSynthesizer``)."""

    options: SynthesisOptions

    def run(self) -> None: ...

    def close(self) -> None: ...

    def pool(self) -> tuple[torch.Tensor, torch.Tensor]: ...

    def state_dict(self) -> dict[str, object]: ...


def stream_normalisation(env: StrategyEnv) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """The mean and std the stream normalises its images with, read off its
    ``public_inputs`` at pixel values 0 and 255 (x ↦ (x/255 − mean)/std): the generator's
    images must reach the teacher as the clients' data does. (0, 1) per channel for a
    stream that only scales."""
    channels = int(env.input_shape[0])
    if env.public_inputs is None:
        return (0.0,) * channels, (1.0,) * channels
    shape = (1, *env.input_shape)
    low = env.public_inputs(torch.zeros(shape, dtype=torch.uint8))[0, :, 0, 0].double()
    high = env.public_inputs(torch.full(shape, 255, dtype=torch.uint8))[0, :, 0, 0].double()
    std = 1.0 / (high - low)
    mean = -low * std
    return tuple(mean.tolist()), tuple(std.tolist())


def classifier_name(model: nn.Module) -> str:
    """The model's last Linear layer: the classifier the code's ``weight_init`` leaves alone
    on the KD student (PyCIL's ``SimpleLinear``)."""
    names = [name for name, m in model.named_modules() if isinstance(m, nn.Linear)]
    return names[-1] if names else ""


def require_batchnorm(model: nn.Module, name: str = "target", code_model: str = "resnet32") -> None:
    """Refuse a model without BatchNorm2d: the synthesis matches the teacher's BatchNorm
    statistics, and without them there is nothing to invert."""
    if not any(isinstance(m, nn.BatchNorm2d) for m in model.modules()):
        raise UserError(
            f"{name} inverts the global model's BatchNorm statistics, which this model "
            f"lacks; use --model {code_model} (the code's) or another model with BatchNorm."
        )


class PoolServer(Learner):
    """The server side TARGET, LANDER and MFCL share: the stream checks, the synthesis at
    every task end but the last (``synthesizer``, overridden per method), its pool and
    engine state (checkpointed), the pool's delivery once a task, its image grid and its
    price in the cost estimate. Why a class of its own: the clients' side (``TARGET``)
    differs per method, this does not."""

    opts: TARGETOptions
    requires: ClassVar[frozenset[str]] = frozenset({"class_logits"})
    assumes_stream_order: ClassVar[bool] = True
    state_attributes: ClassVar[tuple[str, ...]] = (
        "pool",
        "pool_labels",
        "pool_task",
        "delivered",
        "engine",
    )
    # Whether a client's walk over its pool runs through its whole round (LANDER's DataIter)
    # rather than anew each epoch (TARGET's loader restarted by its zip).
    cycles_pool: ClassVar[bool] = False

    def setup_pool(self, env: StrategyEnv) -> None:
        """Refuse streams without classes per task; read the stream's normalisation; an
        empty pool (what TARGET and LANDER share)."""
        if env.scenario != "class-il" or env.classes_per_task <= 0:
            raise UserError(
                f"{self.name} synthesises images of the classes of earlier tasks, so it needs a "
                f"class-incremental stream (seq-cifar10, seq-cifar100), not "
                f"{env.stream_name!r} ({env.scenario})."
            )
        self.num_classes, self.num_tasks = env.num_classes, env.num_tasks
        self.classes_per_task, self.seed = env.classes_per_task, env.seed
        channels, height, width = (int(size) for size in env.input_shape[:3])
        self.image_shape = (channels, height, width)
        self.mean, self.std = stream_normalisation(env)
        self.known_classes = self.classes_per_task
        self.synthesizes = True
        # The latest task end's pool (uint8, the images the clients read), the task it is
        # for, the clients that received it, and the engine's state that made it.
        self.pool = torch.zeros((0, *self.image_shape), dtype=torch.uint8)
        # The classes the synthesis asked for, per pool image (the report's grid; the
        # clients' loader is unlabelled and never reads them).
        self.pool_labels = torch.zeros(0, dtype=torch.long)
        self.pool_task = -1
        self.delivered: list[int] = []
        self.engine: dict[str, object] = {}
        # This round's walk over each training client's pool (rebuilt every round from the
        # client's kept pool, so it is not state).
        self.walks: dict[int, PoolWalk] = {}

    def synthesis_options(self, classifier: str) -> SynthesisOptions:
        o = self.opts
        return SynthesisOptions(
            synthesis_batch_size=o.synthesis_batch_size,
            g_steps=o.g_steps,
            warmup=o.warmup,
            kd_steps=o.kd_steps,
            syn_round=o.syn_round,
            nums=o.nums,
            mean=self.mean,
            std=self.std,
            classifier=classifier,
        )

    # -- server ----------------------------------------------------------------------------------
    def on_task_start(self, server: ServerState, task: int, holdout: torch.Tensor | None) -> None:
        """Refuse a model without BatchNorm before any training (``require_batchnorm``)."""
        require_batchnorm(server.model.module, self.name)

    def on_round_start(self, server: ServerState) -> None:
        self.known_classes = min(self.num_classes, (server.task + 1) * self.classes_per_task)

    def broadcast(self, server: ServerState) -> dict[str, torch.Tensor]:
        """The pool for task t > 0 while a participant lacks it (``delivers``)."""
        if not self.delivers(server, self.pool_task):
            return {}
        return {f"{self.name}.pool": self.pool}

    def delivers(self, server: ServerState, made_for: int) -> bool:
        """Whether this round's broadcast carries the server's task-end payload (made for
        task ``made_for``): in task t > 0 once it is made for t, while a participant lacks it;
        then every participant of the round receives it (and is counted) and is listed."""
        if server.task == 0 or made_for != server.task:
            return False
        missing = [c.index for c in server.participants if c.index not in self.delivered]
        if not missing:
            return False
        self.delivered = sorted({*self.delivered, *(c.index for c in server.participants)})
        return True

    def task_end_synthesis(self, server: ServerState) -> TaskSynthesis | None:
        """At a task end but the last (unless on the cost probe's copy): the synthesis on θ_g
        over the classes seen, run and closed; None at any other time."""
        if not server.is_task_end or server.task + 1 >= self.num_tasks or not self.synthesizes:
            return None
        model = server.model
        model.load(server.global_params, server.global_buffers)
        seen = min(self.num_classes, (server.task + 1) * self.classes_per_task)
        seed = derive_seed(self.seed, self.random_stream, server.task)
        synthesizer = self.synthesizer(model.module, seen, seed)
        try:
            synthesizer.run()
        finally:
            synthesizer.close()
        return synthesizer

    def after_aggregate(self, server: ServerState) -> None:
        """At a task end but the last: synthesise the next task's pool from θ_g."""
        synthesizer = self.task_end_synthesis(server)
        if synthesizer is None:
            return
        images, labels = synthesizer.pool()
        o = synthesizer.options
        kept = kept_indices(images.shape[0], o.synthesis_batch_size, o.nums)
        self.pool = images[kept].contiguous()
        self.pool_labels = labels[kept].contiguous()
        self.pool_task, self.delivered = server.task + 1, []
        self.engine = synthesizer.state_dict()

    def images(self) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """The latest pool, named by the task whose end made it (``after-task-<t>``, 1-based)."""
        if self.pool_task < 1:
            return {}
        return {f"after-task-{self.pool_task}": (self.pool, self.pool_labels)}

    def synthesizer(self, model: nn.Module, seen: int, seed: int) -> TaskSynthesis:
        """TARGET's synthesis of the ``seen`` classes with ``model`` as the teacher."""
        options = self.synthesis_options(classifier_name(model))
        return Synthesizer(model, seen, self.image_shape, options, seed)

    def extra_work(self) -> ExtraWork:
        """The synthesis at every task end but the last: ``syn_round`` rounds, one unit each."""
        return ExtraWork(task_end_server=self.synthesis_work)

    def synthesis_work(self, model: nn.Module) -> TaskEndWork:
        """The task end's generator and KD steps by kind, on ``model`` as the teacher
        (``synthesis.price``: a probe copy of one step per round times each kind)."""
        require_batchnorm(model, self.name)
        options = self.synthesis_options(classifier_name(model))
        probe = dataclasses.replace(options, g_steps=1, kd_steps=1)
        synthesizer = Synthesizer(model, self.num_classes, self.image_shape, probe, self.seed)
        return price(synthesizer, options)

    def probe_copy(self) -> None:
        """The cost probe times the synthesis as ``extra_work``'s units, not in its round."""
        self.synthesizes = False


class TARGET(PoolServer):
    declaration: ClassVar[Declaration] = declarations.TARGET
    sequential_only: ClassVar[str] = (
        "TARGET's clients draw the server's synthetic images from their own pool and end "
        "their epochs with it"
    )

    def setup(self, env: StrategyEnv) -> None:
        """The shared set-up (``setup_pool``), then the code's synthetic batch."""
        self.setup_pool(env)
        self.syn_bs = self.opts.synthetic_batch or synthetic_batch_size(
            self.opts.nums,
            CODE_DATASET_SIZE,
            max(1, env.num_clients),
            env.num_tasks,
            env.batch_size,
        )
        if self.syn_bs <= 0:
            raise UserError(
                f"target's synthetic batch ⌊nums / ⌈50000 / (clients · tasks · batch size)⌉⌋ "
                f"is 0 for nums={self.opts.nums}; raise nums or set target:synthetic_batch=N."
            )

    # -- client ----------------------------------------------------------------------------------
    def replay_plan(self) -> ReplayPlan:
        """One draw of the code's synthetic batch from the pool per step, distilled from
        the teacher over the old classes (weight kd, temperature T); the new-class CE
        (``loss_term``) replaces the objective's loss on the batch."""
        o = self.opts
        old = max(0, self.known_classes - self.classes_per_task)
        distil = ReplayTerm(
            draw=0,
            kind="kd",
            weight=o.kd,
            temperature=o.temperature,
            outputs=old,
            teacher=("teacher", "teacher_buffers"),
        )
        return ReplayPlan(draws=1, terms=(distil,), batch_weight=0.0, draw_size=self.syn_bs)

    def replaces_batch_loss(self) -> bool:
        return True

    def offers_batches(self) -> bool:
        return False

    def exemplar_memory(self) -> int:
        """The synthetic rows a client forwards per epoch from task 1 on, counted as
        training rows by the cost estimate: about the pool, ``syn_round`` × the synthesis
        batch, at most ``nums`` (an over-count where the client's data ends its epoch
        first; the teacher's forwards are not counted)."""
        return min(self.opts.nums, self.opts.syn_round * self.opts.synthesis_batch_size)

    def replay_source(self, client: ClientState, epoch: int) -> PoolWalk | None:
        """The client's walk over its pool this round, reshuffled at each new epoch."""
        walk = self.walks.get(client.index)
        return None if walk is None else walk.at(epoch)

    def epoch_steps(self, client: ClientState) -> int:
        """The code zips the task loader with the synthetic one (``target_loss.
        steps_per_epoch``): an epoch ends with the shorter; uncapped without a pool."""
        walk = self.walks.get(client.index)
        if walk is None:
            return 0
        return math.ceil(walk.filled / self.syn_bs)

    def client_inputs(self, client: ClientState, local: LocalRound) -> ClientInputs:
        """Keep the teacher (θ_g when the client first trains in its task: the end of the
        previous task when it takes part in the task's first round, as every client does in
        the code); keep a received pool and start this round's walk over it; the old
        classes' count (0 in task 0, where the teacher is unused)."""
        state = client.state_for(self.name)
        broadcast = local.broadcast
        if state.get("teacher_task") != client.task:
            state["teacher"] = broadcast.params.detach().clone()
            state["teacher_buffers"] = broadcast.buffers.detach().clone()
            state["teacher_task"] = client.task
        pool = broadcast.payloads.get(f"{self.name}.pool")
        if pool is not None and state.get("pool_task") != client.task:
            state["pool"], state["pool_task"] = pool.detach().clone(), client.task
        self.walks.pop(client.index, None)
        held = state.get("pool")
        if state.get("pool_task") == client.task and isinstance(held, torch.Tensor):
            assert client.train_x is not None
            device = client.train_x.device
            self.walks[client.index] = PoolWalk(
                held, client.decode, client.generator, device, cycle=self.cycles_pool
            )
        return {
            "teacher": state["teacher"],
            "teacher_buffers": state["teacher_buffers"],
            "known": torch.tensor(client.task * self.classes_per_task),
        }

    def term_inputs(self) -> tuple[str, ...]:
        return ("known",)

    def loss_term(
        self,
        outputs: torch.Tensor,
        representation: torch.Tensor | None,
        y: torch.Tensor,
        mask: torch.Tensor | None,
        values: dict[str, torch.Tensor],
    ) -> torch.Tensor:
        """The code's CE on the task batch over the task's own outputs (``new_class_ce``);
        the distillation is the replay plan's "kd" term on the synthetic draw."""
        return new_class_ce(outputs, y, int(values["known"]), self.classes_per_task)

    def evaluation_classifier(self) -> Classifier | None:
        return self.known_outputs

    def known_outputs(self, module: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """The outputs of the classes seen so far, −∞ for the others (the code's grown head)."""
        outputs = module(x)
        unknown = torch.arange(outputs.shape[1], device=outputs.device) >= self.known_classes
        return outputs.masked_fill(unknown, float("-inf"))
