"""Compact task data: streams keep uint8 pixels until a batch is taken, and the engine
materialises a task's train split only when a client first enters the task.

Why these tests: the compact form is only allowed because it changes no value — every
decoded batch must be bit for bit the float32 the stream produced before (``torch.equal``,
never ``allclose``) — and it only saves memory if nothing builds a task's train data ahead
of time or keeps every task alive.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from cfl_bench.core.evaluation import predict_logits
from cfl_bench.engine.loop import RunOutcome
from cfl_bench.streams.augment import normalize
from cfl_bench.streams.base import Stream, TaskData, TaskTest, TaskTrain
from cfl_bench.streams.class_il import CIFAR10_MEAN, CIFAR10_STD
from cfl_bench.streams.domain_il import DomainILStream, PermutedStream, RotatedStream
from cfl_bench.streams.registry import build_stream
from cfl_bench.streams.transforms import permute_pixels, rotate_batch
from tests.helpers import digits_federation, end_task, enter_task
from tests.synthetic_data import write_tiny_cifar10, write_tiny_mnist

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def data_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """MNIST- and CIFAR-format files with random pixels (every uint8 value occurs)."""
    root = tmp_path_factory.mktemp("compact-data")
    write_tiny_mnist(root, gz=True, n_train=600, n_test=200)
    write_tiny_cifar10(root, n=100, n_test=30)
    return root


def stream(name: str, root: Path | None, num_tasks: int = 3) -> Stream:
    return build_stream(
        name,
        num_tasks=num_tasks,
        seed=0,
        device=CPU,
        data_root=None if root is None else str(root),
        download=False,
    )


def old_domain_floats(s: DomainILStream, split: str, t: int) -> torch.Tensor:
    """Task ``t``'s inputs as the stream computed them before compact storage: transform
    the uint8 base, then ``float32 / levels`` over the whole split."""
    base = getattr(s._images, f"{split}_x")
    return s._transform(base, t).to(torch.float32).div_(s._levels)


def float_first(s: DomainILStream, split: str, t: int) -> torch.Tensor:
    """The same task transformed on floats (what a float pipeline such as torchvision's
    ``ToTensor`` then rotate would give): rotation and permutation only move pixels, so a
    rotated task is exactly uint8-representable."""
    base = getattr(s._images, f"{split}_x").to(torch.float32).div_(s._levels)
    if isinstance(s, RotatedStream):
        return rotate_batch(base, s.angles[t])
    assert isinstance(s, PermutedStream)
    return permute_pixels(base, s.permutation(t))


@pytest.mark.parametrize("name", ["rot-mnist", "perm-mnist", "rot-digits", "perm-digits"])
def test_domain_il_decoded_uint8_equals_old_floats(name: str, data_root: Path) -> None:
    s = stream(name, None if name.endswith("digits") else data_root)
    assert isinstance(s, DomainILStream)
    for t in range(s.num_tasks):
        train, test = s.task_train(t), s.task_test(t)
        assert train.train_x.dtype == torch.uint8 and test.test_x.dtype == torch.uint8
        for split, stored in (("train", train.train_x), ("test", test.test_x)):
            old = old_domain_floats(s, split, t)
            decoded = s.as_model_input(stored)
            assert decoded.dtype == torch.float32
            assert torch.equal(decoded, old)
            assert torch.equal(decoded, float_first(s, split, t))
        task = s.task(t)
        assert torch.equal(task.train_x, s.as_model_input(train.train_x))
        assert torch.equal(task.train_y, train.train_y)
        assert torch.equal(task.test_y, test.test_y) and task.classes == test.classes


def test_cifar_decoded_uint8_equals_old_floats(data_root: Path) -> None:
    s = stream("seq-cifar10", data_root, num_tasks=5)
    images = s._images  # type: ignore[attr-defined]
    for t in range(5):
        train, test = s.task_train(t), s.task_test(t)
        assert train.train_x.dtype == torch.uint8
        for stored, base, labels in (
            (train.train_x, images.train_x, images.train_y),
            (test.test_x, images.test_x, images.test_y),
        ):
            rows = ((labels == 2 * t) | (labels == 2 * t + 1)).nonzero().flatten()
            old = normalize(base[rows].to(torch.float32).div_(255), CIFAR10_MEAN, CIFAR10_STD)
            assert torch.equal(s.as_model_input(stored), old)


@pytest.mark.parametrize("name", ["rot-mnist", "seq-cifar10"])
def test_decoding_a_batch_equals_slicing_the_decoded_split(name: str, data_root: Path) -> None:
    """Per-batch conversion is per element: any rows, any chunk, the same floats."""
    s = stream(name, data_root, num_tasks=2)
    stored = s.task_train(1).train_x
    whole = s.as_model_input(stored)
    rows = torch.randperm(stored.shape[0], generator=torch.Generator().manual_seed(0))[:37]
    assert torch.equal(s.as_model_input(stored[rows]), whole[rows])
    assert torch.equal(s.as_model_input(stored[5:69]), whole[5:69])


def test_chunked_evaluation_of_stored_inputs_equals_float_evaluation() -> None:
    s = stream("rot-digits", None)
    test = s.task_test(1)
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 10))
    expected = predict_logits(module, s.task(1).test_x, batch=50)
    assert torch.equal(
        predict_logits(module, test.test_x, batch=50, decode=s.as_model_input), expected
    )


def test_compact_streams_refuse_float_input() -> None:
    """Decoding twice would divide by 255 twice; a float batch is a wiring bug."""
    s = stream("rot-digits", None)
    with pytest.raises(ValueError, match="stores uint8"):
        s.as_model_input(s.task(0).train_x)


class Calls:
    """Which stored splits the engine asked a stream for, in order."""

    def __init__(self, s: Stream) -> None:
        self.train: list[int] = []
        self.test: list[int] = []
        self.whole: list[int] = []
        self._wrap(s, "task_train", self.train)
        self._wrap(s, "task_test", self.test)
        self._wrap(s, "task", self.whole)

    @staticmethod
    def _wrap(s: Stream, name: str, log: list[int]) -> None:
        original: Callable[[int], object] = getattr(s, name)

        def counted(t: int) -> object:
            log.append(t)
            return original(t)

        setattr(s, name, counted)


def test_train_data_is_materialised_when_a_client_first_enters_its_task() -> None:
    fed = digits_federation("der", num_tasks=3)
    calls = Calls(fed.stream)
    fed._prepare_eval_sets()
    assert calls.test == [0, 1, 2] and calls.train == [] and calls.whole == []
    assert all(e.x.dtype == torch.uint8 for e in fed.measure.eval_sets)  # 4x smaller than floats
    enter_task(fed, 0)
    assert calls.train == [0]  # tasks 1 and 2 are not built yet
    assert fed.data.live_tasks == {}  # every client entered task 0: nothing kept beyond shards
    for c in fed.clients:
        assert c.train_x is not None and c.train_x.dtype == torch.uint8
    fed.server.round_index = 1
    fed._round(RunOutcome())
    end_task(fed, 0)
    assert calls.train == [0]
    enter_task(fed, 1)
    assert calls.train == [0, 1] and calls.whole == []


def test_a_full_run_builds_each_train_split_once_and_never_a_whole_task() -> None:
    """Under an async shift clients enter a task over several rounds; the split is built
    once, kept only until the last of them has entered, and never as a whole float task."""
    fed = digits_federation("er", num_tasks=3, async_shift=2)
    calls = Calls(fed.stream)
    fed.run()
    assert calls.train == [0, 1, 2]
    assert calls.whole == []
    assert fed.data.live_tasks == {}


def test_client_inputs_are_the_old_float_rows() -> None:
    """What a client trains on equals the rows of the float task it used to hold."""
    fed = digits_federation("fedavg", num_tasks=2)
    enter_task(fed, 1)
    task = fed.stream.task(1)
    parts = fed.data.split(1, len(fed.clients)).parts
    for c in fed.clients:
        rows = torch.arange(c.num_samples)
        assert torch.equal(c.inputs(rows), task.train_x[parts[c.index]])
        assert torch.equal(c.train_y, task.train_y[parts[c.index]])  # type: ignore[arg-type]


def test_streams_without_a_compact_form_keep_their_inputs() -> None:
    """The default stored form is the model input itself (text embeddings, Avalanche)."""

    class Plain(Stream):
        name, scenario, num_tasks, num_classes = "plain", "domain-il", 1, 2
        input_shape, device = (3,), CPU

        def task(self, t: int) -> TaskData:
            x = torch.arange(12.0).view(4, 3)
            return TaskData(0, x, torch.zeros(4, dtype=torch.long), x + 1, torch.ones(4), (0, 1))

        def train_labels(self, t: int) -> torch.Tensor:
            return torch.zeros(4, dtype=torch.long)

        def describe(self) -> dict[str, object]:
            return {}

    plain = Plain()
    train, test = plain.task_train(0), plain.task_test(0)
    assert isinstance(train, TaskTrain) and isinstance(test, TaskTest)
    assert plain.as_model_input(train.train_x) is train.train_x
    assert torch.equal(test.test_x, torch.arange(12.0).view(4, 3) + 1) and test.classes == (0, 1)
