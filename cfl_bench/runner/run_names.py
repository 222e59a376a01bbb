"""A run's identity as a folder name: the request that identifies it and the name
``<stream>_<strategy>_s<seed>[_<key>-<value>...]-<hash8>``.

Why its own module, below the sweep: `cfl-bench run` names its default folder exactly as
`cfl-bench sweep` names the same request's grid point, so the run (``plan.default_out``)
and the sweep (``sweep.grid``) share these rules; here the run layer does not import the
sweep application that sits above it.
"""

from __future__ import annotations

import re
from typing import Any

from cfl_bench.runner.config import RunConfig, option_specs

# Keys the sweep owns: every point writes to its own directory, never overwrites others and
# resumes an interrupted point from its checkpoint.
SWEEP_OWNED = frozenset({"out", "overwrite", "restart"})
# Protocol options added after points were first named: absent from a point's request at
# their defaults, so the points of existing sweeps (and the shipped reproductions' run
# folders, which ``reproduce`` finds by name) keep their names.
LATER_OPTIONS = (
    "arrivals",
    "heads",
    "task_order",
    "classes_per_task",
    "lr_schedule",
    "lr_end",
    "class_order",
)
NAME_KEYS = ("stream", "strategy", "seed")


def slug(text: str, limit: int = 80) -> str:
    """Directory-safe text, sanitised by the same rule as run directory names."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-")[:limit] or "run"


def point_request(config: RunConfig) -> dict[str, Any]:
    """What identifies a point: every option but the sweep's own; options that only change
    how a run executes (checkpoints), and the ``LATER_OPTIONS``, count only when set, so
    adding such an option to the suite never renames the points of existing sweeps."""
    defaults = RunConfig()
    specs = option_specs()
    return {
        k: v
        for k, v in config.to_dict().items()
        if k not in SWEEP_OWNED
        and not ((specs[k].execution or k in LATER_OPTIONS) and v == getattr(defaults, k))
    }


def point_name(request: dict[str, Any], varying: dict[str, Any], request_hash: str) -> str:
    """``<stream>_<strategy>_s<seed>[_<key>-<value>...]-<hash8>``."""
    parts = [str(request["stream"]), str(request["strategy"]), f"s{request['seed']}"]
    parts += [f"{k}-{_text(v)}" for k, v in varying.items() if k not in NAME_KEYS]
    return f"{slug('_'.join(parts))}-{request_hash[:8]}"


def _text(value: object) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    return "none" if value is None else str(value)
