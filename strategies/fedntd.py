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

The teacher runs in eval mode (a frozen, deterministic copy: no dropout noise, BatchNorm on
its running statistics) on a private copy of the module, so its forward never touches the
global statistics or the student's parameters. Defaults τ = 1, β = 1 (specs).
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, ClassVar

from cfl_bench.errors import UserError
from strategies.base import Component, Option, Role, StrategyEnv, non_negative_float, positive_float

if TYPE_CHECKING:
    import torch

    from cfl_bench.engine.context import ClientState, LocalRound, StepContext
    from cfl_bench.flat import FlatModel


def drop_true_class(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """(B, C) → (B, C−1): every column except the label's, in the original order.

    A gather with computed indices (column j < y stays j, j ≥ y reads j + 1) rather than a
    boolean mask: masked indexing must count the kept entries on the host, a device sync at
    every local step on a GPU.
    """
    import torch

    rows, classes = logits.shape
    cols = torch.arange(classes - 1, device=logits.device).expand(rows, -1)
    cols = cols + (cols >= labels.unsqueeze(1)).long()
    return logits.gather(1, cols)


def not_true_distillation(
    logits: torch.Tensor, teacher_logits: torch.Tensor, labels: torch.Tensor, tau: float
) -> torch.Tensor:
    """τ² · KL(softmax(z̃_g/τ) ‖ softmax(z̃/τ)) with batchmean reduction."""
    from torch.nn import functional as F

    student = F.log_softmax(drop_true_class(logits, labels) / tau, dim=1)
    teacher = F.log_softmax(drop_true_class(teacher_logits, labels) / tau, dim=1)
    return tau * tau * F.kl_div(student, teacher, reduction="batchmean", log_target=True)


class FedNTD(Component):
    name: ClassVar[str] = "fedntd"
    roles: ClassVar[frozenset[Role]] = frozenset({Role.LOSS_TERM})
    summary: ClassVar[str] = "distil the round's global model on the not-true classes only"
    paper: ClassVar[str] = "Lee et al., NeurIPS 2022 (FedNTD)"
    requires: ClassVar[frozenset[str]] = frozenset({"class_logits"})
    options: ClassVar[tuple[Option, ...]] = (
        Option("tau", 1.0, "distillation temperature τ", positive_float),
        Option("beta", 1.0, "weight β of the not-true distillation term", non_negative_float),
    )

    def setup(self, env: StrategyEnv) -> None:
        if env.num_classes < 2:
            raise UserError(
                f"fedntd needs at least two classes; stream {env.stream_name!r} has "
                f"{env.num_classes}."
            )
        self.tau = float(str(self.values["tau"]))
        self.beta = float(str(self.values["beta"]))
        self.teacher: FlatModel | None = None

    def on_client_start(self, client: ClientState, local: LocalRound) -> None:
        """The teacher is a frozen copy of θ_g as broadcast (the model architecture is the
        client's own)."""
        from cfl_bench.flat import FlatModel

        if self.teacher is None:
            self.teacher = FlatModel(copy.deepcopy(local.model.module))
            self.teacher.module.eval()
            self.teacher.module.requires_grad_(False)
        self.teacher.load(local.broadcast.params, local.broadcast.buffers)

    def loss_term(self, step: StepContext) -> torch.Tensor | None:
        import torch

        if self.beta == 0 or self.teacher is None or step.outputs is None:
            return None
        with torch.no_grad():
            teacher_logits = self.teacher.module(step.x)
        return self.beta * not_true_distillation(step.outputs, teacher_logits, step.y, self.tau)
