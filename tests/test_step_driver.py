"""The local step's order is written once (``cfl_bench/engine/step_driver.py``) and both
executors run it (issue 40, "one step driver").

Two kinds of check: a recording backend stand-in (``RecordingBackend``, not a real
executor) shows what ``StepDriver.step`` calls and in which order, what it passes on and
what it skips; and a source check fails if a second copy of the step order appears: the
strategy's step hooks (``penalty``, ``refine``, the three-argument ``transform``) and the
backend's ``optimizer_step`` may be called from ``step_driver.py`` alone, in every
package the wheel installs.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path
from typing import ClassVar

import torch

from cfl_bench.engine import step_driver
from cfl_bench.engine.one_client import OneClientBackend
from cfl_bench.engine.step_driver import StepBackend, StepDriver
from cfl_bench.engine.vectorized_step import ChunkBackend
from cfl_bench.strategies.base import ClientInputs, Component, Learner, Role
from cfl_bench.strategies.registry import component_classes

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("cfl_bench", "strategies", "streams", "carla_bridge", "leaderboard")
DRIVER = ROOT / "cfl_bench" / "engine" / "step_driver.py"
# The documented order (strategies/base.py, docs/methods.md "One local step").
ORDER = [
    "zero_grad",
    "loss",
    "backward",
    "gradient",
    "penalty:a",
    "penalty:b",
    "view",
    "refine",
    "transform:first",
    "transform:second",
    "optimizer_step",
    "observe",
    "reported",
]


class RecordingBackend:
    """A stand-in for a ``StepBackend`` (no model): it records each call, adds 1 to the
    gradient at each stage so the test sees what was passed on, and reports a step as
    not finite when told to."""

    def __init__(self, log: list[str], finite: bool = True, idle: frozenset[str] = frozenset()):
        self.log, self.finite, self.idle = log, finite, idle
        self.params = torch.zeros(3)
        self.stepped: tuple[torch.Tensor, object] | None = None

    def zero_grad(self) -> None:
        self.log.append("zero_grad")

    def loss(self) -> torch.Tensor:
        self.log.append("loss")
        return torch.tensor(1.0)

    def backward(self, loss: torch.Tensor) -> bool:
        self.log.append("backward")
        return self.finite

    def gradient(self) -> torch.Tensor:
        self.log.append("gradient")
        return torch.zeros(3)

    def inputs(self, name: str) -> ClientInputs | None:
        return None if name in self.idle else {"name": name}

    def view(self) -> object:
        self.log.append("view")
        return "the view"

    def optimizer_step(self, grads: torch.Tensor, finite: torch.Tensor | bool) -> None:
        self.log.append("optimizer_step")
        self.stepped = (grads, finite)

    def observe(self) -> None:
        self.log.append("observe")

    def reported(self, loss: torch.Tensor) -> torch.Tensor:
        self.log.append("reported")
        return loss.detach()


class RecordingLearner(Learner):
    name: ClassVar[str] = "recording-learner"

    def __init__(self, log: list[str]) -> None:
        super().__init__()
        self.log = log

    def refine(self, g: torch.Tensor, view: object) -> torch.Tensor:
        assert view == "the view"
        self.log.append("refine")
        return g + 1


class RecordingTerm(Component):
    roles: ClassVar[frozenset[Role]] = frozenset({Role.LOSS_TERM})

    def __init__(self, label: str, log: list[str]) -> None:
        super().__init__()
        self.label, self.log = label, log

    @property
    def name(self) -> str:  # type: ignore[override]
        return self.label

    def penalty(
        self, params: torch.Tensor, grads: torch.Tensor, inputs: ClientInputs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        assert inputs == {"name": self.label}
        self.log.append(f"penalty:{self.label}")
        return grads + 1, torch.tensor(10.0)

    def transform(self, grads: torch.Tensor, inputs: ClientInputs, step: object) -> torch.Tensor:
        assert step == "the view"
        self.log.append(f"transform:{self.label}")
        return grads * 2


def recording_driver(log: list[str]) -> StepDriver:
    terms = [RecordingTerm("a", log), RecordingTerm("b", log)]
    transforms = [RecordingTerm("first", log), RecordingTerm("second", log)]
    return StepDriver(RecordingLearner(log), terms, transforms)


def test_the_driver_runs_the_documented_order() -> None:
    log: list[str] = []
    backend = RecordingBackend(log)
    loss = recording_driver(log).step(backend)
    assert log == ORDER
    # g: 0 → two penalties (+1 each) → refine (+1) → two transforms (×2 each) = 12.
    assert backend.stepped is not None
    grads, finite = backend.stepped
    assert torch.equal(grads, torch.full((3,), 12.0)) and finite is True
    assert float(loss) == 21.0  # the loss plus both penalties' values


def test_idle_components_are_skipped_and_a_non_finite_step_is_passed_on() -> None:
    log: list[str] = []
    backend = RecordingBackend(log, finite=False, idle=frozenset({"a", "second"}))
    loss = recording_driver(log).step(backend)
    assert log == [s for s in ORDER if s not in ("penalty:a", "transform:second")]
    assert backend.stepped is not None
    grads, finite = backend.stepped
    assert torch.equal(grads, torch.full((3,), 4.0)) and finite is False  # (0+1+1)×2
    assert float(loss) == 11.0


def test_both_executors_backends_implement_the_protocol() -> None:
    members = [
        name
        for name, _ in inspect.getmembers(StepBackend)
        if not name.startswith("_") and name in StepBackend.__dict__
    ]
    assert len(members) == 10
    for backend in (OneClientBackend, ChunkBackend):
        fields = getattr(backend, "__dataclass_fields__", {})
        missing = [m for m in members if not hasattr(backend, m) and m not in fields]
        assert not missing, (backend.__name__, missing)


def step_hook_calls(path: Path) -> list[tuple[str, int]]:
    """Calls in ``path`` of the step hooks: ``.penalty(…)``, ``.refine(…)``,
    ``.optimizer_step(…)`` and ``.transform(g, inputs, view)`` (three arguments: pandas'
    one-argument ``transform`` is not a step hook)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            name, count = node.func.attr, len(node.args) + len(node.keywords)
            if name in ("penalty", "refine", "optimizer_step") or (
                name == "transform" and count == 3
            ):
                found.append((name, node.lineno))
    return found


def test_only_the_step_driver_calls_the_step_hooks() -> None:
    # A second copy of the step order (an executor calling penalties, the learner's refine,
    # the transform chain or the optimizer step itself) fails here.
    elsewhere = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            calls = step_hook_calls(path)
            if calls and path != DRIVER:
                elsewhere[str(path.relative_to(ROOT))] = calls
    assert not elsewhere, elsewhere
    names = {name for name, _ in step_hook_calls(DRIVER)}
    assert names == {"penalty", "refine", "transform", "optimizer_step"}


def test_the_driver_step_calls_the_backend_in_the_documented_order() -> None:
    # The same order, read from the source of ``StepDriver.step`` (what a reader sees).
    tree = ast.parse(inspect.getsource(step_driver))
    step = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "step")
    calls = [
        n.func.attr
        for n in ast.walk(step)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
    ]
    lines = {
        n.func.attr: n.lineno
        for n in ast.walk(step)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
    }
    expected = [
        "zero_grad",
        "loss",
        "backward",
        "penalize",
        "view",
        "refine",
        "transform",
        "optimizer_step",
        "observe",
        "reported",
    ]
    assert set(expected) <= set(calls)
    assert sorted(expected, key=lines.__getitem__) == expected


def test_components_overriding_after_local_declare_it() -> None:
    # The vectorized executor loads a client's row to run ``after_local`` only for
    # components declaring ``uses_after_local``: an undeclared override would be skipped.
    for name, cls in component_classes().items():
        overrides = cls.after_local is not Component.after_local
        assert overrides == cls.uses_after_local, name
