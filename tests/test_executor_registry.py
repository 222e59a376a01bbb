"""The executor registry (cfl_bench/runner/executors.py): one entry per ``--executor`` name, the
engine given the executor built from it, and nothing that dispatches on the name.

Why these checks: the names used to be compared as strings across the run, the sweep and
the engine, and the engine read the Flower app's grid from a module global; a new executor
now means one entry, and the CLI must still parse options without importing torch.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from cfl_bench.core.errors import UserError
from cfl_bench.engine.executor import SequentialExecutor
from cfl_bench.runner.config import EXECUTORS
from cfl_bench.runner.executors import EXECUTOR_KINDS, executor_kind
from tests.helpers import digits_federation

ROOT = Path(__file__).resolve().parent.parent


def test_every_configurable_executor_has_an_entry() -> None:
    assert tuple(EXECUTOR_KINDS) == EXECUTORS


def test_importing_the_registry_imports_no_torch() -> None:
    code = "import sys, cfl_bench.runner.executors; print('torch' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert result.stdout.strip() == "False"


def test_the_federation_runs_the_executor_it_is_given() -> None:
    fed = digits_federation("der", executor="vectorized", num_tasks=1)
    assert type(fed.executor).__name__ == "VectorizedExecutor"
    assert fed.clients[0].buffer is not None and fed.clients[0].buffer.stack is not None
    plain = digits_federation("der", num_tasks=1)
    assert type(plain.executor) is SequentialExecutor
    assert plain.clients[0].buffer is not None and plain.clients[0].buffer.stack is None


def test_a_hosted_executor_without_its_host_is_refused() -> None:
    kind = executor_kind("flower")
    assert kind.hosted
    fed = digits_federation("fedavg", num_tasks=1)
    build = kind.for_federation(fed.schedule, host=None)
    with pytest.raises(UserError, match="runs inside a Flower simulation"):
        build.make(fed.executor.trainer)  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "path",
    [
        "cfl_bench/engine/loop.py",
        "cfl_bench/runner/plan.py",
        "cfl_bench/runner/run.py",
        "cfl_bench/sweeps/grid.py",
    ],
)
def test_no_executor_name_is_compared(path: str) -> None:
    """Nothing outside the registry compares ``executor`` with a name."""
    tree = ast.parse((ROOT / path).read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            names = [node.left, *node.comparators]
            words = {n.value for n in names if isinstance(n, ast.Constant)}
            assert not words & set(EXECUTORS), f"{path}:{node.lineno} compares an executor name"


def test_the_engine_reads_no_flower_module_state() -> None:
    for path in (ROOT / "cfl_bench" / "engine").glob("*.py"):
        text = path.read_text(encoding="utf-8")
        assert "server_app" not in text and "_GRID" not in text, path.name
