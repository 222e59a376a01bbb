"""The stream interface the engine codes against: an ordered list of materialisable tasks.

Why an abstract class with a tiny surface: the federation loop must not care whether a task
comes from rotated MNIST, a class split of CIFAR or a CARLA recording. It asks for task ``t``
as tensors already on the run's device — its train and test splits separately and in the
stream's stored form (uint8 pixels where that is exact), converted by ``as_model_input`` one
batch at a time —, for cheap training labels (to partition without materialising the
transform) and for a JSON description that enters the protocol hash.
"""

from __future__ import annotations

import abc
import hashlib
import operator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from cfl_bench.core.errors import UserError
from cfl_bench.core.objective import Classification, Objective

if TYPE_CHECKING:
    from cfl_bench.streams.images import ImageSplits


@dataclass(frozen=True)
class TaskData:
    """One task's tensors, ready for training and evaluation on the stream's device."""

    index: int
    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    classes: tuple[int, ...]


@dataclass(frozen=True)
class TaskTrain:
    """One task's training split in the stream's stored form.

    Why separate from the test split: the engine materialises a task's training data only
    when a client first enters the task, and its test data once for evaluation, so neither
    keeps the other alive. ``train_x`` is stored, not yet model input: pass rows of it
    through :meth:`Stream.as_model_input` (uint8 pixels stay uint8 until a batch is taken).
    """

    index: int
    train_x: torch.Tensor
    train_y: torch.Tensor


@dataclass(frozen=True)
class TaskTest:
    """One task's test split in the stream's stored form (see :class:`TaskTrain`)."""

    index: int
    test_x: torch.Tensor
    test_y: torch.Tensor
    classes: tuple[int, ...]


@dataclass(frozen=True)
class RoundData:
    """What one client received during one round of a stream whose clients get new data
    every round (frames streamed by a vehicle), in the stream's stored form.

    ``keys`` name each row (a frame's town and number): a learner that keeps history (the
    joint upper bound) trains on every distinct row a client has received, so a replayed
    frame that comes round again is not counted twice.
    """

    x: torch.Tensor
    y: torch.Tensor
    keys: tuple[str, ...]


@dataclass(frozen=True)
class StreamRequest:
    """What a run asks of a stream builder (``streams.builders``): how many tasks, the seed,
    the device, where the data is and whether it may be downloaded, and optional prefixes
    of the base data (``--train-size`` / ``--test-size``)."""

    num_tasks: int
    seed: int
    device: torch.device
    data_root: str | None
    download: bool
    train_size: int | None = None
    test_size: int | None = None
    # The federation's client count: streams whose data belongs to clients (CARLA vehicles)
    # need it; the others ignore it.
    num_clients: int = 1
    # Cutout's square side in pixels (0: none); only image streams that declare it take it.
    cutout: int = 0
    # The classes per task of a class-IL stream that splits its classes (``--classes-per-task``);
    # None: the stream's own.
    classes_per_task: int | None = None
    # ``--class-order``: natural, or numpy:seed=N (``streams.class_order``); only the
    # class-split streams take it, the catalogue refuses it elsewhere.
    class_order: str = "natural"

    def require_data_root(self) -> str:
        """The data folder of a stream that needs one; ``streams.catalogue``'s
        ``require_data_root`` has already refused a missing one with the user's sentence."""
        if self.data_root is None:
            raise AssertionError("require_data_root must run before a builder that reads data")
        return self.data_root


class Stream(abc.ABC):
    """An ordered list of tasks; task ``t`` is deterministic given the stream's seed."""

    name: str
    scenario: str
    num_tasks: int
    num_classes: int
    input_shape: tuple[int, ...]
    device: torch.device

    # Whether ``augment`` changes inputs (train-time augmentation, e.g. CIFAR crop + flip).
    augments: bool = False
    # One example's target: a class id by default; a detection stream stores padded boxes.
    target_shape: tuple[int, ...] = ()
    target_dtype: torch.dtype = torch.long

    # Whether a checkpointed run can go on where it stopped (a live simulator cannot be
    # rewound to the checkpoint's moment).
    resumable: bool = True
    # Whether clients receive new data every round (:meth:`round_data`) instead of one shard
    # of each task's training split (a CARLA frame stream: vehicles keep driving).
    per_round: bool = False
    # A class-split stream's ``--class-order``: ``class_order[i]`` is the original class of
    # label i; None: the labels as the data has them (every other stream).
    class_order: tuple[int, ...] | None = None

    def round_data(
        self, round_index: int, entries: dict[int, tuple[int, ...]]
    ) -> dict[int, RoundData]:
        """Each client's data of 0-based round ``round_index``; only streams with
        ``per_round`` implement it.

        ``entries[k]`` lists the first round of every task client k has entered, so its
        current task is ``len(entries[k]) - 1``. Given by the task clock, not by the order of
        calls, so a resumed run asks the same questions as an uninterrupted one.
        """
        raise NotImplementedError(f"stream {self.name!r} gives data per task, not per round")

    def test_domain(self) -> TaskTest | None:
        """A held-out test domain no task trains on (CARLA's Town05), evaluated beside the
        tasks' own test sets and recorded as ``test_<metric>`` rows with eval task -1;
        None for streams without one."""
        return None

    def close(self) -> None:
        """Release what the stream holds when the run ends (a live CARLA source restores
        the simulator); nothing by default."""
        return None

    @property
    def output_shape(self) -> tuple[int, ...]:
        """The shape of the model's output for one example (what a replay buffer stores):
        class logits by default, dense maps for a detector."""
        return (self.num_classes,)

    def augment(self, x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """Train-time augmentation of a batch of task inputs (identity unless overridden)."""
        return x

    @property
    def objective(self) -> Objective:
        """What the tasks ask of a model: class logits scored by accuracy (and task-IL
        accuracy on class-incremental streams). A detection stream returns its own."""
        return Classification(task_il=self.scenario == "class-il")

    @abc.abstractmethod
    def task(self, t: int) -> TaskData:
        """Materialise task ``t`` (0-based) as model inputs; a bad index is a
        :class:`UserError`."""

    def task_train(self, t: int) -> TaskTrain:
        """Task ``t``'s training split in stored form (what the engine keeps per client).

        The default materialises the whole task; streams with a compact stored form
        override this, :meth:`task_test` and :meth:`as_model_input` together.
        """
        task = self.task(t)
        return TaskTrain(task.index, task.train_x, task.train_y)

    def task_test(self, t: int) -> TaskTest:
        """Task ``t``'s test split in stored form (what the engine keeps for evaluation)."""
        task = self.task(t)
        return TaskTest(task.index, task.test_x, task.test_y, tuple(task.classes))

    def as_model_input(self, stored: torch.Tensor) -> torch.Tensor:
        """Model inputs of stored rows (a batch, an evaluation chunk): identity unless the
        stream stores something more compact than the model's floats.

        Must be an exact per-element function of the stored values, so converting a batch
        gives bit for bit the floats that converting the whole split would.
        """
        return stored

    def model_input_to_stored(self, x: torch.Tensor) -> torch.Tensor | None:
        """The exact inverse of :meth:`as_model_input`, or None when the stream has none.

        Replay buffers keep offered model inputs; a stream that returns its compact stored
        form here (uint8 pixels) lets them hold that form instead of float32 (4× less memory
        and checkpoint), with ``as_model_input(model_input_to_stored(x)) == x`` bit for bit,
        so no result changes. None (the default) keeps float32 buffers."""
        return None

    @abc.abstractmethod
    def train_labels(self, t: int) -> torch.Tensor:
        """Int64 labels of task ``t``'s train split, without running any transform."""

    @abc.abstractmethod
    def describe(self) -> dict[str, object]:
        """A JSON-able description of everything about the stream that changes results."""

    def protocol_fields(self) -> dict[str, object]:
        """What identifies the stream's data beyond its name and the run options, and does
        not depend on the seed (seed-derived parameters such as rotation angles stay out, so
        the seeds of one protocol average together).

        Streams that read files say which data they read (sizes and a content digest, see
        :func:`data_identity`): the name and the options do not fix it — a CIFAR subset and
        the full CIFAR, or two different subsets, must never share a leaderboard row.
        """
        return {}

    def _task_index(self, t: int) -> int:
        """Validate a task index once, so every subclass reports bad ones the same way."""
        if isinstance(t, bool):
            raise UserError(f"task index must be an integer, got {t!r}")
        try:
            index = operator.index(t)
        except TypeError:
            raise UserError(f"task index must be an integer, got {t!r}") from None
        if not 0 <= index < self.num_tasks:
            raise UserError(
                f"task {index} is out of range for stream {self.name!r} with "
                f"{self.num_tasks} tasks; use 0..{self.num_tasks - 1}"
            )
        return index


def decoded_task(stream: Stream, t: int) -> TaskData:
    """Task ``t`` as model inputs, built from a compact stream's stored splits (the
    :meth:`Stream.task` of streams that override ``task_train`` / ``task_test``)."""
    train, test = stream.task_train(t), stream.task_test(t)
    return TaskData(
        index=train.index,
        train_x=stream.as_model_input(train.train_x),
        train_y=train.train_y,
        test_x=stream.as_model_input(test.test_x),
        test_y=test.test_y,
        classes=test.classes,
    )


Column = torch.Tensor | list[str]


def data_identity(
    base: str, train: tuple[Column, ...], test: tuple[Column, ...]
) -> dict[str, object]:
    """{base, sizes, sha256} of a stream's base data: the digest covers every column's dtype,
    shape and bytes (tensors) or every text (text streams), so runs on different data never
    get the same protocol hash. Seed-independent by construction (base data, not tasks)."""
    digest = hashlib.sha256()
    for column in (*train, *test):
        if isinstance(column, torch.Tensor):
            array = column.detach().cpu().contiguous()
            digest.update(f"{array.dtype}{tuple(array.shape)}".encode())
            digest.update(array.numpy().tobytes())
        else:
            digest.update(f"{len(column)} texts".encode())
            for text in column:
                digest.update(text.encode("utf-8", "surrogatepass") + b"\x00")
    sizes = {"train": len(train[0]), "test": len(test[0])}
    return {"base": base, "sizes": sizes, "sha256": digest.hexdigest()}


def images_identity(base: str, images: ImageSplits) -> dict[str, object]:
    """:func:`data_identity` of an image stream's base splits (images and labels)."""
    return data_identity(
        base, train=(images.train_x, images.train_y), test=(images.test_x, images.test_y)
    )
