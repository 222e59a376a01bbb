"""MFCL's losses as pure tensor functions, written from its official code.

Babakniya et al., NeurIPS 2023, code SaraBabakN/MFCL-NeurIPS23 (paper not read here: the
code decides). Two objectives:

**The server's generator** (``clients/helper.py``, ``Teacher.get_images`` 71–111), on a
batch G(z) of the generator and the frozen global model f's outputs o over the K classes
seen so far (``[:, :num_k]``):

    L_G = CE(o / 1000, argmax o)                                  content (T = 1e3, weight 1)
        + w_ie · (1 + Σ_c p̄_c log p̄_c / log K),  p̄ = mean_rows softmax(o)   information entropy
        + Σ_l w_bn / L · r_l                                       BatchNorm statistics
        + w_noise · mean((G(z) − smooth(G(z)))²)                   image prior

with r_l the code's ``DeepInversionFeatureHook`` (121–129) on BatchNorm layer l of f: from
the layer's input, per channel the batch mean μ and biased variance σ² + 1e−8, and the
layer's running statistics (m, v):

    r_l = mean_c log(σ_c / √(v_c + 1e−8)) − ½ · mean_c (1 − (v_c + 1e−8 + (m_c − μ_c)²) / σ²_c)

(the KL divergence between the two Gaussians, averaged over the channels — not TARGET's L2
norms), and ``smooth`` a 5 × 5 Gaussian blur (σ = 1, the code's ``Gaussiansmoothing``,
135–163, whose exponent is −((i − 2)/(2σ))², written as the code has it) of the image
reflect-padded by 2.

**The clients in task t > 0** (``clients/MFCL.py``, ``train_cl`` 37–60 and ``kd`` 62–68):
the task batch (x, y) and a synthetic batch x̃ = G(z̃), labelled ỹ = argmax of the old
model's outputs over the old classes, go through the model as one batch x̂ = [x; x̃], ŷ =
[y; ỹ] (the code's ``combine_data``): z = φ(x̂), o = h(z), and

    L = CE(o[real][:, known:known+c], y − known)                   the task's own classes
      + w_ft · CE(h(sg(φ(x̂)))[:, :known+c], ŷ)                      the head on all rows
      + w_kd · mean_rows Σ_{j<known} (h_old(z) − h_old(φ_old(x̂)))²_j / known

where sg is a second forward without gradient (its features feed only the head), h_old and
φ_old the old model's head and feature extractor (frozen; the gradient of the last term
reaches φ through z). Task 0 is plain CE (``train``, 21–35).
"""

from __future__ import annotations

import math

import torch
from torch.nn import functional as F

from cfl_bench.strategies.replay import head_cross_entropy, head_distillation
from cfl_bench.strategies.target_loss import new_class_ce

#: ``train_gen``'s ``deep_inv_params`` (utiles.py:61): the content loss's temperature and
#: weight; the variance floor of the BatchNorm hook (helper.py:124, 127).
CONTENT_TEMPERATURE = 1e3
CONTENT_WEIGHT = 1.0
VARIANCE_FLOOR = 1e-8
#: ``Gaussiansmoothing(3, 5, 1)`` (helper.py:34) and its reflect padding (helper.py:104).
SMOOTHING_SIZE, SMOOTHING_SIGMA, SMOOTHING_PAD = 5, 1.0, 2


def bn_divergence(
    running_mean: torch.Tensor, running_var: torch.Tensor, mean: torch.Tensor, var: torch.Tensor
) -> torch.Tensor:
    """One layer's r_l from the batch's per-channel ``mean`` and biased ``var`` (the floor
    1e−8 is added here, as the hook adds it) against the layer's running statistics."""
    var = var + VARIANCE_FLOOR
    running_var = running_var.detach().to(var.dtype) + VARIANCE_FLOOR
    running_mean = running_mean.detach().to(var.dtype)
    log_ratio = torch.log(var.sqrt() / running_var.sqrt()).mean()
    return log_ratio - 0.5 * (1.0 - (running_var + (running_mean - mean) ** 2) / var).mean()


def batch_statistics(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel mean and biased variance of a BatchNorm layer's input (N, C, ...)."""
    flat = x.transpose(0, 1).reshape(x.shape[1], -1)
    return flat.mean(dim=1), flat.var(dim=1, unbiased=False)


def content_loss(outputs: torch.Tensor) -> torch.Tensor:
    """CE of the outputs at T = 1e3 against their own argmax, times the content weight."""
    targets = outputs.argmax(dim=1)
    return F.cross_entropy(outputs / CONTENT_TEMPERATURE, targets) * CONTENT_WEIGHT


def information_entropy_loss(outputs: torch.Tensor) -> torch.Tensor:
    """1 + Σ p̄ log p̄ / log K of the batch's mean softmax p̄ over the K outputs: 0 when the
    batch covers the classes evenly, 1 when it collapses on one (unweighted)."""
    mean_p = F.softmax(outputs, dim=1).mean(dim=0)
    return 1.0 + (mean_p * torch.log(mean_p) / math.log(outputs.shape[1])).sum()


def smoothing_kernel(channels: int) -> torch.Tensor:
    """The code's depthwise 5 × 5 Gaussian (channels, 1, 5, 5), normalised to sum 1 per
    channel, with its exponent −((i − centre)/(2σ))² per axis as written."""
    grid = torch.arange(SMOOTHING_SIZE, dtype=torch.float32)
    centre = (SMOOTHING_SIZE - 1) / 2
    scale = 1 / (SMOOTHING_SIGMA * math.sqrt(2 * math.pi))
    axis = scale * torch.exp(-(((grid - centre) / (2 * SMOOTHING_SIGMA)) ** 2))
    kernel = axis[:, None] * axis[None, :]
    kernel = kernel / kernel.sum()
    return kernel.expand(channels, 1, SMOOTHING_SIZE, SMOOTHING_SIZE).contiguous()


def smoothness_loss(images: torch.Tensor, kernel: torch.Tensor) -> torch.Tensor:
    """mean((x − blur(reflect_pad(x, 2)))²) over every element (unweighted)."""
    pad = (SMOOTHING_PAD,) * 4
    blurred = F.conv2d(F.pad(images, pad, mode="reflect"), kernel, groups=images.shape[1])
    return ((images - blurred) ** 2).mean()


def generator_loss(
    outputs: torch.Tensor,
    divergences: list[torch.Tensor],
    images: torch.Tensor,
    kernel: torch.Tensor,
    weights: tuple[float, float, float],
) -> torch.Tensor:
    """L_G on the teacher's ``outputs`` over the seen classes, the BatchNorm layers'
    ``divergences`` and the generated ``images``; ``weights`` = (w_ie, w_bn, w_noise)."""
    w_ie, w_bn, w_noise = weights
    loss = content_loss(outputs)
    if w_ie:
        loss = loss + information_entropy_loss(outputs) * w_ie
    if w_bn and divergences:
        loss = loss + sum(r * w_bn / len(divergences) for r in divergences)
    if w_noise:
        loss = loss + w_noise * smoothness_loss(images, kernel)
    return loss


def client_loss(
    outputs: torch.Tensor,
    head_outputs: torch.Tensor,
    y: torch.Tensor,
    old_heads: tuple[torch.Tensor, torch.Tensor],
    real: int,
    known: int,
    classes: int,
    weights: tuple[float, float],
) -> torch.Tensor:
    """One step of ``train_cl`` on the joint batch's ``outputs`` (real rows first), the
    head's outputs on its detached features, the labels ŷ, the old head on the student's
    and the teacher's features; ``weights`` = (w_ft, w_kd)."""
    w_ft, w_kd = weights
    own = new_class_ce(outputs[:real], y[:real], known, classes)
    ft = head_cross_entropy(head_outputs, y, known + classes)
    return own + w_ft * ft + w_kd * head_distillation(*old_heads)
