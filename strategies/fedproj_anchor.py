"""FedProj's anchor: what the server's distillation pulls θ towards with γ·‖θ − anchor‖²
(``fedproj:anchor``; ``strategies.fedproj``, ``strategies.distillation.distill``).

Why a module of its own: the anchor's per-round material (``mean``: the sum of the
round's client models; ``global``: θ_g as the round began; ``snapshot``: the FedAvg mean
itself, nothing to keep) is one concern, collected as uploads arrive and spent once at
aggregation. ``AnchorMaterial`` holds it as component methods mixed in before
``Component`` (``class FedProj(AnchorMaterial, PublicSetUser, Component)``); the material
is empty at every round end, where checkpoints are written, so it is no saved state.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from cfl_bench.core.context import ServerState, Upload


class AnchorMaterial:
    """This round's anchor material and the anchor it gives, as component methods."""

    gamma: float
    anchor: str
    _param_sum: torch.Tensor | None
    _param_count: int
    _previous: torch.Tensor | None

    def collect_anchor(self, upload: Upload, server: ServerState) -> None:
        """anchor=mean: sum θ_k; anchor=global: keep θ_g as it was before this round's
        aggregation replaces it (copied at the round's first upload)."""
        if self.gamma == 0:
            return
        if self.anchor == "mean":
            if self._param_sum is None:
                self._param_sum = upload.params.detach().clone()
            else:
                self._param_sum.add_(upload.params)
            self._param_count += 1
        elif self.anchor == "global" and self._previous is None:
            self._previous = server.global_params.detach().clone()

    def anchor_params(self, theta_avg: torch.Tensor) -> torch.Tensor:
        """The round's anchor of γ·‖θ − anchor‖² (snapshot: θ_avg itself); the per-round
        material is reset for the next round."""
        param_sum, count, previous = self._param_sum, self._param_count, self._previous
        self._param_sum, self._param_count, self._previous = None, 0, None
        if self.anchor == "mean" and param_sum is not None and count > 0:
            return param_sum.div_(count)
        if self.anchor == "global" and previous is not None:
            return previous
        return theta_avg
