"""MNIST and Fashion-MNIST from the torchvision on-disk layout, with structural checks.

Why not just ``torchvision.datasets.MNIST``: it needs network access to populate a folder,
decodes per sample through PIL, and does not tell a truncated download from a good one.
We read ``<root>/<dataset>/raw/{train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]``
ourselves into whole tensors, and use torchvision only to *fetch* files when the user asks
for ``--download``. Every failure becomes one :class:`UserError` naming the file and the fix.
"""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from cfl_bench.core.errors import UserError
from cfl_bench.streams.datafiles import (
    check_data_root,
    data_file,
    fetch_quietly,
    one_line,
    read_bytes,
)
from cfl_bench.streams.idx import IdxFormatError, parse_images, parse_labels

DATASETS = ("MNIST", "FashionMNIST")
SPLITS = {"train": "train", "test": "t10k"}
IMAGE_SHAPE = (28, 28)
NUM_CLASSES = 10


def raw_dir(root: str | Path, dataset: str) -> Path:
    """Where torchvision keeps the raw files of ``dataset`` under ``root``."""
    return Path(root) / dataset / "raw"


def layout_hint(dataset: str) -> str:
    """What ``--data-root`` must hold for ``dataset``, as messages say it."""
    return f"{dataset}/raw/*-ubyte.gz (torchvision layout)"


def split_present(root: str | Path, dataset: str, split: str) -> bool:
    """Whether something is in place of both files (images and labels) of ``split``.

    Something, not necessarily a good file: a directory or a dangling link where a file
    should be counts as present, so that reading it reports the real problem rather than
    "missing" (and ``--download`` does not try to write over it).
    """
    return all(_locate(root, dataset, stem) is not None for stem in _stems(split))


def load_idx_split(root: str | Path, dataset: str, split: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Read one split: uint8 images (N, 28, 28) and int64 labels (N,)."""
    _check_dataset(dataset)
    check_data_root(root, holds=layout_hint(dataset))
    images_stem, labels_stem = _stems(split)
    images_path = _require(root, dataset, images_stem)
    labels_path = _require(root, dataset, labels_stem)
    images = _parse(images_path, dataset, lambda b: parse_images(b, shape=IMAGE_SHAPE))
    labels = _parse(labels_path, dataset, lambda b: parse_labels(b, num_classes=NUM_CLASSES))
    if images.shape[0] != labels.shape[0]:
        raise UserError(
            f"{dataset} files {images_path} ({images.shape[0]} images) and {labels_path} "
            f"({labels.shape[0]} labels) disagree; delete them and re-run with --download "
            "or copy a good copy"
        )
    return torch.from_numpy(images), torch.from_numpy(labels)


def load_mnist(
    root: str | Path, *, download: bool, which: str = "MNIST"
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Train images, train labels, test images, test labels of MNIST or Fashion-MNIST.

    Images are uint8 (N, 28, 28), labels int64 (N,). For ``which="FashionMNIST"`` the
    train files may be absent (the shared offline copy only has the test split, used as
    public/proxy data); then the train tensors are empty. ``download=True`` fetches files
    through torchvision only when a required file is missing, so an existing offline copy
    is never re-downloaded; ``root`` itself is checked first, so a file given as
    ``--data-root`` is reported as such before anything is read or fetched.
    """
    _check_dataset(which)
    check_data_root(root, holds=layout_hint(which), download_hint=True, may_create=download)
    train_optional = which != "MNIST"
    required = ["test"] if train_optional else ["train", "test"]
    if download and not all(split_present(root, which, s) for s in required):
        _download(root, which)
    if train_optional and not _any_present(root, which, "train"):
        train_x = torch.empty((0, *IMAGE_SHAPE), dtype=torch.uint8)
        train_y = torch.empty((0,), dtype=torch.int64)
    else:
        train_x, train_y = load_idx_split(root, which, "train")
    test_x, test_y = load_idx_split(root, which, "test")
    return train_x, train_y, test_x, test_y


def _stems(split: str) -> tuple[str, str]:
    """File names (without .gz) of the images and labels of ``split``."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {sorted(SPLITS)}, got {split!r}")
    prefix = SPLITS[split]
    return f"{prefix}-images-idx3-ubyte", f"{prefix}-labels-idx1-ubyte"


def _check_dataset(dataset: str) -> None:
    if dataset not in DATASETS:
        raise UserError(f"unknown IDX dataset {dataset!r}; use one of {', '.join(DATASETS)}")


def _locate(root: str | Path, dataset: str, stem: str) -> Path | None:
    """The first of ``<stem>.gz`` (the pristine download) and ``<stem>`` that is there.

    Whatever is there decides: a regular file is returned, anything else (a directory, a
    dangling link, a pipe, a file in place of the raw folder) is a UserError saying what
    it is; None only when nothing at all is in place.
    """
    folder = raw_dir(root, dataset)
    for name in (f"{stem}.gz", stem):
        path = data_file(folder / name, title=dataset, root=root)
        if path is not None:
            return path
    return None


def _any_present(root: str | Path, dataset: str, split: str) -> bool:
    """Whether anything is in place of either file of ``split`` (then both must be good)."""
    return any(_locate(root, dataset, stem) is not None for stem in _stems(split))


def _require(root: str | Path, dataset: str, stem: str) -> Path:
    """Locate a file or explain exactly where it should be."""
    path = _locate(root, dataset, stem)
    if path is not None:
        return path
    folder = raw_dir(root, dataset)
    if Path(root).name == dataset and (Path(root) / "raw").is_dir():
        raise UserError(
            f"{dataset} data folder {root} is the dataset folder itself; pass its parent "
            f"{Path(root).parent} as --data-root (torchvision layout <root>/{dataset}/raw)"
        )
    raise UserError(
        f"{dataset} file {folder / (stem + '.gz')} is missing; put the four *-ubyte.gz "
        f"files under {folder} (torchvision layout) or pass --download"
    )


def _parse(path: Path, dataset: str, parse: Callable[[bytes], np.ndarray]) -> np.ndarray:
    """Read, decompress and parse one file, turning every failure into advice."""
    data = read_bytes(path, dataset)
    try:
        if path.suffix == ".gz":
            data = gzip.decompress(data)
        return parse(data)
    except (EOFError, gzip.BadGzipFile, zlib.error, IdxFormatError) as exc:
        raise UserError(
            f"{dataset} file {path} is truncated or corrupt ({one_line(exc)}); delete it and "
            "re-run with --download or copy a good copy"
        ) from exc
    except MemoryError as exc:
        raise UserError(
            f"{dataset} file {path} decompresses to more than this machine's memory; it is "
            "not an IDX file, so delete it and re-run with --download or copy a good copy"
        ) from exc


def _torchvision_dataset_class(dataset: str) -> type:
    """The torchvision dataset class used only to fetch files (imported lazily: heavy)."""
    import torchvision.datasets

    return getattr(torchvision.datasets, dataset)


def _download(root: str | Path, dataset: str) -> None:
    """Fetch the raw files into the torchvision layout, quietly; failure is one UserError.

    torchvision writes ``<root>/<dataset>/raw/*`` (the .gz files and their uncompressed
    copies); on failure what it created there is removed (see ``fetch_quietly``).
    """
    folder = raw_dir(root, dataset)
    names = [f"{stem}.gz" for split in SPLITS for stem in _stems(split)]

    def fetch() -> None:
        dataset_class = _torchvision_dataset_class(dataset)
        for train in (True, False):
            dataset_class(str(root), train=train, download=True)

    fetch_quietly(
        fetch,
        title=dataset,
        root=Path(root),
        into=folder,
        watched=[Path(root) / dataset],
        by_hand=(
            f"copy the four files {', '.join(names)} into {folder} by hand (torchvision "
            f"layout <root>/{dataset}/raw/)"
        ),
    )
