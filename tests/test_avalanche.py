"""The Avalanche adapter on benchmarks built by Avalanche's own generators (from the embedded
real digits, or from files in the CIFAR format): task contents against our native streams,
scenario detection, factory loading by spec string, every refusal, one CLI run through the
adapter, and Avalanche's classic SplitMNIST on the real shared MNIST files."""

from __future__ import annotations

import json
import re
import socket
import sys
import types
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

with warnings.catch_warnings():  # Avalanche's import prints optional-dependency notices
    warnings.simplefilter("ignore")
    pytest.importorskip("avalanche", reason="avalanche-lib is in the [test] extra")
    from avalanche.benchmarks import benchmark_from_datasets, nc_benchmark
from torch.utils.data import TensorDataset
from torchvision.transforms import Compose, Normalize, RandomCrop, RandomHorizontalFlip

import cfl_bench.streams.avalanche as adapter
from cfl_bench.core.errors import UserError
from cfl_bench.streams.avalanche import AvalancheStream, build_avalanche_stream, load_benchmark
from cfl_bench.streams.cifar import load_cifar10
from cfl_bench.streams.class_il import CIFAR10_MEAN, CIFAR10_STD, ClassILStream
from cfl_bench.streams.registry import STREAMS, build_stream, stream_info
from tests.avalanche_factories import (
    TINY_TEST,
    TINY_TRAIN,
    classification,
    digits_floats,
    mnist_floats,
)
from tests.synthetic_data import write_tiny_cifar10
from tests.test_cli import in_process

CPU = torch.device("cpu")
FAKE = "cflb_fake_benchmarks"  # a module registered per test to hold factories


@pytest.fixture(scope="module")
def digits() -> tuple[torch.Tensor, ...]:
    """The first 1000 train / 300 test embedded (real) 8×8 digits as floats in [0, 1]."""
    return digits_floats(1000, 300)


def by_class(x: torch.Tensor, y: torch.Tensor, classes: set[int]) -> Any:
    """An Avalanche classification dataset of the samples of ``classes``."""
    keep = torch.isin(y, torch.tensor(sorted(classes)))
    return classification(x[keep], y[keep])


def class_split(digits: tuple[torch.Tensor, ...], groups: list[set[int]]) -> Any:
    """A benchmark with one experience per class group, from Avalanche's generic builder."""
    train_x, train_y, test_x, test_y = digits
    return benchmark_from_datasets(
        train=[by_class(train_x, train_y, g) for g in groups],
        test=[by_class(test_x, test_y, g) for g in groups],
    )


def rows(x: torch.Tensor, y: torch.Tensor) -> list[tuple[int, bytes]]:
    """A split as a sorted multiset of (label, input bytes): equal iff the same examples."""
    flat = x.reshape(x.shape[0], -1).contiguous()
    return sorted(zip(y.tolist(), (r.numpy().tobytes() for r in flat), strict=True))


@pytest.fixture
def fake_module(monkeypatch: pytest.MonkeyPatch) -> Iterator[types.ModuleType]:
    """An importable module for factory-loading tests, removed after the test."""
    module = types.ModuleType(FAKE)
    monkeypatch.setitem(sys.modules, FAKE, module)
    yield module


# --- task contents against the native streams -------------------------------------------


def test_class_il_matches_native_seq_cifar10(tmp_path: Path) -> None:
    """nc_benchmark on CIFAR-10-format files = native seq-cifar10, task by task.

    Same normalisation on both sides: the Avalanche datasets hold exactly the [0, 1] floats
    the native stream computes from the uint8 pixels, and both benchmark transform groups
    normalise with the native mean/std (torchvision's Normalize computes the same
    (x - mean) / std elementwise, so the values are bit-identical). The train group also
    crops and flips at random, as Avalanche's SplitCIFAR10 does: equality proves the
    adapter reads the deterministic eval group instead of freezing one random draw.
    """
    write_tiny_cifar10(tmp_path, n=30, n_test=20)  # random pixels: 150 train, 20 test
    images = load_cifar10(tmp_path, download=False)
    native = ClassILStream(
        images,
        name="seq-cifar10",
        num_tasks=5,
        classes_per_task=2,
        mean=CIFAR10_MEAN,
        std=CIFAR10_STD,
        device=CPU,
    )
    normalise = Normalize(CIFAR10_MEAN, CIFAR10_STD)
    benchmark = nc_benchmark(
        TensorDataset(images.train_x.float().div_(255), images.train_y),
        TensorDataset(images.test_x.float().div_(255), images.test_y),
        n_experiences=5,
        task_labels=False,
        fixed_class_order=list(range(10)),
        train_transform=Compose([RandomCrop(32, padding=4), RandomHorizontalFlip(), normalise]),
        eval_transform=normalise,
    )
    stream = AvalancheStream(benchmark, device=CPU, name="avalanche:test")
    assert stream.scenario == "class-il"  # so the engine also scores task-IL
    assert (stream.num_tasks, stream.num_classes, stream.input_shape) == (5, 10, (3, 32, 32))
    assert not stream.augments
    for t in range(5):
        ours, theirs = stream.task(t), native.task(t)
        assert ours.classes == theirs.classes == (2 * t, 2 * t + 1)  # task-IL masks
        assert rows(ours.train_x, ours.train_y) == rows(theirs.train_x, theirs.train_y)
        assert rows(ours.test_x, ours.test_y) == rows(theirs.test_x, theirs.test_y)
        assert torch.equal(stream.train_labels(t), ours.train_y)
        assert ours.train_x.dtype == torch.float32 and ours.train_y.dtype == torch.int64
    described = stream.describe()
    json.dumps(described)  # JSON-able for config.json
    assert described["classes_per_task"] == [[2 * t, 2 * t + 1] for t in range(5)]
    assert described["train_sizes"] == [native.task(t).train_y.shape[0] for t in range(5)]
    assert len(str(described["content_sha256"])) == 64
    # Same benchmark, same numbers, same hash; the first 2 experiences hash differently.
    assert AvalancheStream(benchmark).content_sha256 == stream.content_sha256
    first_two = AvalancheStream(benchmark, num_tasks=2)
    assert first_two.num_tasks == 2 and first_two.content_sha256 != stream.content_sha256


def test_domain_il_matches_native_rot_digits() -> None:
    """benchmark_from_datasets over the tasks of native rot-digits gives the same tasks."""
    native = build_stream(
        "rot-digits",
        num_tasks=3,
        seed=0,
        device=CPU,
        data_root=None,
        download=False,
        train_size=600,
        test_size=200,
    )
    tasks = [native.task(t) for t in range(3)]
    benchmark = benchmark_from_datasets(
        train=[classification(task.train_x, task.train_y) for task in tasks],
        test=[classification(task.test_x, task.test_y) for task in tasks],
    )
    stream = AvalancheStream(benchmark, device=CPU)
    assert stream.scenario == "domain-il"
    assert (stream.num_tasks, stream.num_classes, stream.input_shape) == (3, 10, (1, 8, 8))
    for t, theirs in enumerate(tasks):
        ours = stream.task(t)
        assert ours.classes == tuple(range(10))
        # benchmark_from_datasets keeps each dataset's order: exactly the native tensors
        for field in ("train_x", "train_y", "test_x", "test_y"):
            assert torch.equal(getattr(ours, field), getattr(theirs, field)), field
    assert stream.describe()["task_labels"] == [[0], [0], [0]]


def test_task_labels_with_global_class_ids_stay_class_il(
    digits: tuple[torch.Tensor, ...],
) -> None:
    train_x, train_y, test_x, test_y = digits
    benchmark = nc_benchmark(
        TensorDataset(train_x, train_y),
        TensorDataset(test_x, test_y),
        n_experiences=5,
        task_labels=True,
        fixed_class_order=[1, 0, 3, 2, 5, 4, 7, 6, 9, 8],
    )
    stream = AvalancheStream(benchmark)
    assert stream.scenario == "class-il"
    assert [stream.task(t).classes for t in range(5)] == [(0, 1), (2, 3), (4, 5), (6, 7), (8, 9)]
    assert stream.describe()["task_labels"] == [[0], [1], [2], [3], [4]]


# --- refusals ----------------------------------------------------------------------------


def test_overlapping_unequal_classes_are_refused(digits: tuple[torch.Tensor, ...]) -> None:
    with pytest.raises(UserError, match="overlapping but unequal class sets"):
        AvalancheStream(class_split(digits, [{0, 1}, {1, 2}]))


def test_multi_head_relabelled_classes_are_refused(digits: tuple[torch.Tensor, ...]) -> None:
    train_x, train_y, test_x, test_y = digits
    benchmark = nc_benchmark(
        TensorDataset(train_x, train_y),
        TensorDataset(test_x, test_y),
        n_experiences=5,
        task_labels=True,
        fixed_class_order=list(range(10)),
        class_ids_from_zero_in_each_exp=True,
    )
    with pytest.raises(UserError, match="different task labels"):
        AvalancheStream(benchmark)


def test_mismatched_stream_lengths_are_refused(digits: tuple[torch.Tensor, ...]) -> None:
    train_x, train_y, test_x, test_y = digits
    benchmark = benchmark_from_datasets(
        train=[by_class(train_x, train_y, {0, 1}), by_class(train_x, train_y, {2, 3})],
        test=[by_class(test_x, test_y, {0, 1})],
    )
    with pytest.raises(UserError, match="has 2 train but 1 test experiences"):
        AvalancheStream(benchmark)


def test_more_tasks_than_experiences_is_refused(digits: tuple[torch.Tensor, ...]) -> None:
    benchmark = class_split(digits, [{0, 1}, {2, 3}, {4, 5}])
    with pytest.raises(UserError, match="has 3 experiences; use --tasks 3 or fewer"):
        AvalancheStream(benchmark, num_tasks=4)
    assert AvalancheStream(benchmark, num_tasks=2).num_tasks == 2
    with pytest.raises(UserError, match="task 2 is out of range"):
        AvalancheStream(benchmark, num_tasks=2).task(2)


def test_uint8_inputs_are_refused(digits: tuple[torch.Tensor, ...]) -> None:
    """Unscaled pixels would train silently worse: ask for the benchmark's transform."""
    train_x, train_y, test_x, test_y = digits
    as_bytes = [classification(x.mul(255).to(torch.uint8), y) for x, y in ((train_x, train_y),)]
    benchmark = benchmark_from_datasets(train=as_bytes, test=[classification(test_x, test_y)])
    with pytest.raises(UserError, match=r"yields torch\.uint8 inputs; add a transform"):
        AvalancheStream(benchmark)


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ("avalanche:nocolon", "is not of the form avalanche:package.module:factory"),
        ("avalanche:pkg.mod:", "is not of the form avalanche:package.module:factory"),
        ("avalanche:a:b:c", "is not of the form avalanche:package.module:factory"),
        ("avalanche:no_such_module_cflb:factory", "'no_such_module_cflb' of stream"),
        ("avalanche:tests.avalanche_factories:nope", "has no attribute 'nope'"),
    ],
)
def test_bad_specs_are_refused(spec: str, fragment: str) -> None:
    with pytest.raises(UserError, match=re.escape(fragment)):
        build_stream(spec, num_tasks=0, seed=0, device=CPU, data_root=None, download=False)


def test_missing_avalanche_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(adapter.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(UserError, match=r"install the extra: pip install 'cfl-bench\[avalanche\]'"):
        load_benchmark("avalanche:pkg.mod:factory", num_tasks=0, seed=0, data_root=None)


def test_factory_failures_are_user_errors(
    fake_module: types.ModuleType, digits: tuple[torch.Tensor, ...]
) -> None:
    def broken(seed: int) -> None:
        raise RuntimeError("no such dataset")

    def needs_tasks(n_experiences: int) -> Any:
        return class_split(digits, [{0, 1}] * n_experiences)

    def needs_root(dataset_root: str) -> Any:
        raise AssertionError("not called")

    def needs_other(classes: int) -> Any:
        raise AssertionError("not called")

    fake_module.broken = broken
    fake_module.not_a_benchmark = lambda: [1, 2]
    fake_module.needs_tasks = needs_tasks
    fake_module.needs_root = needs_root
    fake_module.needs_other = needs_other
    fake_module.number = 3
    cases = {
        "broken": "failed (RuntimeError: no such dataset)",
        "not_a_benchmark": "returned a list, not a benchmark with train_stream and test_stream",
        "needs_tasks": "needs n_experiences; pass --tasks N",
        "needs_root": "needs dataset_root; pass --data-root",
        "needs_other": "needs argument(s) classes that the adapter cannot supply",
        "number": "is a int, neither a callable nor an Avalanche benchmark",
    }
    for attribute, fragment in cases.items():
        with pytest.raises(UserError, match=re.escape(fragment)):
            load_benchmark(f"avalanche:{FAKE}:{attribute}", num_tasks=0, seed=0, data_root=None)
    with pytest.raises(UserError, match="do not apply to Avalanche stream"):
        build_avalanche_stream(
            f"avalanche:{FAKE}:needs_tasks",
            num_tasks=1,
            seed=0,
            device=CPU,
            data_root=None,
            train_size=100,
        )


# --- factory loading ---------------------------------------------------------------------


def test_factory_gets_the_arguments_it_names_and_a_seeded_rng(
    fake_module: types.ModuleType, digits: tuple[torch.Tensor, ...]
) -> None:
    calls: list[dict[str, object]] = []
    groups = [{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}]

    def factory(seed: int, n_experiences: int = 5, dataset_root: str | None = None) -> Any:
        calls.append({"seed": seed, "n_experiences": n_experiences, "root": dataset_root})
        order = torch.randperm(5).tolist()  # the global RNG: seeded by the adapter
        return class_split(digits, [groups[i] for i in order[:n_experiences]])

    fake_module.factory = factory
    spec = f"avalanche:{FAKE}:factory"
    rng_before = torch.get_rng_state()
    stream = build_avalanche_stream(spec, num_tasks=0, seed=7, device=CPU, data_root=None)
    assert torch.equal(torch.get_rng_state(), rng_before)  # the run's own RNG is untouched
    assert calls[-1] == {"seed": 7, "n_experiences": 5, "root": None}  # no --tasks, no root
    assert stream.num_tasks == 5 and stream.name == spec
    again = build_avalanche_stream(spec, num_tasks=0, seed=7, device=CPU, data_root=None)
    assert again.content_sha256 == stream.content_sha256  # deterministic draw
    two = build_avalanche_stream(spec, num_tasks=2, seed=7, device=CPU, data_root="/data")
    assert calls[-1] == {"seed": 7, "n_experiences": 2, "root": "/data"}
    assert two.num_tasks == 2
    described = two.describe()
    assert described["factory"] == f"{FAKE}:factory"
    assert described["factory_kwargs"] == {
        "seed": 7,
        "n_experiences": 2,
        "dataset_root": "<--data-root>",  # the path is machine-specific, not part of it
    }
    # A ready benchmark object instead of a callable; --tasks then takes its first n.
    fake_module.ready = class_split(digits, groups[:3])
    ready = build_stream(
        f"avalanche:{FAKE}:ready", num_tasks=2, seed=0, device=CPU, data_root=None, download=False
    )
    assert [ready.task(t).classes for t in range(2)] == [(0, 1), (2, 3)]


def test_stream_info_for_native_and_avalanche_names() -> None:
    assert stream_info("seq-cifar10") is STREAMS["seq-cifar10"]
    info = stream_info("avalanche:tests.avalanche_factories:tiny_split_digits")
    assert (info.default_model, info.default_tasks, info.default_partition) == (
        "mlp",
        0,
        "dirichlet",
    )
    assert not info.needs_data_root and info.default_rounds_per_task == 20
    with pytest.raises(
        UserError, match=r"unknown stream 'nosuch'.*avalanche:package\.module:factory"
    ):
        stream_info("nosuch")
    with pytest.raises(UserError, match="is not of the form"):
        stream_info("avalanche:broken")


def test_classic_split_mnist_by_spec_offline(
    tmp_path: Path, shared_data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Avalanche's own SplitMNIST, by spec, on the shared MNIST files with the network cut.

    torchvision's MNIST wants the uncompressed files beside the archives and extracts them
    when absent; the shared folder is read-only, so the archives are linked into a scratch
    root where the extraction can happen. Their md5s match, so nothing is fetched.
    """
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for archive in (shared_data / "MNIST" / "raw").glob("*.gz"):
        (raw / archive.name).symlink_to(archive)

    def no_network(*args: object) -> None:
        raise AssertionError("the benchmark tried to reach the network")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    spec = "avalanche:avalanche.benchmarks.classic:SplitMNIST"
    with pytest.raises(UserError, match="needs n_experiences; pass --tasks N"):
        build_stream(spec, num_tasks=0, seed=0, device=CPU, data_root=str(tmp_path), download=False)
    stream = build_stream(
        spec, num_tasks=5, seed=0, device=CPU, data_root=str(tmp_path), download=False
    )
    assert stream.scenario == "class-il" and stream.num_tasks == 5
    classes = [stream.task(t).classes for t in range(5)]
    assert sorted(c for pair in classes for c in pair) == list(range(10))
    assert all(len(pair) == 2 for pair in classes)
    _, train_y, _, _ = mnist_floats(shared_data, 60000, 10000)
    described = stream.describe()
    assert sum(described["train_sizes"]) == 60000 and sum(described["test_sizes"]) == 10000
    counts = torch.bincount(torch.cat([stream.train_labels(t) for t in range(5)]), minlength=10)
    assert torch.equal(counts, torch.bincount(train_y, minlength=10))


# --- through the CLI ---------------------------------------------------------------------


def test_cli_run_through_the_adapter(tmp_path: Path) -> None:
    out = tmp_path / "run"
    spec = "avalanche:tests.avalanche_factories:tiny_split_digits"
    code, output = in_process(
        "run",
        *("--stream", spec, "--strategy", "der"),
        *("--clients", "4", "--rounds-per-task", "1", "--epochs", "1", "--probe-size", "50"),
        *("--threads", "1", "--device", "cpu", "--out", str(out)),
    )
    assert code == 0, output
    assert "class-IL" in output and "task-IL" in output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "finished"
    assert summary["Acc_T"] is not None and summary["acc_task_il_T"] is not None
    assert summary["acc_task_il_T"] >= summary["Acc_T"]
    config = json.loads((out / "config.json").read_text())
    described = config["stream"]
    assert described["name"] == spec and described["scenario"] == "class-il"
    assert described["factory"] == "tests.avalanche_factories:tiny_split_digits"
    assert described["num_tasks"] == 2  # all the factory's experiences (no --tasks)
    assert described["classes_per_task"] == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]
    assert sum(described["train_sizes"]) == TINY_TRAIN
    assert sum(described["test_sizes"]) == TINY_TEST
    assert config["config"]["model"] == "mlp"
    assert config["protocol"]["partition"]["name"] == "dirichlet"
    protocol = config["protocol"]
    assert protocol["avalanche_factory"] == "tests.avalanche_factories:tiny_split_digits"
    assert "seed" not in protocol["avalanche_factory_kwargs"]  # seeds of one protocol average
    assert protocol["train_sizes"] == described["train_sizes"]
