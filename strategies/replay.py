"""A learner's replay terms as data, and the one function that computes each term.

A replay learner's local loss is the objective's loss on the batch plus weighted terms on
buffer draws (ER, DER, DER++; interpreted by ``engine.one_client.plan_loss`` on one client):

    draws    d_1 … d_D ← buffer.sample(m) each (buffer generator), only when filled > 0
    loss     ℓ(f(x), y) + Σ_t w_t · ℓ_t(f(aug(x_{d(t)})), target_t)

The draws come from the learner's ``replay_source`` (the client's reservoir buffer, or
TARGET's synthetic pool walked epoch by epoch). A "kd" term's target is not stored: it is a
frozen teacher's outputs on the same augmented draw (TARGET's distillation on synthetic
images), so only the one-client reading (``plan_loss``) runs it; the vectorized executor
refuses such learners (they are ``sequential_only``).

Why data and not code: an executor needs to know what a step draws and computes to run it
its own way — the sequential executor forwards each draw separately, the vectorized one
forwards every client's batch and draws as one padded, masked batch inside ``vmap`` — and
with the plan written down once (``Learner.replay_plan``), both run the same terms through
``replay_term_loss`` and no executor needs to know which learner it trains.

``mask`` None means every row is real: the term is the library's mean (``F.mse_loss``, the
objective's loss), exactly what the sequential executor always computed. With a mask (the
padded rows of a chunk) it is the mean over the real rows; a term without real rows is 0.
torch is imported inside the functions: ``strategies.base`` imports this module, and the
declarations it serves stay torch-free (``strategies.declarations``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import torch

    from cfl_bench.core.buffer import BufferDraw
    from cfl_bench.core.objective import Objective


class ReplaySource(Protocol):
    """What a step's replay draws come from (``Learner.replay_source``): the reservoir
    buffer, or a learner's own store such as TARGET's synthetic pool."""

    @property
    def filled(self) -> int:
        """How many rows a draw can come from (0: the step makes no draws)."""
        ...

    def sample(self, m: int) -> BufferDraw | None:
        """The next draw of m rows (None when empty)."""
        ...


#: The replay terms a plan can hold: the objective's loss on the draw's stored labels, the
#: mean squared error to the outputs stored with them (DER's logits), or the distillation
#: of a frozen teacher's outputs on the draw at a temperature (``soft_cross_entropy``).
#: A ``joint`` plan's terms read the batch and the draw forwarded as one: "head_ce" (the
#: classifier's CE on features of a second forward without gradient, MFCL's ``w_ft`` term)
#: and "head_kd" (the teacher's classifier on the student's and on the teacher's features,
#: ``head_distillation``: MFCL's ``kd``).
KINDS = ("ce", "mse", "kd", "head_ce", "head_kd")


@dataclass(frozen=True)
class ReplayTerm:
    """One replay term of the loss: ``weight`` · ``kind`` on the rows of draw ``draw``;
    ``kind`` is "ce" (the objective's loss on the stored labels) or "mse" (mean squared
    error to the stored outputs)."""

    draw: int
    kind: str
    weight: float
    # "kd" only: the temperature, how many leading outputs are distilled (0: all of them),
    # and the keys of the learner's client inputs holding the teacher's parameters and
    # buffers (run on the draw in eval mode, without gradient).
    temperature: float = 1.0
    outputs: int = 0
    teacher: tuple[str, str] = ("", "")
    # "kd" only: ≥ 0 adds the mean squared error between the draw's representation columns
    # from this one on under the model and under the teacher (LANDER's embeddings of the
    # synthetic batch, ``embedding_mse``), at the same weight, from the same forwards.
    features_from: int = -1


@dataclass(frozen=True)
class ReplayPlan:
    """How many buffer draws a step makes while the buffer holds anything, and the terms
    built from them (in the order the learner forwards them)."""

    draws: int = 0
    terms: tuple[ReplayTerm, ...] = ()
    # The weight of the objective's loss on the batch: 0 when the learner's own loss term
    # replaces it (iCaRL's sigmoid binary cross-entropy, the paper's form).
    batch_weight: float = 1.0
    # Rows per draw; 0: the run's --buffer-batch-size (TARGET draws its code's synthetic
    # batch size instead).
    draw_size: int = 0
    # The batch and the first draw go through the model as one batch (MFCL's
    # ``combine_data``: BatchNorm sees both in one set of statistics), the draw as its source
    # made it (no replay augmentation); the batch loss reads the batch's rows, the terms
    # every row (the batch's first) with the labels y then the draw's.
    joint: bool = False


def logit_mse(
    outputs: torch.Tensor, stored: torch.Tensor, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """DER's term before weighting: the mean squared error over rows × outputs."""
    from torch.nn import functional as F

    from cfl_bench.core.objective import masked_mean

    if mask is None:
        return F.mse_loss(outputs, stored)
    diff = outputs - stored
    return masked_mean((diff * diff).flatten(1).mean(dim=1), mask)


def soft_cross_entropy(
    student: torch.Tensor,
    teacher: torch.Tensor,
    temperature: float,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Distillation at temperature T as FCL codes write it (TARGET's ``_KD_loss``):
    −Σ_c softmax(teacher/T)_c · log softmax(student/T)_c per row, averaged over the rows
    (the real rows under ``mask``). No T² factor, and the soft cross-entropy rather than KL:
    the two differ by the teacher's entropy, a constant of the student."""
    from torch.nn import functional as F

    from cfl_bench.core.objective import masked_mean

    log_p = F.log_softmax(student / temperature, dim=1)
    q = F.softmax(teacher / temperature, dim=1)
    per_row = -(q * log_p).sum(dim=1)
    return per_row.mean() if mask is None else masked_mean(per_row, mask)


def replay_term_loss(
    term: ReplayTerm,
    outputs: torch.Tensor,
    labels: torch.Tensor,
    stored: torch.Tensor,
    objective: Objective,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """``term``'s loss (unweighted) of the replayed ``outputs`` against the draw's stored
    ``labels`` or outputs (``stored``; for "kd", the teacher's outputs on the draw)."""
    if term.kind == "ce":
        return objective.masked_loss(outputs, labels, mask)
    if term.kind == "kd":
        width = term.outputs or outputs.shape[1]
        return soft_cross_entropy(outputs[:, :width], stored[:, :width], term.temperature, mask)
    return logit_mse(outputs, stored, mask)


def embedding_mse(
    student: torch.Tensor, teacher: torch.Tensor, start: int, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """LANDER's feature term on a draw: the mean squared error between the student's and
    the teacher's representation columns from ``start`` on (the embeddings), over rows ×
    columns (the real rows under ``mask``)."""
    return logit_mse(student[:, start:], teacher[:, start:].detach(), mask)


def head_distillation(student_old: torch.Tensor, teacher_old: torch.Tensor) -> torch.Tensor:
    """A "head_kd" term before its weight (MFCL's ``kd``): the teacher's classifier outputs
    on the student's features against those on the teacher's, squared differences summed
    over the outputs, averaged over the rows, divided by the number of outputs."""
    per_row = ((student_old - teacher_old.detach()) ** 2).sum(dim=1)
    return per_row.mean() / student_old.shape[1]


def head_cross_entropy(head_outputs: torch.Tensor, y: torch.Tensor, width: int) -> torch.Tensor:
    """A "head_ce" term before its weight (MFCL's ``w_ft`` term): the CE of the classifier's
    outputs on every row over the leading ``width`` outputs (0: all of them)."""
    from torch.nn import functional as F

    return F.cross_entropy(head_outputs[:, : width or head_outputs.shape[1]], y)
