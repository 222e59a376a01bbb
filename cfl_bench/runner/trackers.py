"""Mirror a run's per-round records to experiment trackers: TensorBoard and MLflow, offline.

Why a mirror and not a replacement: ``records.csv`` stays the source of truth (summaries and
the leaderboard are functions of it); a tracker only shows the same numbers in the tool a
researcher already has open. Both write inside the run directory (``tensorboard/`` event
files, an ``mlflow.db`` SQLite store with artifacts under ``mlruns/``), need no server and no
network, and are imported only when ``--log`` asks for them.

What is logged, with the round as the step: every global record — ``acc/task3``,
``acc_task_il/task3``, ``kl_drift/task1``, ``train_loss``, ``bytes_up``, ``bytes_down`` — the
mean accuracy over the tasks trained so far at each evaluation (``acc/avg_seen``), and the
per-client records (``client_acc/client_4``, ``buffer_drift/client_4``). A resumed run logs
the rounds after its checkpoint again, as it computes them again: the values are identical,
so a tracker shows the same curve (MLflow keeps both entries in a metric's history).
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Protocol

from cfl_bench.core.errors import UserError
from cfl_bench.core.metric_registry import ACCURACY_METRICS

TRACKERS = ("tensorboard", "mlflow")
EXTRA = "pip install -e '.[trackers]'"

PlainRow = tuple[Any, ...]  # (round, trained_task, eval_task, scope, metric, float value)


def parse_trackers(text: str) -> tuple[str, ...]:
    """``tensorboard``, ``mlflow`` or ``tensorboard,mlflow``; ValueError("must …") else."""
    names = tuple(part.strip() for part in text.split(","))
    if not names or any(n not in TRACKERS for n in names) or len(set(names)) != len(names):
        raise ValueError("must be tensorboard, mlflow or tensorboard,mlflow")
    return names


def scalars(rows: Iterable[PlainRow]) -> list[tuple[str, float, int]]:
    """(tag, value, step) for every record, plus the mean accuracy over the trained tasks."""
    out: list[tuple[str, float, int]] = []
    seen: dict[tuple[int, str], list[float]] = defaultdict(list)
    for round_index, trained, evaluated, scope, metric, value in rows:
        step, trained, evaluated = int(round_index), int(trained), int(evaluated)
        if scope != "global":
            out.append((f"{metric}/{scope}", float(value), step))
        elif evaluated >= 0:
            out.append((f"{metric}/task{evaluated + 1}", float(value), step))
            if metric in ACCURACY_METRICS and evaluated <= trained:
                seen[(step, metric)].append(float(value))
        else:
            out.append((metric, float(value), step))
    for (step, metric), values in sorted(seen.items()):
        out.append((f"{metric}/avg_seen", sum(values) / len(values), step))
    return out


class Tracker(Protocol):
    def log(self, rows: Sequence[PlainRow]) -> None: ...

    def close(self) -> None: ...


class TensorBoardTracker:
    """Event files under ``<run>/tensorboard`` (``tensorboard --logdir <run>/tensorboard``)."""

    def __init__(self, run_dir: Path, params: dict[str, Any]) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(run_dir / "tensorboard"))
        self.writer.add_text("config", f"```\n{json.dumps(params, indent=1, default=str)}\n```")

    def log(self, rows: Sequence[PlainRow]) -> None:
        for tag, value, step in scalars(rows):
            self.writer.add_scalar(tag, value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class MLflowTracker:
    """A local SQLite store ``<run>/mlflow.db`` (``mlflow ui --backend-store-uri
    sqlite:///<run>/mlflow.db``); one MLflow run per cfl-bench run directory, reopened on
    resume."""

    def __init__(self, run_dir: Path, params: dict[str, Any]) -> None:
        import logging

        from mlflow.tracking import MlflowClient

        for noisy in ("mlflow", "alembic"):  # table creation logs INFO lines on every run
            logging.getLogger(noisy).setLevel(logging.WARNING)

        store = f"sqlite:///{(run_dir / 'mlflow.db').resolve()}"
        self.client = MlflowClient(tracking_uri=store)
        experiment = self.client.get_experiment_by_name("cfl-bench")
        experiment_id = (
            experiment.experiment_id
            if experiment is not None
            else self.client.create_experiment(
                "cfl-bench", artifact_location=(run_dir / "mlruns").resolve().as_uri()
            )
        )
        existing = self.client.search_runs([experiment_id], max_results=1)
        if existing:
            self.run_id = existing[0].info.run_id
        else:
            self.run_id = self.client.create_run(experiment_id, run_name=run_dir.name).info.run_id
            for key, value in sorted(params.items()):
                self.client.log_param(self.run_id, key, str(value)[:500])

    def log(self, rows: Sequence[PlainRow]) -> None:
        from mlflow.entities import Metric

        stamp = int(time.time() * 1000)
        metrics = [
            Metric(key=tag.replace("/", "."), value=value, timestamp=stamp, step=step)
            for tag, value, step in scalars(rows)
        ]
        for start in range(0, len(metrics), 900):  # the store takes ≤ 1000 per batch
            self.client.log_batch(self.run_id, metrics=metrics[start : start + 900])

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


def check_available(names: Sequence[str]) -> None:
    """Refuse a tracker whose package is not installed, before the run starts."""
    import importlib.util

    modules = {"tensorboard": "tensorboard", "mlflow": "mlflow"}
    for name in names:
        if importlib.util.find_spec(modules[name]) is None:
            raise UserError(f"--log {name} needs the {name} package; install it with {EXTRA}.")


def open_trackers(names: Sequence[str], run_dir: Path, params: dict[str, Any]) -> list[Tracker]:
    classes: dict[str, Callable[[Path, dict[str, Any]], Tracker]] = {
        "tensorboard": TensorBoardTracker,
        "mlflow": MLflowTracker,
    }
    return [classes[name](run_dir, params) for name in names]
