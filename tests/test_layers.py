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


def imported(path: Path, name: str) -> Iterator[str]:
    """Every project module ``path`` imports (dotted names, relative imports resolved)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
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
