"""The label-quantity partition (NIID-Bench's #C = k), checked against its definition."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from cfl_bench.core.errors import UserError
from cfl_bench.streams.partition import client_class_counts, partitioner_from_spec
from cfl_bench.streams.partition_quantity import LabelQuantityPartitioner
from tests.sweep_helpers import in_process

# 4 classes (labels 10, 11, 12, 13: positions 0..3), 7, 6, 5 and 4 examples, interleaved.
LABELS = torch.tensor([10, 11, 12, 13] * 4 + [10, 11, 12, 10, 11, 10])


def test_k_equal_to_the_classes_splits_every_class_evenly_among_all_clients() -> None:
    parts = LabelQuantityPartitioner(4).split(LABELS, 3, task=0, seed=0)
    counts = client_class_counts(parts, LABELS - 10, 4)
    # np.array_split sizes: 7 → 3, 2, 2; 6 → 2, 2, 2; 5 → 2, 2, 1; 4 → 2, 1, 1.
    assert counts.tolist() == [[3, 2, 2, 2], [2, 2, 2, 1], [2, 2, 1, 1]]


def test_one_label_each_gives_client_i_all_of_class_i() -> None:
    parts = LabelQuantityPartitioner(1).split(LABELS, 4, task=0, seed=3)
    for i, part in enumerate(parts):
        assert torch.equal(part, torch.nonzero(LABELS.eq(10 + i)).flatten())


def test_every_client_holds_k_distinct_classes_its_own_first_and_nothing_twice() -> None:
    labels = torch.arange(1000) % 10
    parts = LabelQuantityPartitioner(3).split(labels, 25, task=2, seed=7)
    joined = torch.cat(parts)
    assert joined.numel() == torch.unique(joined).numel() == 1000  # disjoint, all held
    counts = client_class_counts(parts, labels, 10)
    for i, row in enumerate(counts):
        assert int((row > 0).sum()) == 3 and row[i % 10] > 0
    # Each class is cut into near-equal parts among its holders.
    for c in range(10):
        held = counts[:, c][counts[:, c] > 0]
        assert int(held.max() - held.min()) <= 1
    again = LabelQuantityPartitioner(3).split(labels, 25, task=2, seed=7)
    assert all(torch.equal(a, b) for a, b in zip(parts, again, strict=True))
    other = LabelQuantityPartitioner(3).split(labels, 25, task=3, seed=7)
    assert any(not torch.equal(a, b) for a, b in zip(parts, other, strict=True))


def test_classes_no_client_draws_are_left_out() -> None:
    labels = torch.arange(100) % 10
    parts = LabelQuantityPartitioner(1).split(labels, 3, task=0, seed=0)
    assert [torch.unique(labels[p]).tolist() for p in parts] == [[0], [1], [2]]
    assert sum(p.numel() for p in parts) == 30


def test_more_labels_than_the_task_has_is_refused() -> None:
    with pytest.raises(UserError, match="labels_per_client=4 or fewer"):
        LabelQuantityPartitioner(5).split(LABELS, 3, task=0, seed=0)
    with pytest.raises(UserError, match="positive integer"):
        LabelQuantityPartitioner(0)


def test_the_spec_and_a_run_use_it(tmp_path: Path) -> None:
    assert partitioner_from_spec("label-quantity:labels_per_client=3").describe() == {
        "name": "label-quantity",
        "labels_per_client": 3,
        "per_task": True,
    }
    out = tmp_path / "run"
    code, output = in_process(
        "run", "--stream", "rot-digits", "--partition", "label-quantity", "--tasks", "2",
        "--rounds-per-task", "1", "--clients", "3", "--threads", "1", "--out", str(out),
    )  # fmt: skip
    assert code == 0, output
    assert '"labels_per_client": 2' in (out / "config.json").read_text()
