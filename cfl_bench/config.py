"""Run configuration: defaults < YAML file < command line, validated before anything runs.

Why one frozen dataclass: the fully resolved config is written to ``config.json`` and its
protocol part is hashed, so two runs are comparable exactly when their protocol hashes match.
The protocol is everything except the strategy, the seed and where/how it runs (device,
paths, output), so a leaderboard row can average seeds of one protocol.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import yaml

from cfl_bench.errors import UserError

BUFFER_OFFER = ("first_pass", "every_step")
WEIGHTING = ("samples", "uniform")
DEVICES = ("auto", "cpu", "cuda")

# Fields that do not change what is being measured.
NON_PROTOCOL = frozenset(
    {"strategy", "seed", "device", "threads", "data_root", "download", "out", "overwrite", "config"}
)


@dataclass(frozen=True)
class RunConfig:
    stream: str = "rot-digits"
    strategy: str = "fedavg"
    model: str | None = None  # None → the stream's default model
    tasks: int | None = None  # None → the stream's default number of tasks
    rounds_per_task: int | None = None  # None → the stream's default (20 for MNIST)
    clients: int = 10
    participation: float = 1.0
    async_shift: int = 0  # per-client task-boundary delays in [0, S] rounds (TaskClock)
    epochs: int | None = None  # None → the stream's default (1 for MNIST)
    batch_size: int = 32
    buffer_batch_size: int | None = None  # None → batch_size
    lr: float | None = None  # None → the stream's default (0.01 for MNIST)
    momentum: float = 0.0
    weight_decay: float = 0.0
    buffer_size: int = 200
    buffer_offer: str = "first_pass"
    replay_augment: bool | None = None  # None → on when the stream augments its train inputs
    partition: str | None = None  # None → the stream's default partitioner
    weighting: str = "samples"
    train_size: int | None = None
    test_size: int | None = None
    probe_size: int = 500
    eval_every_round: bool = False
    seed: int = 0
    device: str = "auto"
    threads: int | None = None  # CPU intra-op threads; None → torch's default
    data_root: str | None = None
    download: bool = False
    out: str | None = None
    overwrite: bool = False

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def protocol(self) -> dict[str, Any]:
        return {k: v for k, v in self.to_dict().items() if k not in NON_PROTOCOL}


def canonical_hash(obj: object, length: int = 12) -> str:
    """Short sha256 of the canonical JSON form (sorted keys) of ``obj``."""
    blob = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:length]


def field_names() -> set[str]:
    return {f.name for f in fields(RunConfig)}


def read_yaml_mapping(path: str | Path, kind: str, shape: str) -> dict[Any, Any]:
    """The mapping in YAML file ``path``; ``kind`` names the file in errors ("config file"),
    ``shape`` says what the mapping must hold."""
    p = Path(path)
    if not p.is_file():
        raise UserError(f"{kind} '{p}' does not exist; pass the path of a YAML file.")
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as exc:
        raise UserError(
            f"{kind} '{p}' is not valid YAML ({exc.__class__.__name__}); fix its syntax."
        ) from None
    if not isinstance(data, dict):
        raise UserError(f"{kind} '{p}' must be a mapping {shape}.")
    return data


def load_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML config whose keys are RunConfig fields (dashes or underscores)."""
    p = Path(path)
    data = read_yaml_mapping(p, "config file", "of option names to values")
    normalised = {str(k).replace("-", "_"): v for k, v in data.items()}
    unknown = sorted(set(normalised) - field_names())
    if unknown:
        raise UserError(
            f"config file '{p}' has unknown key(s) {', '.join(unknown)}; valid keys are the "
            f"`cfl-bench run` options."
        )
    return normalised


def make_config(overrides: dict[str, Any], yaml_path: str | None = None) -> RunConfig:
    """Defaults, then the YAML file, then explicit CLI values (None = not given)."""
    values: dict[str, Any] = {}
    if yaml_path:
        values.update(load_yaml(yaml_path))
    values.update({k: v for k, v in overrides.items() if v is not None})
    try:
        config = RunConfig(**values)
    except TypeError as exc:
        raise UserError(f"invalid configuration: {exc}.") from None
    validate(config)
    return config


def validate(c: RunConfig) -> None:
    """Refuse impossible numbers with one sentence naming the option and the fix."""
    positive_ints = {
        "clients": c.clients,
        "batch-size": c.batch_size,
        "buffer-size": c.buffer_size,
        "probe-size": c.probe_size,
    }
    optional_ints = {
        "tasks": c.tasks,
        "rounds-per-task": c.rounds_per_task,
        "epochs": c.epochs,
        "buffer-batch-size": c.buffer_batch_size,
        "train-size": c.train_size,
        "threads": c.threads,
        "test-size": c.test_size,
    }
    for name, value in {**positive_ints, **optional_ints}.items():
        if value is None and name in optional_ints:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise UserError(f"--{name} must be a positive integer, got {value!r}.")
    if isinstance(c.async_shift, bool) or not isinstance(c.async_shift, int) or c.async_shift < 0:
        raise UserError(f"--async-shift must be an integer >= 0, got {c.async_shift!r}.")
    if isinstance(c.participation, bool) or not isinstance(c.participation, (int, float)):
        raise UserError(f"--participation must be a number in (0, 1], got {c.participation!r}.")
    if not 0 < c.participation <= 1:
        raise UserError(f"--participation must be in (0, 1], got {c.participation}.")
    if c.lr is not None and (not isinstance(c.lr, (int, float)) or not c.lr > 0):
        raise UserError(f"--lr must be a positive number, got {c.lr!r}.")
    if not isinstance(c.momentum, (int, float)) or not 0 <= c.momentum < 1:
        raise UserError(f"--momentum must be in [0, 1), got {c.momentum!r}.")
    if not isinstance(c.weight_decay, (int, float)) or c.weight_decay < 0:
        raise UserError(f"--weight-decay must be ≥ 0, got {c.weight_decay!r}.")
    if not isinstance(c.seed, int) or isinstance(c.seed, bool) or c.seed < 0:
        raise UserError(f"--seed must be a non-negative integer, got {c.seed!r}.")
    if c.replay_augment is not None and not isinstance(c.replay_augment, bool):
        raise UserError(f"replay_augment must be true or false, got {c.replay_augment!r}.")
    choices = {
        "buffer-offer": (c.buffer_offer, BUFFER_OFFER),
        "weighting": (c.weighting, WEIGHTING),
        "device": (c.device, DEVICES),
    }
    for name, (value, allowed) in choices.items():
        if value not in allowed:
            raise UserError(f"--{name} must be one of {', '.join(allowed)}, got {value!r}.")
