"""A reproducible figure: a claim a paper draws from curves it prints without numbers.

FedGP's Fig. 4b (CARLA detection) prints no value, only curves and a sentence: after one
vehicle enters the highway, FedAvg's detection quality falls while DER and DER+FedGP keep
theirs. A table file cannot hold it (every cell of a table has a printed number), so a
figure file (``reproductions/figures/<name>.yaml``) states the claim as data instead:

* ``metric`` and ``eval_task``: the curve, one record of ``records.csv`` per round (a run
  evaluated every round), e.g. mAP@0.5 on the first task's (urban) test frames;
* ``window``: per scale, k, the rounds a headline averages. A run's headline is never one
  round's value: *before* is the mean over the k rounds ending at the shift (the first task's last
  round), *end* the mean over the run's last k rounds, and *fall* = before − end;
* ``claims``: ``drops`` (rows whose fall is positive), ``holds`` (rows whose fall is smaller
  than every ``drops`` row's, seed by seed) and ``close`` (pairs whose end values the paper
  calls close: reported, not judged, since "close" has no threshold);
* ``rows``, ``protocol`` and ``scales`` as in a table file (:mod:`cfl_bench.reproduce.tables`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cfl_bench.core.errors import UserError
from cfl_bench.reproduce.tables import (
    Row,
    Scale,
    ScaledProtocol,
    _check_options,
    _mapping,
    _rows,
    _scales,
    _text,
)

# A run's three headlines (module docstring), in the order reports show them.
BEFORE = "before the shift"
END = "at the end"
FALL = "fall"
HEADLINES = (BEFORE, END, FALL)

FIGURE_KEYS = frozenset(
    {
        "paper",
        "figure",
        "title",
        "metric",
        "metric_label",
        "eval_task",
        "window",
        "rows",
        "claims",
        "protocol",
        "scales",
    }
)


@dataclass(frozen=True)
class FigureClaims:
    drops: tuple[str, ...]
    holds: tuple[str, ...]
    close: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class ReproFigure(ScaledProtocol):
    """A figure file as loaded and checked."""

    name: str
    paper: str
    figure: str
    title: str
    metric: str
    metric_label: str
    eval_task: int
    windows: dict[str, int]
    rows: tuple[Row, ...]
    claims: FigureClaims
    protocol: dict[str, Any]
    scales: dict[str, Scale]

    @property
    def runs_name(self) -> str:
        return self.name

    def runs(self, scale: str) -> int:
        return len(self.rows) * len(self.scales[scale].seeds)

    def window(self, scale: str) -> int:
        return self.windows[scale]


def figures_folder(root: Path) -> Path:
    return root / "figures"


def figure_names(root: Path) -> list[str]:
    return sorted(p.stem for p in figures_folder(root).glob("*.yaml"))


def _claims(raw: object, rows: tuple[Row, ...], where: str) -> FigureClaims:
    entry = _mapping(raw, "claims", where)
    labels = {row.label for row in rows}

    def named(key: str) -> tuple[str, ...]:
        value = entry.get(key, [])
        if not isinstance(value, list) or not set(map(str, value)) <= labels:
            raise UserError(f"{where}: claims.{key} must list rows of the figure.")
        return tuple(map(str, value))

    drops, holds = named("drops"), named("holds")
    if not drops:
        raise UserError(f"{where}: claims.drops must name the row whose curve falls.")
    close = []
    for pair in entry.get("close", []):
        if not isinstance(pair, list) or len(pair) != 2 or not set(pair) <= labels:
            raise UserError(f"{where}: claims.close pair {pair} must name two rows.")
        close.append((str(pair[0]), str(pair[1])))
    return FigureClaims(drops, holds, tuple(close))


def _positive_int(raw: object, what: str, where: str, least: int) -> int:
    if type(raw) is not int or raw < least:
        raise UserError(f"{where}: {what} must be an integer >= {least}; fix the figure file.")
    return raw


def _windows(
    raw: object, protocol: dict[str, Any], scales: dict[str, Scale], where: str
) -> dict[str, int]:
    """k per scale; it may not reach past the shift nor past the rounds after it."""
    entries = _mapping(raw, "window", where)
    windows = {}
    for scale in scales.values():
        unset = sorted(set(scale.options) - set(protocol))
        if unset:
            raise UserError(
                f"{where}: scale {scale.name} sets {', '.join(unset)}, which the protocol does "
                "not; give the protocol its value too, so each scale's runs are told apart."
            )
        window = _positive_int(entries.get(scale.name), f"window.{scale.name}", where, 1)
        options = {**protocol, **scale.options}
        after = int(options.get("rounds_per_task", 0))
        before = after + int(options.get("lead_rounds", 0))
        if window > min(before, after):
            raise UserError(
                f"{where}: window {window} does not fit scale {scale.name} ({before} rounds "
                f"before the shift, {after} after); give a smaller window."
            )
        if options.get("tasks") != 2 or options.get("eval_every_round") is not True:
            raise UserError(
                f"{where}: scale {scale.name} must run tasks: 2 with eval_every_round: true "
                "(a curve has a value every round, and one shift)."
            )
        windows[scale.name] = window
    return windows


def load_figure(path: Path) -> ReproFigure:
    """The figure file ``path``, checked: keys, rows that build, run options, three scales,
    claims naming rows, and a window that fits every scale."""
    from cfl_bench.runner.config import read_yaml_mapping

    where = path.name
    raw = read_yaml_mapping(path, "figure file", "a reproducible figure")
    unknown = sorted(set(map(str, raw)) - FIGURE_KEYS)
    if unknown:
        raise UserError(f"{where}: unknown key(s) {', '.join(unknown)}; fix the figure file.")
    rows = _rows(raw.get("rows"), where)
    protocol = _check_options(_mapping(raw.get("protocol"), "protocol", where), "protocol", where)
    scales = _scales(raw.get("scales"), rows, where)
    windows = _windows(raw.get("window"), protocol, scales, where)
    metric = _text(raw.get("metric"), "metric", where)
    return ReproFigure(
        name=path.stem,
        paper=_text(raw.get("paper"), "paper", where),
        figure=_text(raw.get("figure"), "figure", where),
        title=_text(raw.get("title"), "title", where),
        metric=metric,
        metric_label=str(raw.get("metric_label") or metric),
        eval_task=_positive_int(raw.get("eval_task"), "eval_task", where, 0),
        windows=windows,
        rows=rows,
        claims=_claims(raw.get("claims"), rows, where),
        protocol=protocol,
        scales=scales,
    )


def find_figure(name: str, root: Path) -> ReproFigure | None:
    """The figure called ``name``, or None when there is none (it may be a table)."""
    path = figures_folder(root) / f"{name}.yaml"
    return load_figure(path) if path.is_file() else None


def load_all_figures(root: Path) -> list[ReproFigure]:
    return [load_figure(figures_folder(root) / f"{n}.yaml") for n in figure_names(root)]
