"""The Dirichlet/LDA partitioner: covering, seeded per task, skew follows alpha, balanced, fast."""

from __future__ import annotations

import json
import math
import time

import pytest
import torch

from cfl_bench.core.errors import UserError
from cfl_bench.streams.partition import (
    PARTITIONERS,
    DirichletPartitioner,
    build_partitioner,
    client_class_counts,
)


def shuffled_labels(num_classes: int, per_class: int, seed: int = 0) -> torch.Tensor:
    """Balanced labels in shuffled order, like one class-IL task of seq-CIFAR."""
    labels = torch.arange(num_classes).repeat_interleave(per_class)
    return labels[torch.randperm(labels.shape[0], generator=torch.Generator().manual_seed(seed))]


def assert_partition(parts: list[torch.Tensor], total: int) -> None:
    """Sorted int64 CPU parts whose union is every index exactly once (nothing dropped)."""
    for part in parts:
        assert part.dtype == torch.int64 and part.device.type == "cpu" and part.dim() == 1
        assert torch.equal(part, part.sort().values)
    joined = torch.cat(parts)
    assert torch.equal(joined.sort().values, torch.arange(total))


def same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(map(torch.equal, a, b))


def mean_max_class_share(parts: list[torch.Tensor], labels: torch.Tensor, classes: int) -> float:
    """Mean over clients of the largest class's share of the client's data (1 = one class)."""
    counts = client_class_counts(parts, labels, classes).double()
    return (counts.max(dim=1).values / counts.sum(dim=1)).mean().item()


def test_covers_every_index_once_sorted_and_min_size() -> None:
    labels = shuffled_labels(10, 300)
    parts = DirichletPartitioner(alpha=0.3, min_size=10).split(labels, 10, task=0, seed=0)
    assert len(parts) == 10
    assert_partition(parts, labels.numel())
    assert min(part.numel() for part in parts) >= 10


def test_small_alpha_still_reaches_min_size_by_redrawing() -> None:
    labels = shuffled_labels(5, 60)
    for seed in range(5):
        parts = DirichletPartitioner(alpha=0.05, min_size=20).split(labels, 6, task=0, seed=seed)
        assert_partition(parts, labels.numel())
        assert min(part.numel() for part in parts) >= 20


def test_deterministic_per_seed_and_task() -> None:
    labels = shuffled_labels(10, 200)
    first = DirichletPartitioner().split(labels, 8, task=2, seed=5)
    assert same(first, DirichletPartitioner().split(labels, 8, task=2, seed=5))
    assert not same(first, DirichletPartitioner().split(labels, 8, task=3, seed=5))
    assert not same(first, DirichletPartitioner().split(labels, 8, task=2, seed=6))


def test_small_alpha_skews_labels_far_more_than_large_alpha() -> None:
    labels = shuffled_labels(10, 500)
    skewed = DirichletPartitioner(alpha=0.05).split(labels, 10, task=0, seed=0)
    flat = DirichletPartitioner(alpha=100.0).split(labels, 10, task=0, seed=0)
    skewed_share = mean_max_class_share(skewed, labels, 10)
    flat_share = mean_max_class_share(flat, labels, 10)
    # IID would give ~0.1 + noise; near one class per client gives ~1.
    assert flat_share < 0.2
    assert skewed_share > 0.5
    assert skewed_share > 3 * flat_share


def test_balancing_rule_bounds_every_client() -> None:
    # Unequal class sizes, small alpha: without the cap one client could take most classes.
    sizes = [400, 50, 300, 120, 80, 250, 30, 170]
    labels = torch.cat([torch.full((n,), c) for c, n in enumerate(sizes)])
    labels = labels[torch.randperm(labels.numel(), generator=torch.Generator().manual_seed(1))]
    total, clients = labels.numel(), 6
    # A client receives class c only while it holds < N/K, then at most n_c more samples.
    bound = total / clients + max(sizes)
    for seed in range(10):
        parts = DirichletPartitioner(alpha=0.1, min_size=0).split(
            labels, clients, task=0, seed=seed
        )
        assert_partition(parts, total)
        assert max(part.numel() for part in parts) < bound
        # Sharper check of the rule itself: replay the classes in ascending order and check
        # that no client received a class after it already held >= N/K samples.
        counts = client_class_counts(parts, labels, len(sizes))
        held = torch.zeros(clients, dtype=torch.int64)
        for c in range(len(sizes)):
            assert not bool(((held >= total / clients) & (counts[:, c] > 0)).any())
            held += counts[:, c]


def test_impossible_min_size_is_a_clear_user_error() -> None:
    labels = shuffled_labels(3, 5)  # 15 samples
    with pytest.raises(UserError, match=r"needs at least 40 .*4 clients x min_size 10"):
        DirichletPartitioner(min_size=10).split(labels, 4, task=0, seed=0)
    # Feasible by count (4 x 10 = 40) but only if every client gets exactly 10: no draw works.
    tight = shuffled_labels(2, 20)
    with pytest.raises(UserError, match=r"alpha 0.3, 4 clients, min_size 10.*all 5 draws.*larger"):
        DirichletPartitioner(max_redraws=5).split(tight, 4, task=0, seed=0)


@pytest.mark.parametrize("alpha", [0, -1.0, math.nan, math.inf, True, "0.3"])
def test_bad_alpha_is_a_user_error(alpha: object) -> None:
    with pytest.raises(UserError, match="alpha must be a finite number > 0"):
        DirichletPartitioner(alpha=alpha)  # type: ignore[arg-type]


@pytest.mark.parametrize("min_size", [-1, 1.5, False])
def test_bad_min_size_is_a_user_error(min_size: object) -> None:
    with pytest.raises(UserError, match="min_size must be an integer >= 0"):
        DirichletPartitioner(min_size=min_size)  # type: ignore[arg-type]


def test_bad_clients_and_redraws_are_user_errors() -> None:
    with pytest.raises(UserError, match="max_redraws must be a positive integer"):
        DirichletPartitioner(max_redraws=0)
    with pytest.raises(UserError, match="number of clients must be a positive integer"):
        DirichletPartitioner().split(shuffled_labels(2, 50), 0, task=0, seed=0)


def test_build_by_name_and_describe() -> None:
    part = build_partitioner("dirichlet", alpha=0.5)
    assert isinstance(part, DirichletPartitioner) and part.alpha == 0.5
    assert "dirichlet" in PARTITIONERS
    described = part.describe()
    assert described == {
        "name": "dirichlet",
        "alpha": 0.5,
        "min_size": 10,
        "balance": "N/K cap while drawing",
        "per_task": True,
    }
    json.dumps(described)
    with pytest.raises(UserError, match="unknown option 'beta' for partition 'dirichlet'"):
        build_partitioner("dirichlet", beta=0.5)


def test_client_class_counts_by_hand() -> None:
    labels = torch.tensor([0, 2, 1, 2, 0, 2, 1])
    parts = [
        torch.tensor([0, 1, 3]),
        torch.tensor([], dtype=torch.int64),
        torch.tensor([2, 4, 5, 6]),
    ]
    expected = torch.tensor([[1, 0, 2], [0, 0, 0], [1, 2, 1]])
    counts = client_class_counts(parts, labels, 3)
    assert counts.dtype == torch.int64
    assert torch.equal(counts, expected)
    assert torch.equal(client_class_counts(parts, labels, 4)[:, :3], expected)


def test_hundred_clients_hundred_classes_is_fast() -> None:
    labels = shuffled_labels(100, 500)  # 50,000 labels, like CIFAR-100's train split
    part = DirichletPartitioner(alpha=0.3)
    start = time.perf_counter()
    parts = part.split(labels, 100, task=0, seed=0)
    elapsed = time.perf_counter() - start
    assert_partition(parts, labels.numel())
    assert min(p.numel() for p in parts) >= 10
    assert client_class_counts(parts, labels, 100).sum().item() == labels.numel()
    assert elapsed < 5.0, f"100 x 100 Dirichlet split took {elapsed:.2f} s"
