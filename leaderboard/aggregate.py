"""Group runs by (protocol hash, strategy) → one leaderboard row: mean ± sample std over seeds.

Rules, and why:

* Only ``finished`` runs enter means. A diverged run's numbers describe a broken model and
  a failed or incomplete one has none; they are *counted* per row (``n_diverged``,
  ``n_failed``, ``n_incomplete``) and listed in the report, never averaged.
* Mean and **sample** standard deviation (``ddof=1``, specs/metrics.md asks to say which).
  One seed gives no std (NaN: empty in the CSV, "–" in the HTML), never a misleading 0.
* A metric that a finished run lacks (null in its summary) makes the row's mean NaN rather
  than a mean over the seeds that happen to have it, which would mean something else.
* Runs are averaged in (seed, path) order, so the float sums — hence the CSV bytes — do not
  depend on the order of the RUN_DIRS arguments.
* Rows within one protocol are ranked by ``Acc_T_mean`` (best first, NaN last), then by
  strategy name; protocols are ordered by (stream, protocol hash).
* ``packages`` and ``git_commit`` are those of the runs entering the means (all runs of the
  row when none finished); when they disagree, every distinct value is listed (joined by
  `` | ``) and ``provenance_flag`` says what differs, because averaging seeds of different
  code is how irreproducible numbers are made.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from leaderboard.protocol import describe_protocol
from leaderboard.runs import METRICS

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

#: Columns identifying a leaderboard row (targets files select rows with these).
KEY_COLUMNS: tuple[str, ...] = ("protocol_hash", "stream", "scenario", "strategy")
#: Columns of leaderboard.csv, in order.
BOARD_COLUMNS: tuple[str, ...] = (
    *KEY_COLUMNS,
    "n_seeds",
    "seeds",
    *(f"{m}_{stat}" for m in METRICS for stat in ("mean", "std")),
    "n_diverged",
    "n_failed",
    "n_incomplete",
    "protocol",
    "packages",
    "git_commit",
    "provenance_flag",
)
#: The numeric columns a targets file may check.
NUMERIC_COLUMNS: tuple[str, ...] = (
    "n_seeds",
    *(f"{m}_{stat}" for m in METRICS for stat in ("mean", "std")),
    "n_diverged",
    "n_failed",
    "n_incomplete",
)


def packages_text(packages: dict[str, Any]) -> str:
    """``name=version`` pairs sorted by name (``?`` for a package that was not installed)."""
    return " ".join(f"{k}={'?' if v is None else v}" for k, v in sorted(packages.items()))


def _distinct(values: Sequence[str]) -> list[str]:
    return sorted(set(values))


def provenance(group: pd.DataFrame) -> dict[str, str]:
    """``packages``, ``git_commit`` and ``provenance_flag`` cells for one row's runs."""
    packages = _distinct([packages_text(p) for p in group["packages"]])
    commits = _distinct(["unknown" if c is None else str(c) for c in group["git_commit"]])
    flags = []
    if len(packages) > 1:
        flags.append("package versions differ")
    if len(commits) > 1:
        flags.append("git commits differ")
    return {
        "packages": " | ".join(packages),
        "git_commit": " | ".join(commits),
        "provenance_flag": "; ".join(flags),
    }


def _first(values: pd.Series) -> Any:
    present = [v for v in values if v is not None and v == v]
    return present[0] if present else None


def mean_std(values: pd.Series) -> tuple[float, float]:
    """Mean and sample std (ddof=1); NaN if any value is NaN, std NaN below two values."""
    floats = [float(v) for v in values]
    if not floats or any(math.isnan(v) for v in floats):
        return math.nan, math.nan
    mean = math.fsum(floats) / len(floats)
    if len(floats) < 2:
        return mean, math.nan
    variance = math.fsum((v - mean) ** 2 for v in floats) / (len(floats) - 1)
    return mean, math.sqrt(variance)


def finished_runs(group: pd.DataFrame) -> pd.DataFrame:
    """The runs of one row that enter the means, in (seed, path) order."""
    done = group[group["status"] == "finished"]
    return done.sort_values(["seed", "path"], kind="stable")


def aggregate(runs: pd.DataFrame) -> pd.DataFrame:
    """The leaderboard: one row per (protocol hash, strategy), columns :data:`BOARD_COLUMNS`.

    Runs without a protocol hash or strategy (a summary.json alone from a crashed sweep
    member) cannot be placed in a row; they still appear in the report's runs section.
    """
    import pandas as pd

    keyed = runs[runs["protocol_hash"].notna() & runs["strategy"].notna()]
    rows: list[dict[str, Any]] = []
    for (protocol_hash, strategy), group in keyed.groupby(["protocol_hash", "strategy"], sort=True):
        done = finished_runs(group)
        protocol = _first(group["protocol"].map(lambda p: p or None))
        scenario = _first(group["scenario"])
        row: dict[str, Any] = {
            "protocol_hash": protocol_hash,
            "stream": _first(group["stream"]),
            "scenario": scenario,
            "strategy": strategy,
            "n_seeds": len(done),
            "seeds": " ".join(str(int(s)) for s in done["seed"]),
        }
        for metric in METRICS:
            row[f"{metric}_mean"], row[f"{metric}_std"] = mean_std(done[metric])
        for status in ("diverged", "failed", "incomplete"):
            row[f"n_{status}"] = int((group["status"] == status).sum())
        row["protocol"] = describe_protocol(protocol or {}, scenario)
        row.update(provenance(done if len(done) else group))
        rows.append(row)
    board = pd.DataFrame(rows, columns=list(BOARD_COLUMNS))
    if board.empty:
        return board
    board["_missing"] = board["Acc_T_mean"].isna()
    board["_neg_acc"] = -board["Acc_T_mean"].fillna(0.0)
    board = board.sort_values(
        ["stream", "protocol_hash", "_missing", "_neg_acc", "strategy"], kind="stable"
    )
    return board.drop(columns=["_missing", "_neg_acc"]).reset_index(drop=True)


def protocol_json(protocol: dict[str, Any]) -> str:
    """The full protocol as indented, key-sorted JSON (for the report's details blocks)."""
    return json.dumps(protocol, indent=2, sort_keys=True, default=str)


@dataclass
class StrategySeries:
    """Per-task curves and matrices of one strategy in one protocol, averaged over its
    finished seeds (what the report's figures draw)."""

    strategy: str
    n_seeds: int
    acc_t: tuple[np.ndarray, np.ndarray] | None = None
    fgt_t: tuple[np.ndarray, np.ndarray] | None = None
    md_t: tuple[np.ndarray, np.ndarray] | None = None
    acc_task_il_t: tuple[np.ndarray, np.ndarray] | None = None
    fgt_task_il_t: tuple[np.ndarray, np.ndarray] | None = None
    acc_matrix: np.ndarray | None = None
    acc_task_il_matrix: np.ndarray | None = None
    acc_final: tuple[float, float] = (math.nan, math.nan)
    bytes_total: tuple[float, float] = (math.nan, math.nan)


def _stack(values: Sequence[Any]) -> np.ndarray | None:
    """Equal-shaped per-run arrays stacked on axis 0; None when any run lacks the curve or
    shapes disagree (a protocol fixes T, so that would be a damaged run)."""
    import numpy as np

    if not values or any(v is None for v in values):
        return None
    arrays = [np.asarray(v, dtype=float) for v in values]
    if any(a.shape != arrays[0].shape for a in arrays):
        return None
    return np.stack(arrays)


def _curve_stats(values: Sequence[Any]) -> tuple[np.ndarray, np.ndarray] | None:
    """Mean and sample std per task (std NaN for one seed), NaN entries kept as gaps."""
    import numpy as np

    stacked = _stack(values)
    if stacked is None:
        return None
    mean = stacked.mean(axis=0)
    std = stacked.std(axis=0, ddof=1) if stacked.shape[0] > 1 else np.full_like(mean, np.nan)
    return mean, std


def strategy_series(runs: pd.DataFrame, board_rows: pd.DataFrame) -> list[StrategySeries]:
    """One :class:`StrategySeries` per leaderboard row (same order), from the finished runs."""
    out: list[StrategySeries] = []
    for _, row in board_rows.iterrows():
        group = runs[
            (runs["protocol_hash"] == row["protocol_hash"]) & (runs["strategy"] == row["strategy"])
        ]
        done = finished_runs(group)
        series = StrategySeries(strategy=str(row["strategy"]), n_seeds=len(done))
        for name in ("acc_t", "fgt_t", "md_t", "acc_task_il_t", "fgt_task_il_t"):
            setattr(series, name, _curve_stats(list(done[name])))
        for name in ("acc_matrix", "acc_task_il_matrix"):
            stacked = _stack(list(done[name]))
            setattr(series, name, None if stacked is None else stacked.mean(axis=0))
        series.acc_final = (float(row["Acc_T_mean"]), float(row["Acc_T_std"]))
        series.bytes_total = (float(row["bytes_total_mean"]), float(row["bytes_total_std"]))
        out.append(series)
    return out


def row_notes(row: Any) -> str:
    """Counts of runs kept out of the means, and the provenance flag."""
    parts = [
        f"{int(row[f'n_{s}'])} {s}"
        for s in ("diverged", "failed", "incomplete")
        if int(row[f"n_{s}"])
    ]
    if row["provenance_flag"]:
        parts.append(str(row["provenance_flag"]))
    return "; ".join(parts)
