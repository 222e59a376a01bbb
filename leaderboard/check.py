"""Reproduction checks: compare leaderboard cells with a table of target values.

Why: a table of expected results (a paper's numbers, last release's numbers) becomes a test
— ``cfl-bench leaderboard runs/ --out lb --check targets.csv`` exits 0 when every target
is met, 1 on any miss, 2 when the targets file itself is malformed.

Targets file (CSV, UTF-8 with or without a byte-order mark, a header row; blank lines and
lines starting with ``#`` skipped):

=============== ==========================================================================
column          meaning
=============== ==========================================================================
protocol_hash   selects rows by protocol hash; a prefix of the hash is enough
stream          selects rows by stream name (exact)
scenario        selects rows by scenario (``class-il``, ``domain-il``; exact)
strategy        selects rows by strategy name (exact, e.g. ``der+fedgp``)
metric          a numeric leaderboard.csv column (``Acc_T_mean``, ``Fgt_T_std``,
                ``n_seeds``…); a bare metric name (``Acc_T``) means its ``_mean``;
                ``*_std`` cells are of the kind chosen with ``--std`` (sample by
                default, population for papers that report ``np.std``)
target          the expected value (a number)
tolerance       allowed absolute deviation, ≥ 0: met when |value − target| ≤ tolerance
note            optional free text, shown next to a miss
=============== ==========================================================================

``metric``, ``target`` and ``tolerance`` are required, plus at least one selector column;
an empty selector cell matches anything. Each target must select exactly one leaderboard
row: none ("no row") or several ("ambiguous", add ``protocol_hash``) count as misses, as
does a missing value (no finished seed, or a metric the runs did not record). Example::

    stream,strategy,metric,target,tolerance,note
    rot-digits,fedavg,Acc_T,61.2,1.5,FedAvg baseline
    rot-digits,der+fedgp,n_seeds,3,0,
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from cfl_bench.core.errors import UserError
from cfl_bench.core.run_dir import os_problem
from cfl_bench.leaderboard.aggregate import NUMERIC_COLUMNS
from cfl_bench.leaderboard.runs import METRICS

if TYPE_CHECKING:
    import pandas as pd

SELECTORS: tuple[str, ...] = ("protocol_hash", "stream", "scenario", "strategy")
REQUIRED: tuple[str, ...] = ("metric", "target", "tolerance")
OPTIONAL: tuple[str, ...] = ("note",)


@dataclass(frozen=True)
class Target:
    """One line of a targets file."""

    line: int
    selectors: dict[str, str]
    metric: str
    target: float
    tolerance: float
    note: str = ""

    def describe(self) -> str:
        """``stream=rot-digits strategy=fedavg`` — which rows the target selects."""
        return " ".join(f"{k}={v}" for k, v in self.selectors.items() if v) or "(all rows)"


@dataclass(frozen=True)
class Outcome:
    """The result of checking one target."""

    target: Target
    value: float | None
    met: bool
    reason: str = field(default="")


def _number(text: str, column: str, line: int, path: Path) -> float:
    """A finite number: ``inf`` / ``nan`` would make a target that can never be met (or one
    that is always met), which is no test at all."""
    try:
        value = float(text)
    except ValueError:
        raise UserError(
            f"{path} line {line}: {column} {text!r} is not a number; write a plain number."
        ) from None
    if not math.isfinite(value):
        raise UserError(
            f"{path} line {line}: {column} {text!r} is not a finite number; write a plain "
            f"number such as 61.2."
        )
    return value


def _metric_column(name: str, line: int, path: Path) -> str:
    column = f"{name}_mean" if name in METRICS else name
    if column not in NUMERIC_COLUMNS:
        raise UserError(
            f"{path} line {line}: unknown metric {name!r}; use a numeric leaderboard.csv column "
            f"such as Acc_T_mean, Fgt_T_std, bytes_total_mean or n_seeds."
        )
    return column


def _read_text(path: Path) -> str:
    """The text of a targets file, or a UserError saying what the path is instead. A UTF-8
    byte-order mark (spreadsheets write one) is dropped, so the first column keeps its name."""
    try:
        if path.is_dir():
            raise UserError(
                f"targets file {path} is a directory, not a file; pass the path of a CSV file."
            )
        raw = path.read_bytes()
    except FileNotFoundError:
        raise UserError(f"targets file {path} does not exist; pass the path of a CSV.") from None
    except OSError as exc:
        raise UserError(
            f"cannot read targets file {path} ({os_problem(exc)}); check its permissions or "
            f"pass another file."
        ) from None
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise UserError(
            f"targets file {path} is not UTF-8 text (byte {exc.start}); save it as a UTF-8 CSV."
        ) from None


def _header_problem(header: list[str]) -> str:
    """What is wrong with a targets file's header (the first problem), or ""."""
    allowed = (*SELECTORS, *REQUIRED, *OPTIONAL)
    unknown = [h for h in header if h not in allowed]
    missing = [h for h in REQUIRED if h not in header]
    twice = sorted({h for h in header if header.count(h) > 1})
    if unknown:
        return f"{unknown[0]!r} is not a known column"
    if missing:
        return f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} missing"
    if twice:
        return f"{twice[0]!r} appears twice"
    if not any(h in SELECTORS for h in header):
        return "no column selects leaderboard rows"
    return ""


def read_targets(path: str | Path) -> list[Target]:
    """Parse and validate a targets file; any problem is a UserError (exit code 2)."""
    if str(path) == "":  # Path("") would be the current folder
        raise UserError("--check is empty; pass the path of a targets CSV file.")
    path = Path(path)
    text = _read_text(path)
    if "\x00" in text:
        raise UserError(
            f"targets file {path} holds NUL bytes, so it is not a text CSV; pass a CSV file "
            f"saved as UTF-8 text."
        )
    numbered = [
        (number, line)
        for number, line in enumerate(text.splitlines(), start=1)
        if line.strip() and not line.lstrip().startswith("#")
    ]
    if not numbered:
        raise UserError(f"targets file {path} is empty; add a header and at least one target.")
    reader = csv.reader([line for _, line in numbered])
    try:
        rows = list(reader)
    except csv.Error as exc:
        raise UserError(f"targets file {path} is not valid CSV ({exc}); fix its quoting.") from None
    header = [h.strip() for h in rows[0]]
    problem = _header_problem(header)
    if problem:
        raise UserError(
            f"targets file {path} has columns {', '.join(header) or 'none'}, so {problem}; it "
            f"needs metric, target, tolerance and at least one of {', '.join(SELECTORS)} "
            f"(optional: note), each once."
        )
    targets: list[Target] = []
    for (line, _), cells in zip(numbered[1:], rows[1:], strict=True):
        if len(cells) != len(header):
            raise UserError(
                f"{path} line {line}: {len(cells)} cells for {len(header)} columns; "
                f"give one value per column (empty for any)."
            )
        record = dict(zip(header, (c.strip() for c in cells), strict=True))
        tolerance = _number(record["tolerance"], "tolerance", line, path)
        if tolerance < 0:
            raise UserError(
                f"{path} line {line}: tolerance must be ≥ 0, not {tolerance:g}; write the "
                f"allowed absolute deviation, e.g. 0.5."
            )
        targets.append(
            Target(
                line=line,
                selectors={k: record[k] for k in SELECTORS if k in record},
                metric=_metric_column(record["metric"], line, path),
                target=_number(record["target"], "target", line, path),
                tolerance=tolerance,
                note=record.get("note", ""),
            )
        )
    if not targets:
        raise UserError(f"targets file {path} has a header but no targets; add target rows.")
    return targets


def _matches(board: pd.DataFrame, selectors: dict[str, str]) -> pd.Series:
    import pandas as pd

    mask = pd.Series(True, index=board.index)
    for column, wanted in selectors.items():
        if not wanted:
            continue
        values = board[column].astype("string").fillna("")
        if column == "protocol_hash":
            mask &= values.str.startswith(wanted)
        else:
            mask &= values == wanted
    return mask


def check_targets(board: pd.DataFrame, targets: list[Target]) -> list[Outcome]:
    """Check every target against the leaderboard (see the module docstring's rules)."""
    outcomes: list[Outcome] = []
    for t in targets:
        rows = board[_matches(board, t.selectors)]
        if len(rows) == 0:
            outcomes.append(Outcome(t, None, False, "no leaderboard row matches"))
            continue
        if len(rows) > 1:
            reason = f"ambiguous: {len(rows)} rows match; add protocol_hash or strategy"
            outcomes.append(Outcome(t, None, False, reason))
            continue
        value = float(rows.iloc[0][t.metric])
        if math.isnan(value):
            outcomes.append(Outcome(t, None, False, "no value (no finished seed or not recorded)"))
            continue
        deviation = abs(value - t.target)
        met = deviation <= t.tolerance
        reason = "" if met else f"off by {deviation:.4g} > tolerance {t.tolerance:g}"
        outcomes.append(Outcome(t, value, met, reason))
    return outcomes
