"""A reproducible table: which paper cells, which runs reproduce them, at which scales.

A table file (``reproductions/tables/<name>.yaml``) maps every cell of a printed table to a
run configuration: its **columns** name the targets' dataset + setting and the run options
that column changes (``stream: rot-mnist``); its **rows** name the targets' method + variant
and the strategy string; ``protocol`` holds the options every run shares at the paper's
scale, and each **scale** (``smoke``, ``cpu``, ``paper``) is a documented reduction of that
protocol (options it overrides, the seeds, and, per row, cheaper options of the row's own
methods) that keeps its structure. ``claims`` are the
comparisons the paper draws from the cells (with-vs-without pairs, an upper bound), which
the verdicts test (:mod:`cfl_bench.reproduce.verdict`).

Why YAML beside the targets rather than Python: a reader checks the mapping from a printed
cell to a command line in one place, and a new table is a new file.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cfl_bench.core.errors import UserError
from cfl_bench.reproduce.targets import CellKey, Target, load_targets

SCALES = ("smoke", "cpu", "paper")
TABLE_KEYS = frozenset(
    {
        "paper",
        "targets",
        "table",
        "title",
        "metric",
        "columns",
        "rows",
        "claims",
        "protocol",
        "train_per_task",
        "scales",
        "runs_of",
    }
)
SCALE_KEYS = frozenset({"about", "seeds", "options", "strategies", "measured_s"})
# Options a table may not fix: they say where and how a run executes, not what it is.
RUN_PLACE_OPTIONS = frozenset(
    {"out", "overwrite", "restart", "data_root", "device", "threads", "executor", "seed"}
)


@dataclass(frozen=True)
class Column:
    label: str
    dataset: str
    setting: str
    options: dict[str, Any]
    # The summary metric this column reports (a class-IL table's task-IL column reads the
    # same runs as its class-IL column through another metric). A leading "-" reads the
    # metric negated: FOT's code prints forgetting as a[i][i] - a[T][i] averaged, i.e. -BWT.
    metric: str
    # When set, the column reads the global accuracy recorded after round
    # round(fraction x total rounds) of a static run (records.csv, --eval-every-round)
    # instead of a summary metric: IFA's "Gen. g" columns are rounds g/10 of one run.
    round_fraction: float | None = None
    # The reading's name and rule, where the paper's cell can be read from the same runs
    # more than one way (FedGP's Table 7: the paper's forgetting formula, and the authors'
    # code, which also counts the final evaluation): one column per reading, each named in
    # the report, so no reader mistakes one rule's numbers for the other's.
    reading: str = ""
    # The printed metric's name in the targets file ("FGT (%)"), where the paper's table
    # prints more than one metric per (dataset, setting, method, variant): FOT's README
    # table has an ACC and an FGT cell for each. Empty: the cell is the only one.
    target_metric: str = ""


@dataclass(frozen=True)
class Row:
    label: str
    method: str
    variant: str
    strategy: str
    # validate_strategy(strategy).name: how a run's summary names it.
    canonical: str


@dataclass(frozen=True)
class Scale:
    name: str
    about: str
    seeds: tuple[int, ...]
    options: dict[str, Any]
    # A row's strategy string -> the one this scale runs instead: the same components with
    # cheaper options (FedDF's 500 server steps per round are most of a CPU run's time).
    strategies: dict[str, str] = field(default_factory=dict)
    # The same keys -> validate_strategy(that scale strategy).name, how its summaries name it.
    canonical: dict[str, str] = field(default_factory=dict)
    # The measured wall time (s) of the whole scale, `reproduce NAME --scale S` with --jobs 1
    # (docs/reproductions.md says on which machine and when). For a scale no results are
    # shipped of (the smoke scale): an estimate from a shipped scale by the training work
    # leaves out the fixed costs per run, which are most of a smoke run.
    measured_s: float | None = None


@dataclass(frozen=True)
class Claims:
    pairs: tuple[tuple[str, str], ...]
    upper_bound: str | None


class ScaledProtocol:
    """What tables and figures share: a protocol, its scales, and the rows' strategies at
    each scale (a subclass is a dataclass with ``protocol`` and ``scales`` fields)."""

    protocol: dict[str, Any]
    scales: dict[str, Scale]

    def strategy_at(self, row: Row, scale: str) -> str:
        """The strategy string ``row`` runs at ``scale`` (its own unless the scale changes
        its options)."""
        return self.scales[scale].strategies.get(row.strategy, row.strategy)

    def canonical_at(self, row: Row, scale: str) -> str:
        """How the summaries of ``row``'s runs at ``scale`` name their strategy."""
        return self.scales[scale].canonical.get(row.strategy, row.canonical)

    def base_options(self, scale: str) -> dict[str, Any]:
        """The options every run of ``scale`` shares: the protocol with the scale's changes."""
        return {**self.protocol, **self.scales[scale].options}

    def compared_keys(self) -> set[str]:
        """Every option the protocol or a scale sets: a run's scale is told by all of them."""
        keys = set(self.protocol)
        for scale in self.scales.values():
            keys |= set(scale.options)
        return keys


@dataclass(frozen=True)
class ReproTable(ScaledProtocol):
    """A table as loaded and checked: every cell has its target."""

    name: str
    paper: str
    table: str
    title: str
    columns: tuple[Column, ...]
    rows: tuple[Row, ...]
    claims: Claims
    protocol: dict[str, Any]
    train_per_task: int
    scales: dict[str, Scale]
    targets: dict[tuple[str, str], Target]
    # The table whose runs this one reads (itself, or one with the same protocol whose runs
    # also give this table's metric: FedGP's Table 7 is Table 1's runs' forgetting).
    runs_name: str

    def target(self, row: Row, column: Column) -> Target:
        return self.targets[(row.label, column.label)]

    def column_groups(self) -> list[dict[str, Any]]:
        """The distinct option sets of the columns (columns that read the same runs through
        different metrics share one), in column order: one sweep each."""
        groups: list[dict[str, Any]] = []
        for column in self.columns:
            if column.options not in groups:
                groups.append(column.options)
        return groups

    def runs(self, scale: str) -> int:
        return len(self.column_groups()) * len(self.rows) * len(self.scales[scale].seeds)


def tables_folder(root: Path) -> Path:
    return root / "tables"


def _mapping(value: object, what: str, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise UserError(f"{where}: {what} must be a mapping; fix the table file.")
    return value


def _text(value: object, what: str, where: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise UserError(f"{where}: {what} must be non-empty text; fix the table file.")
    return value


def _check_options(options: dict[str, Any], what: str, where: str) -> dict[str, Any]:
    from cfl_bench.runner.config import field_names

    for key in options:
        if key not in field_names():
            raise UserError(f"{where}: {what} names '{key}', which is not a run option.")
        if key in RUN_PLACE_OPTIONS:
            raise UserError(
                f"{where}: {what} fixes '{key}', which says where a run executes; "
                "`cfl-bench reproduce` sets it."
            )
    return dict(options)


def _columns(raw: object, metric: str, where: str) -> tuple[Column, ...]:
    if not isinstance(raw, list) or not raw:
        raise UserError(f"{where}: columns must be a non-empty list; fix the table file.")
    columns = []
    for item in raw:
        entry = _mapping(item, "a column", where)
        label = _text(entry.get("label"), "a column's label", where)
        fraction = _round_fraction(entry.get("round_fraction"), label, where)
        name = str(entry.get("metric", metric))
        columns.append(
            Column(
                label,
                _text(entry.get("dataset"), f"column '{label}' dataset", where),
                str(entry.get("setting", "")),
                _check_options(_mapping(entry.get("options"), "options", where), label, where),
                name if fraction is not None else _metric(name, label, where),
                fraction,
                str(entry.get("reading", "")),
                str(entry.get("target_metric", "")),
            )
        )
    return tuple(columns)


def _metric(name: str, label: str, where: str) -> str:
    """``name`` if it is a leaderboard metric, or one with a leading "-" (read negated);
    columns that read a round's accuracy (``round_fraction``) name it in words instead.

    Checked here because a misspelt metric would otherwise read as missing in every cell
    of its column, and a report of "no value" is not what the table meant."""
    from cfl_bench.core.metric_registry import board_columns

    known = [spec.column for spec in board_columns()]
    if name.removeprefix("-") not in known:
        raise UserError(
            f"{where}: column '{label}' metric '{name}' is not a leaderboard metric; use one "
            f"of {', '.join(str(k) for k in known)} (a leading '-' reads it negated)."
        )
    return name


def _round_fraction(raw: object, label: str, where: str) -> float | None:
    if raw is None:
        return None
    # exactly int or float: a YAML bool (a subclass of int) is no fraction
    number = raw if type(raw) is int or type(raw) is float else None
    if number is None or not 0 < float(number) <= 1:
        raise UserError(
            f"{where}: column '{label}' round_fraction must be a number in (0, 1]; "
            "fix the table file."
        )
    return float(number)


def _rows(raw: object, where: str) -> tuple[Row, ...]:
    from cfl_bench.strategies.compose import validate_strategy

    if not isinstance(raw, list) or not raw:
        raise UserError(f"{where}: rows must be a non-empty list; fix the table file.")
    rows = []
    for item in raw:
        entry = _mapping(item, "a row", where)
        label = _text(entry.get("label"), "a row's label", where)
        strategy = _text(entry.get("strategy"), f"row '{label}' strategy", where)
        rows.append(
            Row(
                label,
                _text(entry.get("method"), f"row '{label}' method", where),
                str(entry.get("variant", "")),
                strategy,
                validate_strategy(strategy).name,
            )
        )
    return tuple(rows)


def _scales(raw: object, rows: tuple[Row, ...], where: str) -> dict[str, Scale]:
    from cfl_bench.strategies.compose import validate_strategy

    entries = _mapping(raw, "scales", where)
    if sorted(entries) != sorted(SCALES):
        raise UserError(f"{where}: scales must be exactly {', '.join(SCALES)}.")
    scales = {}
    for name in SCALES:
        entry = _mapping(entries[name], f"scale {name}", where)
        unknown = sorted(set(map(str, entry)) - SCALE_KEYS)
        if unknown:
            raise UserError(
                f"{where}: scale {name} has unknown key(s) {', '.join(unknown)} (a scale has "
                f"{', '.join(sorted(SCALE_KEYS))}); fix the table file."
            )
        seeds = entry.get("seeds")
        if (
            not isinstance(seeds, list)
            or not seeds
            or not all(type(s) is int and s >= 0 for s in seeds)
        ):
            raise UserError(f"{where}: scale {name} needs seeds, a list of integers >= 0.")
        options = _check_options(
            _mapping(entry.get("options", {}), "options", where), f"scale {name}", where
        )
        about = _text(entry.get("about"), f"scale {name}'s about", where)
        strategies = _scale_strategies(entry.get("strategies", {}), rows, f"scale {name}", where)
        canonical = {key: validate_strategy(text).name for key, text in strategies.items()}
        measured = _measured(entry.get("measured_s"), f"scale {name}", where)
        scales[name] = Scale(name, about, tuple(seeds), options, strategies, canonical, measured)
    return scales


def _measured(raw: object, what: str, where: str) -> float | None:
    """A scale's ``measured_s``: absent, or a positive number of seconds."""
    if raw is None:
        return None
    # exactly int or float: a YAML bool (a subclass of int) is no time
    seconds = float(raw) if type(raw) is int or type(raw) is float else math.nan
    if not 0 < seconds < math.inf:
        raise UserError(
            f"{where}: {what} measured_s must be a positive number of seconds; fix the table file."
        )
    return seconds


def _scale_strategies(raw: object, rows: tuple[Row, ...], what: str, where: str) -> dict[str, str]:
    """A scale's ``strategies`` (row label -> strategy string), keyed by the rows' own
    strategy strings. A scale may lower a row's options (cost), never change its methods:
    the components must be the row's, in its order, or the row would measure another
    method."""
    by_label = {row.label: row for row in rows}
    changed = {}
    for label, text in _mapping(raw, f"{what} strategies", where).items():
        row = by_label.get(str(label))
        if row is None:
            raise UserError(f"{where}: {what} strategies names '{label}', which is no row.")
        text = _text(text, f"{what} strategy of row '{label}'", where)
        if _component_names(text) != _component_names(row.strategy):
            raise UserError(
                f"{where}: {what} runs row '{label}' as '{text}', whose methods are not the "
                f"row's ('{row.strategy}'); a scale may change a row's options only."
            )
        changed[row.strategy] = text
    return changed


def _component_names(strategy: str) -> list[str]:
    from cfl_bench.strategies.compose import parse_strategy

    return [spec.name for spec in parse_strategy(strategy)]


def _claims(raw: object, rows: tuple[Row, ...], where: str) -> Claims:
    entry = _mapping(raw or {}, "claims", where)
    labels = {row.label for row in rows}
    pairs = []
    for pair in entry.get("pairs", []):
        if not isinstance(pair, list) or len(pair) != 2 or not set(pair) <= labels:
            raise UserError(f"{where}: claim pair {pair} must name two rows of the table.")
        pairs.append((pair[0], pair[1]))
    bound = entry.get("upper_bound")
    if bound is not None and bound not in labels:
        raise UserError(f"{where}: upper_bound '{bound}' is not a row of the table.")
    return Claims(tuple(pairs), bound)


def _match_targets(
    targets: dict[CellKey, Target],
    table: str,
    rows: tuple[Row, ...],
    columns: tuple[Column, ...],
    where: str,
) -> dict[tuple[str, str], Target]:
    """The target of every cell; each (row, column) must name exactly one printed cell."""
    matched = {}
    for column in columns:
        for row in rows:
            found = [
                t
                for k, t in targets.items()
                if (k.table, k.dataset, k.setting, k.method, k.variant)
                == (table, column.dataset, column.setting, row.method, row.variant)
                and column.target_metric in ("", k.metric)
            ]
            if len(found) != 1:
                raise UserError(
                    f"{where}: row '{row.label}' × column '{column.label}' matches "
                    f"{len(found)} printed cells of {table}, not one; fix the table file."
                )
            matched[(row.label, column.label)] = found[0]
    return matched


def load_table(path: Path, root: Path) -> ReproTable:
    """The table file ``path``, checked: known keys, run options, three scales, and one
    printed cell with a number for every row × column. A table with ``runs_of`` takes the
    protocol, scales and run folders of that table, and may only ask for its runs."""
    from cfl_bench.runner.config import read_yaml_mapping

    where = path.name
    raw = read_yaml_mapping(path, "table file", "a reproducible table")
    unknown = sorted(set(map(str, raw)) - TABLE_KEYS)
    if unknown:
        raise UserError(f"{where}: unknown key(s) {', '.join(unknown)}; fix the table file.")
    metric = _text(raw.get("metric"), "metric", where)
    columns = _columns(raw.get("columns"), metric, where)
    rows = _rows(raw.get("rows"), where)
    table = _text(raw.get("table"), "table", where)
    targets = load_targets(root / "targets" / _text(raw.get("targets"), "targets", where))
    matched = _match_targets(targets, table, rows, columns, where)
    for (row, column), target in matched.items():
        if target.value is None:
            raise UserError(f"{where}: the cell {row} × {column} has no number in the paper.")
    runs = _runs_part(raw, path, root, rows, columns)
    _refuse_overlap(columns, runs["protocol"], runs["scales"], where)
    return ReproTable(
        name=path.stem,
        paper=_text(raw.get("paper"), "paper", where),
        table=table,
        title=_text(raw.get("title"), "title", where),
        columns=columns,
        rows=rows,
        claims=_claims(raw.get("claims"), rows, where),
        targets=matched,
        **runs,
    )


def _runs_part(
    raw: dict[str, Any],
    path: Path,
    root: Path,
    rows: tuple[Row, ...],
    columns: tuple[Column, ...],
) -> dict[str, Any]:
    """protocol, train_per_task, scales and runs_name: the file's own, or its runs_of's."""
    where = path.name
    source_name = raw.get("runs_of")
    if source_name is None:
        train = raw.get("train_per_task")
        if type(train) is not int or train < 1:
            raise UserError(f"{where}: train_per_task must be a positive integer.")
        protocol = _mapping(raw.get("protocol"), "protocol", where)
        return {
            "protocol": _check_options(protocol, "protocol", where),
            "train_per_task": train,
            "scales": _scales(raw.get("scales"), rows, where),
            "runs_name": path.stem,
        }
    given = sorted({"protocol", "scales", "train_per_task"} & set(raw))
    if given:
        raise UserError(f"{where}: a table with runs_of takes {', '.join(given)} from it.")
    source_path = tables_folder(root) / f"{source_name}.yaml"
    if not source_path.is_file():
        raise UserError(f"{where}: runs_of names '{source_name}', which is no table.")
    source = load_table(source_path, root)
    if source.runs_name != source.name:
        raise UserError(f"{where}: runs_of must name a table with runs of its own.")
    strategies = {r.strategy for r in source.rows}
    groups = source.column_groups()
    for row in rows:
        if row.strategy not in strategies:
            raise UserError(f"{where}: row '{row.label}' is not run by {source_name}.")
    for column in columns:
        if column.options not in groups:
            raise UserError(f"{where}: column '{column.label}' is not run by {source_name}.")
    return {
        "protocol": source.protocol,
        "train_per_task": source.train_per_task,
        "scales": source.scales,
        "runs_name": source.name,
    }


def _refuse_overlap(
    columns: tuple[Column, ...], protocol: dict[str, Any], scales: dict[str, Scale], where: str
) -> None:
    """A column option may not also be a protocol or scale option: a run would get two
    values for it (the sweep refuses a key in both its base and its grid)."""
    shared = set(protocol).union(*(s.options for s in scales.values()))
    for column in columns:
        both = sorted(shared & set(column.options))
        if both:
            raise UserError(
                f"{where}: column '{column.label}' sets {', '.join(both)}, which the protocol "
                "or a scale sets too; keep it in one place."
            )


def table_names(root: Path) -> list[str]:
    return sorted(p.stem for p in tables_folder(root).glob("*.yaml"))


def find_table(name: str, root: Path, extra: list[str] | None = None) -> ReproTable:
    """The table called ``name``, or a refusal naming the tables there are (and the
    ``extra`` names, the figures, that are also reproducible)."""
    names = table_names(root)
    if name not in names:
        raise UserError(
            f"no reproducible table '{name}'; choose one of "
            f"{', '.join(sorted(names + (extra or [])))} (`cfl-bench reproduce list`)."
        )
    return load_table(tables_folder(root) / f"{name}.yaml", root)


def load_all(root: Path) -> list[ReproTable]:
    return [load_table(tables_folder(root) / f"{n}.yaml", root) for n in table_names(root)]
