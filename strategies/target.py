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

**How the synthetic batch reaches a step (differs from the code).** The code zips its task
loader (local_bs rows) with a synthetic loader (syn_bs rows, ``get_syn_data_loader``) and
forwards the two batches separately. The suite's step forwards one batch, so the client joins
the pool to its task data (as iCaRL joins exemplars) with placeholder label 0, and a step's
rows are split by label: rows of the task's classes (≥ known) take the CE, the others the KD,
each averaged over its own rows as the code's two batches are. So (1) one forward holds
both kinds of row, and BatchNorm's batch statistics mix them; (2) an epoch runs over shard +
pool in batches of the run's batch size, while the code's epoch ends with the shorter of its
two loaders (``target_loss.steps_per_epoch``: 6 steps of 128 + 500 rows at its defaults);
(3) under ``--weighting samples`` FedAvg weights clients by shard + pool rows (``uniform`` is
the code's unweighted mean). The losses themselves are the code's. The vectorized and Flower
executors are refused (they do not build the joined data).

Evaluation scores the outputs of the classes seen so far (the code's head grows with the
tasks, so its argmax never sees a future class).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import torch
from torch import nn

from cfl_bench.core.errors import UserError
from cfl_bench.core.seeding import derive_seed
from cfl_bench.strategies import declarations
from cfl_bench.strategies.base import (
    Classifier,
    ClientInputs,
    Declaration,
    ExtraWork,
    FrozenForward,
    Learner,
    StrategyEnv,
)
from cfl_bench.strategies.declarations import TARGETOptions
from cfl_bench.strategies.replay import ReplayPlan
from cfl_bench.strategies.synthesis import SynthesisOptions, Synthesizer, kept_indices
from cfl_bench.strategies.target_loss import kd_loss, new_class_ce

if TYPE_CHECKING:
    from collections.abc import Callable

    from cfl_bench.core.context import ClientState, LocalRound, ServerState

POOL = "target.pool"


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


def require_batchnorm(model: nn.Module) -> None:
    """Refuse a model without BatchNorm2d: the synthesis matches the teacher's BatchNorm
    statistics, and without them there is nothing to invert."""
    if not any(isinstance(m, nn.BatchNorm2d) for m in model.modules()):
        raise UserError(
            "target inverts the global model's BatchNorm statistics, which this model "
            "lacks; use --model resnet32 (the code's) or another model with BatchNorm."
        )


def split_loss(
    outputs: torch.Tensor,
    teacher: torch.Tensor,
    y: torch.Tensor,
    known: int,
    classes: int,
    kd: float,
    temperature: float,
) -> torch.Tensor:
    """``_local_finetune``'s loss on a joined batch: rows labelled ≥ ``known`` (the task's
    data) take the new-class CE, the others (synthetic) kd · KD_T over the old classes; each
    part is the code's mean over its own rows, and a part without rows is 0."""
    real = y >= known
    loss = outputs.new_zeros(())
    if bool(real.any()):
        loss = loss + new_class_ce(outputs[real], y[real], known, classes)
    synthetic = ~real
    if known > 0 and bool(synthetic.any()):
        old_student, old_teacher = outputs[synthetic][:, :known], teacher[synthetic][:, :known]
        loss = loss + kd * kd_loss(old_student, old_teacher, temperature)
    return loss


class TARGET(Learner):
    declaration: ClassVar[Declaration] = declarations.TARGET
    opts: TARGETOptions
    requires: ClassVar[frozenset[str]] = frozenset({"class_logits"})
    keeps_exemplars: ClassVar[bool] = True
    assumes_stream_order: ClassVar[bool] = True
    sequential_only: ClassVar[str] = (
        "TARGET's clients train on the server's synthetic images joined to their data"
    )
    state_attributes: ClassVar[tuple[str, ...]] = ("pool", "pool_task", "delivered", "engine")

    def setup(self, env: StrategyEnv) -> None:
        """Refuse streams without classes per task; read the stream's normalisation."""
        if env.scenario != "class-il" or env.classes_per_task <= 0:
            raise UserError(
                f"target synthesises images of the classes of earlier tasks, so it needs a "
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
        self.pool_task = -1
        self.delivered: list[int] = []
        self.engine: dict[str, object] = {}

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
        require_batchnorm(server.model.module)

    def on_round_start(self, server: ServerState) -> None:
        self.known_classes = min(self.num_classes, (server.task + 1) * self.classes_per_task)

    def broadcast(self, server: ServerState) -> dict[str, torch.Tensor]:
        """The pool for task t > 0 while a participant lacks it (then every participant of
        the round receives it, and is counted)."""
        if server.task == 0 or self.pool_task != server.task:
            return {}
        missing = [c.index for c in server.participants if c.index not in self.delivered]
        if not missing:
            return {}
        self.delivered = sorted({*self.delivered, *(c.index for c in server.participants)})
        return {POOL: self.pool}

    def after_aggregate(self, server: ServerState) -> None:
        """At a task end but the last: synthesise the next task's pool from θ_g."""
        if not server.is_task_end or server.task + 1 >= self.num_tasks or not self.synthesizes:
            return
        model = server.model
        model.load(server.global_params, server.global_buffers)
        seen = min(self.num_classes, (server.task + 1) * self.classes_per_task)
        options = self.synthesis_options(classifier_name(model.module))
        seed = derive_seed(self.seed, self.random_stream, server.task)
        synthesizer = Synthesizer(model.module, seen, self.image_shape, options, seed)
        try:
            synthesizer.run()
        finally:
            synthesizer.close()
        images, _ = synthesizer.pool()
        kept = kept_indices(images.shape[0], options.synthesis_batch_size, options.nums)
        self.pool = images[kept].contiguous()
        self.pool_task, self.delivered = server.task + 1, []
        self.engine = synthesizer.state_dict()

    def extra_work(self) -> ExtraWork:
        """The synthesis at every task end but the last: ``syn_round`` rounds, one unit each."""
        return ExtraWork(task_end_server=self.synthesis_work)

    def synthesis_work(self, model: nn.Module) -> tuple[float, Callable[[], object]]:
        """``syn_round`` units of one synthesis round each, on ``model`` as the teacher."""
        require_batchnorm(model)
        options = self.synthesis_options(classifier_name(model))
        synthesizer = Synthesizer(model, self.num_classes, self.image_shape, options, self.seed)
        return float(self.opts.syn_round), synthesizer.synthesize

    def probe_copy(self) -> None:
        """The cost probe times the synthesis as ``extra_work``'s units, not in its round."""
        self.synthesizes = False

    # -- client ----------------------------------------------------------------------------------
    def replay_plan(self) -> ReplayPlan:
        """No buffer; the split loss replaces the objective's CE (synthetic rows have no
        label)."""
        return ReplayPlan(batch_weight=0.0)

    def replaces_batch_loss(self) -> bool:
        return True

    def offers_batches(self) -> bool:
        return False

    def exemplar_memory(self) -> int:
        """The pool's rows a client joins to its task data from task 1 on (the cost
        estimate's training rows): ``syn_round`` × the synthesis batch, at most ``nums``."""
        return min(self.opts.nums, self.opts.syn_round * self.opts.synthesis_batch_size)

    def local_data(
        self, client: ClientState, x: torch.Tensor, y: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The task's shard, then the pool once the client holds its task's (a resumed run)."""
        state = client.state_for(self.name)
        state["rows"] = int(y.shape[0])
        pool = state.get("pool")
        if state.get("pool_task") != client.task or not isinstance(pool, torch.Tensor):
            return x, y
        return joined(x, y, pool)

    def client_inputs(self, client: ClientState, local: LocalRound) -> ClientInputs:
        """Keep the teacher (θ_g when the client first trains in its task: the end of the
        previous task when it takes part in the task's first round, as every client does in
        the code); join a received pool to the client's data; the old classes' count (0 in
        task 0, where the teacher is unused)."""
        state = client.state_for(self.name)
        broadcast = local.broadcast
        if state.get("teacher_task") != client.task:
            state["teacher"] = broadcast.params.detach().clone()
            state["teacher_buffers"] = broadcast.buffers.detach().clone()
            state["teacher_task"] = client.task
        pool = broadcast.payloads.get(POOL)
        if pool is not None and state.get("pool_task") != client.task:
            assert client.train_x is not None and client.train_y is not None
            rows = int(state["rows"])  # type: ignore[call-overload]
            state["pool"], state["pool_task"] = pool.detach().clone(), client.task
            shard = client.train_x[:rows], client.train_y[:rows]
            client.train_x, client.train_y = joined(*shard, state["pool"])  # type: ignore[arg-type]
        return {
            "teacher": state["teacher"],
            "teacher_buffers": state["teacher_buffers"],
            "known": torch.tensor(client.task * self.classes_per_task),
        }

    def frozen_forwards(self) -> tuple[FrozenForward, ...]:
        return (FrozenForward("teacher_outputs", "teacher", "teacher_buffers"),)

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
        """The code's client loss on the joined batch (``split_loss``)."""
        known = int(values["known"])
        teacher = values["teacher_outputs"]
        o = self.opts
        return split_loss(outputs, teacher, y, known, self.classes_per_task, o.kd, o.temperature)

    def evaluation_classifier(self) -> Classifier | None:
        return self.known_outputs

    def known_outputs(self, module: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """The outputs of the classes seen so far, −∞ for the others (the code's grown head)."""
        outputs = module(x)
        unknown = torch.arange(outputs.shape[1], device=outputs.device) >= self.known_classes
        return outputs.masked_fill(unknown, float("-inf"))


def joined(
    x: torch.Tensor, y: torch.Tensor, pool: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The shard followed by the pool's images, labelled 0 (a placeholder below every task
    t > 0's classes, so ``split_loss`` takes them as synthetic rows)."""
    placeholder = torch.zeros(pool.shape[0], dtype=y.dtype, device=y.device)
    return torch.cat([x, pool.to(x.device, x.dtype)]), torch.cat([y, placeholder])
