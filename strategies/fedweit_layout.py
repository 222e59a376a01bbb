"""Where FedWeIT's decomposed layers lie in the flat θ, and the per-channel operations on
that layout: the channels a client keeps (its upload's sparsity) and the sparse aggregation
of the bases (``strategies.fedweit``; the layers themselves are ``strategies.decomposed``).

Why a module of its own: the client's per-task state (``strategies.fedweit_tasks``), the
server's aggregation (``strategies.fedweit_server``) and the component all read the
layout; here it is written once, below all three.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from cfl_bench.core.errors import UserError
from cfl_bench.strategies.decomposed import FedWeITLeNet

if TYPE_CHECKING:
    from cfl_bench.core.flat import FlatModel

#: The code's ε in the per-channel division of the aggregated bases.
AGGREGATION_EPS = 1e-15
MODEL = "fedweit-lenet"


@dataclass(frozen=True)
class Layout:
    """Where each decomposed layer's base lies in θ: (start, numel, output channels)."""

    layers: tuple[tuple[int, int, int], ...]
    head: tuple[int, int]  # the head's (classes, features)

    @property
    def params(self) -> int:
        return sum(n for _, n, _ in self.layers)

    @property
    def channels(self) -> int:
        return sum(out for _, _, out in self.layers)

    def expand(self, per_channel: torch.Tensor) -> torch.Tensor:
        """A per-output-channel vector (Σ out) spread over θ's layout (out is the first
        axis of every torch weight, so a channel's entries are contiguous)."""
        parts, offset = [], 0
        for _, numel, out in self.layers:
            parts.append(per_channel[offset : offset + out].repeat_interleave(numel // out))
            offset += out
        return torch.cat(parts)


def layout_of(model: FlatModel) -> Layout:
    module = model.module
    if not isinstance(module, FedWeITLeNet):
        raise UserError(f"fedweit composes decomposed layers only; use --model {MODEL}.")
    where = {s.name: s for s in model.slices}
    names = [n for n, m in module.named_modules() if m in module.layers()]
    rows = []
    for name, layer in zip(names, module.layers(), strict=True):
        s = where[f"{name}.shared"]
        rows.append((s.start, s.numel, int(layer.shared.shape[0])))
    return Layout(tuple(rows), (module.num_classes, int(module.fc2.shared.shape[0])))


def keep_mask(mask: torch.Tensor, layout: Layout, sparsity: float) -> torch.Tensor:
    """Per layer, 1 for the channels whose |m| exceeds the ⌊n·s⌋-th smallest |m| (0-based),
    the code's ``hard_threshold`` of ``get_weights``."""
    parts, offset = [], 0
    for _, _, out in layout.layers:
        m = mask[offset : offset + out].abs()
        threshold = torch.sort(m).values[math.floor(out * sparsity)]
        parts.append((m > threshold).to(mask.dtype))
        offset += out
    return torch.cat(parts)


def aggregate_bases(
    pruned_sum: torch.Tensor, keep_sum: torch.Tensor, layout: Layout
) -> torch.Tensor:
    """B_g = Σ B_c⊙keep_c / (Σ keep_c + ε), channel by channel."""
    return pruned_sum / (layout.expand(keep_sum) + AGGREGATION_EPS)
