"""TARGET's client objective (``strategies.target_loss``) against values computed by hand
from the equations of its official code (methods/target.py), on small tensors."""

from __future__ import annotations

import math

import torch

from cfl_bench.strategies.target_loss import (
    finetune_loss,
    kd_loss,
    new_class_ce,
    steps_per_epoch,
    synthetic_batch_size,
)

LN3 = math.log(3.0)
# Row 1: teacher softmax([ln 3, 0]) = (3/4, 1/4) at T = 2, student uniform: −ln ½ = ln 2.
# Row 2: teacher uniform, student (3/4, 1/4): −(½ ln ¾ + ½ ln ¼) = ln 4 − ½ ln 3.
KD_TWO_ROWS = (math.log(2.0) + math.log(4.0) - 0.5 * LN3) / 2


def test_kd_loss_is_the_soft_cross_entropy_summed_over_classes_and_averaged_over_rows() -> None:
    student = torch.tensor([[0.0, 0.0], [2 * LN3, 0.0]])
    teacher = torch.tensor([[2 * LN3, 0.0], [0.0, 0.0]])
    assert math.isclose(kd_loss(student, teacher, 2.0).item(), KD_TWO_ROWS, rel_tol=1e-6)
    assert math.isclose(KD_TWO_ROWS, 0.7650677, rel_tol=1e-6)


def test_the_new_class_ce_reads_only_the_tasks_own_outputs() -> None:
    # known = 2, the task's classes {2, 3}: the old outputs (9, 9) and the future one (9)
    # are outside the softmax; label 3 → shifted 1, softmax([0, ln 3]) = (¼, ¾) → ln 4/3.
    outputs = torch.tensor([[9.0, 9.0, 0.0, LN3, 9.0]])
    value = new_class_ce(outputs, torch.tensor([3]), known=2, classes=2).item()
    assert math.isclose(value, math.log(4 / 3), rel_tol=1e-6)


def test_the_finetune_loss_adds_kd_times_the_old_class_distillation() -> None:
    outputs = torch.tensor([[9.0, 9.0, 0.0, LN3, 9.0]])
    # the synthetic rows' outputs beyond the two old classes must not count
    syn = torch.tensor([[0.0, 0.0, 7.0, 1.0, 2.0], [2 * LN3, 0.0, -5.0, 0.0, 3.0]])
    teacher = torch.tensor([[2 * LN3, 0.0, 4.0, 4.0, 4.0], [0.0, 0.0, 1.0, -1.0, 8.0]])
    value = finetune_loss(outputs, torch.tensor([3]), syn, teacher, 2, 2, 25.0, 2.0).item()
    assert math.isclose(value, math.log(4 / 3) + 25 * KD_TWO_ROWS, rel_tol=1e-6)
    assert math.isclose(value, 19.41437, rel_tol=1e-5)


def test_the_synthetic_batch_and_the_epoch_length_follow_the_codes_arithmetic() -> None:
    # main.py defaults: 5 users, 5 tasks, local_bs 128 → ⌈50000 / 3200⌉ = 16 → 8000 // 16
    assert synthetic_batch_size(8000, 50000, 5, 5, 128) == 500
    # 10 tasks: ⌈50000 / 6400⌉ = 8 → 1000
    assert synthetic_batch_size(8000, 50000, 5, 10, 128) == 1000
    # a client with 2000 rows (16 batches) and the 2,560-image pool in batches of 500 (6)
    assert steps_per_epoch(2000, 128, 2560, 500) == 6
    assert steps_per_epoch(300, 128, 2560, 500) == 3
