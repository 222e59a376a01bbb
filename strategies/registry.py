"""Name → component: the torch-free declaration table (``strategies.declarations``) and the
classes it names, and the listing shown by ``cfl-bench list strategies``.

Why two levels: the grammar, the listing and the run's canonical name need only the
declarations, which import no torch; a component's class (whose module imports torch at its
top) is imported only when a run builds the strategy (``component_class``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from cfl_bench.strategies.base import Declaration
from cfl_bench.strategies.declarations import TABLE

if TYPE_CHECKING:
    from cfl_bench.strategies.base import Component


def component_table() -> dict[str, Declaration]:
    """Every registered component's declaration by name (built on call: no module-level
    mutable registry)."""
    return {row.name: row for row in TABLE}


def component_class(declaration: Declaration) -> type[Component]:
    """The class a declaration names (imports its module, and so torch)."""
    module, _, name = declaration.target.partition(":")
    cls: type[Component] = getattr(importlib.import_module(module), name)
    if cls.declaration is not declaration:
        raise TypeError(f"{declaration.target} does not take declaration {declaration.name!r}")
    return cls


def component_classes() -> dict[str, type[Component]]:
    """All known components' classes by name (imports every component module)."""
    return {name: component_class(row) for name, row in component_table().items()}


def describe_components() -> list[dict[str, object]]:
    """The listing's rows, from the declarations alone (no torch)."""
    rows: list[dict[str, object]] = []
    for name, row in component_table().items():
        rows.append(
            {
                "name": name,
                "roles": row.role_names(),
                "summary": row.summary,
                "paper": row.paper,
                "options": [
                    {
                        "name": o.name,
                        "default": o.default,
                        "help": o.help,
                        "choices": list(o.choices),
                    }
                    for o in row.option_list
                ],
            }
        )
    return rows
