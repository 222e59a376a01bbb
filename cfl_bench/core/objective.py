"""The task objective a stream provides: loss, predictions, per-task metric, buffer outputs.

Why the stream owns it: what "learning a task" means is a property of the data — class
labels scored by accuracy today, boxes scored by mAP for a detection stream — not of the
engine or of a strategy. Learners, FedGP's reference gradient and FedCurv's Fisher take
their loss from here; evaluation and the client spread take their metric from here; replay
buffers store ``buffer_outputs``. Components that only make sense for class logits (FedNTD,
FedProj, task-IL masking) declare ``class_logits`` in ``requires`` and are refused for an
objective that lacks that capability.

torch is imported inside the methods: the strategy grammar and ``cfl-bench list`` import
this module without paying for torch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, TypeAlias

if TYPE_CHECKING:
    import torch
    from torch import nn

# Stored rows → model inputs (a stream's ``as_model_input``); None means "as stored".
Decode: TypeAlias = "Callable[[torch.Tensor], torch.Tensor]"


class Objective(Protocol):
    """What a stream's task asks of a model."""

    # Read-only members: an objective is a frozen value (a frozen dataclass field or a
    # property both satisfy them; a plain ``name: type`` would demand a settable attribute).
    @property
    def capabilities(self) -> frozenset[str]:
        """Names of the capabilities components may require (e.g. ``class_logits``)."""
        ...

    @property
    def metrics(self) -> tuple[str, ...]:
        """The per-task metric records ``score`` returns, the first being the headline one."""
        ...

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The training loss of a batch (mean over examples), differentiable."""
        ...

    def masked_loss(
        self, outputs: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor | None
    ) -> torch.Tensor:
        """``loss`` of the real rows (mask 1) of a padded batch, without a host read (it
        runs inside ``vmap``): a chunk of clients pads every client's batch to one size.
        ``mask`` None: every row is real, and it is ``loss`` itself."""
        ...

    def predict(
        self, module: nn.Module, x: torch.Tensor, decode: Decode | None = None
    ) -> torch.Tensor:
        """The model's outputs on ``x`` for evaluation (eval mode, inference, batched);
        ``decode`` turns each chunk of stored rows into model inputs."""
        ...

    def score(
        self, outputs: torch.Tensor, targets: torch.Tensor, classes: tuple[int, ...]
    ) -> dict[str, torch.Tensor]:
        """The task's metrics (0-d tensors, in ``metrics`` order) of ``outputs``."""
        ...

    def log_probs(self, outputs: torch.Tensor) -> torch.Tensor:
        """The predictive distribution (log-probabilities per row) for memory drift."""
        ...

    def buffer_outputs(self, outputs: torch.Tensor) -> torch.Tensor:
        """What a replay buffer stores of a training batch's outputs (DER's logits)."""
        ...


@dataclass(frozen=True)
class Classification:
    """Class logits, cross-entropy, argmax accuracy in percent; with ``task_il`` also the
    task-IL accuracy (logits masked to the task's classes) for class-incremental streams."""

    task_il: bool = False
    capabilities: frozenset[str] = frozenset({"class_logits"})

    @property
    def metrics(self) -> tuple[str, ...]:
        return ("acc", "acc_task_il") if self.task_il else ("acc",)

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        from torch.nn import functional as F

        return F.cross_entropy(outputs, targets)

    def masked_loss(
        self, outputs: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor | None
    ) -> torch.Tensor:
        """The mean cross-entropy over the real rows (0 if none)."""
        from torch.nn import functional as F

        if mask is None:
            return self.loss(outputs, targets)
        return masked_mean(F.cross_entropy(outputs, targets, reduction="none"), mask)

    def predict(
        self, module: nn.Module, x: torch.Tensor, decode: Decode | None = None
    ) -> torch.Tensor:
        from cfl_bench.core.evaluation import predict_logits

        return predict_logits(module, x, decode=decode)

    def score(
        self, outputs: torch.Tensor, targets: torch.Tensor, classes: tuple[int, ...]
    ) -> dict[str, torch.Tensor]:
        from cfl_bench.core.evaluation import accuracy

        scores = {"acc": accuracy(outputs, targets)}
        if self.task_il:
            scores["acc_task_il"] = accuracy(outputs, targets, classes)
        return scores

    def log_probs(self, outputs: torch.Tensor) -> torch.Tensor:
        from cfl_bench.core.evaluation import log_probs

        return log_probs(outputs)

    def buffer_outputs(self, outputs: torch.Tensor) -> torch.Tensor:
        return outputs


def masked_mean(per_row: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The mean of ``per_row`` over the real (mask 1) rows of a padded batch; 0 when there
    are none (no host read: it runs inside ``vmap``)."""
    return (per_row * mask).sum() / mask.sum().clamp(min=1)
