"""The project's layers point one way: a small core, then streams / strategies / leaderboard
side by side, then the engine, run, sweep and CLI on top.

Why a test: an import in the wrong direction is one line in a review and then a knot that
every later change (a vectorized executor, a Flower client, a CARLA stream) has to cut. The
check reads every module's imports with ``ast`` — top-level, inside functions and under
``TYPE_CHECKING`` alike, relative ones resolved — so it needs no import of the project and
cannot be fooled by lazy imports.

The rules:

1. A core module imports nothing of the project outside the core.
2. ``streams``, ``strategies``, ``leaderboard`` and ``carla_bridge`` import from
   ``cfl_bench`` only core modules (never the engine, run, sweep or CLI).
3. Those four never import one another: a strategy gets stream data (FedProj's public set)
   through ``StrategyEnv``, bound by the run. One exception: ``carla_bridge`` builds the
   CARLA detection streams, so it may import the stream interface ``streams.base`` (and
   nothing else of ``streams``; the catalogue names its builder by string).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("cfl_bench", "streams", "strategies", "leaderboard", "carla_bridge")
SIDE_BY_SIDE = ("streams", "strategies", "leaderboard", "carla_bridge")
# (package, module) pairs rule 3 allows: the CARLA streams implement the stream interface.
ALLOWED_ACROSS = frozenset({("carla_bridge", "streams.base")})

# The core: errors, parsing of user numbers, seeding, atomic writes, the flat model, the
# replay buffer, the state types and traffic counter that components see, evaluation
# primitives, the metric definitions and the run-directory format the leaderboard reads.
CORE = frozenset(
    {
        "cfl_bench",
        "cfl_bench.errors",
        "cfl_bench.text_values",
        "cfl_bench.seeding",
        "cfl_bench.atomic",
        "cfl_bench.flat",
        "cfl_bench.buffer",
        "cfl_bench.metrics",
        "cfl_bench.metric_registry",
        "cfl_bench.records",
        "cfl_bench.run_dir",
        "cfl_bench.run_reader",
        "cfl_bench.run_agreement",
        "cfl_bench.engine",
        "cfl_bench.engine.context",
        "cfl_bench.engine.comm",
        "cfl_bench.engine.payloads",
        "cfl_bench.objective",
        "cfl_bench.engine.evaluation",
    }
)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    """Every module of the five packages, by dotted name."""
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            found[module_name(path)] = path
    return found


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
            if target.split(".")[0] in PACKAGES:
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
        top = name.split(".")[0]
        targets = {owning_module(target, known) for target in imported(path, name)}
        for module in sorted(m for m in targets if m is not None and m != name):
            other = module.split(".")[0]
            if name in CORE and module not in CORE:
                found.append(f"core {name} imports {module}")
            elif top in SIDE_BY_SIDE and other == "cfl_bench" and module not in CORE:
                found.append(f"{name} imports {module}, which is above it")
            elif (top, module) in ALLOWED_ACROSS:
                continue
            elif top in SIDE_BY_SIDE and other in SIDE_BY_SIDE and other != top:
                found.append(f"{name} imports {module}, a side-by-side package")
    return found


def test_layers_point_one_way() -> None:
    assert violations() == []


def test_the_core_exists() -> None:
    """Every module named as core is a real module: a rename cannot silently empty a rule."""
    assert set(modules()) >= CORE


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("from streams.mnist import load_idx_split", ["streams.mnist"]),
        ("import cfl_bench.engine.loop as loop", ["cfl_bench.engine.loop"]),
        ("from . import compose", ["strategies", "strategies.compose"]),
        ("from .base import Component", ["strategies.base"]),
        ("def f():\n    from cfl_bench.run import execute", ["cfl_bench.run"]),
        ("import numpy", []),
    ],
)
def test_the_reader_sees_every_form_of_import(
    source: str, expected: list[str], tmp_path: Path
) -> None:
    path = tmp_path / "fedx.py"
    path.write_text(source, encoding="utf-8")
    known = modules()
    got = sorted({owning_module(t, known) or t for t in imported(path, "strategies.fedx")})
    assert got == sorted(expected)


def test_a_wrong_direction_is_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check fails on the import this issue removed (FedProj reading streams.mnist)."""
    real = modules()
    fake = tmp_path / "strategies" / "fedx.py"
    fake.parent.mkdir()
    fake.write_text("from streams.mnist import load_idx_split\n", encoding="utf-8")
    monkeypatch.setattr(
        __import__(__name__, fromlist=["modules"]),
        "modules",
        lambda: {**real, "strategies.fedx": fake},
    )
    assert violations() == ["strategies.fedx imports streams.mnist, a side-by-side package"]


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


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan), each sorted."""
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


def test_a_cycle_is_found_through_a_function_level_import() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert import_cycles(graph) == [["a", "b", "c"]]
    assert import_cycles({"a": {"b"}, "b": set()}) == []


def test_imports_for_annotations_only_are_not_dependencies(tmp_path: Path) -> None:
    path = tmp_path / "fedx.py"
    path.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from cfl_bench.run import RunPlan\n"
        "def f():\n    from cfl_bench.plan import plan_run\n",
        encoding="utf-8",
    )
    known = modules()
    runs = {owning_module(t, known) for t in imported(path, "strategies.fedx", False)}
    assert runs == {"cfl_bench.plan"}
