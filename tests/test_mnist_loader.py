"""The IDX/MNIST loader: real data loads, and every kind of bad file is one clear UserError."""

from __future__ import annotations

import errno
import gzip
from pathlib import Path

import numpy as np
import pytest
import torch

from cfl_bench.core.errors import UserError
from cfl_bench.streams import mnist
from cfl_bench.streams.mnist import load_idx_split, load_mnist
from tests.synthetic_data import IDX_STEMS as STEMS
from tests.synthetic_data import images_bytes, labels_bytes, write_tiny_mnist

MNIST_TRAIN_COUNTS = [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]
MNIST_TEST_COUNTS = [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]


def test_real_mnist_and_fashion_mnist(shared_data: Path) -> None:
    """The shared copies themselves: full MNIST, and Fashion-MNIST's test split only."""
    train_x, train_y, test_x, test_y = load_mnist(shared_data, download=False)
    assert train_x.shape == (60000, 28, 28) and train_x.dtype == torch.uint8
    assert test_x.shape == (10000, 28, 28) and test_x.dtype == torch.uint8
    assert train_y.dtype == torch.int64 and test_y.dtype == torch.int64
    assert torch.bincount(train_y).tolist() == MNIST_TRAIN_COUNTS
    assert torch.bincount(test_y).tolist() == MNIST_TEST_COUNTS
    assert int(train_x.max()) == 255
    train_x, train_y, test_x, test_y = load_mnist(shared_data, download=False, which="FashionMNIST")
    assert train_x.shape == (0, 28, 28) and train_y.shape == (0,)
    assert test_x.shape == (10000, 28, 28)
    assert torch.bincount(test_y).tolist() == [1000] * 10


def test_fashion_mnist_test_only(tmp_path: Path) -> None:
    """Fashion-MNIST may lack its train split (public data needs only the test split)."""
    write_tiny_mnist(tmp_path, gz=True, n_train=0, n_test=20, dataset="FashionMNIST")
    train_x, train_y, test_x, test_y = load_mnist(tmp_path, download=False, which="FashionMNIST")
    assert train_x.shape == (0, 28, 28) and train_y.shape == (0,)
    assert train_x.dtype == torch.uint8 and train_y.dtype == torch.int64
    assert test_x.shape == (20, 28, 28) and test_y.tolist() == [i % 10 for i in range(20)]
    write_tiny_mnist(tmp_path, gz=True, n_train=0, n_test=20)  # MNIST needs its train split
    with pytest.raises(UserError, match=r"train-images-idx3-ubyte\.gz is missing"):
        load_mnist(tmp_path, download=False)


def test_missing_root_gives_advice(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"does not exist.*MNIST/raw.*--download"):
        load_mnist(tmp_path / "nowhere", download=False)


def test_missing_file_names_the_file_and_layout(tmp_path: Path) -> None:
    raw = write_tiny_mnist(tmp_path, gz=True)
    (raw / "t10k-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(UserError, match=r"t10k-labels-idx1-ubyte\.gz is missing.*--download"):
        load_mnist(tmp_path, download=False)


def test_dataset_folder_instead_of_root_gets_a_hint(tmp_path: Path) -> None:
    write_tiny_mnist(tmp_path, gz=True)
    with pytest.raises(UserError, match="is the dataset folder itself; pass its parent"):
        load_mnist(tmp_path / "MNIST", download=False)


def test_truncated_gz_is_reported(tmp_path: Path) -> None:
    raw = write_tiny_mnist(tmp_path, gz=True, n_train=600, n_test=10)
    data = (raw / "train-labels-idx1-ubyte.gz").read_bytes()
    (raw / "train-labels-idx1-ubyte.gz").write_bytes(data[: len(data) // 2])
    with pytest.raises(UserError, match=r"train-labels-idx1-ubyte\.gz is truncated or corrupt"):
        load_mnist(tmp_path, download=False)


def test_not_gzip_is_corrupt(tmp_path: Path) -> None:
    raw = write_tiny_mnist(tmp_path, gz=True)
    (raw / "train-images-idx3-ubyte.gz").write_bytes(b"definitely not gzip data")
    with pytest.raises(UserError, match="truncated or corrupt"):
        load_mnist(tmp_path, download=False)


def test_wrong_magic_is_corrupt(tmp_path: Path) -> None:
    raw = write_tiny_mnist(tmp_path, gz=False)
    images = np.zeros((6, 28, 28), dtype=np.uint8)
    (raw / STEMS["train_images"]).write_bytes(images_bytes(images, magic=2049))
    with pytest.raises(UserError, match=r"truncated or corrupt \(magic number 2049"):
        load_mnist(tmp_path, download=False)


def test_wrong_size_dims_and_labels_are_corrupt(tmp_path: Path) -> None:
    raw = write_tiny_mnist(tmp_path, gz=False)
    good = (raw / STEMS["test_images"]).read_bytes()
    (raw / STEMS["test_images"]).write_bytes(good + b"\0")
    with pytest.raises(UserError, match="header promises"):
        load_idx_split(tmp_path, "MNIST", "test")
    (raw / STEMS["test_images"]).write_bytes(images_bytes(np.zeros((4, 27, 28))))
    with pytest.raises(UserError, match="27x28"):
        load_idx_split(tmp_path, "MNIST", "test")
    (raw / STEMS["test_images"]).write_bytes(good)
    (raw / STEMS["test_labels"]).write_bytes(labels_bytes(np.array([0, 1, 12, 3])))
    with pytest.raises(UserError, match="label 12"):
        load_idx_split(tmp_path, "MNIST", "test")


def test_image_and_label_counts_must_agree(tmp_path: Path) -> None:
    raw = write_tiny_mnist(tmp_path, gz=False)
    (raw / STEMS["test_labels"]).write_bytes(labels_bytes(np.arange(3)))
    with pytest.raises(UserError, match=r"\(4 images\).*\(3 labels\) disagree"):
        load_idx_split(tmp_path, "MNIST", "test")


def test_uncompressed_files_are_accepted(tmp_path: Path) -> None:
    write_tiny_mnist(tmp_path, gz=False)
    train_x, train_y, test_x, test_y = load_mnist(tmp_path, download=False)
    assert train_x.shape == (6, 28, 28) and test_x.shape == (4, 28, 28)
    assert train_y.tolist() == list(range(6)) and test_y.tolist() == list(range(4))


def test_gz_is_preferred_over_uncompressed(tmp_path: Path) -> None:
    raw = write_tiny_mnist(tmp_path, gz=True)
    for stem in STEMS.values():
        (raw / stem).write_bytes(b"stale garbage")
    train_x, _, _, _ = load_mnist(tmp_path, download=False)
    assert train_x.shape == (6, 28, 28)


def test_download_failure_is_a_user_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    class Offline:
        def __init__(self, root: str, *, train: bool, download: bool) -> None:
            raise OSError(errno.ENETUNREACH, "Network is unreachable")

    monkeypatch.setattr(mnist, "_torchvision_dataset_class", lambda dataset: Offline)
    with pytest.raises(
        UserError,
        match=r"downloading MNIST into .* failed: no network "
        r"connection \(Network is unreachable\).*by hand",
    ):
        load_mnist(tmp_path, download=True)


def test_download_only_when_files_are_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[bool] = []

    class Fetcher:
        """Stands in for torchvision: 'downloads' by writing the tiny files."""

        def __init__(self, root: str, *, train: bool, download: bool) -> None:
            calls.append(train)
            if not (Path(root) / "MNIST").exists():
                write_tiny_mnist(Path(root), gz=True)

    monkeypatch.setattr(mnist, "_torchvision_dataset_class", lambda dataset: Fetcher)
    train_x, _, _, _ = load_mnist(tmp_path, download=True)
    assert train_x.shape == (6, 28, 28) and calls == [True, False]
    load_mnist(tmp_path, download=True)
    assert calls == [True, False]


def test_uncompressed_copy_loads_the_same_tensors(tmp_path: Path) -> None:
    """gunzipped files (as torchvision leaves beside the archives) read exactly the same."""
    source = write_tiny_mnist(tmp_path / "gz", gz=True, n_train=30, n_test=50, seed=3)
    raw = tmp_path / "plain" / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for stem in (STEMS["test_images"], STEMS["test_labels"]):
        with gzip.open(source / f"{stem}.gz") as src:
            (raw / stem).write_bytes(src.read())
    test_x, test_y = load_idx_split(tmp_path / "plain", "MNIST", "test")
    ref_x, ref_y = load_idx_split(tmp_path / "gz", "MNIST", "test")
    assert test_x.shape == (50, 28, 28) and int(test_x.max()) > 0
    assert torch.equal(test_x, ref_x) and torch.equal(test_y, ref_y)
