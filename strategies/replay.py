"""A learner's replay terms as data, and the one function that computes each term.

A replay learner's local loss is the objective's loss on the batch plus weighted terms on
buffer draws (ER, DER, DER++; interpreted by ``engine.one_client.plan_loss`` on one client):

    draws    d_1 … d_D ← buffer.sample(m) each (buffer generator), only when filled > 0
    loss     ℓ(f(x), y) + Σ_t w_t · ℓ_t(f(aug(x_{d(t)})), target_t)

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
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from cfl_bench.core.objective import Objective

#: The replay terms a plan can hold: the objective's loss on the draw's stored labels, or
#: the mean squared error to the outputs stored with them (DER's logits).
KINDS = ("ce", "mse")


@dataclass(frozen=True)
class ReplayTerm:
    """One replay term of the loss: ``weight`` · ``kind`` on the rows of draw ``draw``;
    ``kind`` is "ce" (the objective's loss on the stored labels) or "mse" (mean squared
    error to the stored outputs)."""

    draw: int
    kind: str
    weight: float


@dataclass(frozen=True)
class ReplayPlan:
    """How many buffer draws a step makes while the buffer holds anything, and the terms
    built from them (in the order the learner forwards them)."""

    draws: int = 0
    terms: tuple[ReplayTerm, ...] = ()
    # The weight of the objective's loss on the batch: 0 when the learner's own loss term
    # replaces it (iCaRL's sigmoid binary cross-entropy, the paper's form).
    batch_weight: float = 1.0


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


def replay_term_loss(
    term: ReplayTerm,
    outputs: torch.Tensor,
    labels: torch.Tensor,
    stored: torch.Tensor,
    objective: Objective,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """``term``'s loss (unweighted) of the replayed ``outputs`` against the draw's stored
    ``labels`` or outputs (``stored``)."""
    if term.kind == "ce":
        return objective.masked_loss(outputs, labels, mask)
    return logit_mse(outputs, stored, mask)
