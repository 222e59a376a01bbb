"""The partitioner interface and the checks every partitioner shares (``streams.partition``
holds the partitioners and their registry; a partitioner in a module of its own imports its
base from here, so the registry can import it back)."""

from __future__ import annotations

import abc
from typing import ClassVar

import torch

from cfl_bench.core.errors import UserError


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


def check_labels(labels: torch.Tensor) -> torch.Tensor:
    """Labels as a 1-D int64 CPU tensor (partitioning is host-side bookkeeping)."""
    if labels.dim() != 1 or labels.dtype != torch.int64:
        raise ValueError(f"labels must be 1-D int64, got {labels.dtype} {tuple(labels.shape)}")
    return labels.cpu()


def check_positive_int(what: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UserError(f"{what} must be a positive integer, got {value!r}")


def task_classes(
    labels: torch.Tensor, num_clients: int, per_client: tuple[str, str, int], task: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The checked labels and the task's classes (ascending) of a partition that gives every
    client ``per_client`` = (partition, option, count) of them; refused when the task has
    fewer classes than the count (class-subsets, label-quantity)."""
    labels = check_labels(labels)
    check_positive_int("number of clients", num_clients)
    classes = torch.unique(labels)
    partition, option, count = per_client
    if count > classes.numel():
        raise UserError(
            f"the {partition} partition gives every client {count} classes of the task but "
            f"task {task + 1} has {classes.numel()}; use {partition}:{option}="
            f"{classes.numel()} or fewer"
        )
    return labels, classes
