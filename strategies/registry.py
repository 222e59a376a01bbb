"""Name → component: the torch-free declaration table (``strategies.declarations``) and the
classes it names, the components written outside the package (``strategies.plugins``), and
the listing shown by ``cfl-bench list strategies``.

Why two levels: the grammar, the listing and the run's canonical name need only the
declarations, which import no torch; a component's class (whose module imports torch at its
top) is imported only when a run builds the strategy (``component_class``). A plugin is the
exception: its declaration lives on its class, so naming it imports its module.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from cfl_bench.strategies import plugins
from cfl_bench.strategies.base import Declaration
from cfl_bench.strategies.declarations import TABLE

if TYPE_CHECKING:
    from cfl_bench.strategies.base import Component


TABLE_NAMES = frozenset(row.name for row in TABLE)


def component_table() -> dict[str, Declaration]:
    """Every built-in component's declaration by name (built on call: no module-level
    mutable registry)."""
    return {row.name: row for row in TABLE}


@dataclass
class Catalogue:
    """The components one strategy may name: the built-in table, the installed plugins
    (listed by name; each imported when first named) and import paths (imported when
    named). One catalogue per strategy read, so nothing is cached across calls."""

    builtin: dict[str, Declaration]
    entry_points: dict[str, importlib.metadata.EntryPoint]
    loaded: dict[str, type[Component]] = field(default_factory=dict)

    def names(self) -> list[str]:
        """The names a strategy may write besides import paths, sorted."""
        return sorted({*self.builtin, *self.entry_points})

    def declaration(self, name: str) -> Declaration | None:
        """The declaration of ``name`` (a plugin's is loaded), or None: no such component."""
        if name in self.builtin:
            return self.builtin[name]
        cls = self.plugin_class(name)
        return None if cls is None else cls.declaration

    def plugin_class(self, name: str) -> type[Component] | None:
        """A plugin's class bound to ``name`` (``plugins.bound_class``), loaded once per
        catalogue; None when ``name`` is neither an installed plugin nor an import path."""
        if name not in self.loaded:
            if name in self.entry_points:
                cls = plugins.load_entry_point(self.entry_points[name])
            elif plugins.is_import_path(name):
                cls = plugins.load_import_path(name)
            else:
                return None
            declaration = plugins.bound_declaration(name, cls)
            self.loaded[name] = plugins.bound_class(cls, declaration)
        return self.loaded[name]

    def component_class(self, declaration: Declaration) -> type[Component]:
        """The class to build for a declaration this catalogue gave."""
        if self.builtin.get(declaration.name) is declaration:
            return component_class(declaration)
        cls = self.plugin_class(declaration.name)
        if cls is None or cls.declaration is not declaration:
            raise TypeError(f"{declaration.name!r} is not a component of this catalogue")
        return cls

    def every_declaration(self) -> dict[str, Declaration]:
        """The built-in components and every installed plugin (each loaded), by name."""
        table = dict(self.builtin)
        for name in sorted(self.entry_points):
            cls = self.plugin_class(name)
            assert cls is not None and cls.declaration is not None
            table[name] = cls.declaration
        return table


def catalogue() -> Catalogue:
    """The components this process can name now (entry points listed, none imported)."""
    builtin = component_table()
    return Catalogue(builtin, plugins.installed_entry_points(frozenset(builtin)))


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
    """The listing's rows, from the declarations alone (no torch for the built-in ones; an
    installed plugin's module is imported to read its declaration)."""
    rows: list[dict[str, object]] = []
    for name, row in catalogue().every_declaration().items():
        rows.append(
            {
                "name": name,
                # Where a plugin comes from ("module:Class"); empty for a built-in component.
                "plugin": "" if name in TABLE_NAMES else row.target,
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
