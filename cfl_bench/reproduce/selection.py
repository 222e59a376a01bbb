"""``--row``, ``--column`` and ``--seed``: the part of a table or figure a run starts.

Shared by tables and figures, so both refuse an unknown label or seed with the same sentence.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from cfl_bench.core.errors import UserError
from cfl_bench.reproduce.tables import Scale


def chosen(items: tuple[Any, ...], labels: tuple[str, ...], option: str, name: str) -> Any:
    """The rows or columns named by ``labels`` (all when none), in the file's order."""
    known = [item.label for item in items]
    for label in labels:
        if label not in known:
            raise UserError(
                f"{option} '{label}' is not in {name}; choose from: {'; '.join(known)}."
            )
    return tuple(item for item in items if not labels or item.label in labels)


def with_seeds(
    scales: dict[str, Scale], scale: str, requested: tuple[int, ...], name: str
) -> dict[str, Scale]:
    """``scales`` with ``scale`` cut to the ``requested`` seeds (all when none), in order."""
    seeds = scales[scale].seeds
    unknown = sorted(set(requested) - set(seeds))
    if unknown:
        raise UserError(
            f"--seed {unknown[0]} is not a seed of {name} at scale {scale}; choose from "
            f"{', '.join(map(str, seeds))}."
        )
    kept = tuple(s for s in seeds if s in requested) if requested else seeds
    return {**scales, scale: replace(scales[scale], seeds=kept)}
