"""Quantity-based label imbalance: every client holds a fixed number of the task's classes.

NIID-Bench's ``noniid-#label{k}`` split (Li et al., "Federated Learning on Non-IID Data
Silos: An Experimental Study", ICDE 2022; code Xtra-Computing/NIID-Bench, ``utils.py``
``partition_data``, lines 346–389), the "#C = k" label skew FL and FCL papers name beside
Dirichlet's. Why a partition of its own: ``class-shards`` draws shards, so a client may get
two shards of one class and fewer than k classes; ``class-subsets`` lets clients share
examples. Here every client holds exactly k distinct classes and every held example goes to
exactly one client:

- client i holds the task's class i mod C first (so with at least C clients every class is
  held), then classes drawn uniformly at random, redrawn when already held, until it holds k;
- each class's examples, shuffled, are cut into as many near-equal parts as clients hold it
  (the first parts one larger, as ``np.array_split``) and given out in client order.

A class no client draws (fewer clients than classes) is held by nobody and its examples are
left out (NIID-Bench's ``array_split(…, 0)`` would fail there); ``cfl-bench clients`` shows
the counts. Drawn afresh per task with its own generator (run seed, "partition",
"label-quantity", task); the code draws from Python's and numpy's global generators, so the
classes drawn for one seed differ from its own.
"""

from __future__ import annotations

import torch

from cfl_bench.core.seeding import generator
from cfl_bench.streams.partition_base import Partitioner, check_positive_int, task_classes


class LabelQuantityPartitioner(Partitioner):
    """NIID-Bench's quantity-based label imbalance with ``labels_per_client`` = k."""

    name = "label-quantity"

    def __init__(self, labels_per_client: int = 2) -> None:
        check_positive_int("labels_per_client", labels_per_client)
        self.labels_per_client = labels_per_client

    def split(
        self, labels: torch.Tensor, num_clients: int, *, task: int, seed: int
    ) -> list[torch.Tensor]:
        per_client = (self.name, "labels_per_client", self.labels_per_client)
        labels, classes = task_classes(labels, num_clients, per_client, task)
        rng = generator(seed, "partition", self.name, task)
        held = self.held_classes(classes.numel(), num_clients, rng)
        parts: list[list[torch.Tensor]] = [[] for _ in range(num_clients)]
        for c in range(classes.numel()):
            holders = [k for k in range(num_clients) if c in held[k]]
            if not holders:
                continue
            rows = torch.nonzero(labels == classes[c]).flatten()
            rows = rows[torch.randperm(rows.numel(), generator=rng)]
            for k, piece in zip(holders, torch.tensor_split(rows, len(holders)), strict=True):
                parts[k].append(piece)
        return [
            torch.sort(torch.cat(p)).values if p else torch.zeros(0, dtype=torch.int64)
            for p in parts
        ]

    def held_classes(
        self, num_classes: int, num_clients: int, rng: torch.Generator
    ) -> list[list[int]]:
        """Each client's class positions: i mod C, then uniform draws until k distinct."""
        held = []
        for i in range(num_clients):
            current = [i % num_classes]
            while len(current) < self.labels_per_client:
                drawn = int(torch.randint(num_classes, (1,), generator=rng))
                if drawn not in current:
                    current.append(drawn)
            held.append(current)
        return held

    def describe(self) -> dict[str, object]:
        return {"name": self.name, "labels_per_client": self.labels_per_client, "per_task": True}
