"""Avalanche adapter: any Avalanche benchmark becomes a federated stream.

Why: Avalanche (ContinualAI) ships dozens of continual-learning benchmarks and generators
(``SplitMNIST``, ``nc_benchmark``, ``class_incremental_benchmark``,
``benchmark_from_datasets``, ...). Rather than re-implementing them, the adapter takes any
benchmark object with a ``train_stream`` and a ``test_stream`` of experiences and serves
its experiences as our tasks; the federation then partitions each task among clients with
the chosen partitioner, exactly as for native streams.

On the command line a benchmark is named by the callable that builds it::

    cfl-bench run --stream avalanche:package.module:factory ...
    cfl-bench run --stream avalanche:avalanche.benchmarks.classic:SplitMNIST --tasks 5 \\
        --data-root ~/data

``package.module`` is imported (the current directory is searched first, as ``python -m``
would) and ``factory`` is looked up in it; it is either a callable returning a benchmark or
a ready benchmark object. The callable receives those of these keyword arguments that its
signature names: ``n_experiences`` (only when ``--tasks`` is given), ``seed`` (the run
seed) and ``dataset_root`` (only when ``--data-root`` is given). Python's global random
generators (``random``, numpy, torch) are seeded from the run seed for the call and
restored afterwards, so a factory that draws from them is deterministic and does not
disturb the run's own seeding. Avalanche's classic benchmarks fetch their files themselves
when they are missing: ``--download`` has no say over that.

What the adapter does with the benchmark, and why:

* **Materialised once.** Every selected experience's dataset is read once through a torch
  ``DataLoader`` (large batches, no workers) into float32 inputs and int64 labels that stay
  on the run's device, as the design's speed rules ask; ``train_labels`` then never touches
  a transform.
* **Deterministic preprocessing.** Both splits are read through the datasets' ``eval``
  transform group. Avalanche's train group usually adds random augmentation (random crop,
  flip); reading it once would freeze a single random draw into the data — neither the
  augmented protocol nor a clean one, and different on every run. So the deterministic
  preprocessing (``ToTensor``, ``Normalize``) is kept and train-time augmentation is
  dropped; the stream reports ``augments = False``. A benchmark whose train group does
  something deterministic the eval group lacks loses it too: wrap such a benchmark in a
  factory that moves the step into the eval group.
* **Scenario from the class sets.** Experiences with pairwise disjoint classes are
  class-IL (the engine also scores task-IL by masking logits to each task's classes);
  experiences that all hold the same classes are domain-IL. Anything else (overlapping
  but unequal sets), and experiences that reuse class ids under different task labels
  (multi-head benchmarks built with ``class_ids_from_zero_in_each_exp``), is refused:
  a single-head score of such a benchmark would be silently wrong.
* **Identity.** ``describe()`` names the factory and its arguments, the classes and sizes
  of every experience and a sha256 of the materialised tensors, so two runs can only claim
  the same stream when they saw the same numbers. The hash covers float32 values after the
  benchmark's transforms; elementwise transforms (``ToTensor``, ``Normalize``) give the
  same bits on every machine, while interpolating ones (resizing) may differ between
  library builds.

Avalanche is imported lazily, only when a benchmark is loaded by name: the core package
imports without it (``pip install 'cfl-bench[avalanche]'`` adds it).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.util
import inspect
import itertools
import os
import random
import sys
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader
from torch.utils.data._utils.collate import default_collate

from cfl_bench.core.errors import UserError
from cfl_bench.core.seeding import derive_seed
from cfl_bench.streams.base import Stream, TaskData
from cfl_bench.streams.datafiles import (
    check_data_root,
    classify_download_failure,
    leftovers_removed_on_failure,
)

AVALANCHE_PREFIX = "avalanche:"
SPEC_FORM = "avalanche:package.module:factory"
SPEC_EXAMPLE = "avalanche:avalanche.benchmarks.classic:SplitMNIST"
INSTALL_HINT = "pip install 'cfl-bench[avalanche]'"
# Keyword arguments a factory may receive, each only when its signature names it.
FACTORY_ARGUMENTS = ("n_experiences", "seed", "dataset_root")
# The options that supply the arguments a factory may require (the seed always comes).
SUPPLIED_BY = {
    "n_experiences": "--tasks N (the benchmark is built with N experiences)",
    "dataset_root": "--data-root pointing at the benchmark's data folder",
}
# Samples per DataLoader batch while materialising: large, to keep Python overhead low.
LOAD_BATCH = 1024


def is_avalanche_name(name: str) -> bool:
    """Whether a stream name asks for the adapter (``avalanche:...``)."""
    return name.startswith(AVALANCHE_PREFIX)


def parse_spec(name: str) -> tuple[str, str]:
    """Split ``avalanche:package.module:factory`` into (module path, attribute path)."""
    parts = name.removeprefix(AVALANCHE_PREFIX).split(":")
    if not is_avalanche_name(name) or len(parts) != 2 or not all(_dotted(p) for p in parts):
        raise UserError(
            f"stream {name!r} is not of the form {SPEC_FORM}; name the module and the "
            f"callable that builds the benchmark, e.g. {SPEC_EXAMPLE}"
        )
    return parts[0], parts[1]


def _dotted(text: str) -> bool:
    """A dotted Python name such as ``pkg.mod`` (each part an identifier)."""
    return bool(text) and all(part.isidentifier() for part in text.split("."))


@dataclass(frozen=True)
class _Split:
    """One experience's materialised split, on the CPU until the stream moves it."""

    x: torch.Tensor
    y: torch.Tensor


@dataclass(frozen=True)
class _Experience:
    """The train and test splits of one experience and what they cover."""

    train: _Split
    test: _Split
    classes: tuple[int, ...]
    task_labels: tuple[int, ...]


class AvalancheStream(Stream):
    """The experiences of an Avalanche benchmark as tasks (see the module docstring).

    ``num_tasks`` 0 takes every experience, n > 0 the first n. ``source`` describes where
    the benchmark came from (factory spec and arguments) for :meth:`describe`; ``seed``
    seeds the global RNGs while the experiences are read (see ``_seeded_global_rngs``).
    """

    augments = False

    def __init__(
        self,
        benchmark: object,
        *,
        num_tasks: int = 0,
        device: torch.device | str = "cpu",
        name: str = "avalanche",
        source: dict[str, object] | None = None,
        seed: int = 0,
    ) -> None:
        _check_num_tasks(num_tasks)
        self.name = name
        self.device = torch.device(device)
        self._source = dict(source or {})
        digest = hashlib.sha256()
        # Reading may draw from the global RNGs (DataLoader seeds, a random eval transform):
        # seed them for the read and restore them, so the data and the run's seeding are
        # both independent of what ran before.
        with _seeded_global_rngs(derive_seed(seed, "stream", "avalanche", "read")):
            train_exps, test_exps = _select_experiences(benchmark, num_tasks, name)
            experiences = [
                _read_experience(t, train_exp, test_exp, digest)
                for t, (train_exp, test_exp) in enumerate(zip(train_exps, test_exps, strict=True))
            ]
        self.num_tasks = len(experiences)
        self.scenario = _scenario(experiences, name)
        self.input_shape = _common_input_shape(experiences, name)
        # Declared classes count too: one without samples in the slice still needs a logit
        # (task-IL masks index the logits by class).
        self.num_classes = 1 + max(
            max(max(e.classes), int(e.train.y.max()), int(e.test.y.max())) for e in experiences
        )
        self.content_sha256 = digest.hexdigest()
        self._classes = [e.classes for e in experiences]
        self._task_labels = [e.task_labels for e in experiences]
        self._train_sizes = [int(e.train.y.shape[0]) for e in experiences]
        self._test_sizes = [int(e.test.y.shape[0]) for e in experiences]
        self._benchmark_type = f"{type(benchmark).__module__}.{type(benchmark).__qualname__}"
        self._train_labels_cpu = [e.train.y for e in experiences]
        self._splits = [
            (
                _Split(e.train.x.to(self.device), e.train.y.to(self.device)),
                _Split(e.test.x.to(self.device), e.test.y.to(self.device)),
            )
            for e in experiences
        ]

    def task(self, t: int) -> TaskData:
        index = self._task_index(t)
        train, test = self._splits[index]
        # Copies, like the native streams' fresh tensors: callers may modify what they get.
        return TaskData(
            index=index,
            train_x=train.x.clone(),
            train_y=train.y.clone(),
            test_x=test.x.clone(),
            test_y=test.y.clone(),
            classes=self._classes[index],
        )

    def train_labels(self, t: int) -> torch.Tensor:
        """The labels read at materialisation, on the CPU where partitioning happens."""
        return self._train_labels_cpu[self._task_index(t)].clone()

    def protocol_fields(self) -> dict[str, object]:
        """The factory, its arguments but the seed, and the data's shape: a changed factory
        or data set changes the protocol hash, a different seed (e.g. SplitMNIST's class
        order) does not."""
        kwargs = self._source.get("factory_kwargs") or {}
        assert isinstance(kwargs, dict)
        return {
            "avalanche_factory": self._source.get("factory"),
            "avalanche_factory_kwargs": {k: v for k, v in kwargs.items() if k != "seed"},
            "avalanche_version": self._source.get("avalanche_version"),
            "benchmark_type": self._benchmark_type,
            "num_classes": self.num_classes,
            "input_shape": list(self.input_shape),
            "train_sizes": list(self._train_sizes),
            "test_sizes": list(self._test_sizes),
        }

    def describe(self) -> dict[str, object]:
        return {
            "name": self.name,
            "scenario": self.scenario,
            "source": "avalanche",
            **self._source,
            "benchmark_type": self._benchmark_type,
            "num_tasks": self.num_tasks,
            "num_classes": self.num_classes,
            "classes_per_task": [list(c) for c in self._classes],
            "task_labels": [list(t) for t in self._task_labels],
            "input_shape": list(self.input_shape),
            "train_sizes": list(self._train_sizes),
            "test_sizes": list(self._test_sizes),
            "transforms": "each experience's 'eval' transform group, applied once; "
            "train-time augmentation dropped",
            "augmentation": "none",
            "content_sha256": self.content_sha256,
        }


def build_avalanche_stream(
    name: str,
    *,
    num_tasks: int,
    seed: int,
    device: torch.device | str,
    data_root: str | None,
    train_size: int | None = None,
    test_size: int | None = None,
) -> AvalancheStream:
    """Load the benchmark named ``avalanche:package.module:factory`` and adapt it.

    ``train_size`` / ``test_size`` are refused: native streams cut a prefix of the base
    dataset before splitting it into tasks, but an Avalanche benchmark has no base dataset
    to cut, and a prefix of each experience would be wrong because Avalanche's generators
    order an experience's samples class by class (a prefix could hold a single class).
    """
    if train_size is not None or test_size is not None:
        raise UserError(
            f"--train-size and --test-size do not apply to Avalanche stream {name!r} (its "
            "experiences are ordered by class, so a prefix would drop classes); build a "
            "smaller benchmark in the factory instead"
        )
    benchmark, kwargs = load_benchmark(name, num_tasks=num_tasks, seed=seed, data_root=data_root)
    module, attribute = parse_spec(name)
    source: dict[str, object] = {
        "factory": f"{module}:{attribute}",
        # The data folder is a machine-specific path: record that it was passed, not where.
        "factory_kwargs": {
            k: ("<--data-root>" if k == "dataset_root" else v) for k, v in kwargs.items()
        },
        "avalanche_version": _avalanche_version(),
    }
    return AvalancheStream(
        benchmark, num_tasks=num_tasks, device=device, name=name, source=source, seed=seed
    )


def load_benchmark(
    name: str, *, num_tasks: int, seed: int, data_root: str | None
) -> tuple[object, dict[str, object]]:
    """The benchmark named by ``name`` and the keyword arguments its factory was given."""
    _check_num_tasks(num_tasks)
    module_name, attribute = parse_spec(name)
    if data_root is not None:
        # A folder that does not exist yet is fine (Avalanche's benchmarks download into
        # it); a file, or a path through one, can never work.
        check_data_root(
            data_root,
            holds="the benchmark's data (the factory receives it as dataset_root)",
            may_create=True,
        )
    _require_avalanche()
    with _cwd_on_path():
        target = _resolve(module_name, attribute)
        if _is_benchmark(target):
            return target, {}
        if not callable(target):
            raise UserError(
                f"{module_name}:{attribute} is a {type(target).__name__}, neither a callable "
                f"nor an Avalanche benchmark; name a function that returns a benchmark"
            )
        offered: dict[str, object] = {"seed": seed}
        if num_tasks:
            offered["n_experiences"] = num_tasks
        if data_root is not None:
            offered["dataset_root"] = data_root
        kwargs = _accepted_kwargs(target, offered, f"{module_name}:{attribute}")
        with _seeded_global_rngs(derive_seed(seed, "stream", "avalanche", name)):
            try:
                with _leftovers_removed(data_root):
                    benchmark = target(**kwargs)
            except UserError:
                raise
            except Exception as exc:
                raise _factory_error(f"{module_name}:{attribute}", exc, kwargs, data_root) from exc
    if not _is_benchmark(benchmark):
        raise UserError(
            f"Avalanche factory {module_name}:{attribute} returned a "
            f"{type(benchmark).__name__}, not a benchmark with train_stream and test_stream; "
            "make it return an Avalanche benchmark"
        )
    return benchmark, kwargs


def _leftovers_removed(data_root: str | None) -> contextlib.AbstractContextManager[None]:
    """Remove what a failing factory newly created directly under ``--data-root``.

    Why: Avalanche's benchmarks download into ``dataset_root``; an offline attempt leaves
    empty dataset folders or half-written archives that make the next run believe the data
    is there. Only new top-level entries (or the folder itself, when the factory created
    it) are removed; nothing that existed before is touched.
    """
    if data_root is None:
        return contextlib.nullcontext()
    root = Path(data_root)
    return leftovers_removed_on_failure(root, [root], depth=1)


def _factory_error(
    label: str, exc: Exception, kwargs: dict[str, object], data_root: str | None
) -> UserError:
    """One sentence for a failing factory; a failed download says so instead of blaming
    the factory's arguments."""
    kind, detail = classify_download_failure(exc)
    where = f"into {data_root}" if data_root is not None else "into its dataset folder"
    by_hand = f"copy the benchmark's files {where} by hand"
    if kind == "offline":
        return UserError(
            f"Avalanche factory {label} failed to download its data: no network connection "
            f"({detail}); {by_hand} or run with network"
        )
    if kind in ("connection", "http"):
        what = "the network connection failed" if kind == "connection" else "the server answered"
        return UserError(
            f"Avalanche factory {label} failed to download its data: {what} ({detail}); "
            f"{by_hand} or try again"
        )
    return UserError(
        f"Avalanche factory {label} failed ({type(exc).__name__}: {_one_line(exc)}); fix its "
        f"arguments or data (the adapter passed {_kwargs_text(kwargs)})"
    )


def _require_avalanche() -> None:
    """Import Avalanche once (quietly), or say how to install it."""
    if importlib.util.find_spec("avalanche") is None:
        raise UserError(
            f"Avalanche streams need avalanche-lib, which is not installed; install the "
            f"extra: {INSTALL_HINT}"
        )
    # Its import prints optional-dependency notices (e.g. qpsolvers' "no QP solver
    # found") that say nothing about the run; keep the CLI output to what matters.
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            importlib.import_module("avalanche.benchmarks")
    except Exception as exc:  # e.g. built against another torch
        raise UserError(
            f"avalanche-lib is installed but cannot be imported ({type(exc).__name__}: "
            f"{_one_line(exc)}); reinstall the extra: {INSTALL_HINT}"
        ) from exc


def _resolve(module_name: str, attribute: str) -> Any:
    """Import ``module_name`` and follow the dotted ``attribute`` path in it."""
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if module_name == missing or module_name.startswith(missing + "."):
            raise UserError(
                f"module {module_name!r} of stream {AVALANCHE_PREFIX}{module_name}:{attribute} "
                "was not found; check its spelling and run from the folder that holds it "
                "(or add that folder to PYTHONPATH)"
            ) from exc
        hint = f" ({INSTALL_HINT})" if missing.split(".")[0] == "avalanche" else ""
        raise UserError(
            f"importing module {module_name!r} failed because module {missing!r} is missing; "
            f"install it{hint}"
        ) from exc
    except Exception as exc:
        raise UserError(
            f"importing module {module_name!r} failed ({type(exc).__name__}: "
            f"{_one_line(exc)}); fix the module"
        ) from exc
    target: Any = module
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise UserError(
                f"module {module_name!r} has no attribute {attribute!r}; name a function that "
                f"returns an Avalanche benchmark, as in {SPEC_FORM}"
            )
        target = getattr(target, part)
    return target


def _accepted_kwargs(factory: Any, offered: dict[str, object], label: str) -> dict[str, object]:
    """The offered arguments the factory's signature names; refuse unmet required ones.

    Only explicitly named parameters receive arguments: a ``**kwargs`` catch-all may
    forward them somewhere that does not expect them.
    """
    try:
        parameters = inspect.signature(factory).parameters
    except (TypeError, ValueError):  # builtins and some C callables have no signature
        return {}
    named = {
        p.name: p
        for p in parameters.values()
        if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    }
    kwargs = {k: v for k, v in offered.items() if k in named}
    unmet = [
        p.name
        for p in parameters.values()
        if p.default is inspect.Parameter.empty
        and p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
        and p.name not in kwargs
    ]
    if unmet and all(name in SUPPLIED_BY for name in unmet):
        flags = " and ".join(SUPPLIED_BY[name] for name in unmet)
        raise UserError(f"Avalanche factory {label} needs {', '.join(unmet)}; pass {flags}")
    if unmet:
        raise UserError(
            f"Avalanche factory {label} needs argument(s) {', '.join(unmet)} that the adapter "
            f"cannot supply (it passes only {', '.join(FACTORY_ARGUMENTS)}); wrap it in a "
            "function that fills them in"
        )
    return kwargs


def _check_num_tasks(num_tasks: object) -> None:
    if isinstance(num_tasks, bool) or not isinstance(num_tasks, int) or num_tasks < 0:
        raise UserError(
            f"number of tasks must be a positive integer (or 0 for all the benchmark's "
            f"experiences), got {num_tasks!r}"
        )


def _is_benchmark(obj: object) -> bool:
    return hasattr(obj, "train_stream") and hasattr(obj, "test_stream")


def _select_experiences(
    benchmark: object, num_tasks: int, name: str
) -> tuple[list[Any], list[Any]]:
    """The first ``num_tasks`` (0: all) train and test experiences, checked to pair up."""
    if not _is_benchmark(benchmark):
        raise UserError(
            f"stream {name!r}: a {type(benchmark).__name__} is not an Avalanche benchmark "
            "(it lacks train_stream or test_stream); pass the benchmark object itself"
        )
    streams = {s: getattr(benchmark, f"{s}_stream") for s in ("train", "test")}
    sizes = {s: len(v) if hasattr(v, "__len__") else None for s, v in streams.items()}
    if None not in sizes.values() and sizes["train"] != sizes["test"]:
        raise UserError(
            f"Avalanche benchmark of stream {name!r} has {sizes['train']} train but "
            f"{sizes['test']} test experiences; each task needs both, so build it with "
            "matching train and test streams"
        )
    if num_tasks:
        chosen = {s: list(itertools.islice(v, num_tasks)) for s, v in streams.items()}
    else:
        chosen = {s: list(v) for s, v in streams.items()}
    available = min(len(chosen["train"]), len(chosen["test"]))
    if num_tasks > available:
        raise UserError(
            f"Avalanche benchmark of stream {name!r} has {available} experiences; use "
            f"--tasks {available} or fewer, or leave --tasks unset to take them all"
        )
    if len(chosen["train"]) != len(chosen["test"]):
        raise UserError(
            f"Avalanche benchmark of stream {name!r} has {len(chosen['train'])} train but "
            f"{len(chosen['test'])} test experiences; each task needs both, so build it with "
            "matching train and test streams"
        )
    if not chosen["train"]:
        raise UserError(f"Avalanche benchmark of stream {name!r} has no experiences; add some")
    return chosen["train"], chosen["test"]


def _read_experience(t: int, train_exp: object, test_exp: object, digest: Any) -> _Experience:
    """Materialise one experience pair, check its labels, and feed the content hash."""
    train = _materialise(train_exp, f"train experience {t}")
    test = _materialise(test_exp, f"test experience {t}")
    for split in (train, test):
        digest.update(_contiguous_bytes(split.y))
        digest.update(_contiguous_bytes(split.x))
    declared = _declared_classes(train_exp)
    present = set(train.y.unique().tolist())
    classes = declared if declared is not None else present
    if not present <= classes:
        raise UserError(
            f"train experience {t} holds labels {sorted(present - classes)} outside its "
            f"classes_in_this_experience {sorted(classes)}; the benchmark is inconsistent, "
            "so rebuild it"
        )
    extra = set(test.y.unique().tolist()) - classes
    if extra:
        raise UserError(
            f"test experience {t} holds classes {sorted(extra)} that train experience {t} "
            f"lacks ({sorted(classes)}); build the benchmark so each test experience covers "
            "the classes of its train experience"
        )
    return _Experience(
        train=train,
        test=test,
        classes=tuple(sorted(classes)),
        task_labels=_task_labels(train_exp),
    )


def _materialise(experience: object, what: str) -> _Split:
    """Read an experience's whole dataset through its eval transforms into tensors."""
    dataset, total = _sized_dataset(experience, what)
    xs, ys = _read_batches(dataset, what)
    try:
        x, y = torch.cat(xs), torch.cat(ys)
    except RuntimeError as exc:  # batches of different input shapes or label layouts
        raise UserError(
            f"{what} yields inputs of different shapes ({_one_line(exc)}); give its dataset "
            "a transform that makes every input the same shape (e.g. Resize)"
        ) from exc
    _check_samples(x, y, what, total)
    return _Split(x.to(torch.float32).contiguous(), y.to(torch.int64).contiguous())


def _sized_dataset(experience: object, what: str) -> tuple[Any, int]:
    """The experience's dataset in eval mode and its length; refused when it has none, no
    length or no samples, since the adapter reads every sample by index once."""
    dataset = getattr(experience, "dataset", None)
    if dataset is None:
        raise UserError(
            f"{what} has no dataset (a {type(experience).__name__}); the adapter needs "
            "supervised experiences of (input, label) samples"
        )
    try:
        if callable(getattr(dataset, "eval", None)):
            dataset = dataset.eval()  # deterministic preprocessing, see the module docstring
        total = len(dataset)
    except Exception as exc:  # an iterable-only dataset, or a broken eval() of the benchmark
        raise UserError(
            f"{what} has a dataset of unknown size ({type(exc).__name__}: {_one_line(exc)}); "
            "the adapter needs map-style datasets with a length"
        ) from exc
    if total == 0:
        raise UserError(f"{what} is empty; every experience needs train and test samples")
    return dataset, total


def _read_batches(dataset: Any, what: str) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The inputs and labels of every batch, in order; a benchmark whose samples are not
    (input, label, ...) tuples of tensors is refused with the transform that would fix it."""
    xs: list[torch.Tensor] = []
    ys: list[torch.Tensor] = []
    loader = DataLoader(
        dataset, batch_size=LOAD_BATCH, shuffle=False, num_workers=0, collate_fn=default_collate
    )
    try:
        for batch in loader:
            if not isinstance(batch, (list, tuple)) or len(batch) < 2:
                raise UserError(
                    f"{what} yields {type(batch).__name__} samples, not (input, label, ...) "
                    "tuples; the adapter handles classification benchmarks only"
                )
            xs.append(torch.as_tensor(batch[0]))
            ys.append(torch.as_tensor(batch[1]))
    except UserError:
        raise
    except Exception as exc:  # e.g. PIL images that default_collate cannot stack
        raise UserError(
            f"reading {what} failed ({type(exc).__name__}: {_one_line(exc)}); give its "
            "dataset a transform that returns tensors (e.g. ToTensor)"
        ) from exc
    return xs, ys


def _check_samples(x: torch.Tensor, y: torch.Tensor, what: str, total: int) -> None:
    """Refuse inputs that are not float and labels that are not one non-negative integer
    class per sample: the suite's objectives and partitions read them as such."""
    if not x.is_floating_point():
        raise UserError(
            f"{what} yields {x.dtype} inputs; add a transform that returns float tensors "
            "(e.g. ToTensor and Normalize) so inputs are scaled as the benchmark intends"
        )
    if y.dim() != 1 or y.is_floating_point() or y.dtype == torch.bool:
        raise UserError(
            f"{what} yields labels of type {y.dtype} and shape {tuple(y.shape)}; the adapter "
            "needs one integer class label per sample"
        )
    if int(y.min()) < 0:
        raise UserError(f"{what} holds negative label {int(y.min())}; class labels start at 0")
    if x.shape[0] != total:
        raise ValueError(f"{what}: read {x.shape[0]} samples of {total}")  # a loader bug


def _declared_classes(experience: Any) -> set[int] | None:
    """``classes_in_this_experience`` when the benchmark provides it (a list or a set);
    ``experience`` is duck-typed (Any): which attributes it has depends on the benchmark."""
    try:
        declared = experience.classes_in_this_experience
    except (AttributeError, ValueError):  # absent, or masked (Avalanche raises ValueError)
        return None
    return None if declared is None else {int(c) for c in declared}


def _task_labels(experience: Any) -> tuple[int, ...]:
    """The experience's task labels: its own attribute, else its dataset's, else (0,)
    (``experience`` is duck-typed, as in :func:`_declared_classes`)."""
    try:
        labels = experience.task_labels
    except (AttributeError, ValueError):
        labels = None
    if labels is None:
        attribute = getattr(getattr(experience, "dataset", None), "targets_task_labels", None)
        labels = getattr(attribute, "uniques", None)
    return tuple(sorted({int(v) for v in labels})) if labels is not None else (0,)


def _scenario(experiences: Sequence[_Experience], name: str) -> str:
    """class-il (disjoint class sets) or domain-il (identical ones); refuse the rest."""
    sets = [set(e.classes) for e in experiences]
    if all(s == sets[0] for s in sets):
        labels = {e.task_labels for e in experiences}
        if len(experiences) > 1 and len(labels) > 1:
            raise UserError(
                f"the experiences of stream {name!r} share class ids {sorted(sets[0])} under "
                "different task labels (a multi-head task-IL benchmark, e.g. built with "
                "class_ids_from_zero_in_each_exp=True); cfl-bench trains one head over all "
                "classes, so build it with global class ids or without task labels"
            )
        return "domain-il"
    union: set[int] = set().union(*sets)
    if sum(len(s) for s in sets) == len(union):
        return "class-il"
    listed = "; ".join(f"experience {t}: {sorted(s)}" for t, s in enumerate(sets))
    raise UserError(
        f"the experiences of stream {name!r} have overlapping but unequal class sets "
        f"({listed}); cfl-bench scores class-IL (disjoint classes) or domain-IL (identical "
        "classes) only, so build the benchmark with disjoint or identical class sets"
    )


def _common_input_shape(experiences: Sequence[_Experience], name: str) -> tuple[int, ...]:
    shapes = {tuple(split.x.shape[1:]) for e in experiences for split in (e.train, e.test)}
    if len(shapes) != 1:
        raise UserError(
            f"the experiences of stream {name!r} have inputs of different shapes "
            f"{sorted(shapes)}; one model needs one input shape, so resize them in the "
            "benchmark's transforms"
        )
    return shapes.pop()


def _contiguous_bytes(tensor: torch.Tensor) -> memoryview:
    """The tensor's bytes without a copy (it is contiguous and on the CPU here)."""
    return np.ascontiguousarray(tensor.numpy()).data.cast("B")


@contextlib.contextmanager
def _seeded_global_rngs(seed: int) -> Iterator[None]:
    """Seed Python's, numpy's and torch's global RNGs for a block; restore them after.

    Why: Avalanche's generators shuffle with the global torch RNG when given no seed (and
    re-seed it when given one); either way the run's own seeding must not depend on it.
    """
    py_state, np_state = random.getstate(), np.random.get_state()
    with torch.random.fork_rng(devices=[]):
        random.seed(seed)
        np.random.seed(seed % 2**32)
        torch.random.default_generator.manual_seed(seed)  # CPU only: CUDA is untouched
        try:
            yield
        finally:
            random.setstate(py_state)
            np.random.set_state(np_state)


@contextlib.contextmanager
def _cwd_on_path() -> Iterator[None]:
    """Let ``package.module`` name a module in the current folder, as ``python -m`` does.

    The ``cfl-bench`` console script puts its own bin folder on ``sys.path``, not the
    working directory; the entry is removed again once the benchmark is built.
    """
    cwd = os.getcwd()
    added = cwd not in sys.path and "" not in sys.path
    if added:
        sys.path.insert(0, cwd)
    try:
        yield
    finally:
        if added and cwd in sys.path:
            sys.path.remove(cwd)


def _avalanche_version() -> str | None:
    try:
        from importlib.metadata import version

        return version("avalanche-lib")
    except Exception:  # not installed as a distribution (e.g. a source checkout)
        return None


def _one_line(exc: BaseException) -> str:
    """An exception's message on one short line, for a one-sentence UserError."""
    text = " ".join(str(exc).split()) or "no message"
    return text if len(text) <= 200 else text[:197] + "..."


def _kwargs_text(kwargs: dict[str, object]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in kwargs.items()) or "no arguments"
