"""CIFAR-10 and CIFAR-100 from the standard python-pickle layouts, with structural checks.

Why our own reader rather than ``torchvision.datasets.CIFAR10``: torchvision verifies every
file against the md5 of the original release, so it rejects the smaller offline subsets that
share the exact same layout, and its error for a truncated file is a raw pickle traceback.
We read ``<root>/cifar-10-batches-py/{data_batch_1..5,test_batch,batches.meta}`` and
``<root>/cifar-100-python/{train,test,meta}`` ourselves, check their *structure* (keys,
dtype, shape, label range, class-name count) instead of their checksums, and use torchvision
only to *fetch* the archive when the user asks for ``--download`` and a file is missing.
Every failure becomes one :class:`UserError` naming the file and the fix.

Security: the CIFAR files are Python pickles, and unpickling can execute arbitrary code.
We only ever unpickle files under the folder the user points us at (``--data-root``) or that
torchvision just downloaded there; this is the standard practice for CIFAR (torchvision's
own loader does exactly the same). Do not point ``--data-root`` at files you do not trust.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from cfl_bench.core.errors import UserError
from cfl_bench.streams.datafiles import (
    check_data_root,
    data_file,
    fetch_quietly,
    one_line,
    read_error,
)
from cfl_bench.streams.images import ImageSplits

CHANNELS, HEIGHT, WIDTH = 3, 32, 32
PIXELS = CHANNELS * HEIGHT * WIDTH  # 3072 bytes per image: 1024 red, 1024 green, 1024 blue
LEVELS = 255


@dataclass(frozen=True)
class CifarLayout:
    """Where one CIFAR variant keeps its files and which pickle entries it uses."""

    name: str  # our dataset name, as in ImageSplits.name
    title: str  # how messages call it
    folder: str  # the folder the official archive extracts to
    train_files: tuple[str, ...]
    test_files: tuple[str, ...]
    meta_file: str
    labels_key: str
    names_key: str
    num_classes: int
    torchvision_class: str
    archive: str  # the file torchvision downloads into <root> before extracting it

    @property
    def files(self) -> tuple[str, ...]:
        """Every file the loader needs, in reading order."""
        return (*self.train_files, *self.test_files, self.meta_file)


LAYOUTS: dict[str, CifarLayout] = {
    "cifar10": CifarLayout(
        name="cifar10",
        title="CIFAR-10",
        folder="cifar-10-batches-py",
        train_files=tuple(f"data_batch_{i}" for i in range(1, 6)),
        test_files=("test_batch",),
        meta_file="batches.meta",
        labels_key="labels",
        names_key="label_names",
        num_classes=10,
        torchvision_class="CIFAR10",
        archive="cifar-10-python.tar.gz",
    ),
    "cifar100": CifarLayout(
        name="cifar100",
        title="CIFAR-100",
        folder="cifar-100-python",
        train_files=("train",),
        test_files=("test",),
        meta_file="meta",
        labels_key="fine_labels",
        names_key="fine_label_names",
        num_classes=100,
        torchvision_class="CIFAR100",
        archive="cifar-100-python.tar.gz",
    ),
}


def layout(which: str) -> CifarLayout:
    """The layout of ``which`` ("cifar10" or "cifar100"), or a UserError listing the choices."""
    if which not in LAYOUTS:
        raise UserError(f"unknown CIFAR dataset {which!r}; use one of {', '.join(LAYOUTS)}")
    return LAYOUTS[which]


def cifar_dir(root: str | Path, which: str) -> Path:
    """The folder the official archive of ``which`` extracts to under ``root``."""
    return Path(root) / layout(which).folder


def layout_hint(which: str) -> str:
    """What ``--data-root`` must hold for ``which``, as messages say it."""
    return f"{layout(which).folder}/ (the extracted python-pickle archive)"


def cifar_present(root: str | Path, which: str) -> bool:
    """Whether every file of ``which`` exists (say nothing yet about whether they are good).

    Anything but a file in a file's place (a directory, a dangling link) is a UserError
    here already, so ``--download`` never tries to write over it.
    """
    spec = layout(which)
    folder = cifar_dir(root, which)
    return all(data_file(folder / name, title=spec.title, root=root) for name in spec.files)


def cifar_train_present(root: str | Path, which: str) -> bool:
    """Whether the train files of ``which`` exist (a public set reads nothing else)."""
    spec = layout(which)
    folder = cifar_dir(root, which)
    return all(data_file(folder / name, title=spec.title, root=root) for name in spec.train_files)


def load_cifar_train_images(root: str | Path, which: str) -> torch.Tensor:
    """The train images of ``which``, uint8 (N, 3, 32, 32), checked like the full loader's
    (labels are read and checked too, then dropped: a public set is unlabelled)."""
    return _read_split(root, layout(which), layout(which).train_files)[0]


def load_cifar10(root: str | Path, *, download: bool) -> ImageSplits:
    """CIFAR-10 (or a subset in the same layout): uint8 (N, 3, 32, 32) images, 10 classes."""
    return load_cifar(root, "cifar10", download=download)


def load_cifar100(root: str | Path, *, download: bool) -> ImageSplits:
    """CIFAR-100 with its 100 *fine* labels (the usual class-incremental setting)."""
    return load_cifar(root, "cifar100", download=download)


def load_cifar(root: str | Path, which: str, *, download: bool) -> ImageSplits:
    """Read train and test splits of ``which`` into an :class:`ImageSplits`.

    ``download=True`` fetches through torchvision only when a file is missing, so an
    existing offline copy (original or subset) is never re-downloaded or md5-checked. The
    meta file is read too, although the tensors do not need it, so that a broken or
    mismatched class-name list is reported now rather than when names are first shown.
    """
    spec = layout(which)
    check_data_root(root, holds=layout_hint(which), download_hint=True, may_create=download)
    if download and not cifar_present(root, which):
        _download(root, spec)
    train_x, train_y = _read_split(root, spec, spec.train_files)
    test_x, test_y = _read_split(root, spec, spec.test_files)
    cifar_class_names(root, which)
    return ImageSplits(
        name=spec.name,
        train_x=train_x,
        train_y=train_y,
        test_x=test_x,
        test_y=test_y,
        levels=LEVELS,
        num_classes=spec.num_classes,
    )


def cifar_class_names(root: str | Path, which: str) -> list[str]:
    """Class names of ``which`` in label order, read from its meta file.

    Why from the file and not a hard-coded list: the meta file is part of every copy,
    and reading it catches a folder whose meta does not match the label count.
    """
    spec = layout(which)
    check_data_root(root, holds=layout_hint(which), download_hint=True)
    path = _require(root, spec, spec.meta_file)
    entry = _entry(_load_pickle(path, spec), spec.names_key, path, spec)
    if not isinstance(entry, (list, tuple)) or not all(isinstance(n, (bytes, str)) for n in entry):
        raise _not_cifar(path, spec, f"{spec.names_key!r} is not a list of names")
    if len(entry) != spec.num_classes:
        raise UserError(
            f"{spec.title} meta file {path} lists {len(entry)} class names instead of "
            f"{spec.num_classes}; it belongs to another dataset, so copy the right "
            f"{spec.meta_file} or re-run with --download"
        )
    try:
        return [n.decode("utf-8") if isinstance(n, bytes) else n for n in entry]
    except UnicodeDecodeError as exc:
        raise _not_cifar(path, spec, f"a class name is not UTF-8 text: {exc}") from exc


def read_cifar_batch(path: Path, which: str) -> tuple[np.ndarray, np.ndarray]:
    """Raw rows of one batch file: uint8 (N, 3072) pixels and int64 (N,) labels, checked."""
    spec = layout(which)
    batch = _load_pickle(path, spec)
    data = _entry(batch, "data", path, spec)
    raw_labels = _entry(batch, spec.labels_key, path, spec)
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2:
        found = f"{data.dtype} {data.shape}" if isinstance(data, np.ndarray) else type(data)
        raise _not_cifar(path, spec, f"'data' is {found}, expected a uint8 N x {PIXELS} array")
    if data.shape[1] != PIXELS:
        raise _not_cifar(
            path, spec, f"'data' rows have {data.shape[1]} values, expected {PIXELS} (3x32x32)"
        )
    labels = _as_labels(raw_labels, path, spec)
    if labels.shape[0] != data.shape[0]:
        raise UserError(
            f"{spec.title} file {path} has {data.shape[0]} images but {labels.shape[0]} "
            "labels; delete it and re-run with --download or copy a good copy"
        )
    bad = labels[(labels < 0) | (labels >= spec.num_classes)]
    if bad.size:
        raise UserError(
            f"{spec.title} file {path} has label {int(bad[0])} outside 0..{spec.num_classes - 1}; "
            f"it is not a {spec.title} batch, so delete it and re-run with --download or copy "
            "a good copy"
        )
    return data, labels


def _read_split(
    root: str | Path, spec: CifarLayout, names: tuple[str, ...]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Concatenate the batch files of one split into (N, 3, 32, 32) uint8 and (N,) int64."""
    paths = [_require(root, spec, name) for name in names]  # all missing files before parsing
    parts = [read_cifar_batch(path, spec.name) for path in paths]
    data = np.concatenate([d for d, _ in parts]) if len(parts) > 1 else parts[0][0]
    labels = np.concatenate([y for _, y in parts]) if len(parts) > 1 else parts[0][1]
    # Each row is channel-major (all red, then green, then blue), each plane row-major:
    # exactly C x H x W in C order, so a reshape (no transpose) gives the image.
    images = np.require(data, requirements=["C", "W"]).reshape(-1, CHANNELS, HEIGHT, WIDTH)
    return torch.from_numpy(images), torch.from_numpy(np.require(labels, requirements=["W"]))


def _as_labels(raw: Any, path: Path, spec: CifarLayout) -> np.ndarray:
    """Labels as int64 (N,), accepting the list of ints of the originals or an int array."""
    try:
        labels = np.asarray(raw)
    except (TypeError, ValueError) as exc:
        raise _not_cifar(path, spec, f"{spec.labels_key!r} is not a list of integers") from exc
    if labels.ndim != 1 or not (labels.size == 0 or np.issubdtype(labels.dtype, np.integer)):
        raise _not_cifar(path, spec, f"{spec.labels_key!r} is not a flat list of integers")
    return labels.astype(np.int64)


def _require(root: str | Path, spec: CifarLayout, name: str) -> Path:
    """Locate a file or explain exactly where it should be."""
    folder = Path(root) / spec.folder
    path = folder / name
    if data_file(path, title=spec.title, root=root) is not None:
        return path
    if Path(root).name == spec.folder and (Path(root) / name).is_file():
        raise UserError(
            f"{spec.title} data folder {root} is the dataset folder itself; pass its parent "
            f"{Path(root).parent} as --data-root (layout <root>/{spec.folder}/{name})"
        )
    raise UserError(
        f"{spec.title} file {path} is missing; put {', '.join(spec.files)} under {folder} "
        "(the extracted python-pickle archive) or pass --download"
    )


def _load_pickle(path: Path, spec: CifarLayout) -> dict[str, Any]:
    """Unpickle one CIFAR file into a dict with str keys; every failure becomes advice.

    ``encoding="bytes"`` is how the Python 2 originals must be read; it leaves their keys
    as bytes, while re-pickled copies (such as the offline subsets) may have str keys, so
    both are normalised to str here.
    """
    try:
        with path.open("rb") as f:
            obj = pickle.load(f, encoding="bytes")  # trusted: see the module docstring
    except OSError as exc:
        raise read_error(path, spec.title, exc) from exc
    except Exception as exc:  # UnpicklingError, EOFError, ValueError, ... all mean "bad file"
        raise _not_cifar(path, spec, f"{type(exc).__name__}: {one_line(exc, 120)}") from exc
    if not isinstance(obj, dict):
        raise _not_cifar(path, spec, f"it holds a {type(obj).__name__}, not a dict")
    return {k.decode("latin-1") if isinstance(k, bytes) else str(k): v for k, v in obj.items()}


def _entry(batch: dict[str, Any], key: str, path: Path, spec: CifarLayout) -> Any:
    """``batch[key]`` or a UserError saying which entry is missing."""
    if key not in batch:
        found = ", ".join(sorted(batch)) or "nothing"
        raise _not_cifar(path, spec, f"no {key!r} entry; found {found}")
    return batch[key]


def _not_cifar(path: Path, spec: CifarLayout, detail: str) -> UserError:
    """The one message for any file that is there but is not a usable CIFAR pickle."""
    return UserError(
        f"{spec.title} file {path} is truncated or not a {spec.title} pickle ({detail}); "
        "delete it and re-run with --download or copy a good copy"
    )


def _torchvision_dataset_class(name: str) -> type:
    """The torchvision dataset class used only to fetch files (imported lazily: heavy)."""
    import torchvision.datasets

    return getattr(torchvision.datasets, name)


def _download(root: str | Path, spec: CifarLayout) -> None:
    """Fetch and extract the official archive into ``root``, quietly; failure is one UserError.

    One call suffices: the archive holds both splits and the meta file, in our layout.
    torchvision writes the archive beside the folder it extracts; on failure whatever it
    created of either (or of ``root`` itself) is removed (see ``fetch_quietly``).
    """
    folder = Path(root) / spec.folder

    def fetch() -> None:
        Path(root).mkdir(parents=True, exist_ok=True)
        dataset_class = _torchvision_dataset_class(spec.torchvision_class)
        dataset_class(str(root), train=True, download=True)

    fetch_quietly(
        fetch,
        title=spec.title,
        root=Path(root),
        into=folder,
        watched=[folder, Path(root) / spec.archive],
        by_hand=(
            f"copy {', '.join(spec.files)} into {folder} by hand (the extracted python-pickle "
            f"layout <root>/{spec.folder}/)"
        ),
    )
