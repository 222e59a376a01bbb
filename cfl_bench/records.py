"""Run directories: ``config.json``, ``records.csv``, ``costs.csv``, ``summary.json``.

Why these files and this order: ``config.json`` is written first, the tidy records as tasks
finish, ``summary.json`` last; every file is written to a temporary name and renamed, so a
killed run never leaves a half-written file, and a run is complete exactly when
``summary.json`` exists with ``status`` "finished" (or "diverged") and the config hash of the
directory's ``config.json``.

``records.csv`` holds only deterministic measurements (same seed → identical file on CPU);
wall time and memory live in ``costs.csv`` with the same columns, because time is never
reproducible.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
from collections.abc import Iterable
from pathlib import Path

import torch

from cfl_bench.atomic import atomic_write_json, atomic_write_text
from cfl_bench.errors import UserError
from cfl_bench.metrics import RECORD_COLUMNS

# The tidy long-format columns are defined once, beside the metrics that read them.
COLUMNS = RECORD_COLUMNS


def _plain(value: object) -> object:
    if isinstance(value, torch.Tensor):
        return value.item()
    return value


def format_value(value: object) -> str:
    """Shortest text that reads back as the same float (repr), ints as ints."""
    value = _plain(value)
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, int):
        return str(value)
    return repr(float(value))  # type: ignore[arg-type]


def records_csv(rows: Iterable[tuple[object, ...]]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(COLUMNS)
    for r in rows:
        writer.writerow([r[0], r[1], r[2], r[3], r[4], format_value(r[5])])
    return buf.getvalue()


class RunDirectory:
    """The on-disk home of one run."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    @property
    def summary_path(self) -> Path:
        return self.path / "summary.json"

    @property
    def config_path(self) -> Path:
        return self.path / "config.json"

    def is_complete(self) -> bool:
        try:
            summary = json.loads(self.summary_path.read_text())
        except (OSError, json.JSONDecodeError):
            return False
        return summary.get("status") in ("finished", "diverged")

    def prepare(self, config_hash: str, overwrite: bool) -> None:
        """Refuse to mix a new run into a directory holding something else."""
        if self.path.exists() and not self.path.is_dir():
            raise UserError(f"--out '{self.path}' is a file; give a directory path.")
        if self.path.is_dir() and any(self.path.iterdir()):
            old_hash = None
            with contextlib.suppress(OSError, json.JSONDecodeError):
                old_hash = json.loads(self.config_path.read_text()).get("config_hash")
            if old_hash is None:
                raise UserError(
                    f"--out '{self.path}' exists and is not a cfl-bench run directory; "
                    f"choose an empty or new directory."
                )
            if self.is_complete() and not overwrite:
                raise UserError(
                    f"--out '{self.path}' already holds a finished run; pass --overwrite to "
                    f"replace it or choose another --out."
                )
            if old_hash != config_hash and not overwrite:
                raise UserError(
                    f"--out '{self.path}' holds an unfinished run of a different configuration; "
                    f"pass --overwrite to replace it or choose another --out."
                )
            for name in ("summary.json", "records.csv", "costs.csv"):
                (self.path / name).unlink(missing_ok=True)
        self.path.mkdir(parents=True, exist_ok=True)

    def write_config(self, config: dict[str, object]) -> None:
        atomic_write_json(self.config_path, config)

    def write_records(self, rows: Iterable[tuple[object, ...]], name: str = "records.csv") -> None:
        atomic_write_text(self.path / name, records_csv(rows))

    def write_summary(self, summary: dict[str, object]) -> None:
        atomic_write_json(self.summary_path, summary)
