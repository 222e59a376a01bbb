"""One-line, human-readable summaries of a protocol (the ``protocol`` dict of config.json).

Why: the protocol hash says *whether* two runs are comparable, but a reader of the
leaderboard needs to see *what* was compared — stream, scenario, tasks, clients,
participation, rounds, epochs, buffer, partition, asynchronous shift — without opening
config.json. Keys the summary does not know are still shown (as ``key=value``), so a new
protocol field can never hide a difference between two leaderboard sections.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

#: Keys rendered by :func:`describe_protocol` in a fixed phrase; everything else is listed
#: as ``key=value`` after them.
_KNOWN = {
    "stream",
    "tasks",
    "classes_per_task",
    "clients",
    "participation",
    "rounds_per_task",
    "epochs",
    "batch_size",
    "buffer_batch_size",
    "buffer_size",
    "buffer_offer",
    "partition",
    "async_shift",
    "lead_rounds",
    "lr",
    "lr_decay",
    "momentum",
    "weight_decay",
    "cutout",
    "model",
    "weighting",
    "train_size",
    "test_size",
    "probe_size",
    "replay_augment",
    "eval_every_round",
    "data",
}


def _value(value: object) -> str:
    """Compact JSON for nested values (sorted keys, so the text is deterministic)."""
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def describe_partition(partition: object) -> str:
    """``shards(shards_per_client=2)`` from the partitioner's description dict."""
    if not isinstance(partition, Mapping):
        return "" if partition is None else str(partition)
    name = str(partition.get("name", "?"))
    options = [
        f"{k}={_value(v)}"
        for k, v in sorted(partition.items())
        if k not in ("name", "remainder") and not isinstance(v, (dict, list))
    ]
    return f"{name}({', '.join(options)})" if options else name


def describe_data(data: object) -> str:
    """``data digits 1437+360 (sha256 671ef426)``: the base data's name, train + test sizes
    and the start of its digest — enough to see that two sections used different data,
    without a 64-character hash in a one-line summary."""
    if not isinstance(data, Mapping) or not {"base", "sizes", "sha256"} <= set(data):
        return f"data={_value(data)}"
    sizes = data["sizes"]
    if isinstance(sizes, Mapping) and {"train", "test"} <= set(sizes):
        counts = f" {sizes['train']}+{sizes['test']}"
    else:
        counts = f" {_value(sizes)}"
    return f"data {data['base']}{counts} (sha256 {str(data['sha256'])[:8]})"


def describe_protocol(protocol: Mapping[str, Any], scenario: str | None = None) -> str:
    """The protocol as one line, e.g. ``rot-digits (domain-il) · 5 tasks · 10 clients ×
    1.0 · 20 rounds/task · 1 epoch · batch 32 · buffer 200 (first_pass) · shards(...)``."""
    if not protocol:
        return "unknown protocol (no config.json)"
    p = dict(protocol)
    parts = [f"{p.get('stream', '?')}" + (f" ({scenario})" if scenario else "")]
    if "tasks" in p:
        per_task = f" × {p['classes_per_task']} classes" if p.get("classes_per_task") else ""
        parts.append(f"{p['tasks']} tasks{per_task}")
    if "clients" in p:
        parts.append(f"{p['clients']} clients × {p.get('participation', 1.0)}")
    if "rounds_per_task" in p:
        parts.append(f"{p['rounds_per_task']} rounds/task")
    if "epochs" in p:
        parts.append(f"{p['epochs']} epoch{'s' if p['epochs'] != 1 else ''}")
    if "batch_size" in p:
        parts.append(f"batch {p['batch_size']}")
    if "buffer_size" in p:
        parts.append(f"buffer {p['buffer_size']} ({p.get('buffer_offer', '?')})")
    if "partition" in p:
        parts.append(describe_partition(p["partition"]))
    if p.get("async_shift"):
        parts.append(f"async shift {p['async_shift']}")
    if p.get("lead_rounds"):
        parts.append(f"first task +{p['lead_rounds']} rounds")
    if "model" in p:
        parts.append(f"model {p['model']}")
    if "lr" in p:
        decay = f" × {p['lr_decay']}/round" if p.get("lr_decay") not in (None, 1.0) else ""
        parts.append(f"lr {p['lr']}{decay}")
    if p.get("momentum"):
        parts.append(f"momentum {p['momentum']}")
    if p.get("weight_decay"):
        parts.append(f"weight decay {p['weight_decay']}")
    if p.get("cutout"):
        parts.append(f"cutout {p['cutout']}")
    if "weighting" in p:
        parts.append(f"weights {p['weighting']}")
    if p.get("train_size") is not None:
        parts.append(f"train {p['train_size']}")
    if p.get("test_size") is not None:
        parts.append(f"test {p['test_size']}")
    if "data" in p:
        parts.append(describe_data(p["data"]))
    parts.extend(f"{k}={_value(v)}" for k, v in sorted(p.items()) if k not in _KNOWN)
    return " · ".join(parts)
