"""Checkpoint files: a run's whole state at a round end, written atomically.

Why a plain nested structure of tensors and numbers: ``torch.load(weights_only=True)`` reads
it back without unpickling arbitrary objects, so a checkpoint from an untrusted folder cannot
run code. Generators, sets and tuples, which that loader does not know, are packed into
tagged dicts here and rebuilt on load; every tensor is moved to the run's device on load, so
a CPU checkpoint resumes on a GPU and back.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from cfl_bench.core.atomic import atomic_write

FORMAT = 1
TAG = "__cfl_kind__"


def pack(obj: Any) -> Any:
    """``obj`` with generators, sets and tuples replaced by tagged dicts (recursively)."""
    if isinstance(obj, torch.Generator):
        return {TAG: "generator", "device": str(obj.device), "state": obj.get_state()}
    if isinstance(obj, torch.Tensor):
        return _compact(obj.detach())
    if isinstance(obj, dict):
        if TAG in obj:
            raise ValueError(f"state dict key {TAG!r} is reserved")
        return {k: pack(v) for k, v in obj.items()}
    if isinstance(obj, (set, frozenset)):
        return {TAG: "set", "items": sorted(obj)}
    if isinstance(obj, tuple):
        return {TAG: "tuple", "items": [pack(v) for v in obj]}
    if isinstance(obj, list):
        return [pack(v) for v in obj]
    if obj is None:
        return None
    for kind in (bool, int, float, str):  # plain types: subclasses (TorchVersion) unpickle unsafely
        if isinstance(obj, kind):
            return kind(obj)
    raise TypeError(f"cannot checkpoint a {type(obj).__name__}; keep state in tensors and numbers")


def _compact(t: torch.Tensor) -> torch.Tensor:
    """``t`` itself, or a copy when it is a view: torch.save writes a view's whole storage
    (a buffer's filled rows would drag the whole buffer along); inference tensors are copied
    into normal ones."""
    if t.is_inference() or t.untyped_storage().nbytes() != t.numel() * t.element_size():
        return t.clone()
    return t


def unpack(obj: Any, device: torch.device) -> Any:
    """The inverse of :func:`pack`, with tensors and generators placed on ``device``."""
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, list):
        return [unpack(v, device) for v in obj]
    if not isinstance(obj, dict):
        return obj
    kind = obj.get(TAG)
    if kind == "generator":
        # A generator made on the CPU stays there (e.g. the participation sampler); others
        # follow the run's device.
        where = torch.device("cpu") if obj["device"] == "cpu" else device
        gen = torch.Generator(device=where)
        gen.set_state(obj["state"].cpu())
        return gen
    if kind == "set":
        return set(obj["items"])
    if kind == "tuple":
        return tuple(unpack(v, device) for v in obj["items"])
    return {k: unpack(v, device) for k, v in obj.items()}


def save(path: Path, state: dict[str, Any]) -> int:
    """Write ``state`` atomically (temp + fsync + rename); returns the file size in bytes."""
    payload = {"format": FORMAT, "state": pack(state)}
    atomic_write(path, lambda fh: torch.save(payload, fh))
    return os.path.getsize(path)


def load(path: Path, device: torch.device) -> dict[str, Any]:
    """Read a checkpoint written by :func:`save`; ValueError if it is not one."""
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many kinds for a truncated or foreign file
        raise ValueError(f"{path} is not a readable checkpoint ({type(exc).__name__})") from exc
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise ValueError(f"{path} is not a cfl-bench checkpoint of format {FORMAT}")
    state = unpack(payload["state"], device)
    assert isinstance(state, dict)
    return state
