"""The forgetting number of the boundary pilot: where a client's local model stops agreeing
with the global model it started from.

For client k in round r, with θ_g^{r−1} the global model it received and θ_k^r its model
after local training, and a set of points P,

    D_P(k, r) = |{p ∈ P : argmax f(p; θ_k^r) ≠ argmax f(p; θ_g^{r−1})}| / |P|

on two sets: the *area* — the centres of an n × n grid of equal cells over the plotting box
(the PCA bounding box of the data, widened by ``margin`` of its width and height on every
side), so D is the fraction of the plotted area whose class the client changed — and the
*data* — the 150 real points. The pilot's forgetting number is the mean of D over clients and
rounds. Why disagreement with the round's own starting model, not with the final or the best
global model: the paper's claim is about what local training does to the boundary it was
given (forgetting during local training), whatever that boundary is worth.

Ties in ``argmax`` go to the lowest class index (torch's rule) for both models alike.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from cfl_bench.core.flat import FlatModel


@dataclass(frozen=True)
class Box:
    """The plotting area: [x0, x1] × [y0, y1]."""

    x0: float
    x1: float
    y0: float
    y1: float

    @property
    def extent(self) -> tuple[float, float, float, float]:
        """As matplotlib's ``imshow(extent=…)`` takes it."""
        return (self.x0, self.x1, self.y0, self.y1)


def plot_box(points: torch.Tensor, margin: float) -> Box:
    """The bounding box of 2-D ``points`` widened by ``margin`` × its size on every side."""
    lo = points.min(dim=0).values.tolist()
    hi = points.max(dim=0).values.tolist()
    dx, dy = (hi[0] - lo[0]) * margin, (hi[1] - lo[1]) * margin
    return Box(lo[0] - dx, hi[0] + dx, lo[1] - dy, hi[1] + dy)


def grid_points(box: Box, n: int) -> torch.Tensor:
    """The centres of an n × n grid of equal cells over ``box``, float32 (n·n, 2), row-major
    from the bottom row up (row i, column j is point i·n + j), so ``labels.view(n, n)`` is
    the picture ``imshow(origin="lower")`` draws."""
    steps = (torch.arange(n, dtype=torch.float64) + 0.5) / n
    xs = box.x0 + steps * (box.x1 - box.x0)
    ys = box.y0 + steps * (box.y1 - box.y0)
    gy, gx = torch.meshgrid(ys, xs, indexing="ij")
    return torch.stack([gx.reshape(-1), gy.reshape(-1)], dim=1).to(torch.float32)


def predict_labels(
    model: FlatModel, params: torch.Tensor, buffers: torch.Tensor, points: torch.Tensor
) -> torch.Tensor:
    """The class ``model`` with the flat state (``params``, ``buffers``) gives each point."""
    model.load(params, buffers)
    module = model.module
    was_training = module.training
    module.eval()
    try:
        with torch.no_grad():
            return module(points).argmax(dim=1)
    finally:
        module.train(was_training)


def disagreement(labels_a: torch.Tensor, labels_b: torch.Tensor) -> float:
    """The fraction of points on which two labelings differ (``D_P`` above)."""
    if labels_a.shape != labels_b.shape or labels_a.numel() == 0:
        raise ValueError(
            f"labelings must be non-empty and of one shape, got {tuple(labels_a.shape)} "
            f"and {tuple(labels_b.shape)}"
        )
    return float((labels_a != labels_b).double().mean())
