"""The project's layers are folders, and imports point one way between them.

    core  ←  streams · strategies · leaderboard · carla_bridge  ←  engine  ←  runner
          ←  sweep · flower · pilot  ←  reproduce  ←  the command line (cfl_bench/*.py)

Why a test: an import in the wrong direction is one line in a review and then a knot that
every later change (a vectorized executor, a Flower client, a CARLA stream) has to cut. The
check reads every module's imports with ``ast`` — top-level, inside functions and under
``TYPE_CHECKING`` alike, relative ones resolved — so it needs no import of the project and
cannot be fooled by lazy imports.

The rules (``MAY_IMPORT``): each layer package imports only itself and the layers listed for
it. In particular the core imports nothing of the project outside itself; ``streams``,
``strategies``, ``leaderboard`` and ``carla_bridge`` import the core and never one another
(a strategy gets stream data, FedProj's public set, through ``StrategyEnv``), except that
``carla_bridge`` implements the stream interface ``cfl_bench.streams.base``; the engine never
imports the run, and the run never imports an application (Flower's executor entry is
named by string in ``runner.executors``). No import circle exists between modules, nor between
layer packages.

The repository keeps ``streams/``, ``strategies/``, ``leaderboard/`` and ``carla_bridge/`` at
its top, installed as ``cfl_bench.streams`` & co. (``pyproject.toml``'s ``package-dir``);
``FOLDERS`` maps each source folder to its package.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# Source folder → the dotted package it installs as.
FOLDERS = {
    "cfl_bench": "cfl_bench",
    "streams": "cfl_bench.streams",
    "strategies": "cfl_bench.strategies",
    "leaderboard": "cfl_bench.leaderboard",
    "carla_bridge": "cfl_bench.carla_bridge",
}
SIDE_BY_SIDE = ("streams", "strategies", "leaderboard", "carla_bridge")
BELOW_ENGINE = ("core", *SIDE_BY_SIDE)
BELOW_RUNNER = (*BELOW_ENGINE, "engine")
BELOW_APPS = (*BELOW_RUNNER, "runner")
# Layer → the other layers it may import. "cli" is the command line: the modules at the
# root of cfl_bench (cli, carla_cli, carla_demo, __main__), which may import anything.
MAY_IMPORT: dict[str, tuple[str, ...]] = {
    "core": (),
    "streams": ("core",),
    "strategies": ("core",),
    "leaderboard": ("core",),
    "carla_bridge": ("core",),
    "engine": BELOW_ENGINE,
    "runner": BELOW_RUNNER,
    "sweeps": BELOW_APPS,
    "flower": BELOW_APPS,
    "pilot": BELOW_APPS,
    "reproduce": (*BELOW_APPS, "sweeps"),
    "cli": (*BELOW_APPS, "sweeps", "flower", "pilot", "reproduce"),
}
# Single modules a layer may import beyond its rule: the CARLA streams implement the
# stream interface.
ALLOWED_ACROSS = frozenset({("carla_bridge", "cfl_bench.streams.base")})


def module_name(path: Path) -> str:
    """The dotted name ``path`` (a file under one of ``FOLDERS``) installs as."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([FOLDERS[parts[0]], *parts[1:]])


def modules() -> dict[str, Path]:
    """Every module of the project's packages, by dotted name."""
    found = {}
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            found[module_name(path)] = path
    return found


def layer(name: str) -> str | None:
    """The layer of module ``name``: the package under ``cfl_bench`` it lies in, "cli" for
    the modules at the root of ``cfl_bench``, None for the root package itself (its
    ``__init__`` holds only the version and imports nothing)."""
    parts = name.split(".")
    if len(parts) == 1:
        return None
    if len(parts) == 2 and parts[1] not in MAY_IMPORT:
        return "cli"
    return parts[1]


def imported(path: Path, name: str, type_checking: bool = True) -> Iterator[str]:
    """Every project module ``path`` imports (dotted names, relative imports resolved);
    without ``type_checking``, not those under ``if TYPE_CHECKING:`` (never run)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skipped = set() if type_checking else type_checking_nodes(tree)
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            # ``from pkg import mod`` imports the module pkg.mod when it is one.
            targets = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        for target in targets:
            if target.split(".")[0] == "cfl_bench":
                yield target


def type_checking_nodes(tree: ast.AST) -> set[int]:
    """The ids of every node inside an ``if TYPE_CHECKING:`` body (imports for annotations
    only, which never run)."""
    found: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for statement in node.body:
                found.update(id(inner) for inner in ast.walk(statement))
    return found


def owning_module(target: str, known: dict[str, Path]) -> str | None:
    """The project module a dotted import refers to (``pkg.mod.Class`` → ``pkg.mod``)."""
    while target:
        if target in known:
            return target
        target = target.rpartition(".")[0]
    return None


def violations() -> list[str]:
    known = modules()
    found = []
    for name, path in known.items():
        here = layer(name)
        targets = {owning_module(target, known) for target in imported(path, name)}
        for module in sorted(m for m in targets if m is not None and m != name):
            there = layer(module)
            if here is None or there is None or there == here or there in MAY_IMPORT[here]:
                continue
            if (here, module) in ALLOWED_ACROSS:
                continue
            found.append(f"{name} ({here}) imports {module} ({there})")
    return found


def test_layers_point_one_way() -> None:
    assert violations() == []


def test_every_folder_is_a_layer_with_a_rule() -> None:
    """A new package under cfl_bench must be given its place: a folder without a rule would
    be read as the command line and allowed everything."""
    packages = {p.parent.name for p in (ROOT / "cfl_bench").glob("*/__init__.py")}
    assert packages <= set(MAY_IMPORT)
    assert set(MAY_IMPORT) == {*packages, *SIDE_BY_SIDE, "cli"}


def test_the_core_is_a_folder_of_real_modules() -> None:
    """The core holds the shared maths and records; a rename cannot silently empty it."""
    core = {n for n in modules() if layer(n) == "core"}
    assert {
        "cfl_bench.core.errors",
        "cfl_bench.core.metrics",
        "cfl_bench.core.run_dir",
        "cfl_bench.core.context",
        "cfl_bench.core.flat",
    } <= core


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("from cfl_bench.streams.mnist import load_idx_split", ["cfl_bench.streams.mnist"]),
        ("import cfl_bench.engine.loop as loop", ["cfl_bench.engine.loop"]),
        ("from . import compose", ["cfl_bench.strategies", "cfl_bench.strategies.compose"]),
        ("from .base import Component", ["cfl_bench.strategies.base"]),
        ("def f():\n    from cfl_bench.runner.run import execute", ["cfl_bench.runner.run"]),
        ("import numpy", []),
    ],
)
def test_the_reader_sees_every_form_of_import(
    source: str, expected: list[str], tmp_path: Path
) -> None:
    path = tmp_path / "fedx.py"
    path.write_text(source, encoding="utf-8")
    known = modules()
    got = sorted(
        {owning_module(t, known) or t for t in imported(path, "cfl_bench.strategies.fedx")}
    )
    assert got == sorted(expected)


@pytest.mark.parametrize(
    ("module", "source", "expected"),
    [
        (
            "cfl_bench.strategies.fedx",
            "from cfl_bench.streams.mnist import load_idx_split\n",
            "cfl_bench.strategies.fedx (strategies) imports cfl_bench.streams.mnist (streams)",
        ),
        (
            "cfl_bench.engine.fedx",
            "def f():\n    from cfl_bench.runner.plan import plan_run\n",
            "cfl_bench.engine.fedx (engine) imports cfl_bench.runner.plan (runner)",
        ),
        (
            "cfl_bench.core.fedx",
            "from cfl_bench.engine.loop import Federation\n",
            "cfl_bench.core.fedx (core) imports cfl_bench.engine.loop (engine)",
        ),
        (
            "cfl_bench.runner.fedx",
            "from cfl_bench.sweeps.grid import expand\n",
            "cfl_bench.runner.fedx (runner) imports cfl_bench.sweeps.grid (sweeps)",
        ),
    ],
)
def test_a_wrong_direction_is_reported(
    module: str, source: str, expected: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check fails on imports against the arrows (FedProj reading streams.mnist was
    one; the run importing the sweep was another)."""
    real = modules()
    fake = tmp_path / "fedx.py"
    fake.write_text(source, encoding="utf-8")
    monkeypatch.setattr(
        __import__(__name__, fromlist=["modules"]), "modules", lambda: {**real, module: fake}
    )
    assert violations() == [expected]


# -- import cycles -------------------------------------------------------------------------------
def import_graph() -> dict[str, set[str]]:
    """Module → the project modules it imports when it runs: at module level and inside
    functions alike (a lazy import is still a dependency), not under ``TYPE_CHECKING``;
    importing ``a.b.c`` also runs the packages ``a`` and ``a.b``."""
    known = modules()
    graph: dict[str, set[str]] = {}
    for name, path in known.items():
        targets = {owning_module(t, known) for t in imported(path, name, type_checking=False)}
        edges = set()
        for target in targets - {None, name}:
            assert target is not None
            parts = target.split(".")
            edges.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
        graph[name] = {
            m for m in edges if m in known and m != name and not name.startswith(m + ".")
        }
    return graph


def package_graph() -> dict[str, set[str]]:
    """Layer → the layers its modules import (annotations included: a package-level
    circle through types is still a knot for a reader)."""
    known = modules()
    graph: dict[str, set[str]] = {layer_name: set() for layer_name in MAY_IMPORT}
    for name, path in known.items():
        here = layer(name)
        if here is None:
            continue
        for target in imported(path, name):
            module = owning_module(target, known)
            there = None if module is None else layer(module)
            if there is not None and there != here:
                graph[here].add(there)
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                cycles.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


def test_no_module_imports_itself_back() -> None:
    """No import circles: a module that needs another's code must not be needed by it,
    however lazily either imports (the run, the engine, Flower and the cost estimate used to
    form one). A package importing its own package is allowed (the package runs first)."""
    assert import_cycles(import_graph()) == []


def test_no_layer_package_imports_another_back() -> None:
    """No circle between layer packages either (the run used to import the sweep's naming
    and Flower's launcher, both of which import the run)."""
    assert import_cycles(package_graph()) == []


def test_a_cycle_is_found_through_a_function_level_import() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert import_cycles(graph) == [["a", "b", "c"]]
    assert import_cycles({"a": {"b"}, "b": set()}) == []


def test_imports_for_annotations_only_are_not_dependencies(tmp_path: Path) -> None:
    path = tmp_path / "fedx.py"
    path.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from cfl_bench.runner.run import RunPlan\n"
        "def f():\n    from cfl_bench.runner.plan import plan_run\n",
        encoding="utf-8",
    )
    known = modules()
    runs = {owning_module(t, known) for t in imported(path, "cfl_bench.strategies.fedx", False)}
    assert runs == {"cfl_bench.runner.plan"}
