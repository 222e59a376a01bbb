"""The catalogue of streams: names, defaults, descriptions and the data each one needs.

Why a module apart from ``streams.registry``: listing streams, filling in per-stream
defaults and refusing a misspelled name or a missing ``--data-root`` must answer at once,
and the registry's builders import torch, scikit-learn and the data loaders. This module
imports none of them; ``streams.registry`` re-exports it and keeps the builders.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, replace

from cfl_bench.core.errors import UserError

# The embedded digits have ~140 training images per client (40× fewer than MNIST); a few
# local epochs at a larger step let the quickstart learn something in seconds.
DIGITS_ROUNDS = 10
DIGITS_EPOCHS = 5
DIGITS_LR = 0.05

# The Avalanche form, as streams.avalanche spells it (a test pins the two together; that
# module imports torch, so it is only imported for names of this form).
AVALANCHE_PREFIX = "avalanche:"
AVALANCHE_FORM = "avalanche:package.module:factory"
# How `cfl-bench list streams` and error messages show the Avalanche form.
AVALANCHE_STREAM_HELP = (
    f"any Avalanche benchmark: {AVALANCHE_FORM} (a callable returning a benchmark, given "
    "n_experiences from --tasks, seed and dataset_root from --data-root when it names them); "
    "all its experiences unless --tasks; class-IL or domain-IL from its class sets"
)

# What --data-root must hold, as messages say it. The image wordings are the loaders' own
# (streams.mnist.layout_hint, streams.cifar.layout_hint; a test pins them together).
MNIST_HOLDS = "MNIST/raw/*-ubyte.gz (torchvision layout)"
CIFAR_HOLDS = {
    "seq-cifar10": "cifar-10-batches-py/ (the extracted python-pickle archive)",
    "seq-cifar100": "cifar-100-python/ (the extracted python-pickle archive)",
}
TEXT_HOLDS = {
    "seq-agnews": "text/agnews-subset/train.json and test.json",
    "seq-dbpedia": "text/dbpedia-test/test.json",
    "seq-yahooqa": "yahoo_answers_csv/train.csv and test.csv",
}


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
    default_optimizer: str = "sgd"
    # What --data-root must hold ("" when nothing: embedded data, Avalanche's own files),
    # and whether --download can fetch it there.
    data: str = ""
    downloadable: bool = False
    # How to build it: "module:function" of ``streams.builders`` (imported only to build),
    # the base dataset that function reads, and the classes per task of class-IL streams.
    builder: str = ""
    base: str = ""
    classes_per_task: int = 0
    # Whether train batches may get Cutout (``--cutout``): the CIFAR-like image streams.
    supports_cutout: bool = False
    # Class-IL streams that split their ``num_classes`` classes into consecutive groups
    # whose size ``--classes-per-task`` may set (the CIFAR class-IL streams).
    num_classes: int = 0
    splits_classes: bool = False
    # Class-split streams (``streams.class_il.ClassSplitStream``) whose labels
    # ``--class-order`` may permute before tasks are cut: the CIFAR class-IL and text streams.
    orders_classes: bool = False

    def data_line(self) -> str:
        """Where the stream's data comes from, as `cfl-bench list streams` shows it."""
        if not self.needs_data_root:
            return "none (embedded)"
        fetch = "; --download fetches it" if self.downloadable else ""
        return f"{self.data} under --data-root{fetch}"


BUILDERS = "cfl_bench.streams.builders"


def _domain_il_info(name: str, transform: str, base: str, builder: str) -> StreamInfo:
    """Rotated / permuted streams share everything but their base data and transform."""
    digits = base == "digits"
    info = StreamInfo(
        name=name,
        description=f"{'embedded 8x8 digits' if digits else 'MNIST'}, each task {transform} "
        "(domain-IL)",
        default_model="mlp" if digits else "mnist-cnn",
        # MNIST: the FedGP paper's and code's T = 10; the embedded digits keep 5 so that
        # the quickstart ends in seconds.
        default_tasks=5 if digits else 10,
        default_partition="shards",
        needs_data_root=not digits,
        data="" if digits else MNIST_HOLDS,
        downloadable=not digits,
        builder=f"{BUILDERS}:{builder}",
        base=base,
    )
    if digits:  # the embedded digits' own protocol (FedGP's MNIST settings otherwise)
        info = replace(
            info,
            default_rounds_per_task=DIGITS_ROUNDS,
            default_epochs=DIGITS_EPOCHS,
            default_lr=DIGITS_LR,
        )
    return info


def _cifar_info(name: str, base: str, label: str, *, tasks: int, per_task: int) -> StreamInfo:
    """FedGP CIFAR protocol: ResNet-18, 5 local epochs, lr 0.1, Dirichlet α = 0.3 per task."""
    return StreamInfo(
        name=name,
        description=f"{label} as {tasks} tasks x {per_task} classes, natural order "
        "(class-IL + task-IL)",
        default_model="resnet18",
        default_tasks=tasks,
        default_partition="dirichlet",
        needs_data_root=True,
        default_epochs=5,
        default_lr=0.1,
        data=CIFAR_HOLDS[name],
        downloadable=True,
        builder=f"{BUILDERS}:build_class_il",
        base=base,
        classes_per_task=per_task,
        supports_cutout=True,
        num_classes=tasks * per_task,
        splits_classes=True,
        orders_classes=True,
    )


ROTATED = "rotated by its own angle in [0, 180) degrees"
PERMUTED = "with its own fixed pixel permutation"
STREAMS: dict[str, StreamInfo] = {
    "rot-mnist": _domain_il_info("rot-mnist", ROTATED, "mnist", "build_rotated"),
    "perm-mnist": _domain_il_info("perm-mnist", PERMUTED, "mnist", "build_permuted"),
    # FOT's permuted MNIST: its code keeps task 1 in place and normalises pixels.
    "perm-mnist-fot": replace(
        _domain_il_info("perm-mnist-fot", PERMUTED, "mnist", "build_permuted_fot"),
        description="MNIST as FOT's code permutes it: task 1 in place, each later task with "
        "its own fixed pixel permutation, pixels normalised (0.1307, 0.3081) (domain-IL)",
        default_model="fot-mlp",
    ),
    "rot-digits": _domain_il_info("rot-digits", ROTATED, "digits", "build_rotated"),
    "perm-digits": _domain_il_info("perm-digits", PERMUTED, "digits", "build_permuted"),
    "seq-cifar10": _cifar_info("seq-cifar10", "cifar10", "CIFAR-10", tasks=5, per_task=2),
    "seq-cifar100": _cifar_info("seq-cifar100", "cifar100", "CIFAR-100", tasks=10, per_task=10),
    # FOT's Split-CIFAR-100: its loader normalises with CIFAR-10's statistics, never augments.
    "seq-cifar100-fot": replace(
        _cifar_info("seq-cifar100", "cifar100", "CIFAR-100", tasks=10, per_task=10),
        name="seq-cifar100-fot",
        description="CIFAR-100 as FOT's code builds it: 10 tasks x 10 classes in natural "
        "order, pixels normalised with its CIFAR-10 statistics, no augmentation (task-IL "
        "with --heads per-task)",
        default_model="fot-alexnet",
        default_partition="iid",
        default_epochs=1,
        default_lr=0.01,
        builder=f"{BUILDERS}:build_class_il_fot",
        supports_cutout=False,
    ),
}

# Text: a linear head on frozen MiniLM embeddings (FedGP trains a head on a frozen encoder).
for _name, _base, _label, _tasks in (
    ("seq-agnews", "agnews", "AG News (4 classes)", 2),
    ("seq-dbpedia", "dbpedia", "DBpedia-14", 7),
    ("seq-yahooqa", "yahooqa", "Yahoo! Answers topics (10 classes)", 5),
):
    STREAMS[_name] = StreamInfo(
        name=_name,
        description=f"{_label} as {_tasks} tasks x 2 classes on frozen MiniLM embeddings",
        default_model="linear",
        default_tasks=_tasks,
        default_partition="dirichlet",
        needs_data_root=True,
        default_lr=0.1,
        data=TEXT_HOLDS[_name],
        builder=f"{BUILDERS}:build_text",
        base=_base,
        orders_classes=True,
    )


# CARLA detection streams (carla_bridge.stream): vehicles stream frames per round, from
# the replayed shared dataset or, for carla-live, a CARLA server named by --data-root.
CARLA_HOLDS = "carla-object-detection/ (images/, labels/ or labels_yolo_format/, labels.txt)"
CARLA_SERVER = "a CARLA server, named as carla://HOST:PORT"
for _name, _description, _tasks, _rounds, _holds in (
    (
        "carla-det",
        "CARLA frames, tasks = towns in arrival order (Town01 → 04 highway), "
        "vehicle clients, mAP (domain-IL detection)",
        4,
        4,
        CARLA_HOLDS,
    ),
    (
        "carla-highway",
        "CARLA frames, FedGP's shift: urban driving, then one vehicle enters "
        "the highway (domain-IL detection)",
        2,
        4,
        CARLA_HOLDS,
    ),
    (
        "carla-live",
        "live CARLA drive: the fleet drives Town03, then the Town04 highway "
        "(domain-IL detection; needs a server)",
        2,
        4,
        CARLA_SERVER,
    ),
):
    STREAMS[_name] = StreamInfo(
        name=_name,
        description=_description,
        default_model="centernet",
        default_tasks=_tasks,
        default_partition="iid",
        needs_data_root=True,
        default_rounds_per_task=_rounds,
        # A detector from scratch learns far faster per step with Adam (bench/
        # detector_learns.py, 10 epochs: SGD lr 0.01 reached 0.2 % mAP@0.5 on Town05).
        default_optimizer="adam",
        default_lr=0.005,
        default_epochs=2,
        data=_holds,
        builder="cfl_bench.carla_bridge.stream:build_frame_stream",
        base="carla-object-detection",
    )


# Static FL streams (streams.static): one task with all classes, the FL papers' setting.
# Defaults follow FedNTD's CIFAR-10 protocol (5 local epochs, lr 0.01, class shards s = 2)
# with the smaller model this suite runs on a CPU.
STATIC_HOLDS = {
    "mnist": MNIST_HOLDS,
    "fmnist": "FashionMNIST/raw/{train,t10k}-*-ubyte.gz (torchvision layout, train and test)",
    "cifar10": CIFAR_HOLDS["seq-cifar10"],
    "cifar100": CIFAR_HOLDS["seq-cifar100"],
    "cinic10": "CINIC-10/train/<class>/*.png and CINIC-10/test/<class>/*.png",
}
for _name, _label, _model in (
    ("mnist", "MNIST", "fedavg-cnn"),
    ("fmnist", "Fashion-MNIST", "fedavg-cnn"),
    ("cifar10", "CIFAR-10", "fedavg-cnn"),
    ("cifar100", "CIFAR-100", "fedavg-cnn"),
    ("cinic10", "CINIC-10", "fedavg-cnn"),
):
    STREAMS[_name] = StreamInfo(
        name=_name,
        description=f"{_label}, one task with all classes (static non-IID FL)",
        default_model=_model,
        default_tasks=1,
        default_partition="class-shards",
        needs_data_root=True,
        default_rounds_per_task=100,
        default_epochs=5,
        default_lr=0.01,
        data=STATIC_HOLDS[_name],
        downloadable=_name != "cinic10",
        builder=f"{BUILDERS}:build_static",
        base=_name,
        supports_cutout=True,
    )


def check_cutout(info: StreamInfo, cutout: int) -> None:
    """Refuse ``--cutout`` on a stream whose inputs are not images it augments."""
    if cutout and not info.supports_cutout:
        able = ", ".join(name for name, entry in STREAMS.items() if entry.supports_cutout)
        raise UserError(
            f"--cutout applies to the image streams {able}; stream {info.name!r} does not "
            "take it, drop --cutout"
        )


def check_class_order(info: StreamInfo, class_order: str) -> None:
    """Refuse ``--class-order numpy:...`` on a stream that does not cut tasks out of its
    class labels (domain-IL, CARLA, static, Avalanche): there it would be silently ignored."""
    if class_order.strip() == "natural" or info.orders_classes:
        return
    able = ", ".join(name for name, entry in STREAMS.items() if entry.orders_classes)
    raise UserError(
        f"--class-order applies to the class-split streams {able}; stream {info.name!r} does "
        "not cut its tasks by class, drop --class-order"
    )


def check_classes_per_task(info: StreamInfo, classes_per_task: int | None) -> None:
    """Refuse ``--classes-per-task`` on a stream that does not split classes into groups,
    and a group size outside 1..the stream's classes (decided from the catalogue alone, so
    the command line answers before any data is read)."""
    if classes_per_task is None:
        return
    if not info.splits_classes:
        able = ", ".join(name for name, entry in STREAMS.items() if entry.splits_classes)
        raise UserError(
            f"--classes-per-task applies to the class-incremental streams {able}; stream "
            f"{info.name!r} does not take it, drop --classes-per-task"
        )
    if not 1 <= classes_per_task <= info.num_classes:
        raise UserError(
            f"stream {info.name!r} has {info.num_classes} classes, so --classes-per-task "
            f"{classes_per_task} is out of range; use 1 to {info.num_classes}"
        )


def default_task_count(info: StreamInfo, classes_per_task: int | None) -> int:
    """How many tasks a run has without ``--tasks``: as many whole groups of
    ``--classes-per-task`` classes as the stream holds when that is given (CIFAR-100 with 20
    is 5 tasks), else the stream's own count (0: an Avalanche benchmark's, known once
    built)."""
    if classes_per_task and info.splits_classes:
        return max(1, info.num_classes // classes_per_task)
    return info.default_tasks


def stream_info(name: str) -> StreamInfo:
    """What the CLI needs to know about stream ``name`` (native or ``avalanche:...``).

    Avalanche benchmarks get defaults that fit any of them: an MLP (any input shape),
    all of the benchmark's experiences (``default_tasks`` 0; the built stream's
    ``num_tasks`` says how many), and the per-task Dirichlet split.
    """
    if name in STREAMS:
        return STREAMS[name]
    if name.startswith(AVALANCHE_PREFIX):
        from cfl_bench.streams.avalanche import parse_spec  # torch: only for this form

        module, factory = parse_spec(name)
        return StreamInfo(
            name=name,
            description=f"Avalanche benchmark from {module}:{factory}",
            default_model="mlp",
            default_tasks=0,
            default_partition="dirichlet",
            needs_data_root=False,
            builder=f"{BUILDERS}:build_avalanche",
        )
    guess = difflib.get_close_matches(name.lower(), list(STREAMS), n=1)
    hint = f" (did you mean '{guess[0]}'?)" if guess else ""
    raise UserError(
        f"unknown stream {name!r}{hint}; choose one of {', '.join(sorted(STREAMS))}, or name "
        f"an Avalanche benchmark as {AVALANCHE_FORM}"
    )


def require_data_root(name: str, data_root: str | None, download: bool = False) -> None:
    """Refuse a stream that reads a data folder when no ``--data-root`` names one.

    Decided from names alone, so ``cfl-bench run`` says it before importing the engine and
    the builders say the same sentence. With ``--download`` given, the sentence asks for
    the folder to fetch into (suggesting --download again would send the user in a circle).
    """
    info = stream_info(name)
    if data_root is not None or not info.needs_data_root:
        return
    if download and info.downloadable:
        raise UserError(
            f"--download needs a folder to fetch the data of stream {name!r} into: add "
            f"--data-root DIR (e.g. --data-root data); {info.data} is then written under DIR"
        )
    fetch = ", or add --download to fetch it there" if info.downloadable else ""
    raise UserError(
        f"stream {name!r} needs its data: pass --data-root pointing at a folder that holds "
        f"{info.data}{fetch}"
    )
