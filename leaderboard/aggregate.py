"""Group runs by (protocol hash, strategy) → one leaderboard row: mean ± std over seeds.

Rules, and why:

* Only ``finished`` runs enter means. A diverged run's numbers describe a broken model, a
  failed or incomplete one has none and a damaged one's cannot be trusted (its files were
  edited or corrupted, see :mod:`leaderboard.runs`); they are *counted* per row
  (``n_diverged``, ``n_failed``, ``n_incomplete``, ``n_damaged``) and listed in the report,
  never averaged.
* Mean and, by default, the **sample** standard deviation (``ddof=1``, the unbiased
  estimate of the seed-to-seed spread); ``std="population"`` gives ``ddof=0`` instead
  (``np.std``'s default, what FedGP's tables report), so numbers can be compared with such
  papers like for like. Which one a board holds is never left implicit: the ``std_kind``
  column, the HTML legends and the terminal caption all say it (docs/metrics.md).
* One seed gives no std under either convention (NaN: empty in the CSV, "–" in the HTML
  and the terminal), never a misleading 0: a single seed has no spread to report, and the
  population formula's 0.0 would read as "perfectly reproducible".
* A metric that a finished run lacks (null in its summary) makes the row's mean NaN rather
  than a mean over the seeds that happen to have it, which would mean something else.
* Runs are averaged in (seed, path) order, so the float sums — hence the CSV bytes — do not
  depend on the order of the RUN_DIRS arguments.
* Rows within one protocol are ranked by ``Acc_T_mean`` (``RANK_BY`` of the metric registry;
  best first by its direction, NaN last), then by strategy name; protocols are ordered by
  (stream, protocol hash).
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

from cfl_bench.core import metric_registry as registry
from cfl_bench.core.errors import UserError
from cfl_bench.leaderboard.protocol import describe_protocol
from cfl_bench.leaderboard.runs import COUNTED_STATUSES, CURVES, MATRICES, METRICS
from cfl_bench.leaderboard.significance import Comparison, ci95_half_width, compare_with_best
from cfl_bench.leaderboard.targets import PROGRESS, check_target, target_hits

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

#: ``--std`` choices → (ddof, the ``std_kind`` text written to the CSV).
STD_KINDS: dict[str, tuple[int, str]] = {
    "sample": (1, "sample (ddof=1)"),
    "population": (0, "population (ddof=0)"),
}
#: The default: the sample std, as the leaderboard always showed.
DEFAULT_STD = "sample"

#: Columns identifying a leaderboard row (targets files select rows with these).
KEY_COLUMNS: tuple[str, ...] = ("protocol_hash", "stream", "scenario", "strategy")
#: Per compared metric (registry.COMPARED): the 95 % CI half-width, the test against the
#: best row, its Holm-adjusted p and whether the row is tied with the best
#: (:mod:`leaderboard.significance`).
COMPARISON_STATS: tuple[str, ...] = ("ci95", "test", "p_vs_best", "tied_best")
COMPARISON_COLUMNS: tuple[str, ...] = tuple(
    f"{m}_{stat}" for m in registry.COMPARED for stat in COMPARISON_STATS
)
#: ``--target``: the target (%), rounds and bytes until a run's average accuracy reached
#: it (means over the finished seeds; empty unless every seed reached it) and how many
#: seeds never did (:mod:`leaderboard.targets`). All empty without ``--target``.
TARGET_COLUMNS: tuple[str, ...] = (
    "target",
    "rounds_to_target_mean",
    "rounds_to_target_std",
    "bytes_to_target_mean",
    "bytes_to_target_std",
    "n_target_not_reached",
)
#: Columns of leaderboard.csv, in order.
BOARD_COLUMNS: tuple[str, ...] = (
    *KEY_COLUMNS,
    "n_seeds",
    "seeds",
    "std_kind",
    *(f"{m}_{stat}" for m in METRICS for stat in ("mean", "std")),
    *COMPARISON_COLUMNS,
    *TARGET_COLUMNS,
    *(f"n_{status}" for status in COUNTED_STATUSES),
    "protocol",
    "packages",
    "git_commit",
    "provenance_flag",
)
#: The numeric columns a targets file may check.
NUMERIC_COLUMNS: tuple[str, ...] = (
    "n_seeds",
    *(f"{m}_{stat}" for m in METRICS for stat in ("mean", "std")),
    *(f"{m}_{stat}" for m in registry.COMPARED for stat in ("ci95", "p_vs_best")),
    *(c for c in TARGET_COLUMNS if c != "target"),
    *(f"n_{status}" for status in COUNTED_STATUSES),
)


def std_ddof(std: str) -> int:
    """The ddof of a ``--std`` choice; a UserError (exit 2, one line) for anything else, so
    a typo can never silently fall back to the other convention."""
    if std not in STD_KINDS:
        raise UserError(
            f"--std {std!r} is not a standard-deviation kind; use 'sample' (ddof=1, the "
            f"default) or 'population' (ddof=0, np.std over seeds, as FedGP reports)."
        )
    return STD_KINDS[std][0]


def std_kind(std: str) -> str:
    """The ``std_kind`` cell, e.g. ``sample (ddof=1)`` (validated like :func:`std_ddof`)."""
    std_ddof(std)
    return STD_KINDS[std][1]


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


def mean_std(values: pd.Series | Sequence[float], ddof: int = 1) -> tuple[float, float]:
    """Mean and std with the given ddof (1 = sample, 0 = population); NaN if any value is
    NaN, std NaN below two values whatever the ddof (one seed has no spread)."""
    floats = [float(v) for v in values]
    if not floats or any(math.isnan(v) for v in floats):
        return math.nan, math.nan
    mean = math.fsum(floats) / len(floats)
    if len(floats) < 2:
        return mean, math.nan
    variance = math.fsum((v - mean) ** 2 for v in floats) / (len(floats) - ddof)
    return mean, math.sqrt(variance)


def finished_runs(group: pd.DataFrame) -> pd.DataFrame:
    """The runs of one row that enter the means, in (seed, path) order."""
    done = group[group["status"] == "finished"]
    return done.sort_values(["seed", "path"], kind="stable")


def aggregate(
    runs: pd.DataFrame, std: str = DEFAULT_STD, target: float | None = None
) -> pd.DataFrame:
    """The leaderboard: one row per (protocol hash, strategy), columns :data:`BOARD_COLUMNS`.

    ``std`` picks the deviation in the ``*_std`` columns (``sample`` or ``population``, see
    :data:`STD_KINDS`); every row's ``std_kind`` names it, so a CSV read on its own says
    which convention it holds. ``target`` (``--target``, %): rounds and bytes until the
    runs' average accuracy reached it (:mod:`leaderboard.targets`). Runs without a protocol
    hash or strategy (a summary.json alone from a crashed sweep member) cannot be placed in
    a row; they still appear in the report's runs section. Each protocol's rows are then
    compared with its best row (:mod:`leaderboard.significance`).
    """
    import pandas as pd

    ddof, kind = std_ddof(std), std_kind(std)
    target = check_target(target)
    keyed = runs[runs["protocol_hash"].notna() & runs["strategy"].notna()]
    rows: list[dict[str, Any]] = []
    for (protocol_hash, strategy), group in keyed.groupby(["protocol_hash", "strategy"], sort=True):
        rows.append(board_row(str(protocol_hash), str(strategy), group, ddof, kind, target))
    board = pd.DataFrame(rows, columns=[*BOARD_COLUMNS, "_by_seed"])
    if board.empty:
        return board.drop(columns=["_by_seed"])
    ranked = registry.metric(registry.RANK_BY)
    rank = f"{ranked.column}_mean"
    board["_missing"] = board[rank].isna()
    board["_rank"] = rank_values(board[rank], ranked.direction)
    board = board.sort_values(
        ["stream", "protocol_hash", "_missing", "_rank", "strategy"], kind="stable"
    ).reset_index(drop=True)
    add_comparisons(board)
    return board.drop(columns=["_missing", "_rank", "_by_seed"])


def board_row(
    protocol_hash: str,
    strategy: str,
    group: pd.DataFrame,
    ddof: int,
    kind: str,
    target: float | None,
) -> dict[str, Any]:
    """One leaderboard row from the runs of one (protocol, strategy), plus ``_by_seed``:
    the compared metrics' values by seed, for :func:`add_comparisons`."""
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
        "std_kind": kind,
    }
    for metric in METRICS:
        row[f"{metric}_mean"], row[f"{metric}_std"] = mean_std(done[metric], ddof)
    progress = list(done[PROGRESS]) if PROGRESS in done else [None] * len(done)
    row.update(target_cells(progress, target, ddof))
    for status in COUNTED_STATUSES:
        row[f"n_{status}"] = int((group["status"] == status).sum())
    row["protocol"] = describe_protocol(protocol or {}, scenario)
    row.update(provenance(done if len(done) else group))
    row["_by_seed"] = {
        m: {int(s): float(v) for s, v in zip(done["seed"], done[m], strict=True)}
        for m in registry.COMPARED
    }
    return row


def target_cells(
    progress: Sequence[Sequence[Any] | None], target: float | None, ddof: int
) -> dict[str, Any]:
    """The :data:`TARGET_COLUMNS` cells of one row from its finished runs' progress lists
    (:mod:`leaderboard.targets`): means empty unless every seed reached the target, and
    every cell empty without a target."""
    nan = math.nan
    if target is None:
        names = ("rounds_to_target", "bytes_to_target")
        cells: dict[str, Any] = {f"{n}_{s}": nan for n in names for s in ("mean", "std")}
        return {"target": nan, **cells, "n_target_not_reached": None}
    hits = target_hits(progress, target)
    reached = [h for h in hits if h is not None]
    missed = len(hits) - len(reached)
    rounds = mean_std([float(r) for r, _ in reached], ddof) if not missed else (nan, nan)
    spent = mean_std([b for _, b in reached], ddof) if not missed else (nan, nan)
    return {
        "target": target,
        "rounds_to_target_mean": rounds[0],
        "rounds_to_target_std": rounds[1],
        "bytes_to_target_mean": spent[0],
        "bytes_to_target_std": spent[1],
        "n_target_not_reached": missed,
    }


def add_comparisons(board: pd.DataFrame) -> None:
    """Fill the :data:`COMPARISON_COLUMNS` of a ranked board (in place) from its
    ``_by_seed`` column: per compared metric, each row's 95 % CI half-width and its
    standing against the best row of its protocol (:mod:`leaderboard.significance`)."""
    by_seed: list[dict[str, dict[int, float]]] = list(board["_by_seed"])
    groups = list(board.groupby("protocol_hash", sort=False).indices.values())
    for metric in registry.COMPARED:
        direction = str(registry.metric(metric).direction)
        results = [Comparison("") for _ in by_seed]
        for rows in groups:
            found = compare_with_best([by_seed[i][metric] for i in rows], direction)
            for i, comparison in zip(rows, found, strict=True):
                results[i] = comparison
        board[f"{metric}_ci95"] = [ci95_half_width(list(v[metric].values())) for v in by_seed]
        board[f"{metric}_test"] = [c.test for c in results]
        board[f"{metric}_p_vs_best"] = [c.p for c in results]
        board[f"{metric}_tied_best"] = [
            "" if c.tied is None else ("true" if c.tied else "false") for c in results
        ]


def rank_values(means: pd.Series, direction: str | None) -> pd.Series:
    """Sort keys putting the best mean first: negated when higher is better (missing means
    are sorted last by the caller and count as 0 here)."""
    if direction not in ("higher", "lower"):
        raise ValueError(f"the ranking metric needs a direction, not {direction!r}")
    filled = means.fillna(0.0)
    return -filled if direction == "higher" else filled


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


def _curve_stats(values: Sequence[Any], ddof: int = 1) -> tuple[np.ndarray, np.ndarray] | None:
    """Mean and std (the board's ddof) per task (std NaN for one seed, as in the table),
    NaN entries kept as gaps."""
    import numpy as np

    stacked = _stack(values)
    if stacked is None:
        return None
    mean = stacked.mean(axis=0)
    std = stacked.std(axis=0, ddof=ddof) if stacked.shape[0] > 1 else np.full_like(mean, np.nan)
    return mean, std


def strategy_series(
    runs: pd.DataFrame, board_rows: pd.DataFrame, std: str = DEFAULT_STD
) -> list[StrategySeries]:
    """One :class:`StrategySeries` per leaderboard row (same order), from the finished runs;
    the curves' bands use the same std kind as the table (``std``)."""
    ddof = std_ddof(std)
    out: list[StrategySeries] = []
    for _, row in board_rows.iterrows():
        group = runs[
            (runs["protocol_hash"] == row["protocol_hash"]) & (runs["strategy"] == row["strategy"])
        ]
        done = finished_runs(group)
        series = StrategySeries(strategy=str(row["strategy"]), n_seeds=len(done))
        for name in CURVES:
            setattr(series, name, _curve_stats(list(done[name]), ddof))
        for name in MATRICES:
            stacked = _stack(list(done[name]))
            setattr(series, name, None if stacked is None else stacked.mean(axis=0))
        series.acc_final = (float(row["Acc_T_mean"]), float(row["Acc_T_std"]))
        series.bytes_total = (float(row["bytes_total_mean"]), float(row["bytes_total_std"]))
        out.append(series)
    return out


def row_notes(row: Any) -> str:
    """Counts of runs kept out of the means, and the provenance flag."""
    parts = [f"{int(row[f'n_{s}'])} {s}" for s in COUNTED_STATUSES if int(row[f"n_{s}"])]
    if row["provenance_flag"]:
        parts.append(str(row["provenance_flag"]))
    return "; ".join(parts)
