"""The diagnostics FedNTD is about (``--diagnostics``): what local training forgets.

Per participating client and round, measured by the client on its local model right after
local training (before aggregation), on the current task's probe (the first
``--probe-size`` test examples):

* ``in_local_acc``  = Σ_c a_c·p_c and ``out_local_acc`` = Σ_c a_c·(1 − p_c)/(C − 1), where
  a_c is the local model's accuracy on class c and p_c the client's share of class c in its
  training data — FedNTD's code (``get_round_personalized_acc``): accuracy on the classes
  the client holds, weighted by how much it holds them, against the classes it lacks;
* ``weight_divergence`` = ‖θ_k − θ_g‖₂, the local model's distance from the round's
  global model (trainable parameters).

Per round, on the global model after aggregation, from its per-class accuracy A_c^r on the
current task's whole test split:

* ``class_forgetting`` = (1/C)·Σ_c max_{r' < r} (A_c^{r'} − A_c^r): FedNTD's eq. 5, the
  class-wise forgetting of Chaudhry et al. taken over rounds instead of tasks (0 in the
  first evaluated round; negative while every class is at its best; classes absent from
  the test split are left out);
* ``round_forgetting`` = (1/C)·Σ_c max(0, A_c^{r−1} − A_c^r): what the global model lost
  between two consecutive rounds, class by class.

Why by class: a non-IID round can keep the mean accuracy while trading classes, which is
exactly the forgetting FedNTD describes and a mean hides.
"""

from __future__ import annotations

from typing import Any

import torch


def class_accuracy(logits: torch.Tensor, y: torch.Tensor, num_classes: int) -> torch.Tensor:
    """Accuracy (%) of each class c over the examples labelled c; NaN for absent classes."""
    hits = (logits.argmax(dim=1) == y).float()
    count = torch.bincount(y, minlength=num_classes)[:num_classes].float()
    correct = torch.zeros(num_classes, device=logits.device).index_add_(0, y, hits)
    return torch.where(count > 0, correct * 100.0 / count.clamp(min=1), torch.nan)


def class_shares(labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """The client's distribution over classes, p_c = n_c / n."""
    counts = torch.bincount(labels, minlength=num_classes)[:num_classes].float()
    return counts / counts.sum().clamp(min=1)


def local_split_accuracy(
    class_acc: torch.Tensor, shares: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(in-local, out-local) accuracy as FedNTD's code weighs them (module docstring).

    A class absent from the probe counts as 0 in both sums, as in the authors' code where
    it cannot occur (their probe is the whole test set)."""
    acc = torch.nan_to_num(class_acc, nan=0.0)
    others = (1.0 - shares) / max(int(shares.numel()) - 1, 1)
    return torch.dot(acc, shares), torch.dot(acc, others)


class ClassForgetting:
    """The global model's per-class accuracy history, reduced to what eq. 5 needs: the best
    accuracy of every class so far and the previous round's (saved by checkpoints)."""

    def __init__(self) -> None:
        self.best: torch.Tensor | None = None
        self.last: torch.Tensor | None = None

    def update(self, class_acc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(class_forgetting, round_forgetting) at a round whose per-class accuracy is
        ``class_acc``; then remember it."""
        present = ~torch.isnan(class_acc)
        if self.best is None or self.last is None:
            zero = torch.zeros((), device=class_acc.device)
            forgetting, drop = zero, zero
            self.best = class_acc.clone()
        else:
            forgetting = _mean_where(present & ~torch.isnan(self.best), self.best - class_acc)
            lost = (self.last - class_acc).clamp(min=0)
            drop = _mean_where(present & ~torch.isnan(self.last), lost)
            self.best = torch.fmax(self.best, class_acc)
        self.last = class_acc.clone()
        return forgetting, drop

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best, "last": self.last}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best, self.last = state["best"], state["last"]


def _mean_where(mask: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """Mean of ``values`` over ``mask`` (NaN-free: masked-out entries are ignored)."""
    kept = torch.where(mask, torch.nan_to_num(values, nan=0.0), 0.0)
    return kept.sum() / mask.sum().clamp(min=1)
