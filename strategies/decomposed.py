"""FedWeIT's decomposed layers and its LeNet (Yoon et al., ICML 2021; official code
wyjeong/FedWeIT, ``modules/layers.py`` and ``modules/nets.py``).

Each decomposed layer's weight for task t on a client is composed in its forward as the
code's ``DecomposedConv`` / ``DecomposedDense`` do::

    θ = B ⊙ σ(m) + A + Σ_k α_k · kb_k

with the base B shared by the federation and the per-output-channel mask m (one value per
output unit, broadcast over the kernel, as the code's ``mask`` of shape ``(out,)``), the
task-adaptive A, the attention α over the knowledge base kb (K task-adaptive tensors of
other clients) and the bias all private to the client. In evaluation mode A is pruned by
the hard threshold ``|A| > l1_thr`` and σ(m) by ``|σ(m)| > mask_thr`` (the code's
``l1_pruning`` with λ1 and λ_mask), while training uses them dense.

Why only B is a registered parameter: the flat global vector θ (``core.flat``) is what the
server aggregates and what travels, and the code aggregates only B; everything else is the
client's, set on the layers by the ``fedweit`` component for one client's round
(``LayerPrivate``) and trained by it. A layer with nothing set composes θ = B (bias 0), and
the head with nothing set gives zero logits: what the server's global model holds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from cfl_bench.core.errors import UserError

#: The code's VarianceScaling default (fan-in, truncated normal): the truncated normal's
#: standard deviation is sqrt(1 / fan_in) divided by this (Keras' constant).
TRUNCATED_STD = 0.87962566103423978


def variance_scaling_(tensor: torch.Tensor, fan_in: int, gen: torch.Generator | None) -> None:
    """Keras' ``VarianceScaling()`` (scale 1, fan_in, truncated normal at ±2σ) in place."""
    std = math.sqrt(1.0 / max(fan_in, 1)) / TRUNCATED_STD
    with torch.no_grad():
        sample = torch.empty(tensor.shape).normal_(generator=gen)
        while True:  # redraw what falls outside ±2σ, as a truncated normal
            bad = sample.abs() > 2.0
            if not bool(bad.any()):
                break
            sample[bad] = torch.empty(int(bad.sum())).normal_(generator=gen)
        tensor.copy_(sample.mul_(std))


@dataclass
class LayerPrivate:
    """One client's private tensors of one decomposed layer for its current task (views
    into the component's trained vector, or constants): mask m (out,), adaptive A (the
    weight's shape), attention α (K,), bias (out,), the knowledge base kb (K, *shape),
    and ``fixed_mask``: σ(m) taken at the round start (the code's forward mask) or None to
    differentiate through σ(m) (the paper)."""

    mask: torch.Tensor
    adaptive: torch.Tensor
    atten: torch.Tensor
    bias: torch.Tensor
    kb: torch.Tensor
    fixed_mask: torch.Tensor | None
    l1_thr: float
    mask_thr: float


def prune(weights: torch.Tensor, threshold: float) -> torch.Tensor:
    """The code's ``l1_pruning``: entries with |w| ≤ threshold set to 0."""
    return weights * (weights.abs() > threshold).to(weights.dtype)


class Decomposed(nn.Module):
    """The part both decomposed layers share: the base B (torch layout, out first) and the
    composition of θ from the client's ``private`` tensors."""

    def __init__(self, shape: tuple[int, ...], fan_in: int) -> None:
        super().__init__()
        self.shared = nn.Parameter(torch.empty(shape))
        variance_scaling_(self.shared, fan_in, None)
        self.private: LayerPrivate | None = None

    def composed(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(θ, bias) of the client's current task; (B, None) with nothing set."""
        p = self.private
        if p is None:
            return self.shared, None
        ones = (-1,) + (1,) * (self.shared.dim() - 1)
        mask = p.fixed_mask if p.fixed_mask is not None else torch.sigmoid(p.mask)
        adaptive = p.adaptive
        if not self.training:
            mask, adaptive = prune(mask, p.mask_thr), prune(adaptive, p.l1_thr)
        theta = self.shared * mask.view(ones) + adaptive
        if p.kb.shape[0]:
            theta = theta + torch.tensordot(p.atten, p.kb, dims=1)
        return theta, p.bias


class DecomposedConv2d(Decomposed):
    """A 'same'-padded stride-1 conv whose kernel is composed (``DecomposedConv``)."""

    def __init__(self, in_channels: int, out_channels: int, kernel: int) -> None:
        super().__init__((out_channels, in_channels, kernel, kernel), kernel * kernel * in_channels)
        self.padding = kernel // 2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        theta, bias = self.composed()
        return F.conv2d(x, theta, bias, padding=self.padding)


class DecomposedLinear(Decomposed):
    """A dense layer whose weight is composed (``DecomposedDense``)."""

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__((out_features, in_features), in_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        theta, bias = self.composed()
        return F.linear(x, theta, bias)


def max_pool_same(x: torch.Tensor) -> torch.Tensor:
    """TensorFlow's 3×3 stride-2 'same' max-pool: ceil(H/2) outputs, the padding (of −∞)
    split with the larger half after, which torch's symmetric padding does not give."""
    pads = []
    for size in (x.shape[-1], x.shape[-2]):
        out = halved(size)
        total = max((out - 1) * 2 + 3 - size, 0)
        pads += [total // 2, total - total // 2]
    return F.max_pool2d(F.pad(x, pads, value=float("-inf")), 3, 2)


def halved(size: int) -> int:
    """A side after one stride-2 'same' pool: ⌈size / 2⌉."""
    return -(-size // 2)


class FedWeITLeNet(nn.Module):
    """The code's LeNet (``build_lenet_body``): decomposed conv 5×5 C→20 and 20→50 ('same'),
    each ReLU, local response normalisation (TF ``lrn(x, 4, 1.0, 0.001/9, 0.75)``: a
    window of 9 channels, which torch writes as size 9, alpha 0.001) and a 3×3 stride-2
    'same' max-pool; flatten; decomposed dense →800 and 800→500, ReLU; one head. The
    code's one 5-class softmax head per task is one 500→classes matrix here whose task
    rows are that task's head (``--heads per-task``); it is the client's (``head``), never
    aggregated, as in the code. On 3×32×32 the dense input is 3,200, as the code's."""

    def __init__(self, input_shape: tuple[int, int, int], num_classes: int) -> None:
        super().__init__()
        channels, height, width = input_shape
        self.conv1 = DecomposedConv2d(channels, 20, 5)
        self.conv2 = DecomposedConv2d(20, 50, 5)
        side_h, side_w = halved(halved(height)), halved(halved(width))
        self.fc1 = DecomposedLinear(50 * side_h * side_w, 800)
        self.fc2 = DecomposedLinear(800, 500)
        self.lrn = nn.LocalResponseNorm(9, alpha=0.001, beta=0.75, k=1.0)
        self.num_classes = num_classes
        # The client's head (weight (classes, 500), bias (classes,)); None: zero logits.
        self.head: tuple[torch.Tensor, torch.Tensor] | None = None

    def layers(self) -> list[Decomposed]:
        """The decomposed layers in the order of θ (and of every per-layer list)."""
        return [self.conv1, self.conv2, self.fc1, self.fc2]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = max_pool_same(self.lrn(F.relu(self.conv1(x))))
        x = max_pool_same(self.lrn(F.relu(self.conv2(x))))
        x = F.relu(self.fc2(F.relu(self.fc1(x.flatten(1)))))
        if self.head is None:  # zero logits, still a function of B (the cost probe's backward)
            return F.linear(x, x.new_zeros(self.num_classes, x.shape[1]))
        return F.linear(x, *self.head)


def build_fedweit_lenet(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """The builder of ``--model fedweit-lenet`` (C×H×W images of any size)."""
    shape = tuple(int(d) for d in input_shape)
    if len(shape) != 3:
        raise UserError(
            f"model 'fedweit-lenet' needs C×H×W image inputs but the stream gives "
            f"{'×'.join(map(str, shape))}; use an image stream such as digits or seq-cifar100."
        )
    return FedWeITLeNet((shape[0], shape[1], shape[2]), num_classes)
