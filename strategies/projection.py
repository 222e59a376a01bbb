"""One-sided gradient projection shared by A-GEM, FedProj (client side) and FedGP.

    g̃ = g − (g·r / r·r) · r    only where g·r < 0

Written with ``torch.where`` so it never reads a tensor value on the host (no device sync
per step). ``min_norm_sq`` is FedProj's ε: no projection when ‖r‖² ≤ ε. torch is imported
inside the functions, as in every strategy module (see ``strategies.base``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def conflict_coefficient(
    g: torch.Tensor, ref: torch.Tensor, ref_sq: torch.Tensor | None = None, min_norm_sq: float = 0.0
) -> torch.Tensor:
    """(g·r / r·r) where g conflicts with r (and ‖r‖² > min_norm_sq), else 0 — a 0-d tensor."""
    import torch

    dot = torch.dot(g, ref)
    if ref_sq is None:
        ref_sq = torch.dot(ref, ref)
    conflict = (dot < 0) & (ref_sq > min_norm_sq)
    return torch.where(conflict, dot / torch.clamp(ref_sq, min=torch.finfo(g.dtype).tiny), 0.0)


def project_conflicting(
    g: torch.Tensor, ref: torch.Tensor, ref_sq: torch.Tensor | None = None, min_norm_sq: float = 0.0
) -> torch.Tensor:
    """g projected onto the half-space {v : v·ref ≥ 0} when it conflicts with ref (new tensor)."""
    return g - conflict_coefficient(g, ref, ref_sq, min_norm_sq) * ref


def project_conflicting_(
    g: torch.Tensor, ref: torch.Tensor, ref_sq: torch.Tensor | None = None, min_norm_sq: float = 0.0
) -> None:
    """In-place variant on the flat gradient: one fused multiply-add, no new vector."""
    coef = conflict_coefficient(g, ref, ref_sq, min_norm_sq)
    g.addcmul_(ref, coef, value=-1.0)


def conflict_coefficients(
    g: torch.Tensor, ref: torch.Tensor, ref_sq: torch.Tensor | None = None, min_norm_sq: float = 0.0
) -> torch.Tensor:
    """``conflict_coefficient`` of every row of ``g`` (C, P) against one shared ``ref`` (P,)
    or against its own row of ``ref`` (C, P): a (C,) tensor (the vectorized executor's
    clients; a shared reference is one matrix-vector product)."""
    import torch

    dot = g @ ref if ref.dim() == 1 else (g * ref).sum(dim=1)
    if ref_sq is None:
        ref_sq = torch.dot(ref, ref) if ref.dim() == 1 else (ref * ref).sum(dim=1)
    conflict = (dot < 0) & (ref_sq > min_norm_sq)
    return torch.where(conflict, dot / torch.clamp(ref_sq, min=torch.finfo(g.dtype).tiny), 0.0)
