"""Who holds what of each task: the seeded holdout slice, then the partitioner's split.

Why planned before the run: an impossible split (too few samples for the clients) is refused
before anything is written, ``config.json`` can show each client's class counts, and the
engine reuses the same index tensors. Partitioners that ignore the task (``shards``,
``iid``) give the same split for tasks with identical labels, so such a split is computed
once and shared (domain-IL streams relabel nothing between tasks).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from cfl_bench.core.errors import UserError
from cfl_bench.core.seeding import generator
from cfl_bench.engine.arrivals import ArrivalPlan
from cfl_bench.strategies.compose import Strategy
from cfl_bench.streams.base import Stream
from cfl_bench.streams.partition import Partitioner


@dataclass(frozen=True)
class TaskSplit:
    """Who holds what of one task: per-client indices into its train split, and the indices
    withheld from every client (a public holdout), if any."""

    parts: list[torch.Tensor]
    held: torch.Tensor | None = None


def plan_task_split(
    labels: torch.Tensor,
    strategy: Strategy,
    partitioner: Partitioner,
    num_clients: int,
    task: int,
    seed: int,
    receivers: tuple[int, ...] | None = None,
) -> TaskSplit:
    """The seeded split of one task (holdout first, then the partitioner on the rest).

    With ``receivers`` (``--arrivals``) the partitioner splits the task among those clients
    only, receiver i (ascending) taking part i, and every other client's part is empty: it
    has not joined yet or keeps its old data."""
    total = labels.shape[0]
    per_task = strategy.holdout_per_task(total)
    # The component withholding the most names itself in a refusal (the maximum is some
    # component's own count, so there always is one).
    owner = next(c.name for c in strategy.all if c.holdout_per_task(total) == per_task)
    held, kept = holdout_split(total, per_task, task, seed, owner)
    among = num_clients if receivers is None else len(receivers)
    parts = partitioner.split(labels if kept is None else labels[kept], among, task=task, seed=seed)
    if kept is not None:
        parts = [kept[p] for p in parts]
    if receivers is not None:
        spread = [torch.zeros(0, dtype=torch.int64) for _ in range(num_clients)]
        for k, part in zip(receivers, parts, strict=True):
            spread[k] = part
        parts = spread
    return TaskSplit(parts, held)


def plan_splits(
    stream: Stream,
    strategy: Strategy,
    partitioner: Partitioner,
    num_clients: int,
    num_tasks: int,
    seed: int,
    arrivals: ArrivalPlan | None = None,
) -> dict[int, TaskSplit]:
    """Every task's split; a task-independent partition is drawn once per distinct labels.
    A per-round stream has none: its clients receive their own data (``round_data``).
    Under ``--arrivals`` each task is split among its own receivers (never reused)."""
    splits: dict[int, TaskSplit] = {}
    if stream.per_round:
        return splits
    reusable = partitioner.describe().get("per_task") is False and arrivals is None
    previous: tuple[torch.Tensor, TaskSplit] | None = None
    for t in range(num_tasks):
        labels = stream.train_labels(t)
        same = previous is not None and torch.equal(previous[0], labels)
        if reusable and same and strategy.holdout_per_task(labels.shape[0]) == 0:
            assert previous is not None
            splits[t] = previous[1]
            continue
        receivers = None if arrivals is None else arrivals.receivers[t]
        splits[t] = plan_task_split(labels, strategy, partitioner, num_clients, t, seed, receivers)
        previous = (labels, splits[t])
    return splits


def holdout_split(
    total: int, per_task: int, task: int, seed: int, owner: str
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(held-out indices, kept indices) of one task's training split, or (None, None).

    The held-out slice is a seeded random draw per task; the partitioner then splits only
    the kept indices, so no client ever holds a held-out example. ``owner`` names the
    component that withholds it, whose ``public_size`` a refusal names.
    """
    if per_task <= 0:
        return None, None
    if per_task >= total:
        raise UserError(
            f"the strategy withholds {per_task} public examples per task but task {task + 1} "
            f"has only {total} training examples; lower {owner}:public_size."
        )
    perm = torch.randperm(total, generator=generator(seed, "holdout", task))
    return torch.sort(perm[:per_task]).values, torch.sort(perm[per_task:]).values
