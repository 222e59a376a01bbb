"""FedNTD: federated not-true distillation.

Lee et al., "Preservation of the Global Knowledge by Not-True Distillation in Federated
Learning", NeurIPS 2022. With z the local logits and z_g the logits of the frozen global
model the round started from, on the same batch, drop the true-class column from both
(C−1 logits left, original order kept) and distil on the rest:

    q̃ = softmax(z̃/τ),  q̃_g = softmax(z̃_g/τ),
    L = CE(z, y) + β · τ² · KL(q̃_g ‖ q̃)          (batchmean)

The CE part is the learner's; this component adds the second term. Because the true class
is removed, the distillation term has no gradient w.r.t. the true-class logit: the global
model's knowledge is kept only on the classes the client is *not* being taught.

The teacher runs in eval mode (a frozen, deterministic forward: no dropout noise, BatchNorm
on its running statistics) at θ_g and the broadcast buffers — a ``FrozenForward`` the
executor runs on a copy of the module, so it never touches the global statistics or the
student's parameters. Defaults τ = 1, β = 1 (specs).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import torch
from torch.nn import functional as F

from cfl_bench.core.errors import UserError
from cfl_bench.core.objective import masked_mean
from cfl_bench.strategies import declarations
from cfl_bench.strategies.base import (
    ClientInputs,
    Component,
    Declaration,
    FrozenForward,
    StrategyEnv,
)
from cfl_bench.strategies.declarations import FedNTDOptions

if TYPE_CHECKING:
    from cfl_bench.core.context import Broadcast


def drop_true_class(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """(B, C) → (B, C−1): every column except the label's, in the original order.

    A gather with computed indices (column j < y stays j, j ≥ y reads j + 1) rather than a
    boolean mask: masked indexing must count the kept entries on the host, a device sync at
    every local step on a GPU.
    """
    rows, classes = logits.shape
    cols = torch.arange(classes - 1, device=logits.device).expand(rows, -1)
    cols = cols + (cols >= labels.unsqueeze(1)).long()
    return logits.gather(1, cols)


def not_true_distillation(
    logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    labels: torch.Tensor,
    tau: float,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """τ² · KL(softmax(z̃_g/τ) ‖ softmax(z̃/τ)) with batchmean reduction (``mask``: the mean
    over a padded batch's real rows instead)."""
    student = F.log_softmax(drop_true_class(logits, labels) / tau, dim=1)
    teacher = F.log_softmax(drop_true_class(teacher_logits, labels) / tau, dim=1)
    if mask is None:
        return tau * tau * F.kl_div(student, teacher, reduction="batchmean", log_target=True)
    per_row = (teacher.exp() * (teacher - student)).sum(dim=1)
    return tau * tau * masked_mean(per_row, mask)


class FedNTD(Component):
    declaration: ClassVar[Declaration] = declarations.FEDNTD
    opts: FedNTDOptions
    requires: ClassVar[frozenset[str]] = frozenset({"class_logits"})

    def setup(self, env: StrategyEnv) -> None:
        if env.num_classes < 2:
            raise UserError(
                f"fedntd needs at least two classes; stream {env.stream_name!r} has "
                f"{env.num_classes}."
            )
        self.tau = self.opts.tau
        self.beta = self.opts.beta

    def round_inputs(self, broadcast: Broadcast) -> ClientInputs | None:
        """The teacher: θ_g and its buffers as broadcast (None: no term at β = 0)."""
        if self.beta == 0:
            return None
        return {"teacher": broadcast.params, "teacher_buffers": broadcast.buffers}

    def frozen_forwards(self) -> tuple[FrozenForward, ...]:
        return (FrozenForward("teacher_logits", "teacher", "teacher_buffers"),)

    def loss_term(
        self,
        outputs: torch.Tensor,
        representation: torch.Tensor | None,
        y: torch.Tensor,
        mask: torch.Tensor | None,
        values: dict[str, torch.Tensor],
    ) -> torch.Tensor:
        """β · τ² · KL on the not-true classes against the teacher's logits."""
        teacher = values["teacher_logits"]
        return self.beta * not_true_distillation(outputs, teacher, y, self.tau, mask)
