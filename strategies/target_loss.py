"""TARGET's client objective as pure tensor functions, written from its official code.

Zhang et al., ICCV 2023, code zj-jayzhang/Federated-Class-Continual-Learning,
``methods/target.py`` (line numbers below are of that file). In every task t > 0 a client
takes, per local step, a batch of its task data (x, y) and a batch s of the synthetic pool,
and minimises (``_local_finetune``, 691–723)

    L = CE(f(x)[:, new], y − known) + kd · KD_T(f(s)[:, old], f_old(s))
    KD_T(p, q) = −(1/B_s) Σ_rows Σ_{c ∈ old} softmax(q/T)_c · log softmax(p/T)_c

with ``old`` = [0, known), ``new`` the task's classes, f_old the global model that ended
task t − 1, kd = 25 (main.py:87) and T = 2 (the literal of line 716). Task 0 is plain CE
over every output of the code's head (``_local_update``, 676–689).

Why the new-class slice is written ``[known, known + c)`` and not the code's ``[known:]``:
the code's head grows with the tasks (``update_fc``), so ``[known:]`` are exactly the
task's c classes; the suite's model has every class's output from the start, and
``[known:]`` would add the future classes' untouched outputs to the softmax. The teacher's
head in the code has ``known`` outputs: here its first ``known`` are taken.

Why there is no T² factor and the target is not KL: ``_KD_loss`` (764–767) is the soft
cross-entropy summed over classes and divided by the rows, as written here; it differs from
KL(q‖p) by q's entropy, a constant of the student, so the gradient is the same either way.
"""

from __future__ import annotations

import math

import torch
from torch.nn import functional as F


def kd_loss(student: torch.Tensor, teacher: torch.Tensor, temperature: float) -> torch.Tensor:
    """The code's ``_KD_loss``: −Σ softmax(teacher/T) · log softmax(student/T), summed over
    the rows and classes, divided by the rows."""
    log_p = F.log_softmax(student / temperature, dim=1)
    q = F.softmax(teacher / temperature, dim=1)
    return -(q * log_p).sum() / student.shape[0]


def new_class_ce(outputs: torch.Tensor, y: torch.Tensor, known: int, classes: int) -> torch.Tensor:
    """CE over the task's own ``classes`` outputs [known, known + classes), the labels
    shifted by ``known`` (the code's ``fake_targets``)."""
    return F.cross_entropy(outputs[:, known : known + classes], y - known)


def finetune_loss(
    outputs: torch.Tensor,
    y: torch.Tensor,
    syn_outputs: torch.Tensor,
    teacher_syn_outputs: torch.Tensor,
    known: int,
    classes: int,
    kd: float,
    temperature: float,
) -> torch.Tensor:
    """One step of ``_local_finetune``: the new-class CE on the task batch plus ``kd`` times
    the KD of the old model on the synthetic batch, over the old classes [0, known)."""
    ce = new_class_ce(outputs, y, known, classes)
    distil = kd_loss(syn_outputs[:, :known], teacher_syn_outputs[:, :known], temperature)
    return ce + kd * distil


def synthetic_batch_size(
    nums: int, dataset_size: int, num_users: int, tasks: int, local_bs: int
) -> int:
    """``get_syn_data_loader``'s batch (616–624): the code spreads ``nums`` synthetic images
    over the ``iters`` batches it expects a client to have per epoch, iters =
    ⌈dataset_size / (num_users · tasks · local_bs)⌉, so syn_bs = ⌊nums / iters⌋."""
    iters = math.ceil(dataset_size / (num_users * tasks * local_bs))
    return int(nums / iters)


def steps_per_epoch(real_rows: int, local_bs: int, pool_rows: int, syn_bs: int) -> int:
    """The code zips the task loader with the synthetic loader (``enumerate(zip(...))``,
    698), so an epoch ends with the shorter one: min(⌈real/local_bs⌉, ⌈pool/syn_bs⌉) steps
    (neither loader drops its last batch). With the code's CIFAR-100 defaults the pool holds
    10 × 256 = 2,560 images, not ``nums`` = 8,000, and this is what cuts the epochs."""
    return min(math.ceil(real_rows / local_bs), math.ceil(pool_rows / syn_bs))
