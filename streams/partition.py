"""Partitioners: which client holds which training indices of a task.

A partitioner is a seeded, deterministic function of (labels, number of clients, task,
seed) returning one sorted int64 CPU index tensor per client, disjoint across clients.
Every random draw uses its own seed from ``derive_seed(seed, "partition", <name>)``, so
partitions never shift when other random consumers are added.

Whether the draw depends on the task is a per-partitioner protocol decision:

* ``shards`` and ``iid`` ignore ``task``: the FedGP protocol draws the MNIST client split
  once and reuses it for every task, which keeps domain-IL tasks comparable (client k sees
  the same digits in every task). Because the draw is fixed, the split is identical for
  every task whose labels are identical, so callers may cache it.
* A Dirichlet/LDA partitioner (seq-CIFAR) will fold ``task`` into its seed, since each
  class-IL task has new classes and the paper redraws per task.

Asynchronous schedules (when a client reaches each task) are a separate concept and do not
belong here: a partitioner only says *what* data a client holds within one task.
"""

from __future__ import annotations

import abc
from typing import ClassVar

import torch

from cfl_bench.errors import UserError
from cfl_bench.seeding import generator


class Partitioner(abc.ABC):
    """Splits one task's training indices among clients."""

    name: ClassVar[str]

    @abc.abstractmethod
    def split(
        self, labels: torch.Tensor, num_clients: int, *, task: int, seed: int
    ) -> list[torch.Tensor]:
        """One ascending int64 CPU index tensor per client, into the task's train split."""

    def describe(self) -> dict[str, object]:
        """JSON-able options that define the split, for the protocol hash."""
        return {"name": self.name}


class ShardPartitioner(Partitioner):
    """The FedGP/FedAvg pathological non-IID split.

    Sort the training indices by label (stable, so ties keep their original order), cut the
    sorted list into ``shards_per_client * K`` equal contiguous shards and give each client
    ``shards_per_client`` shards chosen at random. If N is not divisible by the number of
    shards, the last ``N mod shards`` indices of the label-sorted order (samples of the
    highest labels) are dropped, so every shard and every client has the same size; for
    MNIST with K = 10 or 100 and 2 shards each nothing is dropped.
    """

    name = "shards"

    def __init__(self, shards_per_client: int = 2) -> None:
        _check_positive_int("shards_per_client", shards_per_client)
        self.shards_per_client = shards_per_client

    def split(
        self, labels: torch.Tensor, num_clients: int, *, task: int, seed: int
    ) -> list[torch.Tensor]:
        labels = _check_labels(labels)
        _check_positive_int("number of clients", num_clients)
        num_shards = self.shards_per_client * num_clients
        total = labels.shape[0]
        if total < num_shards:
            raise UserError(
                f"the shards partition needs at least {num_shards} training samples "
                f"({num_clients} clients x {self.shards_per_client} shards), the task has "
                f"{total}; use fewer clients or shards per client, or more data"
            )
        shard_size = total // num_shards
        by_label = torch.sort(labels, stable=True).indices
        shards = by_label[: num_shards * shard_size].view(num_shards, shard_size)
        # Deliberately independent of `task`: the split is drawn once for the whole stream.
        order = torch.randperm(num_shards, generator=generator(seed, "partition", "shards"))
        owned = order.view(num_clients, self.shards_per_client)
        return [torch.sort(shards[row].flatten()).values for row in owned]

    def describe(self) -> dict[str, object]:
        return {
            "name": self.name,
            "shards_per_client": self.shards_per_client,
            "remainder": "dropped from the end of the label-sorted order",
            "per_task": False,
        }


class IIDPartitioner(Partitioner):
    """A uniformly random split into K near-equal parts (sizes differ by at most one).

    The permutation is drawn once (independent of ``task``), like the shard split, so that
    IID baselines on domain-IL streams keep the same client/sample pairing across tasks.
    """

    name = "iid"

    def split(
        self, labels: torch.Tensor, num_clients: int, *, task: int, seed: int
    ) -> list[torch.Tensor]:
        labels = _check_labels(labels)
        _check_positive_int("number of clients", num_clients)
        total = labels.shape[0]
        if total < num_clients:
            raise UserError(
                f"the iid partition needs at least one training sample per client "
                f"({num_clients} clients), the task has {total}; use fewer clients"
            )
        perm = torch.randperm(total, generator=generator(seed, "partition", "iid"))
        return [torch.sort(part).values for part in torch.tensor_split(perm, num_clients)]

    def describe(self) -> dict[str, object]:
        return {"name": self.name, "per_task": False}


_PARTITIONER_TYPES: dict[str, type[Partitioner]] = {
    ShardPartitioner.name: ShardPartitioner,
    IIDPartitioner.name: IIDPartitioner,
}

PARTITIONERS: dict[str, str] = {
    "shards": "sort by label, cut into equal shards, each client gets shards_per_client "
    "(default 2) at random; drawn once for all tasks (FedGP MNIST split)",
    "iid": "uniformly random near-equal split; drawn once for all tasks",
}


def build_partitioner(name: str, **options: object) -> Partitioner:
    """Construct a partitioner by name; unknown names or options are user errors."""
    if name not in _PARTITIONER_TYPES:
        raise UserError(
            f"unknown partition {name!r}; choose one of {', '.join(sorted(_PARTITIONER_TYPES))}"
        )
    try:
        return _PARTITIONER_TYPES[name](**options)
    except TypeError as exc:
        raise UserError(f"bad options {sorted(options)} for partition {name!r} ({exc})") from exc


def _check_labels(labels: torch.Tensor) -> torch.Tensor:
    """Labels as a 1-D int64 CPU tensor (partitioning is host-side bookkeeping)."""
    if labels.dim() != 1 or labels.dtype != torch.int64:
        raise ValueError(f"labels must be 1-D int64, got {labels.dtype} {tuple(labels.shape)}")
    return labels.cpu()


def _check_positive_int(what: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UserError(f"{what} must be a positive integer, got {value!r}")
