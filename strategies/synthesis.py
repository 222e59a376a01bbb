"""The server-side data-free synthesis engine shared by TARGET, LANDER and MFCL: TARGET's
``GlobalSynthesizer`` and the KD student around it, as its official code runs them.

Zhang et al., ICCV 2023, code zj-jayzhang/Federated-Class-Continual-Learning,
``methods/target.py`` (line numbers below are of that file). After a task, the server
inverts the frozen global model (the *teacher*) into a generator, with no client data:

- one synthesis round (``synthesize``, 390–465): a fresh z ~ N(0, I) and requested classes
  y ~ U{0..C−1}; a *fast* copy of the generator takes ``g_steps`` Adam steps (lr_g for its
  weights, lr_z for z, betas (0.5, 0.999)) on
  ``bn·L_BN + oh·CE(teacher(aug(G(z))), y) + adv·L_adv`` (L_BN: the BatchNorm hooks of
  ``synthesis_parts.BNStatHook``; L_adv: ``synthesis_parts.adversarial_loss`` against the
  student, only from round ``warmup`` on); the images of the step with the lowest loss join
  the pool. The meta-generator learns from the fast copy: with ``is_maml`` (the code's
  CIFAR-100 setting) by first-order MAML — the sum of the fast copy's gradients over the
  round, one Adam step (lr lr_g·g_steps) at the round's last step; otherwise by Reptile
  (67·(θ − θ_fast), one step after the round). After the round the hooks' momentum of the
  batch statistics is updated (``bn_mmt``).
- from round ``warmup`` on (``data_generation``, 602–609), ``kd_steps`` steps of the student
  on the pool (``kd_train``, 559–572): SGD (lr 0.2, momentum 0.9, weight decay 1e-4) on
  ``kldiv(student, teacher, T)``, images cropped/flipped/normalised as clients' data, the
  lr cosine-annealed over 200 KD rounds (to 2e-4), one scheduler step per round.

**The code's schedule.** ``target.py`` fixes ``dataset = "cifar100"`` at its top (line 21),
so the CIFAR-100 constants (lines 24–42) hold for every dataset: 10 synthesis rounds of 10
generator steps, warm-up 20. With ``warmup`` > ``syn_round`` the adversarial term and the KD
steps never run and the generator reset of round 120 + warmup never comes: the code's
TARGET synthesises 10 × 256 = 2,560 images with L_BN and CE only. The other branch (200
rounds × 50 steps, lr_g 2e-4, bn 0.1, oh 0.1, T 5, Reptile) is unreachable as written; the
options here take the reachable values, and the other schedule is one option set away.

**What differs, on purpose.** The code writes each pool image as a PNG file and reads back
the first ``nums`` file names in sorted order; here the pool is an in-memory uint8 tensor,
which keeps exactly the PNG's 8 bits (the code's truncating ``astype('uint8')``), and
:func:`kept_indices` picks the same images the sorted names do. The code's kornia / PIL
augmentation is ``synthesis_parts.crop_flip`` (the same whole-pixel crops and flips). The
code's ``reset_bn`` and ``act`` constants are never read, so they are not options. Every
random draw (initialisations, z, y, augmentation, KD batches) comes from one seeded
``torch.Generator`` whose state :meth:`Synthesizer.state_dict` keeps, so a synthesis
resumed from a checkpoint equals an uninterrupted one.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.nn import functional as F

from cfl_bench.core.errors import UserError
from cfl_bench.strategies.base import TaskEndWork
from cfl_bench.strategies.synthesis_parts import (
    BNStatHook,
    Generator,
    adversarial_loss,
    crop_flip,
    draw_crop_flip,
    kldiv,
    normalize,
    reinit_student,
    reset_first_layers,
    to_uint8,
)
from cfl_bench.strategies.synthesis_pricing import count_steps, priced


@dataclass(frozen=True)
class SynthesisOptions:
    """The engine's settings; defaults are the values TARGET's code runs (target.py lines)."""

    nz: int = 256  # data_generation, 575 (the Generator class default 100 is not used)
    ngf: int = 64  # 581
    synthesis_batch_size: int = 256  # 24
    sample_batch_size: int = 256  # 25: the KD batch
    g_steps: int = 10  # 26: generator steps per synthesis round
    is_maml: bool = True  # 27: first-order MAML meta step (False: Reptile)
    kd_steps: int = 400  # 28: student steps per KD round
    warmup: int = 20  # 29: rounds before the adversarial term and the KD steps
    lr_g: float = 0.002  # 30
    lr_z: float = 0.01  # 31
    oh: float = 0.5  # 32: weight of the CE on the requested classes
    temperature: float = 20.0  # 33: T of the KD loss
    adv: float = 1.0  # 35
    bn: float = 10.0  # 36
    reset_l0: bool = True  # 37: reset l1.0 / conv_blocks.0 once, at round 120 + warmup
    bn_mmt: float = 0.9  # 39
    syn_round: int = 10  # 40: synthesis rounds per task
    nums: int = 8000  # main.py:86 --nums: pool images the KD reads
    mean: tuple[float, ...] = (0.5071, 0.4867, 0.4408)  # 42: CIFAR-100 normalisation
    std: tuple[float, ...] = (0.2675, 0.2565, 0.2761)  # 42
    betas: tuple[float, float] = (0.5, 0.999)  # 371, 412: meta and inner Adam
    reptile_scale: float = 67.0  # 181: reptile_grad's alpha
    reset_l0_round: int = 120  # 396: the reset comes at round reset_l0_round + warmup
    kd_lr: float = 0.2  # 598
    kd_momentum: float = 0.9  # 598
    kd_weight_decay: float = 1e-4  # 598
    kd_cosine_rounds: int = 200  # 600: CosineAnnealingLR T_max
    kd_eta_min: float = 2e-4  # 600
    classifier: str = "fc"  # the student layer weight_init leaves alone (SimpleLinear)

    def __post_init__(self) -> None:
        counts = ("nz", "ngf", "synthesis_batch_size", "sample_batch_size", "g_steps", "nums")
        for name in counts:
            if getattr(self, name) < 1:
                raise UserError(
                    f"synthesis option {name} must be at least 1; give a positive count"
                )
        if not 0 <= self.bn_mmt < 1:
            raise UserError("synthesis option bn_mmt must lie in [0, 1); the code uses 0.9")
        if len(self.mean) != len(self.std):
            raise UserError("synthesis options mean and std need one value per channel each")


def kept_indices(count: int, batch: int, nums: int) -> torch.Tensor:
    """The pool images the code's KD reads: it names image i of round r ``"r-i.png"``, sorts
    the names as strings and keeps the first ``nums`` (``_collect_all_images``, 105–120).
    Returned as pool indices (r·batch + i) in that sorted order."""
    names = sorted(range(count), key=lambda k: f"{k // batch}-{k % batch}.png")
    return torch.tensor(names[:nums], dtype=torch.long)


@dataclass
class RoundTrace:
    """One synthesis round's per-step losses (before each step) and the kept step's loss."""

    bn: list[float] = field(default_factory=list)
    oh: list[float] = field(default_factory=list)
    adv: list[float] = field(default_factory=list)
    best: float = math.inf


class HookedPool:
    """What every synthesizer holds besides its own generator: the BatchNorm hooks on its
    teacher copy, the pool so far and its random stream; restored and closed alike."""

    hooks: list[BNStatHook]
    device: torch.device
    images: list[torch.Tensor]
    targets: list[torch.Tensor]
    gen: torch.Generator

    def restore_pool(self, state: dict[str, object]) -> None:
        """The hooks' momentum, the pool and the random stream from a ``state_dict``."""
        restore_mmt(self.hooks, state["mmt"], self.device)
        images, targets = state["images"], state["targets"]
        assert isinstance(images, torch.Tensor) and isinstance(targets, torch.Tensor)
        self.images = [images] if images.shape[0] else []
        self.targets = [targets] if targets.shape[0] else []
        self.gen.set_state(state["rng"])  # type: ignore[arg-type]

    def close(self) -> None:
        """Remove the hooks from the teacher copy."""
        for hook in self.hooks:
            hook.remove()


class Synthesizer(HookedPool):
    """TARGET's synthesis for one task: the generator, the hooked teacher, the KD student and
    the pool. ``teacher`` is copied (hooks go on the copy, as the code's deepcopy, 587); the
    student is another copy re-initialised by the code's ``weight_init``."""

    def __init__(
        self,
        teacher: nn.Module,
        num_classes: int,
        image_shape: tuple[int, int, int],
        options: SynthesisOptions,
        seed: int,
    ) -> None:
        channels, height, width = image_shape
        if height != width or channels != len(options.mean):
            raise UserError(
                f"synthesis needs square images with one mean/std value per channel, got "
                f"{image_shape} and {len(options.mean)} channel values; set mean and std"
            )
        self.options, self.num_classes = options, num_classes
        self.gen = torch.Generator().manual_seed(seed)
        self.teacher = copy.deepcopy(teacher).eval()
        self.device = next(self.teacher.parameters()).device
        self.student = copy.deepcopy(teacher)
        reinit_student(self.student, self.gen, options.classifier)
        self.generator = Generator(options.nz, options.ngf, height, channels, self.gen)
        self.generator.to(self.device).train()
        self.meta_optimizer = torch.optim.Adam(
            self.generator.parameters(), options.lr_g * options.g_steps, betas=options.betas
        )
        self.kd_optimizer = torch.optim.SGD(
            self.student.parameters(),
            lr=options.kd_lr,
            momentum=options.kd_momentum,
            weight_decay=options.kd_weight_decay,
        )
        self.kd_scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(
            self.kd_optimizer, options.kd_cosine_rounds, eta_min=options.kd_eta_min
        )
        self.hooks = teacher_hooks(self.teacher, options.bn_mmt)
        self.ep = 0
        self.images: list[torch.Tensor] = []
        self.targets: list[torch.Tensor] = []

    def run(self) -> None:
        """The task's schedule (``data_generation``, 602–609), from wherever it stands."""
        while self.ep < self.options.syn_round:
            self.step()

    def step(self) -> RoundTrace:
        """One synthesis round, then (from round ``warmup`` on) one KD round."""
        trace = self.synthesize()
        if self.ep - 1 >= self.options.warmup:
            self.kd_round()
        return trace

    def synthesize(self) -> RoundTrace:
        """One round of ``GlobalSynthesizer.synthesize``; its best images join the pool."""
        o = self.options
        self.ep += 1
        self.student.eval()
        if o.reset_l0 and self.ep == o.reset_l0_round + o.warmup:
            reset_first_layers(self.generator, self.gen)
        batch = o.synthesis_batch_size
        z = torch.randn(batch, o.nz, generator=self.gen).to(self.device).requires_grad_()
        targets = torch.randint(0, self.num_classes, (batch,), generator=self.gen).to(self.device)
        fast = copy.deepcopy(self.generator)
        groups: list[dict[str, object]] = [
            {"params": list(fast.parameters())},
            {"params": [z], "lr": o.lr_z},
        ]
        inner = torch.optim.Adam(groups, lr=o.lr_g, betas=o.betas)
        trace, best = RoundTrace(), torch.empty(0)
        for it in range(o.g_steps):
            inputs = fast(z)
            loss = self._loss(inputs, targets, trace)
            if loss.item() < trace.best or it == 0:
                trace.best, best = loss.item(), inputs.detach()
            inner.zero_grad()
            loss.backward(inputs=[*fast.parameters(), z])
            if o.is_maml:
                self._fomaml(fast, first=it == 0, last=it == o.g_steps - 1)
            inner.step()
        if o.bn_mmt != 0:
            for hook in self.hooks:
                hook.update_mmt()
        if not o.is_maml:
            self._reptile(fast)
        self.student.train()
        self.images.append(to_uint8(best))
        self.targets.append(targets.cpu())
        return trace

    def _loss(self, inputs: torch.Tensor, targets: torch.Tensor, trace: RoundTrace) -> torch.Tensor:
        """bn·L_BN + oh·CE + adv·L_adv on the augmented images (target.py:414–431)."""
        o = self.options
        offsets, flips = draw_crop_flip(inputs.shape[0], self.gen)
        augmented = normalize(crop_flip(inputs, offsets, flips), o.mean, o.std)
        t_out = self.teacher(augmented)
        loss_bn = sum(h.r_feature for h in self.hooks if h.r_feature is not None)
        assert isinstance(loss_bn, torch.Tensor)
        loss_oh = F.cross_entropy(t_out, targets)
        if o.adv > 0 and self.ep >= o.warmup:
            loss_adv, _ = adversarial_loss(self.student(augmented), t_out)
        else:
            loss_adv = loss_oh.new_zeros(())
        trace.bn.append(loss_bn.item())
        trace.oh.append(loss_oh.item())
        trace.adv.append(loss_adv.item())
        return o.bn * loss_bn + o.oh * loss_oh + o.adv * loss_adv

    def _fomaml(self, fast: Generator, first: bool, last: bool) -> None:
        """``fomaml_grad``: the meta-generator's gradient sums the fast copy's over the round;
        the meta step comes at the round's last generator step."""
        if first:
            self.meta_optimizer.zero_grad()
        for p, fast_p in zip(self.generator.parameters(), fast.parameters(), strict=True):
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            if fast_p.grad is not None:
                p.grad.add_(fast_p.grad)
        if last:
            self.meta_optimizer.step()

    def _reptile(self, fast: Generator) -> None:
        """``reptile_grad`` and one meta step: gradient 67·(θ − θ_fast)."""
        self.meta_optimizer.zero_grad()
        for p, fast_p in zip(self.generator.parameters(), fast.parameters(), strict=True):
            p.grad = (p.detach() - fast_p.detach()) * self.options.reptile_scale
        self.meta_optimizer.step()

    def kd_round(self) -> list[float]:
        """``kd_train``: :func:`distil` on the kept pool, then one cosine-schedule step."""
        o = self.options
        images, _ = self.pool()
        kept = images[kept_indices(images.shape[0], o.synthesis_batch_size, o.nums)]
        for hook in self.hooks:
            hook.enabled = False
        self.student.train()
        losses = distil(self.student, self.teacher, kept, self.kd_optimizer, o, self.gen)
        self.kd_scheduler.step()
        for hook in self.hooks:
            hook.enabled = True
        return losses

    def pool(self) -> tuple[torch.Tensor, torch.Tensor]:
        """All synthetic images (N, C, H, W) as uint8 and the classes they were asked for."""
        return joined_pool(self.images, self.targets, len(self.options.mean))

    def state_dict(self) -> dict[str, object]:
        """Everything a resumed synthesis needs; the teacher is an input, not state."""
        images, targets = self.pool()
        return {
            "ep": self.ep,
            "generator": self.generator.state_dict(),
            "meta_optimizer": self.meta_optimizer.state_dict(),
            "student": self.student.state_dict(),
            "kd_optimizer": self.kd_optimizer.state_dict(),
            "kd_scheduler": self.kd_scheduler.state_dict(),
            "mmt": [h.mmt for h in self.hooks],
            "images": images,
            "targets": targets,
            "rng": self.gen.get_state(),
        }

    def load_state_dict(self, state: dict[str, object]) -> None:
        """Restore :meth:`state_dict`'s output into a synthesizer built with the same inputs."""
        self.ep = int(state["ep"])  # type: ignore[call-overload]
        self.generator.load_state_dict(state["generator"])  # type: ignore[arg-type]
        self.meta_optimizer.load_state_dict(state["meta_optimizer"])  # type: ignore[arg-type]
        self.student.load_state_dict(state["student"])  # type: ignore[arg-type]
        self.kd_optimizer.load_state_dict(state["kd_optimizer"])  # type: ignore[arg-type]
        self.kd_scheduler.load_state_dict(state["kd_scheduler"])  # type: ignore[arg-type]
        self.restore_pool(state)


def price(probe: Synthesizer, schedule: SynthesisOptions) -> TaskEndWork:
    """``schedule``'s task end in steps by kind (``synthesis_pricing``), each kind's step
    timed on ``probe``, a synthesizer of one generator step and one KD step per round:
    rounds from ``warmup`` on have the adversarial term, rounds after it KD."""
    o = schedule
    counts = count_steps(
        o.syn_round,
        (o.g_steps, o.kd_steps),
        adversarial=lambda ep: o.adv > 0 and ep >= o.warmup,
        distils=lambda ep: ep - 1 >= o.warmup,
    )

    def round_at(ep: int) -> None:
        probe.ep = ep - 1
        probe.synthesize()

    def kd_round() -> None:  # on the pool, made first if empty (the fastest of three calls)
        if not probe.images:
            probe.synthesize()
        probe.kd_round()

    return priced(counts, lambda: round_at(1), lambda: round_at(max(1, o.warmup)), kd_round)


#: A KD step's loss of the student against the teacher on a batch of images x.
PairLoss = Callable[[nn.Module, nn.Module, torch.Tensor], torch.Tensor]


def output_kldiv(temperature: float) -> PairLoss:
    """TARGET's KD loss: ``kldiv`` of the student's outputs against the teacher's (the
    teacher's forward first, without gradient) at ``temperature``."""

    def loss(student: nn.Module, teacher: nn.Module, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            t_out = teacher(x)
        return kldiv(student(x), t_out, temperature)

    return loss


def teacher_hooks(teacher: nn.Module, bn_mmt: float) -> list[BNStatHook]:
    """A :class:`BNStatHook` on every BatchNorm2d of the teacher (its copy); refused
    without any: there would be no statistics to invert."""
    norms = [m for m in teacher.modules() if isinstance(m, nn.BatchNorm2d)]
    if not norms:
        raise UserError("data-free synthesis needs a model with BatchNorm2d layers; use resnet32")
    return [BNStatHook(m, bn_mmt) for m in norms]


def joined_pool(
    images: list[torch.Tensor], targets: list[torch.Tensor], channels: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The rounds' kept images (N, C, H, W) as one uint8 tensor and their requested
    classes; empty tensors before the first round is kept."""
    if not images:
        shape = (0, channels, 0, 0)
        return torch.empty(shape, dtype=torch.uint8), torch.empty(0, dtype=torch.long)
    return torch.cat(images), torch.cat(targets)


def restore_mmt(hooks: list[BNStatHook], saved: object, device: torch.device) -> None:
    """The hooks' momentum of the batch statistics from a state dict's ``mmt`` list."""
    assert isinstance(saved, list)
    for hook, mmt in zip(hooks, saved, strict=True):
        hook.mmt = None if mmt is None else (mmt[0].to(device), mmt[1].to(device))


def distil(
    student: nn.Module,
    teacher: nn.Module,
    kept: torch.Tensor,
    optimizer: torch.optim.Optimizer,
    o: SynthesisOptions,
    gen: torch.Generator,
    pair_loss: PairLoss | None = None,
) -> list[float]:
    """``kd_train``'s loop: ``kd_steps`` steps on the uint8 images ``kept``, one shuffle per
    pass as a fresh ``DataLoader(shuffle=True)`` gives (the last batch of a pass may be
    short), each batch cropped, flipped and normalised as the code's ``train_transform``.
    ``pair_loss``: the step's loss (default TARGET's :func:`output_kldiv` at T; LANDER adds
    its embeddings' MSE)."""
    step_loss = pair_loss or output_kldiv(o.temperature)
    device = next(student.parameters()).device
    order, position, losses = torch.empty(0, dtype=torch.long), kept.shape[0], []
    for _ in range(o.kd_steps):
        if position >= kept.shape[0]:
            order, position = torch.randperm(kept.shape[0], generator=gen), 0
        index = order[position : position + o.sample_batch_size]
        position += o.sample_batch_size
        offsets, flips = draw_crop_flip(index.shape[0], gen)
        x = kept[index].to(device, torch.float32) / 255
        x = normalize(crop_flip(x, offsets, flips), o.mean, o.std)
        loss = step_loss(student, teacher, x)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses
