"""Components written outside cfl-bench: found by a Python entry point in the group
``cfl_bench.components``, or by their import path written in ``--strategy``.

Two ways, because they serve two moments of a method's life:

* **An import path** (``--strategy my_methods.WeightedER:weight=2+fedgp``) needs nothing but a
  module Python can import (installed, or in the current folder): the way to try a method
  written an hour ago. The path is the component's name in the run, so the run's canonical
  strategy name parses back to the same class (a resumed run, a sweep's done points, a
  leaderboard's rows all read that name). A path holds a ``.`` and no built-in name does, and
  ``:`` still starts the options, so the two syntaxes cannot be confused.
* **An entry point** (``[project.entry-points."cfl_bench.components"] my_er =
  "my_methods:WeightedER"``) gives an installed method a short name, ``--strategy my_er+fedgp``,
  shown by ``cfl-bench list strategies`` beside the built-in ones.

Either way the class is an ordinary ``Component`` subclass (a ``Learner`` for a learner) with a
``Declaration`` of its own or inherited from the built-in it subclasses: the same grammar,
options, validation, checkpoints, executors and hashing as a built-in component, because the
suite then handles it exactly as one. A class subclassing a built-in one draws the same random
numbers (``Component.random_stream``), so without changes it gives the built-in's records.

What cannot work is refused in one line before any data is loaded: a module that does not
import, a name it lacks, a class that is no component, roles that contradict the class, an
entry point whose name is a built-in component's or is not writable in ``--strategy``.

Why this module loads the user's code only when asked: the entry points are listed by name
(``importlib.metadata``, no import), and a plugin's module is imported only when a strategy
names it or the listing shows it, so an installed plugin costs a run that does not use it
nothing.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import re
import sys
from dataclasses import replace
from typing import TYPE_CHECKING

from cfl_bench.core.errors import UserError
from cfl_bench.strategies.base import Declaration, Role

if TYPE_CHECKING:
    from cfl_bench.strategies.base import Component

#: The entry-point group a package registers its components in.
ENTRY_POINT_GROUP = "cfl_bench.components"

# A name writable in --strategy: lower-case, as the built-in names (the grammar is case-sensitive).
_NAME = re.compile(r"[a-z][a-z0-9_-]*\Z")
# A dotted import path to a class: at least one '.', every part a Python identifier.
_PATH = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+\Z")


def is_import_path(name: str) -> bool:
    """Whether a component name in a strategy is an import path (it holds a ``.``)."""
    return "." in name


def installed_entry_points(builtin: frozenset[str]) -> dict[str, importlib.metadata.EntryPoint]:
    """The installed plugins by name, without importing them; refuses a name that clashes
    with a built-in component or another plugin, or cannot be written in ``--strategy``."""
    found: dict[str, importlib.metadata.EntryPoint] = {}
    for point in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        where = f"the entry point '{point.name} = {point.value}' (group {ENTRY_POINT_GROUP})"
        if point.name in builtin:
            raise UserError(
                f"{where} clashes with the built-in component '{point.name}'; rename the entry "
                f"point in its package and reinstall it."
            )
        if not _NAME.match(point.name):
            raise UserError(
                f"{where} has a name --strategy cannot write (lower-case letters, digits, '_' "
                f"and '-', starting with a letter); rename it and reinstall its package."
            )
        if point.name in found and found[point.name].value != point.value:
            raise UserError(
                f"{where} and '{point.name} = {found[point.name].value}' share one name; "
                f"uninstall one of the two packages or rename one entry point."
            )
        found[point.name] = point
    return found


def load_entry_point(point: importlib.metadata.EntryPoint) -> type[Component]:
    """The class an entry point names, checked (``checked_component``)."""
    where = f"entry point '{point.name} = {point.value}'"
    try:
        loaded = point.load()
    except Exception as exc:  # the user's module: any failure is theirs to fix, in one line
        raise UserError(f"loading the {where} failed: {_one_line(exc)}; fix its module.") from None
    return checked_component(loaded, where)


def load_import_path(path: str) -> type[Component]:
    """The class at ``package.module.Class``, checked (``checked_component``); the current
    folder is searched too, as ``python -m`` does, so a method in ``./my_methods.py`` needs
    no install."""
    if not _PATH.match(path):
        raise UserError(
            f"component {path!r} is neither a component name nor an import path "
            f"(module.Class, e.g. my_methods.WeightedER)."
        )
    module_name, _, attribute = path.rpartition(".")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and module_name.startswith(exc.name):
            raise UserError(
                f"cannot import module '{module_name}' for strategy component '{path}'; "
                f"install its package, or run from the folder that holds {exc.name}.py."
            ) from None
        raise UserError(f"importing '{module_name}' failed: {_one_line(exc)}.") from None
    except Exception as exc:  # the user's module: any failure is theirs to fix, in one line
        raise UserError(f"importing '{module_name}' failed: {_one_line(exc)}.") from None
    if not hasattr(module, attribute):
        raise UserError(f"module '{module_name}' has no '{attribute}'; check the name in '{path}'.")
    return checked_component(getattr(module, attribute), f"'{path}'")


def checked_component(loaded: object, where: str) -> type[Component]:
    """``loaded`` when it is a usable component class: a ``Component`` subclass with a
    declaration (its own or a built-in parent's) whose learner role matches the class."""
    from cfl_bench.strategies.base import Component, Learner

    if not isinstance(loaded, type) or not issubclass(loaded, Component):
        kind = type(loaded).__name__ if not isinstance(loaded, type) else "class"
        raise UserError(
            f"{where} is a {kind}, not a cfl-bench component; subclass "
            f"cfl_bench.plugin.Learner (a learner) or cfl_bench.plugin.Component and give it a "
            f"declaration (docs/plugins.md)."
        )
    declaration = loaded.declaration
    if declaration is None:
        raise UserError(
            f"{where} has no declaration; give the class a "
            f"`declaration = Declaration(name=..., roles=...)` (docs/plugins.md)."
        )
    is_learner = issubclass(loaded, Learner)
    if is_learner != (Role.LEARNER in declaration.roles):
        has = "is" if is_learner else "is not"
        says = "lists" if Role.LEARNER in declaration.roles else "lacks"
        raise UserError(
            f"{where} {has} a Learner subclass but its declaration {says} Role.LEARNER; "
            f"make the two agree."
        )
    return loaded


def bound_declaration(name: str, cls: type[Component]) -> Declaration:
    """The declaration a plugin runs under: its class's, named as the strategy names it
    (the entry point's name, or the import path) and targeting the class."""
    assert cls.declaration is not None  # checked_component refuses a class without one
    target = f"{cls.__module__}:{cls.__qualname__}"
    return replace(cls.declaration, name=name, target=target)


def bound_class(cls: type[Component], declaration: Declaration) -> type[Component]:
    """A subclass of ``cls`` that takes ``declaration`` (its name in this run), so the
    component reports, records and keys its state by that name; its random numbers stay
    ``cls``'s (``Component.random_stream`` is inherited)."""
    namespace = {
        "declaration": declaration,
        "__module__": cls.__module__,
        "__qualname__": cls.__qualname__,
        "__doc__": cls.__doc__,
    }
    return type(cls.__name__, (cls,), namespace)


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
