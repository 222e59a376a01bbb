"""One-sided gradient projection shared by A-GEM, FedProj (client side) and FedGP.

    g̃ = g − (g·r / r·r) · r    only where g·r < 0

Written with ``torch.where`` so it never reads a tensor value on the host (no device sync
per step). ``min_norm_sq`` is FedProj's ε: no projection when ‖r‖² ≤ ε.
"""

from __future__ import annotations

import torch


def row_dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """⟨a, b⟩ over the parameter axis (the last): () for two (P,) vectors, (C,) when either
    has a leading client axis (the other (P,) shared or (C, P) row by row).

    Why three kernels for one formula: each is the fastest for its shapes (BLAS ``dot`` for
    one client, one matrix-vector product against a shared vector, a fused multiply-sum
    row by row), and each executor keeps the arithmetic it always had, so results recorded
    before the step functions were shared stay bit for bit."""
    if a.dim() == 1 and b.dim() == 1:
        return torch.dot(a, b)
    if b.dim() == 1:
        return a @ b
    if a.dim() == 1:
        return b @ a
    return (a * b).sum(dim=-1)


def conflict_coefficients(
    g: torch.Tensor, ref: torch.Tensor, ref_sq: torch.Tensor | None = None, min_norm_sq: float = 0.0
) -> torch.Tensor:
    """``conflict_coefficient`` of ``g`` against ``ref``, parameter axis last: one client
    ((P,) each: a 0-d tensor) or every row of a chunk's ``g`` (C, P) against one shared
    ``ref`` (P,) or its own row of ``ref`` (C, P): a (C,) tensor."""
    dot = row_dot(g, ref)
    if ref_sq is None:
        ref_sq = row_dot(ref, ref)
    conflict = (dot < 0) & (ref_sq > min_norm_sq)
    return torch.where(conflict, dot / torch.clamp(ref_sq, min=torch.finfo(g.dtype).tiny), 0.0)


def projected(
    g: torch.Tensor, ref: torch.Tensor, ref_sq: torch.Tensor | None = None, min_norm_sq: float = 0.0
) -> torch.Tensor:
    """g − coef·ref with ``conflict_coefficients`` (parameter axis last; a new tensor):
    FedGP's step function, for one client or a chunk."""
    coef = conflict_coefficients(g, ref, ref_sq, min_norm_sq)
    return g.addcmul(ref, coef[..., None], value=-1.0)
