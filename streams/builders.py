"""The builders the stream catalogue names: one function per stream family.

Why by name: every catalogue entry (``streams.catalogue.STREAMS``) carries its builder as
``"module:function"``, so adding a stream is one entry there and, for a new family, one
function here — no parallel tables and no if-chain in ``streams.registry``. The catalogue
stays importable without torch; this module is imported only when a stream is built.

Each builder gets the entry and a :class:`~streams.base.StreamRequest` and does the cheap
checks (data folder, ``--tasks``) before reading any file, downloading or encoding.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import torch

from cfl_bench.core.errors import UserError
from cfl_bench.streams.base import Stream, StreamRequest
from cfl_bench.streams.catalogue import StreamInfo
from cfl_bench.streams.cifar import layout as cifar_layout
from cfl_bench.streams.cifar import load_cifar10, load_cifar100
from cfl_bench.streams.class_il import (
    CIFAR10_MEAN,
    CIFAR10_STD,
    CIFAR100_MEAN,
    CIFAR100_STD,
    ClassILStream,
    check_class_tasks,
)
from cfl_bench.streams.class_order import class_order
from cfl_bench.streams.datafiles import check_data_root
from cfl_bench.streams.digits import digits_images
from cfl_bench.streams.domain_il import (
    DomainILStream,
    FOTPermutedStream,
    PermutedStream,
    RotatedStream,
    check_domain_tasks,
)
from cfl_bench.streams.images import ImageSplits, checked_size
from cfl_bench.streams.mnist import load_mnist

# CIFAR base → (loader, normalisation mean, std): the class-IL family's own data.
_CIFAR: dict[str, tuple[Callable[..., ImageSplits], tuple[float, ...], tuple[float, ...]]] = {
    "cifar10": (load_cifar10, CIFAR10_MEAN, CIFAR10_STD),
    "cifar100": (load_cifar100, CIFAR100_MEAN, CIFAR100_STD),
}


def build_rotated(info: StreamInfo, request: StreamRequest) -> Stream:
    """rot-mnist, rot-digits: each task rotated by its own angle."""
    return _domain_il(RotatedStream, info, request)


def build_permuted(info: StreamInfo, request: StreamRequest) -> Stream:
    """perm-mnist, perm-digits: each task with its own pixel permutation."""
    return _domain_il(PermutedStream, info, request)


def build_permuted_fot(info: StreamInfo, request: StreamRequest) -> Stream:
    """perm-mnist-fot: FOT's permuted MNIST (first task in place, normalised pixels)."""
    return _domain_il(FOTPermutedStream, info, request)


class _SeededDomainIL(Protocol):
    """A domain-IL stream class whose per-task transforms are drawn from a seed (rotations,
    permutations): the constructor ``_domain_il`` calls."""

    def __call__(
        self, images: ImageSplits, *, name: str, num_tasks: int, seed: int, device: torch.device
    ) -> DomainILStream: ...


def _domain_il(kind: _SeededDomainIL, info: StreamInfo, request: StreamRequest) -> Stream:
    load = _base_loader(info, request)
    check_domain_tasks(info.name, request.num_tasks)
    images = load().head(request.train_size, request.test_size)
    return kind(
        images,
        name=info.name,
        num_tasks=request.num_tasks,
        seed=request.seed,
        device=torch.device(request.device),
    )


def _base_loader(info: StreamInfo, request: StreamRequest) -> Callable[[], ImageSplits]:
    """The base dataset loader of a domain-IL stream, after checking its data location."""
    if not info.needs_data_root:
        return digits_images
    root = request.require_data_root()
    check_data_root(root, holds=info.data, download_hint=True, may_create=request.download)
    return lambda: _mnist_images(Path(root), download=request.download)


def _mnist_images(root: Path, *, download: bool) -> ImageSplits:
    train_x, train_y, test_x, test_y = load_mnist(root, download=download)
    return ImageSplits(
        name="mnist",
        train_x=train_x.unsqueeze(1),
        train_y=train_y,
        test_x=test_x.unsqueeze(1),
        test_y=test_y,
        levels=255,
        num_classes=10,
    )


# FOT's Split-CIFAR-100 loader (data_preprocess/cifar100/data_loader.py) normalises with
# these statistics (CIFAR-10's, as that file writes them) and applies no augmentation.
FOT_CIFAR_MEAN, FOT_CIFAR_STD = (0.4914, 0.4824, 0.4467), (0.2471, 0.24353, 0.2616)


def build_class_il(info: StreamInfo, request: StreamRequest) -> Stream:
    """seq-cifar10, seq-cifar100: consecutive class groups, in natural order unless
    ``--class-order`` permutes the labels first."""
    _, mean, std = _CIFAR[info.base]
    return _class_il(info, request, mean, std, crop_flip=True)


def build_class_il_fot(info: StreamInfo, request: StreamRequest) -> Stream:
    """seq-cifar100-fot: seq-cifar100 as FOT's code builds it (its statistics, no crop/flip)."""
    return _class_il(info, request, FOT_CIFAR_MEAN, FOT_CIFAR_STD, crop_flip=False)


def _class_il(
    info: StreamInfo,
    request: StreamRequest,
    mean: tuple[float, ...],
    std: tuple[float, ...],
    *,
    crop_flip: bool,
) -> Stream:
    loader = _CIFAR[info.base][0]
    root = request.require_data_root()
    check_data_root(root, holds=info.data, download_hint=True, may_create=request.download)
    per_task = request.classes_per_task or info.classes_per_task
    check_class_tasks(
        info.name,
        request.num_tasks,
        per_task,
        cifar_layout(info.base).num_classes,
        asked=request.classes_per_task is not None,
    )
    images = loader(Path(root), download=request.download).head(
        request.train_size, request.test_size
    )
    return ClassILStream(
        images,
        name=info.name,
        num_tasks=request.num_tasks,
        classes_per_task=per_task,
        mean=mean,
        std=std,
        device=torch.device(request.device),
        crop_flip=crop_flip,
        class_order=class_order(request.class_order, images.num_classes),
    )


def build_static(info: StreamInfo, request: StreamRequest) -> Stream:
    """mnist, fmnist, cifar10, cifar100, cinic10: one task with all classes."""
    from cfl_bench.streams.static import StaticStream, check_static_tasks

    root = request.require_data_root()
    check_data_root(
        root, holds=info.data, download_hint=info.downloadable, may_create=request.download
    )
    check_static_tasks(info.name, request.num_tasks)
    images, (mean, std) = _static_base(info, Path(root), request.download)
    images = images.head(request.train_size, request.test_size)
    return StaticStream(
        images,
        name=info.name,
        mean=mean,
        std=std,
        device=torch.device(request.device),
        crop_flip=images.input_shape[0] == 3,
        cutout=request.cutout,
    )


def _static_base(
    info: StreamInfo, root: Path, download: bool
) -> tuple[ImageSplits, tuple[tuple[float, ...], tuple[float, ...]]]:
    """The base images of a static stream and their normalisation statistics."""
    from cfl_bench.streams.static import FMNIST_STATS, MNIST_STATS

    if info.base in _CIFAR:
        loader, mean, std = _CIFAR[info.base]
        return loader(root, download=download), (mean, std)
    if info.base == "cinic10":
        from cfl_bench.streams.cinic import CINIC10_MEAN, CINIC10_STD, load_cinic10

        return load_cinic10(root), (CINIC10_MEAN, CINIC10_STD)
    if info.base == "mnist":
        return _mnist_images(root, download=download), MNIST_STATS
    return _fashion_images(root, download=download), FMNIST_STATS


def _fashion_images(root: Path, *, download: bool) -> ImageSplits:
    """Fashion-MNIST train and test; refuses a folder with the test split only (the shared
    offline copy), which other commands use as public data."""
    train_x, train_y, test_x, test_y = load_mnist(root, download=download, which="FashionMNIST")
    if train_x.shape[0] == 0:
        raise UserError(
            f"stream 'fmnist' needs Fashion-MNIST's train split, and {root}/FashionMNIST/raw "
            "holds only the test split; add train-images-idx3-ubyte.gz and "
            "train-labels-idx1-ubyte.gz there, or pass --download"
        )
    return ImageSplits(
        name="fashion-mnist",
        train_x=train_x.unsqueeze(1),
        train_y=train_y,
        test_x=test_x.unsqueeze(1),
        test_y=test_y,
        levels=255,
        num_classes=10,
    )


def build_text(info: StreamInfo, request: StreamRequest) -> Stream:
    """seq-agnews, seq-dbpedia, seq-yahooqa: check --tasks, read the texts, cut their
    prefixes and embed them (the encoder stack is imported only here)."""
    root = request.require_data_root()
    check_data_root(root, holds=info.data)
    from cfl_bench.streams.text import CLASS_NAMES, load_text_dataset
    from cfl_bench.streams.text_stream import CLASSES_PER_TASK, EmbeddedTextStream

    num_classes = len(CLASS_NAMES[info.base])
    check_class_tasks(info.name, request.num_tasks, CLASSES_PER_TASK, num_classes)
    texts = load_text_dataset(info.base, root)
    if request.train_size is not None or request.test_size is not None:
        texts = texts.head(
            checked_size("train_size", request.train_size, len(texts.train_texts), texts.name),
            checked_size("test_size", request.test_size, len(texts.test_texts), texts.name),
        )
    return EmbeddedTextStream(
        texts,
        name=info.name,
        num_tasks=request.num_tasks,
        device=torch.device(request.device),
        class_order=class_order(request.class_order, num_classes),
    )


def build_avalanche(info: StreamInfo, request: StreamRequest) -> Stream:
    """``avalanche:package.module:factory``: any Avalanche benchmark (``--tasks`` 0 takes
    all its experiences; ``--download`` has no say, Avalanche fetches its own files)."""
    from cfl_bench.streams.avalanche import build_avalanche_stream

    return build_avalanche_stream(
        info.name,
        num_tasks=request.num_tasks,
        seed=request.seed,
        device=torch.device(request.device),
        data_root=request.data_root,
        train_size=request.train_size,
        test_size=request.test_size,
    )
