"""What the data-free learners' tests (TARGET, LANDER, MFCL) share: a tiny CIFAR-10 folder,
the CLI arguments of a tiny run, the configuration of a 2-task run for the resume tests,
and one client step's loss through the engine's one-client backend.

Why a module: the three learners are tested the same way at the run level (a tiny run on
seq-cifar10 with a BatchNorm CNN, a crash or a kill in the middle, the refusals), and each
copy of these pieces would drift on its own."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, cast

import pytest
import torch

from cfl_bench.engine.amp import Precision
from cfl_bench.engine.one_client import ClientStepFunctions, OneClientBackend
from tests.synthetic_data import write_tiny_cifar10

if TYPE_CHECKING:
    from cfl_bench.core.context import StepContext
    from cfl_bench.core.flat import FlatModel
    from cfl_bench.engine.optim import LocalOptimizer
    from cfl_bench.strategies.base import Learner


@pytest.fixture(scope="module")
def cifar_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CIFAR-10 folder of 40 training and 20 test images (the real file layout)."""
    root = tmp_path_factory.mktemp("cifar-format")
    write_tiny_cifar10(root, n=40, n_test=20)
    return root


def run_args(root: Path, out: Path, strategy: str, *extra: str) -> list[str]:
    """`cfl-bench run` of ``strategy`` on 2 tasks × 1 round, 2 clients, the cifar-cnn."""
    return [
        "run",
        *("--stream", "seq-cifar10", "--data-root", str(root), "--model", "cifar-cnn"),
        *("--strategy", strategy, "--tasks", "2", "--rounds-per-task", "1", "--epochs", "1"),
        *("--clients", "2", "--threads", "1", "--out", str(out), *extra),
    ]


def two_task_values(root: Path, strategy: str, model: str = "cifar-cnn") -> dict[str, object]:
    """A run's configuration of 2 tasks × 2 rounds (round 2 ends task 0: the server's
    synthesis; round 3 is task 1's first), checkpointed every round."""
    return {
        "stream": "seq-cifar10",
        "data_root": str(root),
        "model": model,
        "strategy": strategy,
        "tasks": 2,
        "rounds_per_task": 2,
        "clients": 2,
        "epochs": 1,
        "threads": 1,
        "checkpoint_every": 1,
    }


def engine_loss(model: FlatModel, learner: Learner, step: StepContext) -> torch.Tensor:
    """The loss the step driver's one-client backend builds for ``step`` (the learner as
    its own loss term), the model in training mode; no optimizer: the loss alone is checked."""
    no_optimizer = cast("LocalOptimizer", None)
    functions = ClientStepFunctions(model)
    backend = OneClientBackend(model, no_optimizer, learner, [learner], functions, Precision())
    backend.current = step
    model.module.train()
    return backend.loss()
