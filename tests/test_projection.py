"""One-sided projection (A-GEM / FedGP) against hand-computed values and its guarantees."""

from __future__ import annotations

import torch

from cfl_bench.strategies.projection import conflict_coefficients, projected, row_dot


def test_projection_formula_by_hand() -> None:
    g = torch.tensor([1.0, -2.0, 0.0])
    ref = torch.tensor([0.0, 1.0, 1.0])
    # g·r = -2, r·r = 2 → g − (−1)·r = [1, −1, 1]
    assert torch.allclose(projected(g, ref), torch.tensor([1.0, -1.0, 1.0]))


def test_no_conflict_leaves_gradient_unchanged() -> None:
    g = torch.tensor([1.0, 2.0, 3.0])
    ref = torch.tensor([0.5, 0.1, 0.0])
    assert torch.equal(projected(g, ref), g)


def test_inner_product_non_negative_after_projection_random() -> None:
    gen = torch.Generator().manual_seed(0)
    for _ in range(200):
        g = torch.randn(1000, generator=gen) * 10
        ref = torch.randn(1000, generator=gen)
        out = projected(g, ref)
        bound = -1e-6 * g.norm() * ref.norm()
        assert torch.dot(out, ref) >= bound
        if torch.dot(g, ref) >= 0:
            assert torch.equal(out, g)


def test_epsilon_threshold_disables_projection_for_tiny_reference() -> None:
    g = torch.tensor([1.0, 0.0])
    ref = torch.tensor([-1e-3, 0.0])
    assert torch.equal(projected(g, ref, min_norm_sq=1e-4), g)
    assert not torch.equal(projected(g, ref, min_norm_sq=0.0), g)


def test_zero_reference_is_harmless() -> None:
    g = torch.tensor([1.0, -1.0])
    assert torch.equal(projected(g, torch.zeros(2)), g)


def test_a_chunk_projects_row_by_row_as_one_client_does() -> None:
    # The step functions take one client's (P,) or a chunk's (C, P): each row of a chunk
    # against a shared reference, or against its own row, equals the one-client result.
    gen = torch.Generator().manual_seed(1)
    g = torch.randn(4, 50, generator=gen)
    ref = torch.randn(50, generator=gen)
    rows = torch.randn(4, 50, generator=gen)
    shared, own = projected(g, ref), projected(g, rows)
    for k in range(4):
        assert torch.allclose(shared[k], projected(g[k], ref), rtol=0, atol=1e-6)
        assert torch.allclose(own[k], projected(g[k], rows[k]), rtol=0, atol=1e-6)
    assert conflict_coefficients(g, ref).shape == (4,)
    assert conflict_coefficients(g[0], ref).shape == ()


def test_row_dot_shapes_and_values_by_hand() -> None:
    a = torch.tensor([[1.0, 2.0], [3.0, -1.0]])
    b = torch.tensor([2.0, 1.0])
    assert torch.equal(row_dot(a, b), torch.tensor([4.0, 5.0]))
    assert torch.equal(row_dot(b, a), torch.tensor([4.0, 5.0]))
    assert torch.equal(row_dot(a, a), torch.tensor([5.0, 10.0]))
    assert row_dot(b, b).item() == 5.0
