"""LANDER's client objective as pure tensor functions, written from its official code.

Tran et al., CVPR 2024, code tmtuan1307/LANDER, ``methods/lander.py`` (line numbers below
are of that file; the paper was not read here: the code decides). The model maps its
features f(x) to the label-text-embedding space (``att``, the backbone's ``mapping`` layer)
and the *label-text-embedding anchors* e_y pull them in:

    L_bound = relu(MSE(att(x), e_y) − r)                                  (790, 839)

with MSE the library's mean over rows *and* dimensions (one scalar per batch, not per row)
and r the radius (``--r`` 0.015, main.py:108). Task 0 (``_local_update``, 775–803):

    L = CE(f(x), y) + ltc · L_bound                                        (ltc = 5)

Tasks t > 0 (``_local_finetune``, 805–873), with s a synthetic batch and f_old the model
that ended the previous task:

    L = w_cur · (CE(f(x)[:, new], y − known) + ltc · L_bound)
      + w_pre · (KD_τ(f(s)[:, old], f_old(s)) + MSE(att(s), att_old(s)))

    α = log2(total/2 + 1),  β = √(known/total)
    w_cur = cur · (1 + 1/α) / β,  w_pre = pre · α · β                      (806–809)

cur = 0.2, pre = 0.4 (main.py:110–111), τ = 2 (line 23); KD_τ is TARGET's ``_KD_loss``
(876–879: the soft cross-entropy summed over classes, divided by the rows, no τ²).
"""

from __future__ import annotations

import math

import torch
from torch.nn import functional as F

from cfl_bench.strategies.replay import soft_cross_entropy
from cfl_bench.strategies.target_loss import new_class_ce


def bounding_loss(embedding: torch.Tensor, anchors: torch.Tensor, radius: float) -> torch.Tensor:
    """relu(MSE(embedding, anchors) − radius): 0 while the batch's mean squared distance to
    its anchors (over rows and dimensions) is within the radius, the excess beyond it."""
    return torch.relu(F.mse_loss(embedding, anchors.detach()) - radius)


def task_weights(known: int, total: int, cur: float, pre: float) -> tuple[float, float]:
    """(w_cur, w_pre) of a task with ``known`` old classes of ``total`` seen (806–809): the
    current task's weight falls and the old tasks' rises as classes accumulate."""
    alpha = math.log2(total / 2 + 1)
    beta = math.sqrt(known / total)
    return cur * (1 + 1 / alpha) / beta, pre * alpha * beta


def current_task_loss(
    outputs: torch.Tensor,
    embedding: torch.Tensor,
    y: torch.Tensor,
    anchors: torch.Tensor,
    known: int,
    classes: int,
    ltc: float,
    radius: float,
) -> torch.Tensor:
    """CE over the task's own outputs plus ltc · the bounding loss around the labels'
    anchors (``anchors`` one row per class): task 0's whole loss, and the part of a later
    task's that ``w_cur`` weighs."""
    ce = new_class_ce(outputs, y, known, classes)
    return ce + ltc * bounding_loss(embedding, anchors[y], radius)


def old_task_loss(
    syn_outputs: torch.Tensor,
    teacher_outputs: torch.Tensor,
    syn_embedding: torch.Tensor,
    teacher_embedding: torch.Tensor,
    known: int,
    temperature: float,
) -> torch.Tensor:
    """KD_τ of the old model over the old classes plus the MSE between the embeddings of
    the synthetic batch under the model and the old model: the part ``w_pre`` weighs."""
    kd = soft_cross_entropy(syn_outputs[:, :known], teacher_outputs[:, :known], temperature)
    return kd + F.mse_loss(syn_embedding, teacher_embedding.detach())


def synthetic_batch(syn_bs: int, local_bs: int) -> int:
    """The clients' synthetic batch (``get_syn_data_loader``, 633): ``syn_bs`` times the
    local batch size (the code's formula from ``nums`` is commented out there, 632)."""
    return syn_bs * local_bs
