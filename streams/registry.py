"""The catalogue of streams and the one function that builds them by name.

Why a table of :class:`StreamInfo`: the CLI lists streams, fills in per-stream defaults
(model, number of tasks, partition) and knows which ones need a data folder, all without
loading any data. Besides the native names, ``avalanche:package.module:factory`` names any
Avalanche benchmark (see ``streams.avalanche``); :func:`stream_info` answers for both.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from cfl_bench.errors import UserError
from streams.avalanche import SPEC_FORM, build_avalanche_stream, is_avalanche_name, parse_spec
from streams.base import Stream
from streams.cifar import layout as cifar_layout
from streams.cifar import layout_hint as cifar_layout_hint
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
from streams.mnist import layout_hint as mnist_layout_hint
from streams.mnist import load_mnist

# The embedded digits have ~140 training images per client (40× fewer than MNIST); a few
# local epochs at a larger step let the quickstart learn something in seconds.
DIGITS_ROUNDS = 10
DIGITS_EPOCHS = 5
DIGITS_LR = 0.05


@dataclass(frozen=True)
class StreamInfo:
    """What the CLI needs to know about a stream before building it."""

    name: str
    description: str
    default_model: str
    default_tasks: int
    default_partition: str
    needs_data_root: bool
    # Protocol defaults: FedGP's MNIST settings unless the stream needs others.
    default_rounds_per_task: int = 20
    default_epochs: int = 1
    default_lr: float = 0.01


def _domain_il_info(name: str, transform: str, base: str) -> StreamInfo:
    """Rotated / permuted streams share everything but their base data and transform."""
    digits = base == "digits"
    protocol = (
        {
            "default_rounds_per_task": DIGITS_ROUNDS,
            "default_epochs": DIGITS_EPOCHS,
            "default_lr": DIGITS_LR,
        }
        if digits
        else {}
    )
    return StreamInfo(
        name=name,
        description=f"{'embedded 8x8 digits' if digits else 'MNIST'}, each task {transform} "
        "(domain-IL)",
        default_model="mlp" if digits else "mnist-cnn",
        default_tasks=5,
        default_partition="shards",
        needs_data_root=not digits,
        **protocol,  # type: ignore[arg-type]
    )


def _cifar_info(name: str, base: str, *, tasks: int, per_task: int) -> StreamInfo:
    """FedGP CIFAR protocol: ResNet-18, 5 local epochs, lr 0.1, Dirichlet α = 0.3 per task."""
    return StreamInfo(
        name=name,
        description=f"{base} as {tasks} tasks x {per_task} classes, natural order "
        "(class-IL + task-IL)",
        default_model="resnet18",
        default_tasks=tasks,
        default_partition="dirichlet",
        needs_data_root=True,
        default_epochs=5,
        default_lr=0.1,
    )


ROTATED = "rotated by its own angle in [0, 180) degrees"
PERMUTED = "with its own fixed pixel permutation"
STREAMS: dict[str, StreamInfo] = {
    "rot-mnist": _domain_il_info("rot-mnist", ROTATED, "mnist"),
    "perm-mnist": _domain_il_info("perm-mnist", PERMUTED, "mnist"),
    "rot-digits": _domain_il_info("rot-digits", ROTATED, "digits"),
    "perm-digits": _domain_il_info("perm-digits", PERMUTED, "digits"),
    "seq-cifar10": _cifar_info("seq-cifar10", "CIFAR-10", tasks=5, per_task=2),
    "seq-cifar100": _cifar_info("seq-cifar100", "CIFAR-100", tasks=10, per_task=10),
}

# Text: a linear head on frozen MiniLM embeddings (FedGP trains a head on a frozen encoder).
for _name, _base, _tasks in (
    ("seq-agnews", "AG News (4 classes)", 2),
    ("seq-dbpedia", "DBpedia-14", 7),
    ("seq-yahooqa", "Yahoo! Answers topics (10 classes)", 5),
):
    STREAMS[_name] = StreamInfo(
        name=_name,
        description=f"{_base} as {_tasks} tasks x 2 classes on frozen MiniLM embeddings",
        default_model="linear",
        default_tasks=_tasks,
        default_partition="dirichlet",
        needs_data_root=True,
        default_lr=0.1,
    )
_TEXT = {"seq-agnews": "agnews", "seq-dbpedia": "dbpedia", "seq-yahooqa": "yahooqa"}
# What --data-root must hold for each text stream, as messages say it.
_TEXT_HOLDS = {
    "seq-agnews": "text/agnews-subset/train.json and test.json",
    "seq-dbpedia": "text/dbpedia-test/test.json",
    "seq-yahooqa": "yahoo_answers_csv/train.csv and test.csv",
}

# How `cfl-bench list streams` and error messages show the Avalanche form.
AVALANCHE_STREAM_HELP = (
    f"any Avalanche benchmark: {SPEC_FORM} (a callable returning a benchmark, given "
    "n_experiences from --tasks, seed and dataset_root from --data-root when it names them); "
    "all its experiences unless --tasks; class-IL or domain-IL from its class sets"
)


def stream_info(name: str) -> StreamInfo:
    """What the CLI needs to know about stream ``name`` (native or ``avalanche:...``).

    Avalanche benchmarks get defaults that fit any of them: an MLP (any input shape),
    all of the benchmark's experiences (``default_tasks`` 0; the built stream's
    ``num_tasks`` says how many), and the per-task Dirichlet split.
    """
    if name in STREAMS:
        return STREAMS[name]
    if is_avalanche_name(name):
        module, factory = parse_spec(name)
        return StreamInfo(
            name=name,
            description=f"Avalanche benchmark from {module}:{factory}",
            default_model="mlp",
            default_tasks=0,
            default_partition="dirichlet",
            needs_data_root=False,
        )
    raise UserError(
        f"unknown stream {name!r}; choose one of {', '.join(sorted(STREAMS))}, or name an "
        f"Avalanche benchmark as {SPEC_FORM}"
    )


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
    if name in _TEXT:
        if data_root is None:
            raise UserError(
                f"stream {name!r} needs its text files: pass --data-root pointing at the "
                "folder that holds text/ (or yahoo_answers_csv/ for seq-yahooqa)"
            )
        check_data_root(data_root, holds=_TEXT_HOLDS[name])
        return _text_stream(name, num_tasks, device, data_root, train_size, test_size)
    if name in _CLASS_IL:
        loader, which, per_task, mean, std = _CLASS_IL[name]
        if data_root is None:
            raise UserError(
                f"stream {name!r} needs CIFAR: pass --data-root pointing at the folder that "
                "holds the python-pickle layout, or add --download to fetch it there"
            )
        check_data_root(
            data_root, holds=cifar_layout_hint(which), download_hint=True, may_create=download
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
    if data_root is None:
        raise UserError(
            f"stream {name!r} needs MNIST: pass --data-root pointing at a folder that holds "
            "MNIST/raw/*-ubyte.gz (torchvision layout), or add --download to fetch it there"
        )
    check_data_root(
        data_root, holds=mnist_layout_hint("MNIST"), download_hint=True, may_create=download
    )
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
