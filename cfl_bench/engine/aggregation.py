"""FedAvg aggregation as a running weighted sum of flat vectors.

Why running: uploads are folded in as they arrive, so the server never holds K model copies
(memory stays one extra model, whatever K). Weighting ``samples`` is FedAvg's n_k / Σ n_j;
``uniform`` is the FedGP code's plain mean over participating clients. BatchNorm running
statistics (the flat float buffers) are averaged with the same weights.
"""

from __future__ import annotations

import torch


class RunningAverage:
    def __init__(self, params_like: torch.Tensor, buffers_like: torch.Tensor) -> None:
        self.params = torch.zeros_like(params_like)
        self.buffers = torch.zeros_like(buffers_like)
        self.total_weight = 0.0

    def add(self, params: torch.Tensor, buffers: torch.Tensor, weight: float) -> None:
        if weight < 0:
            raise ValueError("aggregation weights must be non-negative")
        self.params.add_(params, alpha=weight)
        self.buffers.add_(buffers, alpha=weight)
        self.total_weight += weight

    def result(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The weighted mean, or None when nothing (or only zero weight) was added."""
        if self.total_weight <= 0:
            return None
        return self.params.div_(self.total_weight), self.buffers.div_(self.total_weight)


def client_weight(num_samples: int, weighting: str) -> float:
    if weighting == "samples":
        return float(num_samples)
    if weighting == "uniform":
        return 1.0
    raise ValueError(f"unknown weighting {weighting!r}")
