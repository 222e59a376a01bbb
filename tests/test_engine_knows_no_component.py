"""The engine and the cost estimate know no strategy component: no module under
``cfl_bench/engine/`` nor ``cfl_bench/runner/cost.py`` names one in its code (docstrings may cite
methods) or imports a component's module, so nothing there can dispatch on a component's
name or type — a new method is one module plus its declaration row.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import cfl_bench
from cfl_bench.strategies.registry import component_classes

ROOT = Path(cfl_bench.__file__).parent
CHECKED = sorted([*ROOT.joinpath("engine").glob("*.py"), ROOT / "runner" / "cost.py"])
# The strategy modules that define the contract, not a component: what the engine may import.
CONTRACT = {
    "cfl_bench.strategies.base",
    "cfl_bench.strategies.compose",
    "cfl_bench.strategies.replay",
    "cfl_bench.strategies.projection",
    "cfl_bench.strategies.roles",
}


# Names a module may write as something other than a component: ``--arrivals glfc`` is GLFC's
# clients-joining protocol (a preset of engine/arrivals.py, named after the paper like the
# ``glfc`` learner); the engine reads it from --arrivals, never from the strategy.
PROTOCOL_NAMES: dict[str, set[str]] = {"arrivals.py": {"glfc"}}


def docstring_nodes(tree: ast.AST) -> set[int]:
    """The ids of the module's, classes' and functions' docstring constants."""
    owners = (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    return {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, owners) and node.body and isinstance(node.body[0], ast.Expr)
    }


def named_components(path: Path) -> set[str]:
    """Component names appearing as words in ``path``'s code strings or identifiers."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip = docstring_nodes(tree)
    words: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            # Hyphenated words are one word: the model "fedavg-cnn" is no component.
            words |= {w.lower() for w in re.findall(r"[A-Za-z][A-Za-z0-9-]*", node.value)}
        elif isinstance(node, ast.Name | ast.Attribute):
            name = node.id if isinstance(node, ast.Name) else node.attr
            words.add(name.lower())
    return words & set(component_classes())


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
    return found


@pytest.mark.parametrize("path", CHECKED, ids=lambda p: p.name)
def test_names_no_component_and_imports_none(path: Path) -> None:
    assert named_components(path) - PROTOCOL_NAMES.get(path.name, set()) == set(), path
    strategy_modules = {m for m in imported_modules(path) if m.startswith("cfl_bench.strategies.")}
    assert strategy_modules <= CONTRACT, strategy_modules - CONTRACT


def test_the_check_sees_a_name_and_an_import(tmp_path: Path) -> None:
    # The same reading finds a name where one is written, so the test above can fail.
    sample = tmp_path / "sample.py"
    sample.write_text(
        'from cfl_bench.strategies.der import DER\nKIND = "fedgp+x"\nMODEL = "fedavg-cnn"\n'
        "if type(learner) is DER:\n    pass\n",
        encoding="utf-8",
    )
    assert named_components(sample) == {"fedgp", "der"}
    assert "cfl_bench.strategies.der" in imported_modules(sample)
