"""The pieces of the server-side data-free synthesis engine (TARGET, LANDER, MFCL): the
generator, the BatchNorm-statistics hook, the losses, the differentiable augmentation and
the student's re-initialisation. ``strategies.synthesis`` runs them as TARGET's loop.

Written from TARGET's official code (zj-jayzhang/Federated-Class-Continual-Learning,
``methods/target.py``; line numbers below are of that file): ``Generator`` (280–313),
``reset_l0_fun`` (191–195), ``DeepInversionHook`` (222–263), ``kldiv`` (316–319), the
adversarial term of ``GlobalSynthesizer.synthesize`` (425–430), its augmentation (376–380:
kornia ``RandomCrop(padding=4)``, ``RandomHorizontalFlip``, then the normaliser 80–102) and
``weight_init`` (471–536), which makes the KD student. Every random draw takes an explicit
``torch.Generator`` so that a synthesis is reproducible and resumable.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn
from torch.nn import functional as F

from cfl_bench.core.errors import UserError

# The augmentation's crop padding (target.py:377, ``augmentation.RandomCrop(..., padding=4)``).
CROP_PADDING = 4


class Generator(nn.Module):
    """TARGET's generator: z (nz) → Linear → BN → ×2 upsample, conv, BN, LeakyReLU(0.2) →
    ×2 upsample, conv, BN, LeakyReLU(0.2) → conv → Sigmoid, an image in [0, 1].

    The module names (``l1.0``, ``conv_blocks.0``, ...) are the code's, so that
    :func:`reset_first_layers` resets the same layers. torch's default initialisation (what
    the code gets) is drawn from ``gen`` instead of the global generator."""

    def __init__(
        self, nz: int, ngf: int, img_size: int, nc: int, gen: torch.Generator | None = None
    ) -> None:
        super().__init__()
        if img_size % 4 != 0:
            raise UserError(
                f"the generator needs an image size divisible by 4, got {img_size}; "
                "use images whose side is a multiple of 4 (e.g. 32)"
            )
        self.init_size = img_size // 4
        self.l1 = nn.Sequential(nn.Linear(nz, ngf * 2 * self.init_size**2))
        self.conv_blocks = nn.Sequential(
            nn.BatchNorm2d(ngf * 2),
            nn.Upsample(scale_factor=2),
            nn.Conv2d(ngf * 2, ngf * 2, 3, stride=1, padding=1, bias=False),
            nn.BatchNorm2d(ngf * 2),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Upsample(scale_factor=2),
            nn.Conv2d(ngf * 2, ngf, 3, stride=1, padding=1, bias=False),
            nn.BatchNorm2d(ngf),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(ngf, nc, 3, stride=1, padding=1),
            nn.Sigmoid(),
        )
        if gen is not None:
            torch_default_init(self, gen)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        out = self.l1(z)
        out = out.view(out.shape[0], -1, self.init_size, self.init_size)
        return self.conv_blocks(out)


def torch_default_init(model: nn.Module, gen: torch.Generator) -> None:
    """torch's own ``reset_parameters`` of Linear and Conv2d (Kaiming-uniform with a = √5,
    bias U(±1/√fan_in)), drawn from ``gen``; BatchNorm keeps its weight 1 and bias 0."""
    for module in model.modules():
        if isinstance(module, nn.Linear | nn.Conv2d):
            nn.init.kaiming_uniform_(module.weight, a=math.sqrt(5), generator=gen)
            if module.bias is not None:
                fan_in = module.weight[0].numel()
                bound = 1 / math.sqrt(fan_in)
                nn.init.uniform_(module.bias, -bound, bound, generator=gen)


def reset_first_layers(generator: Generator, gen: torch.Generator) -> None:
    """The code's ``reset_l0_fun``: the modules named ``l1.0`` (the Linear) and
    ``conv_blocks.0`` get weight N(0, 0.02) and bias 0; nothing else changes.

    ``conv_blocks.0`` is the first BatchNorm, so its scale γ becomes N(0, 0.02), near zero
    (DeepInversion-style code resets a first *linear* layer; the code's name picks the
    BatchNorm). That is implemented as written; its running statistics are left alone."""
    for name, module in generator.named_modules():
        if name in ("l1.0", "conv_blocks.0"):
            assert isinstance(module, nn.Linear | nn.BatchNorm2d)
            nn.init.normal_(module.weight, 0.0, 0.02, generator=gen)
            nn.init.constant_(module.bias, 0.0)


class BNStatHook:
    """The code's ``DeepInversionHook`` on one BatchNorm layer of the frozen teacher.

    On each forward (while ``enabled``), from the layer's *input* x: mean μ and biased
    variance σ² per channel over (N, H, W), and

        r = ‖running_var − σ²‖₂ + ‖running_mean − μ‖₂                      (first round)
        r = ‖running_var − (1−m)σ² − m·v̄‖₂ + ‖running_mean − (1−m)μ − m·μ̄‖₂  (later)

    where (μ̄, v̄) is the momentum of earlier rounds, set by :meth:`update_mmt` (m =
    ``bn_mmt``). The norms are plain L2 norms (not squared), summed, as in the code."""

    def __init__(self, module: nn.BatchNorm2d, mmt_rate: float) -> None:
        self.module = module
        self.mmt_rate = mmt_rate
        self.mmt: tuple[torch.Tensor, torch.Tensor] | None = None
        self.tmp_val: tuple[torch.Tensor, torch.Tensor] | None = None
        self.r_feature: torch.Tensor | None = None
        self.enabled = True
        self.handle = module.register_forward_hook(self._hook)

    def _hook(self, module: nn.Module, inputs: tuple[torch.Tensor, ...], _out: object) -> None:
        if not self.enabled:
            return
        x = inputs[0]
        mean = x.mean(dim=(0, 2, 3))
        var = x.transpose(0, 1).reshape(x.shape[1], -1).var(dim=1, unbiased=False)
        self.r_feature = bn_statistics_loss(self.module, mean, var, self.mmt, self.mmt_rate)
        self.tmp_val = (mean, var)

    def update_mmt(self) -> None:
        """The code's ``update_mmt``: the first call keeps the last forward's (μ, σ²), later
        calls blend them in, μ̄ ← m·μ̄ + (1 − m)·μ (the same for σ²), detached."""
        assert self.tmp_val is not None, "update_mmt needs a forward pass first"
        mean, var = (t.detach() for t in self.tmp_val)
        if self.mmt is None:
            self.mmt = (mean, var)
        else:
            m = self.mmt_rate
            self.mmt = (m * self.mmt[0] + (1 - m) * mean, m * self.mmt[1] + (1 - m) * var)

    def remove(self) -> None:
        self.handle.remove()


def bn_statistics_loss(
    module: nn.BatchNorm2d,
    mean: torch.Tensor,
    var: torch.Tensor,
    mmt: tuple[torch.Tensor, torch.Tensor] | None,
    mmt_rate: float,
) -> torch.Tensor:
    """One layer's ‖running_var − v‖₂ + ‖running_mean − μ‖₂ (see :class:`BNStatHook`)."""
    running_mean, running_var = module.running_mean, module.running_var
    assert running_mean is not None and running_var is not None
    if mmt is not None:
        mean = (1 - mmt_rate) * mean + mmt_rate * mmt[0]
        var = (1 - mmt_rate) * var + mmt_rate * mmt[1]
    return torch.norm(running_var.detach() - var, 2) + torch.norm(running_mean.detach() - mean, 2)


def kldiv(
    logits: torch.Tensor,
    targets: torch.Tensor,
    temperature: float = 1.0,
    reduction: str = "batchmean",
) -> torch.Tensor:
    """The code's ``kldiv``: KL(softmax(targets/T) ‖ softmax(logits/T)) with torch's
    ``reduction`` (``batchmean``: summed, divided by the batch), times T²."""
    q = F.log_softmax(logits / temperature, dim=1)
    p = F.softmax(targets / temperature, dim=1)
    return F.kl_div(q, p, reduction=reduction) * (temperature * temperature)


def adversarial_loss(
    student: torch.Tensor, teacher: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The code's adversarial term (target.py:427–428) and its mask.

    mask_i = 1 where the student's and the teacher's argmax agree; the loss is
    −mean_i(mask_i · KL_i) with KL_i = Σ_c KL(teacher ‖ student) at T = 1, the mean over the
    *whole* batch (not over the agreeing rows). Neither side is detached: the gradient
    reaches the images through both networks, as in the code."""
    mask = (student.argmax(dim=1) == teacher.argmax(dim=1)).to(student.dtype)
    per_row = kldiv(student, teacher, reduction="none").sum(dim=1)
    return -(per_row * mask).mean(), mask


def draw_crop_flip(
    batch: int, gen: torch.Generator, padding: int = CROP_PADDING
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random-crop offsets (batch, 2) in 0..2·padding (row, column) and flip flags (batch,),
    each flipped with probability 1/2: kornia's ``RandomCrop(padding=p)`` then
    ``RandomHorizontalFlip()`` draw these per image."""
    offsets = torch.randint(0, 2 * padding + 1, (batch, 2), generator=gen)
    flips = torch.rand(batch, generator=gen) < 0.5
    return offsets, flips


def crop_flip(
    x: torch.Tensor, offsets: torch.Tensor, flips: torch.Tensor, padding: int = CROP_PADDING
) -> torch.Tensor:
    """Zero-pad by ``padding``, cut each image's H×W window at its offset, flip the flagged
    ones left-right: differentiable in x (an index gather).

    Why not kornia (the code's choice; not a dependency here) and not ``grid_sample``: the
    code's crop moves by whole pixels, so a gather is exact (bilinear sampling at integer
    shifts would only add rounding) and costs no interpolation."""
    batch, _, height, width = x.shape
    padded = F.pad(x, (padding, padding, padding, padding))
    offsets = offsets.to(x.device)
    rows = offsets[:, 0:1] + torch.arange(height, device=x.device)
    cols = offsets[:, 1:2] + torch.arange(width, device=x.device)
    index = torch.arange(batch, device=x.device)[:, None, None]
    out = padded[index, :, rows[:, :, None], cols[:, None, :]].permute(0, 3, 1, 2)
    return torch.where(flips.to(x.device)[:, None, None, None], out.flip(-1), out)


def normalize(x: torch.Tensor, mean: Sequence[float], std: Sequence[float]) -> torch.Tensor:
    """(x − mean) / std per channel: the code's ``Normalizer``."""
    m = torch.as_tensor(mean, dtype=x.dtype, device=x.device)[None, :, None, None]
    s = torch.as_tensor(std, dtype=x.dtype, device=x.device)[None, :, None, None]
    return (x - m) / s


def to_uint8(images: torch.Tensor) -> torch.Tensor:
    """The 8 bits the code's PNG files keep: ``(clamp(x, 0, 1)·255).astype('uint8')``, a
    truncation (not a rounding), on the CPU."""
    return (images.detach().clamp(0, 1) * 255).to(torch.uint8).cpu()


def reinit_student(model: nn.Module, gen: torch.Generator, classifier: str = "fc") -> None:
    """The code's ``weight_init`` on the KD student (a copy of the global model).

    Conv2d: Xavier-normal weight, N(0, 1) bias; BatchNorm: weight N(1, 0.02), bias 0;
    Linear: Xavier-normal weight, N(0, 1) bias. The classifier named ``classifier`` keeps
    the copied weights: in the code it is PyCIL's ``SimpleLinear``, which ``weight_init``
    does not recognise, so the student starts with the teacher's classifier."""
    names = dict(model.named_modules())
    if classifier not in names:
        raise UserError(
            f"the KD student has no module named {classifier!r}; name its classifier "
            "module (the layer the code's weight_init leaves alone)"
        )
    for name, module in names.items():
        if name == classifier:
            continue
        if isinstance(module, nn.Conv2d | nn.Linear):
            nn.init.xavier_normal_(module.weight, generator=gen)
            if module.bias is not None:
                nn.init.normal_(module.bias, generator=gen)
        elif isinstance(module, nn.BatchNorm2d | nn.BatchNorm1d):
            nn.init.normal_(module.weight, mean=1.0, std=0.02, generator=gen)
            nn.init.constant_(module.bias, 0.0)


class LabelGenerator(nn.Module):
    """LANDER's (NAYER's) ``NLGenerator`` (LANDER's ``methods/generator.py``, 6–62): the
    image of a requested class y grows from its label-text embedding e_y instead of noise.

    e_y → BatchNorm1d(le_size) over the batch → the rows in consecutive chunks of ``nl``,
    chunk i through its own Linear ``le1[i]`` (le_size → nz; ⌈batch/nl⌉ of them) → the
    same Linear → BN → upsampling convolutions → Sigmoid as TARGET's :class:`Generator`.
    :meth:`reinit_embedding` redraws the chunk layers (N(0, 1) weights, zero biases) at the
    start of every synthesis round (``re_init_le``): their fresh draws are what varies the
    images of one class, as z does in TARGET. The embeddings are a fixed buffer (the code
    holds them as a parameter with ``requires_grad=False``)."""

    label_emb: torch.Tensor

    def __init__(
        self,
        anchors: torch.Tensor,
        nz: int,
        ngf: int,
        img_size: int,
        nc: int,
        nl: int,
        batch: int,
        gen: torch.Generator,
    ) -> None:
        super().__init__()
        le_size = int(anchors.shape[1])
        self.register_buffer("label_emb", anchors.detach().float().clone())
        self.nl = nl
        self.n1 = nn.BatchNorm1d(le_size)
        self.le1 = nn.ModuleList(nn.Linear(le_size, nz) for _ in range(math.ceil(batch / nl)))
        self.body = Generator(nz, ngf, img_size, nc)
        torch_default_init(self, gen)

    def forward(self, targets: torch.Tensor) -> torch.Tensor:
        le = self.n1(self.label_emb[targets])
        chunks = [layer(le[i * self.nl : (i + 1) * self.nl]) for i, layer in enumerate(self.le1)]
        v = torch.cat([c for c in chunks if c.shape[0] > 0])
        return self.body(v)

    def reinit_embedding(self, gen: torch.Generator) -> None:
        """``re_init_le``: every chunk layer's weight N(0, 1), its bias 0."""
        for layer in self.le1:
            assert isinstance(layer, nn.Linear)
            nn.init.normal_(layer.weight, 0.0, 1.0, generator=gen)
            nn.init.constant_(layer.bias, 0.0)


def balanced_targets(batch: int, num_classes: int, gen: torch.Generator) -> torch.Tensor:
    """NAYER's ``generate_ys`` (LANDER's lander.py:436–449): ⌊batch/C⌋ copies of 0..C−1,
    then batch mod C classes drawn uniformly (the code prepends the copies to the draws)."""
    extra = torch.randint(num_classes, (batch % num_classes,), generator=gen)
    cycles = [torch.arange(num_classes)] * (batch // num_classes)
    return torch.cat([*cycles, extra])
