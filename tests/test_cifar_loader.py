"""The CIFAR pickle loader: real subsets load, and every kind of bad file is one clear UserError."""

from __future__ import annotations

import errno
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from cfl_bench.core.errors import UserError
from cfl_bench.streams import cifar
from cfl_bench.streams.cifar import cifar_class_names, load_cifar10, load_cifar100
from tests.synthetic_data import (
    CIFAR10_NAMES,
    dump,
    tiny_batch,
    write_tiny_cifar10,
    write_tiny_cifar100,
)


def raw_pickle(path: Path) -> dict[Any, Any]:
    with path.open("rb") as f:
        return pickle.load(f, encoding="bytes")


def raw_entry(batch: dict[Any, Any], key: str) -> Any:
    return batch[key] if key in batch else batch[key.encode()]


def test_real_cifar10_subset(shared_data: Path) -> None:
    splits = load_cifar10(shared_data, download=False)
    assert splits.name == "cifar10" and splits.num_classes == 10 and splits.levels == 255
    assert splits.train_x.shape == (15000, 3, 32, 32) and splits.train_x.dtype == torch.uint8
    assert splits.test_x.shape == (5000, 3, 32, 32) and splits.test_x.dtype == torch.uint8
    assert splits.train_y.dtype == torch.int64 and splits.test_y.dtype == torch.int64
    assert torch.bincount(splits.train_y).tolist() == [1500] * 10
    assert torch.bincount(splits.test_y).tolist() == [500] * 10
    assert int(splits.train_x.max()) == 255
    assert cifar_class_names(shared_data, "cifar10") == CIFAR10_NAMES


def test_reshape_is_chw(tmp_path: Path) -> None:
    """Re-derive the first train and test images from the raw rows: channel-major, row-major."""
    folder = write_tiny_cifar10(tmp_path, n=3, n_test=2)
    splits = load_cifar10(tmp_path, download=False)
    first = raw_pickle(folder / "data_batch_1")
    row = raw_entry(first, "data")[0]
    assert torch.equal(splits.train_x[0], torch.from_numpy(row.reshape(3, 32, 32).copy()))
    assert torch.equal(splits.train_x[0, 0, 0], torch.from_numpy(row[:32].copy()))  # red row 0
    assert torch.equal(splits.train_x[0, 1, 0], torch.from_numpy(row[1024:1056].copy()))
    assert torch.equal(splits.train_x[0, 2, 31], torch.from_numpy(row[-32:].copy()))  # blue
    assert int(splits.train_y[0]) == raw_entry(first, "labels")[0]
    second = raw_pickle(folder / "data_batch_2")  # batches are concatenated in order
    n1 = raw_entry(first, "data").shape[0]
    expected = raw_entry(second, "data")[0].reshape(3, 32, 32)
    assert torch.equal(splits.train_x[n1], torch.from_numpy(expected.copy()))
    last = raw_pickle(folder / "data_batch_5")
    assert torch.equal(
        splits.train_x[-1], torch.from_numpy(raw_entry(last, "data")[-1].reshape(3, 32, 32).copy())
    )
    test = raw_pickle(folder / "test_batch")
    assert torch.equal(
        splits.test_x[-1], torch.from_numpy(raw_entry(test, "data")[-1].reshape(3, 32, 32).copy())
    )
    assert splits.train_x.shape == (15, 3, 32, 32) and splits.test_x.shape == (2, 3, 32, 32)


def test_real_cifar100_subset(shared_data: Path) -> None:
    splits = load_cifar100(shared_data, download=False)
    assert splits.name == "cifar100" and splits.num_classes == 100 and splits.levels == 255
    assert splits.train_x.shape == (20000, 3, 32, 32) and splits.test_x.shape == (5000, 3, 32, 32)
    assert torch.bincount(splits.train_y).tolist() == [200] * 100
    assert torch.bincount(splits.test_y).tolist() == [50] * 100
    train = raw_pickle(shared_data / "cifar-100-python" / "train")
    assert splits.train_y.tolist() == list(raw_entry(train, "fine_labels"))  # fine, not coarse
    row = raw_entry(train, "data")[0]
    assert torch.equal(splits.train_x[0], torch.from_numpy(row.reshape(3, 32, 32).copy()))
    names = cifar_class_names(shared_data, "cifar100")
    assert len(names) == 100 and len(set(names)) == 100
    assert names[0] == "apple" and all(isinstance(n, str) for n in names)


def test_tiny_trees_with_bytes_and_str_keys(tmp_path: Path) -> None:
    write_tiny_cifar10(tmp_path, n=4)
    write_tiny_cifar100(tmp_path, n=6)
    ten = load_cifar10(tmp_path, download=False)
    assert ten.train_x.shape == (20, 3, 32, 32) and ten.test_x.shape == (4, 3, 32, 32)
    assert ten.train_y.tolist() == [0, 1, 2, 3] * 5
    hundred = load_cifar100(tmp_path, download=False)
    assert hundred.train_x.shape == (6, 3, 32, 32) and hundred.num_classes == 100
    assert cifar_class_names(tmp_path, "cifar100")[:2] == ["c0", "c1"]


def test_missing_root_gives_advice(tmp_path: Path) -> None:
    with pytest.raises(
        UserError, match=r"--data-root '.*nowhere' does not exist; pass.*--download"
    ):
        load_cifar10(tmp_path / "nowhere", download=False)


def test_missing_file_names_the_file(tmp_path: Path) -> None:
    folder = write_tiny_cifar10(tmp_path)
    (folder / "data_batch_3").unlink()
    with pytest.raises(UserError, match=r"data_batch_3 is missing.*--download"):
        load_cifar10(tmp_path, download=False)
    with pytest.raises(UserError, match=r"cifar-100-python/train is missing.*--download"):
        load_cifar100(tmp_path, download=False)


def test_dataset_folder_instead_of_root_gets_a_hint(tmp_path: Path) -> None:
    folder = write_tiny_cifar10(tmp_path)
    with pytest.raises(UserError, match="is the dataset folder itself; pass its parent"):
        load_cifar10(folder, download=False)


def test_truncated_pickle_is_reported(tmp_path: Path) -> None:
    folder = write_tiny_cifar100(tmp_path, n=40, n_test=4)
    data = (folder / "train").read_bytes()
    (folder / "train").write_bytes(data[: len(data) // 2])  # cut inside the pixel rows
    with pytest.raises(UserError, match=r"cifar-100-python/train is truncated or not a CIFAR-100"):
        load_cifar100(tmp_path, download=False)


def test_garbage_and_non_dict_pickles(tmp_path: Path) -> None:
    folder = write_tiny_cifar10(tmp_path)
    (folder / "test_batch").write_bytes(b"definitely not a pickle")
    with pytest.raises(UserError, match=r"test_batch is truncated or not a CIFAR-10 pickle"):
        load_cifar10(tmp_path, download=False)
    (folder / "test_batch").write_bytes(pickle.dumps([1, 2, 3]))
    with pytest.raises(UserError, match=r"holds a list, not a dict"):
        load_cifar10(tmp_path, download=False)


def test_missing_key(tmp_path: Path) -> None:
    folder = write_tiny_cifar10(tmp_path)
    batch = tiny_batch(4, 10, b"labels", seed=1)
    del batch[b"labels"]
    dump(folder / "data_batch_2", batch)
    with pytest.raises(UserError, match=r"data_batch_2 .*no 'labels' entry; found batch_label"):
        load_cifar10(tmp_path, download=False)


def test_bad_data_dtype_and_width(tmp_path: Path) -> None:
    folder = write_tiny_cifar10(tmp_path)
    batch = tiny_batch(4, 10, b"labels", seed=1)
    batch[b"data"] = batch[b"data"].astype(np.float32)
    dump(folder / "test_batch", batch)
    with pytest.raises(UserError, match=r"'data' is float32 \(4, 3072\), expected a uint8"):
        load_cifar10(tmp_path, download=False)
    batch[b"data"] = np.zeros((4, 1024), dtype=np.uint8)
    dump(folder / "test_batch", batch)
    with pytest.raises(UserError, match=r"rows have 1024 values, expected 3072"):
        load_cifar10(tmp_path, download=False)
    batch[b"data"] = b"\0" * 3072 * 4
    dump(folder / "test_batch", batch)
    with pytest.raises(UserError, match=r"'data' is <class 'bytes'>"):
        load_cifar10(tmp_path, download=False)


def test_label_count_and_range(tmp_path: Path) -> None:
    folder = write_tiny_cifar10(tmp_path)
    batch = tiny_batch(4, 10, b"labels", seed=1)
    batch[b"labels"] = [0, 1, 2]
    dump(folder / "test_batch", batch)
    with pytest.raises(UserError, match=r"test_batch has 4 images but 3 labels"):
        load_cifar10(tmp_path, download=False)
    batch[b"labels"] = [0, 1, 10, 3]
    dump(folder / "test_batch", batch)
    with pytest.raises(UserError, match=r"test_batch has label 10 outside 0\.\.9"):
        load_cifar10(tmp_path, download=False)
    batch[b"labels"] = [[0, 1], [2, 3]]
    dump(folder / "test_batch", batch)
    with pytest.raises(UserError, match=r"'labels' is not a flat list of integers"):
        load_cifar10(tmp_path, download=False)


def test_cifar100_label_range_uses_fine_classes(tmp_path: Path) -> None:
    folder = write_tiny_cifar100(tmp_path)
    batch = raw_pickle(folder / "test")
    batch["fine_labels"][0] = 100
    dump(folder / "test", batch)
    with pytest.raises(UserError, match=r"label 100 outside 0\.\.99"):
        load_cifar100(tmp_path, download=False)


def test_meta_name_count_mismatch(tmp_path: Path) -> None:
    folder = write_tiny_cifar10(tmp_path)
    dump(folder / "batches.meta", {b"label_names": [b"a", b"b"]})
    with pytest.raises(UserError, match=r"batches\.meta lists 2 class names instead of 10"):
        load_cifar10(tmp_path, download=False)
    (folder / "batches.meta").unlink()
    with pytest.raises(UserError, match=r"batches\.meta is missing"):
        cifar_class_names(tmp_path, "cifar10")


def test_unknown_dataset_name(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="unknown CIFAR dataset 'cifar1000'"):
        cifar_class_names(tmp_path, "cifar1000")


def test_download_failure_is_a_user_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    class Offline:
        def __init__(self, root: str, *, train: bool, download: bool) -> None:
            raise OSError(errno.ENETUNREACH, "Network is unreachable")

    monkeypatch.setattr(cifar, "_torchvision_dataset_class", lambda name: Offline)
    with pytest.raises(
        UserError,
        match=r"downloading CIFAR-10 into .* failed: no network "
        r"connection \(Network is unreachable\).*by hand",
    ):
        load_cifar10(tmp_path, download=True)


def test_download_only_when_files_are_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[str, bool]] = []

    def fetcher_for(name: str) -> type:
        class Fetcher:
            """Stands in for torchvision: 'downloads' by writing the tiny tree."""

            def __init__(self, root: str, *, train: bool, download: bool) -> None:
                calls.append((name, download))
                if name == "CIFAR10":
                    write_tiny_cifar10(Path(root))
                else:
                    write_tiny_cifar100(Path(root))

        return Fetcher

    monkeypatch.setattr(cifar, "_torchvision_dataset_class", fetcher_for)
    assert load_cifar10(tmp_path / "new", download=True).train_x.shape == (20, 3, 32, 32)
    assert load_cifar100(tmp_path / "new", download=True).test_x.shape == (6, 3, 32, 32)
    assert calls == [("CIFAR10", True), ("CIFAR100", True)]
    load_cifar10(tmp_path / "new", download=True)
    load_cifar100(tmp_path / "new", download=True)
    assert len(calls) == 2
