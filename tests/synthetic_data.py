"""Tiny datasets written in the real on-disk formats, for tests that need a file, not a dataset.

Why: the loaders and the streams built on them (rot-/perm-mnist, seq-cifar10/100, the text
streams) read IDX archives, CIFAR pickles and labelled JSON files. A test of the engine, a
scale knob or a loader's error path needs files *in that format*, not the real contents, so it
writes a few of them here and runs on a fresh clone without ``../shared/data``. Tests about the
real contents (class counts, subset sizes) use the ``shared_data`` fixture instead.

Images are seeded random pixels with labels cycling over the classes (every class in every
prefix); texts are short news-like sentences built from each class's own vocabulary, so a
linear head on sentence embeddings can learn them.
"""

from __future__ import annotations

import gzip
import json
import pickle
import random
import struct
from pathlib import Path
from typing import Any

import numpy as np

IDX_STEMS = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}
CIFAR10_NAMES = [
    "airplane",
    "automobile",
    "bird",
    "cat",
    "deer",
    "dog",
    "frog",
    "horse",
    "ship",
    "truck",
]


# -- IDX (MNIST, Fashion-MNIST) ----------------------------------------------------------------
def images_bytes(images: np.ndarray, magic: int = 2051) -> bytes:
    count, rows, cols = images.shape
    return struct.pack(">4I", magic, count, rows, cols) + images.astype(np.uint8).tobytes()


def labels_bytes(labels: np.ndarray, magic: int = 2049) -> bytes:
    return struct.pack(">2I", magic, len(labels)) + labels.astype(np.uint8).tobytes()


def write_tiny_mnist(
    root: Path,
    *,
    gz: bool,
    n_train: int = 6,
    n_test: int = 4,
    dataset: str = "MNIST",
    seed: int = 0,
) -> Path:
    """A miniature MNIST (or Fashion-MNIST) in the torchvision layout; returns its raw folder.

    ``n_train=0`` writes only the test split, as the shared Fashion-MNIST copy has.
    """
    raw = root / dataset / "raw"
    raw.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    contents = {
        "test_images": images_bytes(rng.integers(0, 256, (n_test, 28, 28))),
        "test_labels": labels_bytes(np.arange(n_test) % 10),
    }
    if n_train:
        contents["train_images"] = images_bytes(rng.integers(0, 256, (n_train, 28, 28)))
        contents["train_labels"] = labels_bytes(np.arange(n_train) % 10)
    for key, data in contents.items():
        name = IDX_STEMS[key] + (".gz" if gz else "")
        (raw / name).write_bytes(gzip.compress(data, compresslevel=1) if gz else data)
    return raw


# -- CIFAR pickles -----------------------------------------------------------------------------
def dump(path: Path, obj: dict[Any, Any]) -> None:
    path.write_bytes(pickle.dumps(obj, protocol=2))


def tiny_batch(n: int, num_classes: int, labels_key: bytes, seed: int) -> dict[bytes, Any]:
    """One batch in the original encoding: bytes keys, uint8 N x 3072 data, list labels."""
    rng = np.random.default_rng(seed)
    return {
        b"batch_label": b"tiny batch",
        b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
        labels_key: [i % num_classes for i in range(n)],
    }


def write_tiny_cifar10(root: Path, n: int = 4, n_test: int | None = None) -> Path:
    """A miniature CIFAR-10 (``n`` images per train batch) in the standard layout."""
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    for i in range(1, 6):
        dump(folder / f"data_batch_{i}", tiny_batch(n, 10, b"labels", seed=i))
    dump(folder / "test_batch", tiny_batch(n if n_test is None else n_test, 10, b"labels", 0))
    dump(folder / "batches.meta", {b"label_names": [s.encode() for s in CIFAR10_NAMES]})
    return folder


def write_tiny_cifar100(root: Path, n: int = 6, n_test: int | None = None) -> Path:
    """A miniature CIFAR-100 with str keys (as re-pickled copies have); returns its folder."""
    folder = root / "cifar-100-python"
    folder.mkdir(parents=True)
    for name, seed, count in (("train", 1, n), ("test", 2, n if n_test is None else n_test)):
        batch = {k.decode(): v for k, v in tiny_batch(count, 100, b"fine_labels", seed).items()}
        batch["coarse_labels"] = [0] * count
        dump(folder / name, batch)
    dump(folder / "meta", {"fine_label_names": [f"c{i}" for i in range(100)]})
    return folder


# -- text --------------------------------------------------------------------------------------
AGNEWS_VOCABULARY = [
    ["president", "parliament", "election", "embassy", "ceasefire", "refugees", "diplomats"],
    ["striker", "goalkeeper", "championship", "coach", "tennis final", "stadium", "playoffs"],
    ["shares", "quarterly profit", "merger", "investors", "central bank", "stock market"],
    ["software", "smartphone", "researchers", "internet", "microchip", "space probe", "laptop"],
]
DBPEDIA_VOCABULARY = [
    ["company", "corporation", "headquarters", "subsidiary", "manufacturer"],
    ["university", "college", "students", "campus", "faculty"],
    ["painter", "singer", "musician", "sculptor", "songwriter"],
    ["footballer", "olympic sprinter", "midfielder", "boxer", "cyclist"],
    ["politician", "senator", "governor", "mayor", "member of parliament"],
    ["ship", "locomotive", "aircraft", "destroyer", "car model"],
    ["building", "tower", "cathedral", "castle", "skyscraper"],
    ["mountain", "river", "lake", "glacier", "volcano"],
    ["village", "rural district", "municipality", "hamlet", "county"],
    ["species of moth", "snail", "beetle", "frog species", "bird"],
    ["flowering plant", "shrub", "orchid", "fern", "tree species"],
    ["studio album", "debut album", "record label", "songs", "live album"],
    ["film", "movie", "director", "drama film", "comedy film"],
    ["novel", "book", "short story collection", "magazine", "poem"],
]


def topic_texts(vocabulary: list[list[str]], n: int, seed: int) -> list[tuple[int, str]]:
    """``n`` (label, sentence) pairs, labels cycling over the classes of ``vocabulary``."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        label = i % len(vocabulary)
        a, b, c = rng.sample(vocabulary[label], 3)
        rows.append((label, f"News {i}: the {a} and the {b}, reports say, after the {c}."))
    return rows


def write_labelled_json(path: Path, rows: list[tuple[int, str]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps([{"label": y, "sentence": s} for y, s in rows]))
    return path


def write_tiny_agnews(root: Path, n_train: int = 40, n_test: int = 20) -> Path:
    """``<root>/text/agnews-subset/{train,test}.json`` with AG News's 4 classes."""
    folder = root / "text" / "agnews-subset"
    write_labelled_json(folder / "train.json", topic_texts(AGNEWS_VOCABULARY, n_train, 1))
    write_labelled_json(folder / "test.json", topic_texts(AGNEWS_VOCABULARY, n_test, 2))
    return folder


def write_tiny_dbpedia(root: Path, n: int = 70) -> Path:
    """``<root>/text/dbpedia-test/test.json`` with DBpedia's 14 classes."""
    return write_labelled_json(
        root / "text" / "dbpedia-test" / "test.json", topic_texts(DBPEDIA_VOCABULARY, n, 3)
    )


def agnews_csv_rows(n: int) -> list[list[str]]:
    """``n`` rows in the original AG News CSV layout: class 1..4, title, description.

    Titles carry commas and quotes, descriptions a line break, so CSV quoting is exercised.
    """
    return [
        [str(label + 1), f'"{sentence.split(":")[0]}", a title, {label}', f"{sentence}\nMore."]
        for label, sentence in topic_texts(AGNEWS_VOCABULARY, n, 4)
    ]
