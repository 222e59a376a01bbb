"""Partitioners: deterministic, disjoint, the FedGP shard rule, and clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from cfl_bench.core.errors import UserError
from cfl_bench.streams.partition import (
    PARTITIONERS,
    IIDPartitioner,
    ShardPartitioner,
    build_partitioner,
    partitioner_from_spec,
)


def mnist_like_labels(per_class: int = 600, seed: int = 0) -> torch.Tensor:
    """Balanced labels in shuffled order, like MNIST's train split but smaller."""
    labels = torch.arange(10).repeat_interleave(per_class)
    return labels[torch.randperm(labels.shape[0], generator=torch.Generator().manual_seed(seed))]


def assert_disjoint_sorted(parts: list[torch.Tensor]) -> torch.Tensor:
    for part in parts:
        assert part.dtype == torch.int64 and part.device.type == "cpu"
        assert torch.equal(part, part.sort().values)
    joined = torch.cat(parts)
    assert joined.unique().numel() == joined.numel(), "clients must not share indices"
    return joined


def test_shards_are_equal_disjoint_and_two_labels_each() -> None:
    labels = mnist_like_labels()
    parts = ShardPartitioner().split(labels, 10, task=0, seed=0)
    assert len(parts) == 10
    joined = assert_disjoint_sorted(parts)
    assert joined.numel() == labels.numel()
    assert {part.numel() for part in parts} == {600}
    assert all(labels[part].unique().numel() <= 2 for part in parts)


def test_shards_are_the_same_for_every_task_and_seeded() -> None:
    labels = mnist_like_labels()
    shards = ShardPartitioner()
    first = shards.split(labels, 10, task=0, seed=3)
    for task in (1, 4):
        assert all(map(torch.equal, first, shards.split(labels, 10, task=task, seed=3)))
    assert all(map(torch.equal, first, ShardPartitioner().split(labels, 10, task=0, seed=3)))
    other = shards.split(labels, 10, task=0, seed=4)
    assert not all(map(torch.equal, first, other))


def test_shards_drop_the_remainder_at_the_end() -> None:
    labels = mnist_like_labels(per_class=11)  # 110 samples, 20 shards of 5, 10 dropped
    parts = ShardPartitioner().split(labels, 10, task=0, seed=0)
    joined = assert_disjoint_sorted(parts)
    assert {part.numel() for part in parts} == {10}
    by_label = torch.sort(labels, stable=True).indices
    assert set(joined.tolist()) == set(by_label[:100].tolist())


def test_iid_covers_everything_near_equally() -> None:
    labels = mnist_like_labels(per_class=101)
    iid = IIDPartitioner()
    parts = iid.split(labels, 7, task=0, seed=0)
    joined = assert_disjoint_sorted(parts)
    assert torch.equal(joined.sort().values, torch.arange(labels.numel()))
    sizes = [part.numel() for part in parts]
    assert max(sizes) - min(sizes) <= 1
    assert all(map(torch.equal, parts, iid.split(labels, 7, task=2, seed=0)))
    assert not all(map(torch.equal, parts, iid.split(labels, 7, task=0, seed=1)))


def test_too_few_samples_is_a_user_error() -> None:
    labels = torch.arange(10) % 10
    with pytest.raises(UserError, match="at least 20 training samples"):
        ShardPartitioner().split(labels, 10, task=0, seed=0)
    with pytest.raises(UserError, match="one training sample per client"):
        IIDPartitioner().split(labels[:3], 4, task=0, seed=0)
    with pytest.raises(UserError, match="number of clients must be a positive integer"):
        IIDPartitioner().split(labels, 0, task=0, seed=0)


def test_build_partitioner_by_name() -> None:
    assert set(PARTITIONERS) == {
        "shards",
        "class-shards",
        "iid",
        "dirichlet",
        "class-subsets",
        "label-quantity",
    }
    shards = build_partitioner("shards", shards_per_client=3)
    assert isinstance(shards, ShardPartitioner) and shards.shards_per_client == 3
    assert shards.describe()["shards_per_client"] == 3
    assert build_partitioner("iid").describe()["name"] == "iid"
    with pytest.raises(UserError, match=r"unknown partition 'lda'.*iid, label-quantity, shards"):
        build_partitioner("lda")
    with pytest.raises(UserError, match="partition 'iid' takes no options"):
        build_partitioner("iid", alpha=0.3)
    with pytest.raises(UserError, match="shards_per_client must be a positive integer"):
        build_partitioner("shards", shards_per_client=0)


def test_partition_specs_carry_options() -> None:
    dirichlet = partitioner_from_spec("dirichlet:alpha=1,min_size=5")
    assert dirichlet.describe()["alpha"] == 1.0 and dirichlet.describe()["min_size"] == 5
    assert (
        partitioner_from_spec(" shards : shards_per_client=3 ").describe()["shards_per_client"] == 3
    )
    assert partitioner_from_spec("iid").describe() == {"name": "iid", "per_task": False}
    with pytest.raises(UserError, match="needs a value; write dirichlet:alpha=VALUE"):
        partitioner_from_spec("dirichlet:alpha")
    with pytest.raises(UserError, match="must be a finite number > 0, got 'high'"):
        partitioner_from_spec("dirichlet:alpha=high")
    with pytest.raises(UserError, match="unknown option 'beta' for partition 'dirichlet'"):
        partitioner_from_spec("dirichlet:beta=1")


def test_partition_option_reaches_the_run_and_its_protocol(tmp_path: Path) -> None:
    from tests.test_cli import in_process

    code, output = in_process(
        "run", "--tasks", "1", "--rounds-per-task", "1", "--clients", "5",
        "--partition", "dirichlet:alpha=2,min_size=3", "--train-size", "300",
        "--test-size", "50", "--out", str(tmp_path / "r"),
    )  # fmt: skip
    assert code == 0, output
    protocol = json.loads((tmp_path / "r" / "config.json").read_text())["protocol"]
    assert protocol["partition"]["alpha"] == 2.0 and protocol["partition"]["min_size"] == 3
    code, output = in_process(
        "run", "--partition", "dirichlet:alpha=x", "--out", str(tmp_path / "b")
    )
    assert code == 2 and "must be a finite number > 0" in output
