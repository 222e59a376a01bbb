"""MFCL's server-side generator and its training on the frozen global model, as its
official code runs them (SaraBabakN/MFCL-NeurIPS23; ``models/generator.py``,
``utiles.py:train_gen`` and ``clients/helper.py:Teacher``; line numbers of those files).

The generator (``Generator``, generator.py:58–99, built by ``CIFAR_GEN`` 219–220 with
out_channel 128) is made once for the run and trained again at every task end but the last,
from where the previous task end left it: ``pi`` Adam steps (lr ``generator_lr``, torch's
default betas; a new optimiser each task end, utiles.py:59), each on a fresh batch of
``server_ss`` images G(z), z ~ N(0, I), with the generator in training mode and the teacher
(the task end's global model) in eval mode, minimising ``mfcl_loss.generator_loss``. The
BatchNorm divergences come from forward hooks on every BatchNorm layer of a copy of the
teacher (``DivergenceHook``). Unlike TARGET's engine there is no pool and no KD student: the
generator itself is what the clients receive. Every random draw (the initialisation, each z)
comes from explicit ``torch.Generator`` s.
"""

from __future__ import annotations

import copy

import torch
from torch import nn
from torch.nn import functional as F

from cfl_bench.core.errors import UserError
from cfl_bench.strategies.mfcl_loss import (
    batch_statistics,
    bn_divergence,
    generator_loss,
    smoothing_kernel,
)
from cfl_bench.strategies.synthesis_parts import torch_default_init

#: ``CIFAR_GEN``'s out_channel (generator.py:219) and the BatchNorm eps its code passes as
#: BatchNorm2d's second argument (generator.py:72, 77).
GENERATOR_CHANNELS = 128
GENERATOR_EPS = 0.8


class CodeGenerator(nn.Module):
    """MFCL's CIFAR generator: z → Linear → BN → ×2 nearest, conv, BN(eps 0.8), LeakyReLU →
    ×2 nearest, conv(→64), BN(eps 0.8), LeakyReLU, conv(→channels), Tanh → BatchNorm without
    affine parameters, whose running statistics (eval mode) set the output's scale: the
    images are meant for the model as they come out, with no normalisation."""

    def __init__(self, z_dim: int, channels: int, img_size: int, gen: torch.Generator) -> None:
        super().__init__()
        if img_size % 4 != 0:
            raise UserError(
                f"mfcl's generator needs an image side divisible by 4, got {img_size}; "
                "use images whose side is a multiple of 4 (e.g. 32)"
            )
        width = GENERATOR_CHANNELS
        self.z_dim, self.channels, self.init_size = z_dim, channels, img_size // 4
        self.l1 = nn.Sequential(nn.Linear(z_dim, width * self.init_size**2))
        self.conv_blocks0 = nn.Sequential(nn.BatchNorm2d(width))
        self.conv_blocks1 = nn.Sequential(
            nn.Conv2d(width, width, 3, stride=1, padding=1),
            nn.BatchNorm2d(width, GENERATOR_EPS),
            nn.LeakyReLU(0.2, inplace=True),
        )
        self.conv_blocks2 = nn.Sequential(
            nn.Conv2d(width, 64, 3, stride=1, padding=1),
            nn.BatchNorm2d(64, GENERATOR_EPS),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(64, channels, 3, stride=1, padding=1),
            nn.Tanh(),
            nn.BatchNorm2d(channels, affine=False),
        )
        torch_default_init(self, gen)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        out = self.l1(z).view(z.shape[0], -1, self.init_size, self.init_size)
        out = F.interpolate(self.conv_blocks0(out), scale_factor=2)
        out = F.interpolate(self.conv_blocks1(out), scale_factor=2)
        return self.conv_blocks2(out)

    def sample(self, count: int, gen: torch.Generator, device: torch.device) -> torch.Tensor:
        """G(z) for ``count`` draws z ~ N(0, I) from ``gen`` (the code's ``sample``)."""
        z = torch.randn(count, self.z_dim, generator=gen, device=gen.device)
        return self(z.to(device))


class DivergenceHook:
    """The code's ``DeepInversionFeatureHook`` on one BatchNorm layer of the teacher copy:
    each forward leaves the layer's ``mfcl_loss.bn_divergence`` in ``r_feature``."""

    def __init__(self, module: nn.BatchNorm1d | nn.BatchNorm2d) -> None:
        self.module = module
        self.r_feature: torch.Tensor | None = None
        self.handle = module.register_forward_hook(self._hook)

    def _hook(self, module: nn.Module, inputs: tuple[torch.Tensor, ...], _out: object) -> None:
        mean, var = batch_statistics(inputs[0])
        running_mean, running_var = self.module.running_mean, self.module.running_var
        assert running_mean is not None and running_var is not None
        self.r_feature = bn_divergence(running_mean, running_var, mean, var)

    def remove(self) -> None:
        self.handle.remove()


class MFCLSynthesizer:
    """One task end's generator training (``Teacher.get_images``): ``run`` takes the
    remaining steps, ``step`` one; ``close`` removes the hooks and leaves the generator in
    eval mode (as ``get_images`` ends). The generator is trained in place."""

    def __init__(
        self,
        teacher: nn.Module,
        generator: CodeGenerator,
        known: int,
        settings: tuple[int, int, float, tuple[float, float, float]],
        seed: int,
    ) -> None:
        self.iterations, self.batch, lr, self.weights = settings
        self.teacher = copy.deepcopy(teacher).eval().requires_grad_(False)
        norms = [
            m for m in self.teacher.modules() if isinstance(m, nn.BatchNorm1d | nn.BatchNorm2d)
        ]
        if not norms:
            raise UserError(
                "mfcl inverts BatchNorm statistics, which this model lacks; use resnet18"
            )
        self.hooks = [DivergenceHook(m) for m in norms]
        self.device = next(self.teacher.parameters()).device
        self.generator, self.known = generator.to(self.device), known
        self.optimizer = torch.optim.Adam(self.generator.parameters(), lr=lr)
        self.kernel = smoothing_kernel(generator.channels).to(self.device)
        self.gen = torch.Generator().manual_seed(seed)
        self.done = 0

    def run(self) -> None:
        """The task end's remaining generator steps."""
        while self.done < self.iterations:
            self.step()

    def step(self) -> float:
        """One Adam step of the generator on L_G of a fresh batch; returns the loss."""
        self.generator.train()
        images = self.generator.sample(self.batch, self.gen, self.device)
        outputs = self.teacher(images)[:, : self.known]
        divergences = [h.r_feature for h in self.hooks if h.r_feature is not None]
        loss = generator_loss(outputs, divergences, images, self.kernel, self.weights)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        self.done += 1
        return loss.item()

    def close(self) -> None:
        """Remove the hooks from the teacher copy; the generator to eval mode."""
        for hook in self.hooks:
            hook.remove()
        self.generator.eval()
