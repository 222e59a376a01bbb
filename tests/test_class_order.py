"""``--class-order``: TARGET's and LANDER's shuffled class order (PyCIL's ``DataManager``:
``np.random.seed(2023)``, ``np.random.permutation(C)``, every label mapped to its position),
applied in the class-split streams before tasks are cut."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
import torch

from cfl_bench.core.errors import UserError
from cfl_bench.runner.config import RunConfig
from cfl_bench.runner.run_names import point_request
from cfl_bench.strategies.lander_anchors import CIFAR10_NAMES, load_anchors
from cfl_bench.streams.catalogue import STREAMS, check_class_order
from cfl_bench.streams.cifar import load_cifar10
from cfl_bench.streams.class_il import relabelled
from cfl_bench.streams.class_order import check_class_order_text, class_order, parse_class_order
from cfl_bench.streams.registry import build_stream
from tests.sweep_helpers import in_process
from tests.synthetic_data import write_tiny_cifar10

CPU = torch.device("cpu")
# np.random.seed(2023); np.random.permutation(10), printed once: a numpy that drew another
# sequence would change TARGET's and LANDER's tasks, and this literal catches it.
ORDER_2023 = (8, 2, 5, 0, 3, 4, 1, 9, 6, 7)
SHUFFLED = "numpy:seed=2023"


@pytest.fixture(scope="module")
def cifar_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CIFAR-10 folder of 5 × 40 training and 20 test images (labels cycle over classes)."""
    root = tmp_path_factory.mktemp("cifar-format")
    write_tiny_cifar10(root, n=40, n_test=20)
    return root


def test_the_order_is_numpys_legacy_permutation_for_the_seed() -> None:
    order = class_order(SHUFFLED, 10)
    assert order == ORDER_2023
    assert list(order or ()) == np.random.RandomState(2023).permutation(10).tolist()
    assert class_order("natural", 10) is None
    assert parse_class_order(" numpy:seed=0 ") == 0


def test_labels_become_their_position_in_the_order() -> None:
    y = torch.tensor([8, 2, 7, 0, 8])
    assert relabelled(y, ORDER_2023).tolist() == [0, 1, 9, 3, 0]
    assert relabelled(y, None) is y


@pytest.mark.parametrize("bad", ["random", "numpy:seed=x", "numpy", "numpy:seed=-1", "numpy:s=1"])
def test_a_bad_order_is_refused_in_one_sentence(bad: str) -> None:
    with pytest.raises(UserError, match="--class-order"):
        parse_class_order(bad)
    with pytest.raises(ValueError, match="must be natural or numpy:seed=N"):
        check_class_order_text(bad)


def test_a_shuffled_task_holds_the_original_classes_of_the_order(cifar_root: Path) -> None:
    stream = build_stream(
        "seq-cifar10",
        num_tasks=5,
        seed=0,
        device=CPU,
        data_root=str(cifar_root),
        download=False,
        class_order=SHUFFLED,
    )
    raw = load_cifar10(cifar_root, download=False)
    assert stream.describe()["class_order"] == list(ORDER_2023)
    for t in range(5):
        train, test = stream.task_train(t), stream.task_test(t)
        assert set(train.train_y.tolist()) == {2 * t, 2 * t + 1}
        assert test.classes == (2 * t, 2 * t + 1)
        originals = ORDER_2023[2 * t : 2 * t + 2]
        rows = ((raw.train_y == originals[0]) | (raw.train_y == originals[1])).nonzero().flatten()
        # the same images, in file order, each under its new label
        assert torch.equal(train.train_x, raw.train_x[rows])
        assert train.train_y.tolist() == [ORDER_2023.index(int(y)) for y in raw.train_y[rows]]
        test_rows = torch.isin(raw.test_y, torch.tensor(originals)).nonzero().flatten()
        assert torch.equal(test.test_x, raw.test_x[test_rows])


def test_the_default_changes_neither_the_protocol_nor_the_description(cifar_root: Path) -> None:
    natural = RunConfig(stream="seq-cifar10")
    assert "class_order" not in natural.protocol()
    shuffled = RunConfig(stream="seq-cifar10", class_order=SHUFFLED)
    assert shuffled.protocol()["class_order"] == SHUFFLED
    assert shuffled.protocol() != natural.protocol()
    # a sweep point's request (its folder name) too: the option counts only when set
    assert "class_order" not in point_request(natural)
    assert point_request(shuffled)["class_order"] == SHUFFLED
    stream = build_stream(
        "seq-cifar10", num_tasks=5, seed=0, device=CPU, data_root=str(cifar_root), download=False
    )
    assert stream.describe()["class_order"] == "natural"
    assert stream.class_order is None
    assert stream.task_train(0).train_y.unique().tolist() == [0, 1]


@pytest.mark.parametrize(
    "extra",
    [
        ["--class-order", "numpy:seed=x"],
        ["--class-order", "random"],
        ["--class-order", SHUFFLED],  # the default stream, rot-digits: domain-IL
        ["--class-order", SHUFFLED, "--stream", "perm-digits"],
    ],
)
def test_the_cli_refuses_a_bad_order_and_a_stream_without_classes(
    extra: list[str], tmp_path: Path
) -> None:
    out = tmp_path / "run"
    code, shown = in_process("run", "--tasks", "2", *extra, "--out", str(out))
    assert code == 2, shown
    lines = [line for line in shown.splitlines() if line.strip()]
    assert len(lines) == 1 and "--class-order" in lines[0], shown
    assert not out.exists()


def test_the_class_split_streams_take_the_order_and_the_others_refuse_it() -> None:
    takes = [name for name, info in STREAMS.items() if info.orders_classes]
    cifar = ["seq-cifar10", "seq-cifar100", "seq-cifar100-fot"]
    assert takes == [*cifar, "seq-agnews", "seq-dbpedia", "seq-yahooqa"]
    for name in ("rot-mnist", "perm-mnist-fot", "carla-det", "cifar10"):
        check_class_order(STREAMS[name], "natural")
        with pytest.raises(UserError, match=f"stream '{name}' does not cut its tasks by class"):
            check_class_order(STREAMS[name], SHUFFLED)


def stub_encoder(texts: Sequence[str]) -> torch.Tensor:
    """A distinct unit vector per CIFAR-10 name (its one-hot row), so rows can be traced."""
    index = [CIFAR10_NAMES.index(text.replace(" ", "_")) for text in texts]
    return torch.eye(10)[index]


def test_landers_anchors_follow_the_order(tmp_path: Path) -> None:
    natural = load_anchors("minilm", "seq-cifar10", 10, stub_encoder)
    shuffled = load_anchors("minilm", "seq-cifar10", 10, stub_encoder, ORDER_2023)
    assert torch.equal(shuffled, natural[list(ORDER_2023)])
    # the anchor of new label 0 is the name of original class 8, "ship"
    assert int(shuffled[0].argmax()) == CIFAR10_NAMES.index("ship") == 8
    # a user's file is in the data's own label order: its rows are permuted the same way
    path = tmp_path / "anchors.pt"
    torch.save(natural, path)
    assert torch.equal(load_anchors(str(path), "seq-cifar10", 10, None, ORDER_2023), shuffled)


def test_a_vectorized_run_trains_the_shuffled_tasks(cifar_root: Path, tmp_path: Path) -> None:
    """The relabelling is in the stream, so the vectorized executor sees only new labels:
    the run records the order and the client class counts of task 0 are labels 0 and 1."""
    out = tmp_path / "run"
    args = ["run", "--stream", "seq-cifar10", "--data-root", str(cifar_root)]
    args += ["--model", "fedavg-cnn", "--tasks", "2", "--rounds-per-task", "1", "--epochs", "1"]
    args += ["--clients", "2", "--threads", "1", "--executor", "vectorized"]
    code, shown = in_process(*args, "--class-order", SHUFFLED, "--out", str(out))
    assert code == 0, shown
    config = json.loads((out / "config.json").read_text())
    assert config["protocol"]["class_order"] == SHUFFLED
    assert config["stream"]["class_order"] == list(ORDER_2023)
    for task, labels in (("1", {0, 1}), ("2", {2, 3})):
        held = {c for row in config["client_class_counts"][task] for c, n in enumerate(row) if n}
        assert held == labels
