"""MFCL: data-free federated class-incremental learning with a server-trained generator
(Babakniya et al., NeurIPS 2023), as its official code runs it.

Code: SaraBabakN/MFCL-NeurIPS23 (``main.py``, ``clients/MFCL.py``, ``clients/helper.py``,
``models/generator.py``, ``utiles.py``; the paper was not read here: the code decides). The
round is FedAvg's; what MFCL adds:

- **Server, at every task end but the last** (main.py:83–89): the run's one generator is
  trained again on the frozen global model (``strategies.synthesis_mfcl``); it is the
  component's checkpointed state from the start (its seeded initialisation) on.
- **Broadcast**: the generator (its parameters and BatchNorm running statistics, float32,
  ``mfcl.generator``) goes to the clients once a task, in the rounds of task t > 0 while a
  participant has not received task t's generator, counted as bytes down. The code's
  clients share the server's object; here every client's copy would equal the server's for
  the whole task, so one copy is held and the clients that received it are listed.
- **Clients**: task 0 is CE over the task's classes (the code's head has only them); in
  task t > 0, ``train_cl``: each step generates ``syn_size`` images from the generator
  (z from the client's generator), labels them with the teacher's argmax over the old
  classes, forwards them joined to the batch (a ``joint`` replay plan) and minimises the
  new-class CE on the batch (``loss_term``), w_ft · the head's CE on every row's detached
  features ("head_ce") and w_kd · the old head's distillation of the features ("head_kd").
  The teacher is the global model the client received when it entered the task (TARGET's
  rule): the code's task-end model whenever the client takes part in the task's first
  round.

Evaluation scores the classes seen so far (the code's head grows with the tasks).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import torch
from torch import nn

from cfl_bench.core.buffer import BufferDraw
from cfl_bench.core.errors import UserError
from cfl_bench.core.flat import FlatModel
from cfl_bench.core.seeding import derive_seed
from cfl_bench.strategies import declarations
from cfl_bench.strategies.base import (
    ClientInputs,
    Declaration,
    ExtraWork,
    StrategyEnv,
    TaskEndWork,
)
from cfl_bench.strategies.declarations import MFCLOptions
from cfl_bench.strategies.replay import ReplayPlan, ReplayTerm
from cfl_bench.strategies.synthesis_mfcl import CodeGenerator, MFCLSynthesizer
from cfl_bench.strategies.synthesis_parts import to_uint8
from cfl_bench.strategies.target import TARGET, require_batchnorm

if TYPE_CHECKING:
    from cfl_bench.core.context import ClientState, LocalRound, ServerState

#: Generated images offered per task end for a person to look at (the report's grid).
SHOWN_IMAGES = 32


@dataclass
class GeneratedDraws:
    """A client's replay source in task t > 0: the code's ``Teacher.sample``. Each draw is
    G(z) of the eval-mode generator, z from the client's generator, labelled by ``label``
    (the teacher's argmax over the old classes); no stored outputs."""

    generator: CodeGenerator
    label: Callable[[torch.Tensor], torch.Tensor]
    gen: torch.Generator
    device: torch.device

    @property
    def filled(self) -> int:
        return 1

    def sample(self, m: int) -> BufferDraw:
        with torch.no_grad():
            x = self.generator.sample(m, self.gen, self.device)
            y = self.label(x)
        return BufferDraw(x, y, torch.zeros((m, 0), device=self.device), torch.zeros_like(y))


def flat_state(module: nn.Module) -> torch.Tensor:
    """The module's floating-point state (parameters and BatchNorm running statistics) as
    one float32 vector, in ``state_dict`` order: what the clients need to sample."""
    state = module.state_dict()
    return torch.cat(
        [v.detach().reshape(-1).float().cpu() for v in state.values() if v.is_floating_point()]
    )


class MFCL(TARGET):
    declaration: ClassVar[Declaration] = declarations.MFCL
    opts: MFCLOptions  # type: ignore[assignment]
    requires: ClassVar[frozenset[str]] = frozenset({"class_logits", "features"})
    random_stream: ClassVar[str] = "mfcl"
    sequential_only: ClassVar[str] = (
        "MFCL's clients draw their synthetic images from the server's generator and forward "
        "them joined to their batch"
    )
    state_attributes: ClassVar[tuple[str, ...]] = (
        "generator_state",
        "generator_task",
        "delivered",
        "shown",
        "shown_labels",
    )

    def setup(self, env: StrategyEnv) -> None:
        """TARGET's refusals and stream facts; the run's generator from its own seed."""
        self.setup_pool(env)
        if self.opts.w_ie and self.classes_per_task < 2:
            raise UserError(
                "mfcl's information-entropy term divides by log K, which is 0 with one class "
                "per task; use at least 2 classes per task or set mfcl:w_ie=0."
            )
        channels, side = self.image_shape[0], self.image_shape[1]
        gen = torch.Generator().manual_seed(derive_seed(self.seed, "mfcl-generator"))
        self.generator_state = CodeGenerator(self.opts.z_dim, channels, side, gen).state_dict()
        self.generator_task = -1
        self.shown = torch.zeros((0, *self.image_shape), dtype=torch.uint8)
        self.shown_labels = torch.zeros(0, dtype=torch.long)
        self.teacher_net: FlatModel | None = None
        self.sampler: tuple[int, CodeGenerator] | None = None
        self.sources: dict[int, GeneratedDraws] = {}

    def generator(self) -> CodeGenerator:
        """A generator module holding the current ``generator_state``."""
        channels, side = self.image_shape[0], self.image_shape[1]
        module = CodeGenerator(self.opts.z_dim, channels, side, torch.Generator())
        module.load_state_dict(self.generator_state)
        return module

    # -- server ----------------------------------------------------------------------------------
    def on_task_start(self, server: ServerState, task: int, holdout: torch.Tensor | None) -> None:
        """Refuse a model without BatchNorm before any training (the code's is ResNet-18)."""
        require_batchnorm(server.model.module, self.name, "resnet18")

    def on_round_start(self, server: ServerState) -> None:
        """The classes seen so far; a private copy of the model for the teachers' labels."""
        super().on_round_start(server)
        if self.teacher_net is None:
            self.teacher_net = FlatModel(copy.deepcopy(server.model.module))
            self.teacher_net.module.eval().requires_grad_(False)

    def broadcast(self, server: ServerState) -> dict[str, torch.Tensor]:
        """The generator in task t > 0 while a participant lacks it (``delivers``)."""
        if not self.delivers(server, self.generator_task):
            return {}
        return {f"{self.name}.generator": flat_state(self.generator())}

    def after_aggregate(self, server: ServerState) -> None:
        """At a task end but the last: train the generator on θ_g over the seen classes,
        and keep a sample of its images for the report."""
        synthesizer = self.task_end_synthesis(server)
        if synthesizer is None:
            return
        assert isinstance(synthesizer, MFCLSynthesizer)
        self.generator_state = {
            k: v.detach().cpu().clone() for k, v in synthesizer.generator.state_dict().items()
        }
        self.generator_task, self.delivered, self.sampler = server.task + 1, [], None
        seed = derive_seed(self.seed, self.random_stream, server.task)
        self.shown, self.shown_labels = self.show(synthesizer, seed)

    def synthesizer(self, model: nn.Module, seen: int, seed: int) -> MFCLSynthesizer:  # type: ignore[override]
        """The code's generator training with ``model`` as the teacher over ``seen`` classes."""
        o = self.opts
        weights = (o.w_ie, o.w_bn, o.w_noise)
        settings = (o.pi, o.server_ss, o.generator_lr, weights)
        return MFCLSynthesizer(model, self.generator(), seen, settings, seed)

    def show(self, synthesizer: MFCLSynthesizer, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``SHOWN_IMAGES`` generated images as uint8 pixels (the stream's normalisation
        undone) and the teacher's argmax labels."""
        gen = torch.Generator().manual_seed(derive_seed(seed, "shown"))
        with torch.no_grad():
            x = synthesizer.generator.eval().sample(SHOWN_IMAGES, gen, synthesizer.device)
            labels = synthesizer.teacher(x)[:, : synthesizer.known].argmax(dim=1).cpu()
        mean = torch.tensor(self.mean, device=x.device)[None, :, None, None]
        std = torch.tensor(self.std, device=x.device)[None, :, None, None]
        return to_uint8(x * std + mean), labels

    def images(self) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """The latest generator's sample, named by the task whose end trained it."""
        if self.generator_task < 1:
            return {}
        return {f"after-task-{self.generator_task}": (self.shown, self.shown_labels)}

    def extra_work(self) -> ExtraWork:
        """The generator's training at every task end but the last (``pi`` steps), and the
        ``syn_size`` generated rows every local step of a later task trains on."""
        return ExtraWork(
            task_end_server=self.synthesis_work, step_rows_after_first_task=self.opts.syn_size
        )

    def synthesis_work(self, model: nn.Module) -> TaskEndWork:
        """``pi`` units of one generator step each, on ``model`` as the teacher."""
        require_batchnorm(model, self.name, "resnet18")
        synthesizer = self.synthesizer(model, self.num_classes, self.seed)
        return ((float(self.opts.pi), synthesizer.step),)

    # -- client ----------------------------------------------------------------------------------
    def replay_plan(self) -> ReplayPlan:
        """One generated draw of ``syn_size`` rows joined to the batch; the head's CE over
        the classes seen by the task's end and the old head's distillation."""
        o, old = self.opts, max(0, self.known_classes - self.classes_per_task)
        teacher = ("teacher", "teacher_buffers")
        terms = (
            ReplayTerm(draw=0, kind="head_ce", weight=o.w_ft, outputs=self.known_classes),
            ReplayTerm(draw=0, kind="head_kd", weight=o.w_kd, outputs=old, teacher=teacher),
        )
        return ReplayPlan(draws=1, terms=terms, batch_weight=0.0, draw_size=o.syn_size, joint=True)

    def exemplar_memory(self) -> int:
        """No kept rows join a client's data: the generated rows ride along each step (the
        cost estimate does not count them; docs/methods.md says so)."""
        return 0

    def replay_source(self, client: ClientState, epoch: int) -> GeneratedDraws | None:  # type: ignore[override]
        """The client's generated draws this round (None in task 0 or before it holds the
        task's generator)."""
        return self.sources.get(client.index)

    def epoch_steps(self, client: ClientState) -> int:
        """The epochs are the task data's (no cap)."""
        return 0

    def client_inputs(self, client: ClientState, local: LocalRound) -> ClientInputs:
        """TARGET's teacher and old-class count; the generated draws once the client holds
        the task's generator."""
        inputs = super().client_inputs(client, local)
        self.sources.pop(client.index, None)
        if (
            client.task > 0
            and self.generator_task == client.task
            and client.index in self.delivered
        ):
            assert client.train_x is not None
            device = client.train_x.device
            label = self.labeller(inputs["teacher"], inputs["teacher_buffers"], client.task)
            self.sources[client.index] = GeneratedDraws(
                self.sampling_generator(device), label, client.generator, device
            )
        return inputs

    def sampling_generator(self, device: torch.device) -> CodeGenerator:
        """The current generator in eval mode on ``device``, made once per task end."""
        if self.sampler is None or self.sampler[0] != self.generator_task:
            module = self.generator().to(device).eval().requires_grad_(False)
            self.sampler = (self.generator_task, module)
        return self.sampler[1]

    def labeller(
        self, params: torch.Tensor, buffers: torch.Tensor, task: int
    ) -> Callable[[torch.Tensor], torch.Tensor]:
        """The teacher's argmax over the old classes (the code's ``Teacher.sample``)."""
        net, old = self.teacher_net, task * self.classes_per_task
        assert net is not None, "on_round_start made the teacher's copy"

        def label(x: torch.Tensor) -> torch.Tensor:
            net.load(params, buffers)
            with torch.no_grad():
                return net.module(x)[:, :old].argmax(dim=1)

        return label
