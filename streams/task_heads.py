"""``--heads per-task``: any classification stream as a task-IL stream with one head per task.

Why a wrapper rather than new streams: the task-incremental protocol of FOT (Split-CIFAR-100
with an AlexNet of one head per task) and of the other federated continual papers is a way
of *reading* a stream — the task identity is known in training and at test — not other data,
so every stream and every method gets it from one place.

Labels: a domain-IL stream (the same C classes in every task: perm-mnist, rot-digits) has
task t's labels moved to C·t … C·t + C − 1, so the model's output has C·T logits, one block
of C per task; a class-IL stream keeps its labels (its tasks' class sets are already
disjoint) and its tasks' class sets are the heads. The objective (``PerTaskHeads``) then:

- trains each example against its own task's head only: the cross-entropy of the logits
  restricted to the classes of the task its label belongs to (the other heads' logits are
  not in its softmax, as with separate output layers: the official FOT AlexNet's
  ``self.last[t]``);
- scores task t's test examples by the argmax over task t's classes only (the task-IL
  accuracy, ``acc``: the headline metric of a task-IL protocol).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch

from cfl_bench.core.errors import UserError
from cfl_bench.core.objective import Classification, masked_mean
from cfl_bench.streams.base import RoundData, Stream, TaskData, TaskTest, TaskTrain

if TYPE_CHECKING:
    from cfl_bench.core.objective import Objective

HEADS = ("shared", "per-task")


@dataclass(frozen=True)
class PerTaskHeads(Classification):
    """Classification with one head per task: ``heads[t]`` are task t's classes."""

    heads: tuple[tuple[int, ...], ...] = ()
    num_classes: int = 0

    @property
    def metrics(self) -> tuple[str, ...]:
        return ("acc",)

    def head_mask(self, targets: torch.Tensor) -> torch.Tensor:
        """(N, classes) booleans: each row's own task's classes."""
        device = targets.device
        masks = torch.zeros(len(self.heads), self.num_classes, dtype=torch.bool, device=device)
        task_of = torch.zeros(self.num_classes, dtype=torch.long, device=device)
        for t, classes in enumerate(self.heads):
            index = torch.tensor(classes, dtype=torch.long, device=device)
            masks[t, index] = True
            task_of[index] = t
        return masks[task_of[targets]]

    def per_row_loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        from torch.nn import functional as F

        masked = outputs.masked_fill(~self.head_mask(targets), float("-inf"))
        return F.cross_entropy(masked, targets, reduction="none")

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return self.per_row_loss(outputs, targets).mean()

    def masked_loss(
        self, outputs: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor | None
    ) -> torch.Tensor:
        if mask is None:
            return self.loss(outputs, targets)
        return masked_mean(self.per_row_loss(outputs, targets), mask)

    def score(
        self, outputs: torch.Tensor, targets: torch.Tensor, classes: tuple[int, ...]
    ) -> dict[str, torch.Tensor]:
        from cfl_bench.core.evaluation import accuracy

        return {"acc": accuracy(outputs, targets, classes)}


class TaskHeadsStream(Stream):
    """``inner`` with its tasks' labels on disjoint heads (see the module docstring)."""

    scenario = "task-il"

    def __init__(self, inner: Stream) -> None:
        self.inner = inner
        self.name = inner.name
        self.num_tasks = inner.num_tasks
        self.input_shape = inner.input_shape
        self.device = inner.device
        self.augments = inner.augments
        self.resumable = inner.resumable
        self.class_order = inner.class_order
        # A domain-IL stream's tasks share one label set: task t's block starts at C·t.
        self.offset = inner.num_classes if inner.scenario == "domain-il" else 0
        self.num_classes = inner.num_classes * (inner.num_tasks if self.offset else 1)
        self.heads = tuple(self._classes(t) for t in range(inner.num_tasks))

    def _classes(self, t: int) -> tuple[int, ...]:
        """Task t's head: its block of C labels (domain-IL), or its own class set read
        from the stream without building the task where the stream names it."""
        if self.offset:
            return tuple(range(self.offset * t, self.offset * (t + 1)))
        named = getattr(self.inner, "classes", None)
        return tuple(named(t)) if callable(named) else tuple(self.inner.task_test(t).classes)

    @property
    def objective(self) -> Objective:
        return PerTaskHeads(heads=self.heads, num_classes=self.num_classes)

    def task(self, t: int) -> TaskData:
        data = self.inner.task(t)
        shift = self.offset * t
        return replace(
            data, train_y=data.train_y + shift, test_y=data.test_y + shift, classes=self.heads[t]
        )

    def task_train(self, t: int) -> TaskTrain:
        data = self.inner.task_train(t)
        return replace(data, train_y=data.train_y + self.offset * t)

    def task_test(self, t: int) -> TaskTest:
        data = self.inner.task_test(t)
        return replace(data, test_y=data.test_y + self.offset * t, classes=self.heads[t])

    def train_labels(self, t: int) -> torch.Tensor:
        return self.inner.train_labels(t) + self.offset * t

    def augment(self, x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        return self.inner.augment(x, generator)

    def as_model_input(self, stored: torch.Tensor) -> torch.Tensor:
        return self.inner.as_model_input(stored)

    def model_input_to_stored(self, x: torch.Tensor) -> torch.Tensor | None:
        return self.inner.model_input_to_stored(x)

    def round_data(
        self, round_index: int, entries: dict[int, tuple[int, ...]]
    ) -> dict[int, RoundData]:
        return self.inner.round_data(round_index, entries)

    def close(self) -> None:
        self.inner.close()

    def protocol_fields(self) -> dict[str, object]:
        return self.inner.protocol_fields()

    def describe(self) -> dict[str, object]:
        return {
            **self.inner.describe(),
            "scenario": self.scenario,
            "num_classes": self.num_classes,
            "heads": "per-task",
            "label_offset_per_task": self.offset,
        }


def with_heads(stream: Stream, heads: str) -> Stream:
    """``stream`` as ``--heads`` asks: itself (``shared``) or with one head per task."""
    if heads == "shared":
        return stream
    if not isinstance(stream.objective, Classification) or stream.per_round:
        raise UserError(
            f"--heads per-task needs a classification stream with tasks of fixed data; "
            f"stream {stream.name!r} is not one, so drop --heads per-task."
        )
    if stream.test_domain() is not None:
        raise UserError(
            f"--heads per-task gives each task its own head, but stream {stream.name!r} also "
            f"tests a domain of no task; drop --heads per-task."
        )
    return TaskHeadsStream(stream)
