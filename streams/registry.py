"""The one function that builds a stream by name, from the catalogue of streams.

Why the catalogue lives apart (``streams.catalogue``, re-exported here): the CLI lists
streams, fills in per-stream defaults and knows which ones need a data folder without
importing torch or any loader; this module keeps the builders, which need both. Besides the
native names, ``avalanche:package.module:factory`` names any Avalanche benchmark (see
``streams.avalanche``); :func:`stream_info` answers for both.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from streams.avalanche import build_avalanche_stream, is_avalanche_name
from streams.base import Stream
from streams.catalogue import (
    AVALANCHE_STREAM_HELP,
    STREAMS,
    StreamInfo,
    require_data_root,
    stream_info,
)
from streams.cifar import layout as cifar_layout
from streams.cifar import load_cifar10, load_cifar100
from streams.class_il import (
    CIFAR10_MEAN,
    CIFAR10_STD,
    CIFAR100_MEAN,
    CIFAR100_STD,
    ClassILStream,
    check_class_tasks,
)
from streams.datafiles import check_data_root
from streams.digits import digits_images
from streams.domain_il import DomainILStream, PermutedStream, RotatedStream, check_domain_tasks
from streams.images import ImageSplits, checked_size
from streams.mnist import load_mnist

__all__ = [
    "AVALANCHE_STREAM_HELP",
    "STREAMS",
    "StreamInfo",
    "build_stream",
    "stream_info",
]

_TEXT = {"seq-agnews": "agnews", "seq-dbpedia": "dbpedia", "seq-yahooqa": "yahooqa"}


# name → (loader, CIFAR layout, classes per task, mean, std)
_CLASS_IL = {
    "seq-cifar10": (load_cifar10, "cifar10", 2, CIFAR10_MEAN, CIFAR10_STD),
    "seq-cifar100": (load_cifar100, "cifar100", 10, CIFAR100_MEAN, CIFAR100_STD),
}

_STREAM_TYPES: dict[str, type[DomainILStream]] = {
    "rot-mnist": RotatedStream,
    "perm-mnist": PermutedStream,
    "rot-digits": RotatedStream,
    "perm-digits": PermutedStream,
}


def build_stream(
    name: str,
    *,
    num_tasks: int,
    seed: int,
    device: torch.device,
    data_root: str | None,
    download: bool,
    train_size: int | None = None,
    test_size: int | None = None,
) -> Stream:
    """Load the base data of stream ``name`` and wrap it as a stream on ``device``.

    For ``avalanche:...`` names, ``num_tasks`` 0 takes all the benchmark's experiences and
    ``download`` has no say (Avalanche's own benchmarks fetch missing files themselves).
    """
    stream_info(name)  # unknown names and malformed avalanche specs fail here, before loading
    if is_avalanche_name(name):
        return build_avalanche_stream(
            name,
            num_tasks=num_tasks,
            seed=seed,
            device=torch.device(device),
            data_root=data_root,
            train_size=train_size,
            test_size=test_size,
        )
    # Cheap checks first: a bad --data-root or --tasks is refused before any file is read,
    # downloaded or encoded.
    require_data_root(name, data_root)
    if name in _TEXT:
        assert data_root is not None  # require_data_root
        check_data_root(data_root, holds=STREAMS[name].data)
        return _text_stream(name, num_tasks, device, data_root, train_size, test_size)
    if name in _CLASS_IL:
        loader, which, per_task, mean, std = _CLASS_IL[name]
        assert data_root is not None  # require_data_root
        check_data_root(
            data_root, holds=STREAMS[name].data, download_hint=True, may_create=download
        )
        check_class_tasks(name, num_tasks, per_task, cifar_layout(which).num_classes)
        images = loader(Path(data_root), download=download).head(train_size, test_size)
        return ClassILStream(
            images,
            name=name,
            num_tasks=num_tasks,
            classes_per_task=per_task,
            mean=mean,
            std=std,
            device=torch.device(device),
        )
    load = _base_loader(name, data_root=data_root, download=download)
    check_domain_tasks(name, num_tasks)
    images = load().head(train_size, test_size)
    stream_type = _STREAM_TYPES[name]
    return stream_type(
        images, name=name, num_tasks=num_tasks, seed=seed, device=torch.device(device)
    )


def _text_stream(
    name: str,
    num_tasks: int,
    device: torch.device,
    data_root: str,
    train_size: int | None,
    test_size: int | None,
) -> Stream:
    """Check --tasks, read a text dataset, cut its prefixes and embed it (imported lazily:
    the encoder stack is only needed here)."""
    from streams.text import CLASS_NAMES, load_text_dataset
    from streams.text_stream import CLASSES_PER_TASK, EmbeddedTextStream

    check_class_tasks(name, num_tasks, CLASSES_PER_TASK, len(CLASS_NAMES[_TEXT[name]]))
    texts = load_text_dataset(_TEXT[name], data_root)
    if train_size is not None or test_size is not None:
        texts = texts.head(
            checked_size("train_size", train_size, len(texts.train_texts), texts.name),
            checked_size("test_size", test_size, len(texts.test_texts), texts.name),
        )
    return EmbeddedTextStream(texts, name=name, num_tasks=num_tasks, device=torch.device(device))


def _base_loader(name: str, *, data_root: str | None, download: bool) -> Callable[[], ImageSplits]:
    """The base dataset loader of a stream, after checking its data location is usable."""
    if not STREAMS[name].needs_data_root:
        return digits_images
    assert data_root is not None  # require_data_root
    check_data_root(data_root, holds=STREAMS[name].data, download_hint=True, may_create=download)
    return lambda: _mnist_images(Path(data_root), download=download)


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
