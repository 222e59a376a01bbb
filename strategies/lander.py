"""LANDER: federated class-incremental learning with label-text-embedding anchors and
server-side data-free synthesis (Tran et al., CVPR 2024), as its official code runs it.

Code: tmtuan1307/LANDER, ``methods/lander.py`` (line numbers below are of that file); the
paper was not read here: the code decides. LANDER is TARGET's code base with three
changes, so the component is TARGET's (``strategies.target``: the pool broadcast once a
task as uint8, kept by each client, walked by its generator, the teacher kept when the
client enters a task, the engine's state checkpointed) with these:

- **The model** gets the code's ``mapping`` head into the anchors' space
  (``strategies.lander_model``; ``wrap_model``), trained and averaged with the network.
- **Server, at every task end but the last** (``incremental_train``, 708–713): NAYER's
  synthesis (``strategies.synthesis_nayer``): a generator conditioned on the anchors,
  ``syn_round + warmup`` rounds, the student distilled on the pool with its embeddings.
- **Clients** (``strategies.lander_loss``): task 0 is CE + ltc · the bounding loss of the
  embeddings around the labels' anchors (``_local_update``, 775–803); in task t > 0
  (``_local_finetune``, 805–873) w_cur · (the new-class CE + ltc · bound) on the task batch
  (the ``loss_term``) plus w_pre · (KD_τ over the old classes + the MSE of the embeddings
  against the old model's) on a synthetic batch (a "kd" replay term reading the
  representation too). The synthetic batch is ``syn_bs`` × the local batch size (633), and
  its loader is one ``DataIter`` for the client's whole round (816, 831): the walk goes on
  across epochs and reshuffles when a pass is through, and the epochs are the task data's
  (no cap, unlike TARGET's zip).

What differs from the code, on purpose: the anchors (``strategies.lander_anchors``: MiniLM
on the class names by default, the code's CLIP vectors from a user's file); the draws'
randomness is the suite's generators; the synthetic images get the stream's replay
augmentation (the code's ``train_transform``, the same crop and flip on CIFAR).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, ClassVar

import torch
from torch import nn

from cfl_bench.core.errors import UserError
from cfl_bench.core.seeding import derive_seed
from cfl_bench.strategies import declarations
from cfl_bench.strategies.base import ClientInputs, Declaration, StrategyEnv, TaskEndWork
from cfl_bench.strategies.declarations import LANDEROptions
from cfl_bench.strategies.lander_anchors import load_anchors
from cfl_bench.strategies.lander_best import LOSS, LowestLossStart
from cfl_bench.strategies.lander_loss import current_task_loss, synthetic_batch, task_weights
from cfl_bench.strategies.lander_model import (
    EmbeddingModel,
    feature_width,
    outputs_and_embedding,
)
from cfl_bench.strategies.replay import ReplayPlan, ReplayTerm
from cfl_bench.strategies.synthesis import SynthesisOptions
from cfl_bench.strategies.synthesis_nayer import NayerOptions, NayerSynthesizer, nayer_defaults
from cfl_bench.strategies.target import TARGET, classifier_name, require_batchnorm

if TYPE_CHECKING:
    from cfl_bench.core.context import ClientState, LocalRound, ServerState, Upload


class LANDER(TARGET):
    declaration: ClassVar[Declaration] = declarations.LANDER
    opts: LANDEROptions  # type: ignore[assignment]
    requires: ClassVar[frozenset[str]] = frozenset({"class_logits", "features"})
    random_stream: ClassVar[str] = "lander"
    sequential_only: ClassVar[str] = (
        "LANDER's clients draw the server's synthetic images from their own pool"
    )
    cycles_pool: ClassVar[bool] = True
    # best_model: each client uploads its first epoch's summed loss after its local steps.
    uses_after_local: ClassVar[bool] = True

    def setup(self, env: StrategyEnv) -> None:
        """TARGET's set-up, the code's synthetic batch (syn_bs local batches), the KD
        student's batch (the local batch size, lander.py:432) and the anchors."""
        self.setup_pool(env)
        self.syn_bs = synthetic_batch(self.opts.syn_bs, env.batch_size)
        self.kd_batch = env.batch_size
        self.anchors = load_anchors(
            self.opts.anchors,
            env.stream_name,
            env.num_classes,
            env.encode_texts,
            env.class_order,
        )
        self.feature_width = 0
        self.best = LowestLossStart()

    def wrap_model(self, model: nn.Module) -> nn.Module:
        """The run's model with the code's ``mapping`` head into the anchors' space."""
        if not hasattr(model, "representation"):
            raise UserError(
                "lander maps the features the classifier reads into the anchors' space, and "
                "this model does not expose them; use --model resnet18 or resnet32"
            )
        self.feature_width = feature_width(model)
        gen = torch.Generator().manual_seed(derive_seed(self.seed, "lander-mapping"))
        return EmbeddingModel(model, self.feature_width, int(self.anchors.shape[1]), gen)

    def wants_representation(self) -> bool:
        return True

    # -- server ----------------------------------------------------------------------------------
    def synthesizer(self, model: nn.Module, seen: int, seed: int) -> NayerSynthesizer:
        """NAYER's synthesis of the ``seen`` classes with ``model`` (an
        ``EmbeddingModel``) as the teacher, at the code's settings and these options."""
        options, nayer = self.nayer_options(model)
        return NayerSynthesizer(
            model, self.anchors, seen, outputs_and_embedding, (options, nayer), seed
        )

    def nayer_options(self, model: nn.Module) -> tuple[SynthesisOptions, NayerOptions]:
        """The engine's and NAYER's settings: the code's values and these options."""
        assert isinstance(model, EmbeddingModel), "lander's model carries its embedding head"
        o = self.opts
        options = nayer_defaults(
            synthesis_batch_size=o.synthesis_batch_size,
            g_steps=o.g_steps,
            warmup=o.warmup,
            syn_round=o.syn_round,
            nums=o.nums,
            kd_steps=o.kd_steps,
            sample_batch_size=self.kd_batch,
            mean=self.mean,
            std=self.std,
            classifier="base." + classifier_name(model.base),
        )
        return options, NayerOptions(ltc=o.ltc, radius=o.r, image_size=self.image_shape[1])

    def synthesis_work(self, model: nn.Module) -> TaskEndWork:
        """The task end's ``syn_round + warmup`` NAYER rounds in steps by kind
        (``NayerSynthesizer.price``: a probe copy of one step per round times each kind)."""
        require_batchnorm(model, self.name)
        options, nayer = self.nayer_options(model)
        probe = (dataclasses.replace(options, g_steps=1, kd_steps=1), nayer)
        synthesizer = NayerSynthesizer(
            model, self.anchors, self.num_classes, outputs_and_embedding, probe, self.seed
        )
        return synthesizer.price(options)

    def exemplar_memory(self) -> int:
        """The pool's rows (``syn_round + 1`` kept rounds, at most ``nums``), as TARGET's
        estimate counts them (the clients draw one synthetic batch per data batch)."""
        o = self.opts
        return min(o.nums, (o.syn_round + 1) * o.synthesis_batch_size)

    # -- client ----------------------------------------------------------------------------------
    def replay_plan(self) -> ReplayPlan:
        """One synthetic batch per step: w_pre · (KD_τ over the old classes + the
        embeddings' MSE against the teacher); the loss term replaces the batch loss."""
        o = self.opts
        old = max(0, self.known_classes - self.classes_per_task)
        pre = task_weights(old, self.known_classes, o.cur, o.pre)[1] if old else 0.0
        distil = ReplayTerm(
            draw=0,
            kind="kd",
            weight=pre,
            temperature=o.tau,
            outputs=old,
            teacher=("teacher", "teacher_buffers"),
            features_from=self.feature_width,
        )
        return ReplayPlan(draws=1, terms=(distil,), batch_weight=0.0, draw_size=self.syn_bs)

    # -- the code's best_model (strategies.lander_best) -------------------------------------------
    def after_local(self, client: ClientState, upload: Upload, local: LocalRound) -> None:
        """Upload the first local epoch's summed loss (the code's ``total_loss``)."""
        if self.opts.best_model:
            assert local.first_epoch_loss is not None, "the sequential executor sums it"
            upload.extras[LOSS] = local.first_epoch_loss.detach().reshape(1)

    def receive_upload(self, upload: Upload, server: ServerState) -> None:
        loss = upload.extras.get(LOSS)
        if loss is not None:
            self.best.add(loss, server)

    def after_aggregate(self, server: ServerState) -> None:
        """The task's lowest-loss round start into θ_g at its end, then the synthesis."""
        if self.opts.best_model:
            self.best.close_round(server)
        super().after_aggregate(server)

    def state_dict(self) -> dict[str, object]:
        return {**super().state_dict(), "best": self.best.state()}

    def load_state_dict(self, state: dict[str, object]) -> None:
        super().load_state_dict(state)
        self.best.load(state["best"])  # type: ignore[arg-type]

    def epoch_steps(self, client: ClientState) -> int:
        """Uncapped: the code's epochs walk the task data; the pool's walk cycles."""
        return 0

    def client_inputs(self, client: ClientState, local: LocalRound) -> ClientInputs:
        """TARGET's (teacher, pool walk, old classes) plus the anchors and w_cur (1 in task
        0, whose loss is unweighted)."""
        inputs = super().client_inputs(client, local)
        known = client.task * self.classes_per_task
        cur = 1.0
        if known:
            total = known + self.classes_per_task
            cur = task_weights(known, total, self.opts.cur, self.opts.pre)[0]
        assert client.train_x is not None
        device = client.train_x.device
        inputs["anchors"] = self.anchors.to(device)
        inputs["cur"] = torch.tensor(cur, device=device)
        return inputs

    def term_inputs(self) -> tuple[str, ...]:
        return ("known", "anchors", "cur")

    def loss_term(
        self,
        outputs: torch.Tensor,
        representation: torch.Tensor | None,
        y: torch.Tensor,
        mask: torch.Tensor | None,
        values: dict[str, torch.Tensor],
    ) -> torch.Tensor:
        """w_cur · (the new-class CE + ltc · the bounding loss) on the task batch."""
        assert representation is not None, "lander asks for the batch's representation"
        embedding = representation[:, self.feature_width :]
        known = int(values["known"])
        loss = current_task_loss(
            outputs, embedding, y, values["anchors"], known, self.classes_per_task,
            self.opts.ltc, self.opts.r,
        )  # fmt: skip
        return values["cur"] * loss
