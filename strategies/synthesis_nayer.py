"""LANDER's server synthesis (its ``NAYER`` class) on the shared engine's parts.

Tran et al., CVPR 2024, code tmtuan1307/LANDER, ``methods/lander.py`` (line numbers below
are of that file; the paper was not read: the code decides). What differs from TARGET's
loop (``strategies.synthesis``), each from the code:

- the generator is :class:`~cfl_bench.strategies.synthesis_parts.LabelGenerator`: a
  requested class's label-text embedding replaces the noise z, and its chunk layers are
  redrawn at the start of every round (``re_init_le``, 337); the classes of a round are
  balanced (``generate_ys``, 436–449);
- no meta-learning: one Adam (lr_g, betas (0.5, 0.999)) made afresh each round steps the
  generator itself (343–347), with a *learnt* normalisation: the images reach the teacher
  as (aug(G(y)) − m)/s with m, s initialised to 0.5 and 0.2 per channel (316–317) and
  stepped by the same Adam at lr 0.01, kept from round to round;
- the loss (370) adds ltc · relu(MSE(att_teacher, e_y) − r), the bounding loss of the
  teacher's embeddings around the requested classes' anchors; the CE is over the seen
  classes (the code's teacher head has only those outputs); the adversarial term runs
  from round warmup + 3 on (``ep − 1 > warmup + 1``, 301 and 360);
- ``syn_round + warmup`` rounds (610); the round's lowest-loss images join the pool from
  round ``warmup`` on (397), so ``syn_round + 1`` rounds are kept; after each kept round
  the student trains ``kd_steps`` = 50 steps (``student_train``, 401–427: a fresh SGD at
  lr 0.1, momentum 0.9, weight decay 2e-4, batches of the clients' local batch size on the
  first ``nums`` pool images, cropped, flipped and normalised by the dataset's statistics)
  on KL_T(student, teacher) with T = 20 plus ltc · MSE of their embeddings.

The BatchNorm hooks, the augmentation, the uint8 pool, the sorted-name selection of
``nums`` images and the KD loop are the shared engine's. Every draw comes from one seeded
``torch.Generator`` kept in :meth:`NayerSynthesizer.state_dict`.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from cfl_bench.strategies.base import TaskEndWork
from cfl_bench.strategies.lander_loss import bounding_loss
from cfl_bench.strategies.synthesis import (
    HookedPool,
    SynthesisOptions,
    distil,
    joined_pool,
    kept_indices,
    teacher_hooks,
)
from cfl_bench.strategies.synthesis_parts import (
    LabelGenerator,
    adversarial_loss,
    balanced_targets,
    crop_flip,
    draw_crop_flip,
    kldiv,
    reinit_student,
    to_uint8,
)
from cfl_bench.strategies.synthesis_pricing import count_steps, priced

#: A model's class outputs and label-text embedding of a batch (``att`` in the code).
EmbeddingForward = Callable[[nn.Module, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


@dataclass(frozen=True)
class NayerOptions:
    """What NAYER adds to the engine's settings (lander.py and main.py lines)."""

    ltc: float = 5.0  # main.py:109: weight of the bounding loss
    radius: float = 0.015  # main.py:108: r
    nl: int = 10  # lander.py:582: rows per chunk layer of the generator
    norm_mean: float = 0.5  # 316: the learnt normalisation's initial mean
    norm_std: float = 0.2  # 317: its initial std
    norm_lr: float = 0.01  # 345–346
    image_size: int = 32  # the images' side (the run's, not an option: 580 for CIFAR-100)


def nayer_defaults(**changes: object) -> SynthesisOptions:
    """The engine's options at LANDER's code values (main.py and lander.py lines)."""
    values: dict[str, object] = {
        "synthesis_batch_size": 256,  # main.py:90
        "g_steps": 40,  # main.py:98
        "warmup": 10,  # main.py:96
        "syn_round": 40,  # main.py:97
        "lr_g": 2e-3,  # main.py:89
        "bn": 1.0,  # main.py:91
        "oh": 0.5,  # main.py:92
        "adv": 1.0,  # main.py:93
        "nz": 256,  # main.py:94 (the chunk layers' output, le_emb_size)
        "nums": 10000,  # main.py:95
        "kd_steps": 50,  # lander.py:25: student_train_step
        "sample_batch_size": 128,  # main.py:83: the KD loader's local_bs
        "temperature": 20.0,  # lander.py:24
        "bn_mmt": 0.9,  # lander.py:22
        "kd_lr": 0.1,  # lander.py:402
        "kd_weight_decay": 2e-4,  # 402
    }
    values.update(changes)
    return SynthesisOptions(**values)  # type: ignore[arg-type]


class NayerSynthesizer(HookedPool):
    """One task end's NAYER synthesis: the label generator, the hooked teacher, the KD
    student and the pool. ``forward`` splits a model's batch into class outputs and
    embeddings; ``anchors`` are the label-text embeddings, one row per class."""

    def __init__(
        self,
        teacher: nn.Module,
        anchors: torch.Tensor,
        seen: int,
        forward: EmbeddingForward,
        options: tuple[SynthesisOptions, NayerOptions],
        seed: int,
    ) -> None:
        self.options, self.nayer = options
        o, channels = self.options, len(self.options.mean)
        self.seen, self.forward = seen, forward
        self.gen = torch.Generator().manual_seed(seed)
        self.teacher = copy.deepcopy(teacher).eval()
        self.device = next(self.teacher.parameters()).device
        self.anchors = anchors.to(self.device).float()
        self.student = copy.deepcopy(teacher)
        reinit_student(self.student, self.gen, o.classifier)
        size = self.nayer.image_size
        self.generator = LabelGenerator(
            self.anchors, o.nz, o.ngf, size, channels, self.nayer.nl, o.synthesis_batch_size,
            self.gen,
        ).to(self.device)  # fmt: skip
        self.generator.train()
        self.mean = torch.full((channels,), self.nayer.norm_mean, device=self.device)
        self.std = torch.full((channels,), self.nayer.norm_std, device=self.device)
        self.hooks = teacher_hooks(self.teacher, o.bn_mmt)
        self.ep = 0
        self.images: list[torch.Tensor] = []
        self.targets: list[torch.Tensor] = []

    @property
    def rounds(self) -> int:
        """The task end's rounds: ``syn_round + warmup`` (610)."""
        return self.options.syn_round + self.options.warmup

    def run(self) -> None:
        """Every round left of the task end's schedule."""
        while self.ep < self.rounds:
            self.step()

    def step(self) -> float:
        """One round (``synthesize``): the generator's steps; from round ``warmup`` on, the
        best images join the pool and the student trains on it. Returns the kept loss."""
        o = self.options
        self.ep += 1
        self.student.eval()
        self.generator.reinit_embedding(self.gen)
        targets = balanced_targets(o.synthesis_batch_size, self.seen, self.gen).to(self.device)
        best = self.generator_steps(targets)
        if o.bn_mmt != 0:
            for hook in self.hooks:
                hook.update_mmt()
        if o.warmup <= self.ep:
            self.images.append(to_uint8(best[1]))
            self.targets.append(targets.cpu())
            self.student_round()
        return best[0]

    def price(self, schedule: SynthesisOptions) -> TaskEndWork:
        """``schedule``'s task end in steps by kind (``synthesis_pricing``), each kind's
        step timed on this synthesizer, a probe copy of one generator step and one KD step
        per round: rounds from ``warmup`` + 3 on have the adversarial term (301, 360),
        rounds from ``warmup`` on KD (397)."""
        o = schedule
        counts = count_steps(
            o.syn_round + o.warmup,
            (o.g_steps, o.kd_steps),
            adversarial=lambda ep: o.adv > 0 and ep - 1 > o.warmup + 1,
            distils=lambda ep: o.warmup <= ep,
        )
        batch = self.options.synthesis_batch_size
        targets = balanced_targets(batch, self.seen, self.gen).to(self.device)
        return priced(
            counts,
            lambda: self.steps_at(1, targets),
            lambda: self.steps_at(o.warmup + 3, targets),
            lambda: self.probe_student_round(targets),
        )

    def steps_at(self, ep: int, targets: torch.Tensor) -> tuple[float, torch.Tensor]:
        """The generator's steps as in round ``ep`` of the schedule (the probe's)."""
        self.ep = ep
        return self.generator_steps(targets)

    def probe_student_round(self, targets: torch.Tensor) -> None:
        """The student's round on the pool, made first if empty (the probe's fastest of
        three calls leaves that out)."""
        if not self.images:
            self.images.append(to_uint8(self.steps_at(1, targets)[1]))
            self.targets.append(targets.cpu())
        self.student_round()

    def generator_steps(self, targets: torch.Tensor) -> tuple[float, torch.Tensor]:
        """``g_steps`` Adam steps of the generator and the learnt normalisation; the images
        of the step with the lowest loss (before that step) and their loss."""
        o = self.options
        self.mean.requires_grad_(True)
        self.std.requires_grad_(True)
        groups: list[dict[str, object]] = [
            {"params": list(self.generator.parameters())},
            {"params": [self.mean], "lr": self.nayer.norm_lr},
            {"params": [self.std], "lr": self.nayer.norm_lr},
        ]
        optimizer = torch.optim.Adam(groups, lr=o.lr_g, betas=o.betas)
        best_cost, best = float("inf"), torch.empty(0)
        for it in range(o.g_steps):
            inputs = self.generator(targets)
            loss = self.loss(inputs, targets)
            if loss.item() < best_cost or it == 0:
                best_cost, best = loss.item(), inputs.detach()
            optimizer.zero_grad()
            loss.backward(inputs=[*self.generator.parameters(), self.mean, self.std])
            optimizer.step()
        self.mean.requires_grad_(False)
        self.std.requires_grad_(False)
        return best_cost, best

    def loss(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """bn·L_BN + oh·CE + adv·L_adv + ltc·L_bound on the augmented images (350–370)."""
        o, n = self.options, self.nayer
        offsets, flips = draw_crop_flip(inputs.shape[0], self.gen)
        augmented = crop_flip(inputs, offsets, flips)
        augmented = (augmented - self.mean[None, :, None, None]) / self.std[None, :, None, None]
        t_out, t_emb = self.forward(self.teacher, augmented)
        t_out = t_out[:, : self.seen]
        loss_bn = torch.stack([h.r_feature for h in self.hooks if h.r_feature is not None]).sum()
        loss_oh = F.cross_entropy(t_out, targets)
        loss_adv = loss_oh.new_zeros(())
        if o.adv > 0 and self.ep - 1 > o.warmup + 1:
            s_out = self.forward(self.student, augmented)[0][:, : self.seen]
            loss_adv, _ = adversarial_loss(s_out, t_out)
        loss_f = bounding_loss(t_emb, self.anchors[targets], n.radius)
        return o.bn * loss_bn + o.oh * loss_oh + o.adv * loss_adv + n.ltc * loss_f

    def student_round(self) -> list[float]:
        """``student_train``: a fresh SGD, ``kd_steps`` steps on the kept pool of
        KL_T(student, teacher) over the seen classes + ltc · MSE of the embeddings."""
        o = self.options
        images, _ = self.pool()
        kept = images[kept_indices(images.shape[0], o.synthesis_batch_size, o.nums)]
        optimizer = torch.optim.SGD(
            self.student.parameters(),
            lr=o.kd_lr,
            momentum=o.kd_momentum,
            weight_decay=o.kd_weight_decay,
        )
        for hook in self.hooks:
            hook.enabled = False
        self.student.train()
        try:
            return distil(self.student, self.teacher, kept, optimizer, o, self.gen, self.kd_loss)
        finally:
            for hook in self.hooks:
                hook.enabled = True

    def kd_loss(self, student: nn.Module, teacher: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """One KD step's loss (418–423): the teacher first, without gradient."""
        with torch.no_grad():
            t_out, t_emb = self.forward(teacher, x)
        s_out, s_emb = self.forward(student, x)
        seen = self.seen
        kd = kldiv(s_out[:, :seen], t_out[:, :seen], self.options.temperature)
        return kd + self.nayer.ltc * F.mse_loss(s_emb, t_emb)

    def pool(self) -> tuple[torch.Tensor, torch.Tensor]:
        """All kept images (N, C, H, W) as uint8 and the classes they were asked for."""
        return joined_pool(self.images, self.targets, len(self.options.mean))

    def state_dict(self) -> dict[str, object]:
        """Everything a resumed synthesis needs (its optimisers are made afresh each
        round, so they hold nothing between rounds)."""
        images, targets = self.pool()
        return {
            "ep": self.ep,
            "generator": self.generator.state_dict(),
            "norm": (self.mean.detach().clone(), self.std.detach().clone()),
            "student": self.student.state_dict(),
            "mmt": [h.mmt for h in self.hooks],
            "images": images,
            "targets": targets,
            "rng": self.gen.get_state(),
        }

    def load_state_dict(self, state: dict[str, object]) -> None:
        """Restore :meth:`state_dict`'s output into a synthesizer built with the same inputs."""
        self.ep = int(state["ep"])  # type: ignore[call-overload]
        self.generator.load_state_dict(state["generator"])  # type: ignore[arg-type]
        norm = state["norm"]
        assert isinstance(norm, tuple) and len(norm) == 2
        self.mean.copy_(norm[0])
        self.std.copy_(norm[1])
        self.student.load_state_dict(state["student"])  # type: ignore[arg-type]
        self.restore_pool(state)
