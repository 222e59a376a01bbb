"""One-sided projection (A-GEM / FedGP) against hand-computed values and its guarantees."""

from __future__ import annotations

import torch

from strategies.projection import project_conflicting, project_conflicting_


def test_projection_formula_by_hand() -> None:
    g = torch.tensor([1.0, -2.0, 0.0])
    ref = torch.tensor([0.0, 1.0, 1.0])
    # g·r = -2, r·r = 2 → g − (−1)·r = [1, −1, 1]
    assert torch.allclose(project_conflicting(g, ref), torch.tensor([1.0, -1.0, 1.0]))


def test_no_conflict_leaves_gradient_unchanged() -> None:
    g = torch.tensor([1.0, 2.0, 3.0])
    ref = torch.tensor([0.5, 0.1, 0.0])
    assert torch.equal(project_conflicting(g, ref), g)
    h = g.clone()
    project_conflicting_(h, ref)
    assert torch.equal(h, g)


def test_inner_product_non_negative_after_projection_random() -> None:
    gen = torch.Generator().manual_seed(0)
    for _ in range(200):
        g = torch.randn(1000, generator=gen) * 10
        ref = torch.randn(1000, generator=gen)
        out = g.clone()
        project_conflicting_(out, ref)
        bound = -1e-6 * g.norm() * ref.norm()
        assert torch.dot(out, ref) >= bound
        if torch.dot(g, ref) >= 0:
            assert torch.equal(out, g)


def test_epsilon_threshold_disables_projection_for_tiny_reference() -> None:
    g = torch.tensor([1.0, 0.0])
    ref = torch.tensor([-1e-3, 0.0])
    assert torch.equal(project_conflicting(g, ref, min_norm_sq=1e-4), g)
    assert not torch.equal(project_conflicting(g, ref, min_norm_sq=0.0), g)


def test_zero_reference_is_harmless() -> None:
    g = torch.tensor([1.0, -1.0])
    assert torch.equal(project_conflicting(g, torch.zeros(2)), g)
