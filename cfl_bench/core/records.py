"""The tidy record files of a run: ``records.csv`` and ``costs.csv``, appended round by round.

Why appended as rounds finish: a run killed after an hour still shows its progress, and a
resumed run continues the same files. Each checkpoint stores the files' byte lengths at that
round end; resuming truncates them back to those lengths, so rows written after the last
checkpoint (perhaps half a line when the process was killed mid-write) are dropped and
written again — the finished file is byte-identical to an uninterrupted run's.

``records.csv`` holds only deterministic measurements (same seed and thread count → identical
file on CPU); wall time and memory live in ``costs.csv`` with the same columns, because time
is never reproducible. Every value is written as the shortest text that reads back as the
same double (``repr``), and read back exactly (see :func:`read_rows`), so the summary computed
from the file equals the one computed from the values in memory.
"""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

import pandas as pd
import torch

from cfl_bench.core.atomic import atomic_write_text
from cfl_bench.core.metrics import RECORD_COLUMNS
from cfl_bench.core.run_reader import read_rows

# The tidy long-format columns are defined once, beside the metrics that read them.
COLUMNS = RECORD_COLUMNS
RECORDS = "records.csv"
COSTS = "costs.csv"

# (round, trained_task, eval_task, scope, metric, value); value may be a 0-d tensor.
Row = tuple[int, int, int, str, str, object]


def plain_rows(rows: Sequence[Row]) -> list[Row]:
    """Rows with tensor values turned into Python floats in one device→host transfer."""
    tensors = {i: v for i, r in enumerate(rows) if isinstance(v := r[5], torch.Tensor)}
    values: list[object] = [r[5] for r in rows]
    if tensors:
        stacked = torch.stack([t.detach().float().cpu() for t in tensors.values()])
        for i, v in zip(tensors, stacked.tolist(), strict=True):
            values[i] = v
    return [(*r[:5], v) for r, v in zip(rows, values, strict=True)]


def format_value(value: object) -> str:
    """Every value as a float's repr: the value column is numeric, so ints read as floats."""
    if isinstance(value, torch.Tensor):
        value = value.item()
    # A Row's value is typed object (the engine's RunOutcome records); it holds numbers and
    # 0-d tensors only. To go when Row's value is typed ``float | torch.Tensor``.
    return repr(float(value))  # type: ignore[arg-type]


def csv_text(rows: Iterable[Sequence[object]], header: bool = False) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    if header:
        writer.writerow(COLUMNS)
    for r in rows:
        writer.writerow([r[0], r[1], r[2], r[3], r[4], format_value(r[5])])
    return buf.getvalue()


class RecordLog:
    """The two record files of one run directory, opened for appending."""

    def __init__(self, directory: Path) -> None:
        self.paths = {name: directory / name for name in (RECORDS, COSTS)}

    def start(self) -> None:
        """Fresh files holding only the header (any old content is replaced atomically)."""
        for path in self.paths.values():
            atomic_write_text(path, csv_text([], header=True))

    def append(self, records: Sequence[Row], costs: Sequence[Row]) -> None:
        for name, rows in ((RECORDS, records), (COSTS, costs)):
            if rows:
                with open(self.paths[name], "a", encoding="utf-8", newline="") as fh:
                    fh.write(csv_text(plain_rows(rows)))

    def sync(self) -> dict[str, int]:
        """Flush both files to disk; their byte lengths (what a checkpoint remembers)."""
        sizes = {}
        for name, path in self.paths.items():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            sizes[name] = path.stat().st_size
        return sizes

    def truncate(self, sizes: dict[str, int]) -> None:
        """Cut both files back to the lengths a checkpoint recorded."""
        for name, path in self.paths.items():
            size = int(sizes[name])
            if not path.is_file() or path.stat().st_size < size:
                raise ValueError(f"{path} is shorter than at the checkpoint")
            os.truncate(path, size)

    def read(self, name: str = RECORDS) -> pd.DataFrame:
        return read_rows(self.paths[name])
