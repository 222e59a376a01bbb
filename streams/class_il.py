"""Class-incremental image streams (Seq-CIFAR-10/100), one run scoring class-IL and task-IL.

Task t holds the classes [t·c, (t+1)·c) in natural class order (c = classes per task), with
all their train and test images; under ``--class-order numpy:seed=N`` the labels are first
relabelled by that permutation (``relabelled``), so the same cut holds the permuted classes.
The model has one head over every class: class-IL accuracy takes the argmax over all
logits, task-IL (computed by the engine from the same forward) masks the logits to the
task's classes — so both matrices come from one run.

Images stay uint8 on the device, and so do a task's train and test splits (``task_train`` /
``task_test``); ``as_model_input`` converts a batch or an evaluation chunk to float32, scaled
to [0, 1] and normalised per channel with the dataset's mean/std (Mammoth's values) — the
same per-element arithmetic as converting the whole split, so the floats are bit-identical
at a quarter of the memory. Training batches are augmented on the device (random crop with
4-pixel padding + horizontal flip, see ``streams.augment``) after that conversion; the
padding shows the normalised value of black, which makes the result identical to
torchvision's crop-then-normalise order.
"""

from __future__ import annotations

import abc

import torch

from cfl_bench.core.errors import UserError
from cfl_bench.streams.augment import crop_flip, cutout, normalize
from cfl_bench.streams.base import (
    Stream,
    TaskData,
    TaskTest,
    TaskTrain,
    decoded_task,
    images_identity,
)
from cfl_bench.streams.images import ImageSplits

# Per-channel statistics used by Mammoth's seq-cifar10 / seq-cifar100 transforms.
CIFAR10_MEAN, CIFAR10_STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2615)
CIFAR100_MEAN, CIFAR100_STD = (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)
CROP_PADDING = 4


def check_class_tasks(
    name: str, num_tasks: object, classes_per_task: int, num_classes: int, *, asked: bool = False
) -> None:
    """Refuse a number of tasks the classes cannot fill, naming the allowed range and the
    classes per task in use (``asked``: set by ``--classes-per-task``, which the message
    then names as the other knob).

    Why a function of its own: the registry and the text stream call it before any data
    is read or any text encoded, so ``--tasks 8`` on a 7-task stream fails in milliseconds
    rather than after minutes of loading.
    """
    available = num_classes // classes_per_task
    given = f" with --classes-per-task {classes_per_task}" if asked else ""
    if isinstance(num_tasks, bool) or not isinstance(num_tasks, int) or num_tasks < 1:
        raise UserError(
            f"number of tasks must be a positive integer, got {num_tasks!r}; use --tasks 1 "
            f"to {available} for stream {name!r}{given}"
        )
    if num_tasks > available:
        smaller = " or a smaller --classes-per-task" if asked else ""
        raise UserError(
            f"stream {name!r} has {available} tasks of {classes_per_task} classes{given}, so "
            f"--tasks {num_tasks} is too many; use --tasks {available} or fewer{smaller}"
        )


def check_tasks_have_data(
    name: str, num_tasks: int, classes_per_task: int, train_y: torch.Tensor, test_y: torch.Tensor
) -> None:
    """Refuse a task whose classes have no train or no test examples in the loaded data.

    Why: such a task would otherwise fail much later with a partitioner message about
    clients, or silently score NaN accuracy; the cause is the data (a subset without those
    classes, or a --train-size/--test-size prefix too short to reach them).
    """
    for split, labels in (("train", train_y), ("test", test_y)):
        present = set(labels.unique().tolist()) if labels.numel() else set()
        for t in range(num_tasks):
            classes = range(t * classes_per_task, (t + 1) * classes_per_task)
            if present.isdisjoint(classes):
                fewer = f", or --tasks {t}" if t else ""
                raise UserError(
                    f"stream {name!r} has no {split} examples of task {t}'s classes "
                    f"{classes.start}..{classes.stop - 1}; use data that holds them (a larger "
                    f"--{split}-size if you set one){fewer}"
                )


def relabelled(labels: torch.Tensor, order: tuple[int, ...] | None) -> torch.Tensor:
    """Every label y as its position in ``order`` (``order[i]`` is the original class of new
    label i; None: unchanged), as PyCIL's ``_map_new_class_index`` maps them.

    Why before tasks are cut: partitions, heads, evaluation and buffers then see only new
    labels, and none of them needs to know an order exists. A lookup table
    (``inverse[order] = arange(C)``) maps every label at once.
    """
    if order is None:
        return labels
    inverse = torch.empty(len(order), dtype=labels.dtype)
    inverse[torch.tensor(order)] = torch.arange(len(order), dtype=labels.dtype)
    return inverse.to(labels.device)[labels]


class ClassSplitStream(Stream):
    """Class-IL over any labelled tensors: task t = classes [t·c, (t+1)·c) of the labels,
    in natural order or relabelled by ``class_order`` first.

    Subclasses say what they store for a row (``_stored``), how stored inputs become model
    inputs (``as_model_input``, identity by default) and describe themselves; the class
    selection, labels and validation are shared.
    """

    scenario = "class-il"

    def __init__(
        self,
        *,
        name: str,
        num_tasks: int,
        classes_per_task: int,
        num_classes: int,
        train_y: torch.Tensor,
        test_y: torch.Tensor,
        device: torch.device,
        class_order: tuple[int, ...] | None = None,
    ) -> None:
        check_class_tasks(name, num_tasks, classes_per_task, num_classes)
        train_y, test_y = relabelled(train_y, class_order), relabelled(test_y, class_order)
        check_tasks_have_data(name, num_tasks, classes_per_task, train_y, test_y)
        # order[i]: the original class of label i (None: natural), for the description and
        # for what names classes by label (LANDER's anchors, via StrategyEnv.class_order).
        self.class_order = class_order
        self.name = name
        self.num_tasks = num_tasks
        self.num_classes = num_classes
        self.classes_per_task = classes_per_task
        self.device = torch.device(device)
        self._train_labels_cpu = train_y.cpu()
        self._train_y = train_y.to(self.device)
        self._test_y = test_y.to(self.device)

    def classes(self, t: int) -> tuple[int, ...]:
        start = self._task_index(t) * self.classes_per_task
        return tuple(range(start, start + self.classes_per_task))

    def _select(self, labels: torch.Tensor, t: int) -> torch.Tensor:
        low = t * self.classes_per_task
        mask = (labels >= low) & (labels < low + self.classes_per_task)
        return torch.nonzero(mask).flatten()

    def task(self, t: int) -> TaskData:
        return decoded_task(self, t)

    def task_train(self, t: int) -> TaskTrain:
        index = self._task_index(t)
        rows = self._select(self._train_y, index)
        return TaskTrain(index, self._stored("train", rows), self._train_y[rows])

    def task_test(self, t: int) -> TaskTest:
        index = self._task_index(t)
        rows = self._select(self._test_y, index)
        return TaskTest(index, self._stored("test", rows), self._test_y[rows], self.classes(index))

    def train_labels(self, t: int) -> torch.Tensor:
        index = self._task_index(t)
        labels = self._train_labels_cpu
        return labels[self._select(labels, index)]

    @abc.abstractmethod
    def _stored(self, split: str, rows: torch.Tensor) -> torch.Tensor:
        """Stored inputs of ``rows`` of ``split`` (train | test); see ``as_model_input``."""

    def _base_description(self) -> dict[str, object]:
        return {
            "name": self.name,
            "scenario": self.scenario,
            "num_tasks": self.num_tasks,
            "num_classes": self.num_classes,
            "classes_per_task": self.classes_per_task,
            "class_order": "natural" if self.class_order is None else list(self.class_order),
            "input_shape": list(self.input_shape),
            "train_size": int(self._train_y.shape[0]),
            "test_size": int(self._test_y.shape[0]),
        }


class ClassILStream(ClassSplitStream):
    """Seq-CIFAR: normalised uint8 images, crop + flip augmentation on the device."""

    augments = True

    def __init__(
        self,
        images: ImageSplits,
        *,
        name: str,
        num_tasks: int,
        classes_per_task: int,
        mean: tuple[float, ...],
        std: tuple[float, ...],
        device: torch.device,
        crop_flip: bool = True,
        cutout: int = 0,
        class_order: tuple[int, ...] | None = None,
    ) -> None:
        super().__init__(
            name=name,
            num_tasks=num_tasks,
            classes_per_task=classes_per_task,
            num_classes=images.num_classes,
            train_y=images.train_y,
            test_y=images.test_y,
            device=device,
            class_order=class_order,
        )
        self.input_shape = images.input_shape
        self.mean, self.std = mean, std
        self._base_name = images.name
        self._levels = images.levels
        self._images = images.to(self.device)
        black = torch.zeros(1, len(mean), 1, 1, device=self.device)
        self._fill = normalize(black, mean, std).flatten()
        self.crop_flip, self.cutout = crop_flip, cutout
        self.augments = crop_flip or cutout > 0

    def augment(self, x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """Crop + flip (unless off), then Cutout when asked (FedNTD's order)."""
        if self.crop_flip:
            x = crop_flip(x, generator, padding=CROP_PADDING, fill=self._fill)
        if self.cutout:
            x = cutout(x, generator, self.cutout)
        return x

    def augmentation_text(self) -> str:
        """The train-time augmentation, as ``describe`` records it."""
        parts = (
            [f"random crop (padding {CROP_PADDING}) + horizontal flip"] if self.crop_flip else []
        )
        if self.cutout:
            parts.append(f"cutout {self.cutout}x{self.cutout} after normalisation")
        return " + ".join(parts) or "none"

    def protocol_fields(self) -> dict[str, object]:
        return {"data": images_identity(self._base_name, self._images)}

    def describe(self) -> dict[str, object]:
        return {
            **self._base_description(),
            "base": self._base_name,
            "normalisation": {"mean": list(self.mean), "std": list(self.std)},
            "augmentation": self.augmentation_text(),
        }

    def _stored(self, split: str, rows: torch.Tensor) -> torch.Tensor:
        return (self._images.train_x if split == "train" else self._images.test_x)[rows]

    def as_model_input(self, stored: torch.Tensor) -> torch.Tensor:
        """uint8 pixels to float32 scaled to [0, 1] and normalised, element by element."""
        if stored.dtype != torch.uint8:
            raise ValueError(f"{self.name} stores uint8 pixels, got {stored.dtype}")
        scaled = stored.to(torch.float32).div_(self._levels)
        return normalize(scaled, self.mean, self.std)
