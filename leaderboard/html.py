"""``leaderboard.html``: one self-contained, offline page rendered from the run records.

Structure (in page order):

* header — counts, how to read the numbers, links to every section;
* one ``<section class="protocol">`` per protocol hash: the protocol in one line and in full
  (JSON), a legend naming the std kind, a sortable table with one row per strategy
  (mean ± std over seeds: sample by default, population with ``std="population"``), then
  the figures — Acc_t and Fgt_t curves over tasks (plus task-IL curves on class-IL streams),
  accuracy-matrix heat maps per strategy, memory drift MD_t per task, and accuracy against
  total bytes communicated;
* ``<section id="runs">`` — incomplete / failed / diverged / duplicate / damaged runs with
  their messages, and (folded) every run;
* ``<section id="provenance">`` — rows whose runs disagree on package versions or git
  commit, and tables of commits, package version sets and machines with run counts.

Safety: every string from run names, options or metadata is inserted by jinja2 with
autoescaping (a strategy called ``<script>alert(1)</script>`` is shown as text); the
figures are matplotlib SVG (escaped there, see :mod:`leaderboard.plots`). A Content
Security Policy allows no network access at all and only the page's own script (by its
sha256), so even a missed escape could not run injected script or fetch anything.
Determinism: no clock, no random ids, fixed ordering — the same runs give the same bytes.
"""

from __future__ import annotations

import base64
import hashlib
import math
import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cfl_bench.core import metric_registry as registry
from cfl_bench.core.atomic import atomic_write_text
from cfl_bench.leaderboard.aggregate import (
    DEFAULT_STD,
    protocol_json,
    row_notes,
    std_kind,
    strategy_series,
)
from cfl_bench.leaderboard.page import CSS, SORT_JS, TEMPLATE
from cfl_bench.leaderboard.plots import (
    curves_svg,
    drift_svg,
    heatmaps_svg,
    human_bytes,
    scatter_svg,
)

if TYPE_CHECKING:
    import pandas as pd

    from cfl_bench.core.metric_registry import MetricSpec

HTML_NAME = "leaderboard.html"
#: Environment keys shown in the machines table (what config.json records).
MACHINE_KEYS: tuple[str, ...] = ("python", "platform", "device", "cuda_device", "torch_threads")
#: Human names of scenarios (anything else is shown as recorded).
SCENARIOS = {"class-il": "class-IL", "domain-il": "domain-IL", "task-il": "task-IL"}
#: How the page names each std kind: (short word for captions and tooltips, full phrase
#: for the header and the per-table legends). Why spelled out everywhere: a reader comparing
#: with a paper must not have to guess whether ± is ddof=1 or ddof=0.
STD_TEXT: dict[str, tuple[str, str]] = {
    "sample": ("sample", "sample standard deviation (ddof = 1)"),
    "population": ("population", "population standard deviation (ddof = 0, np.std)"),
}


def content_security_policy(script: str, images: bool = False) -> str:
    """No network, no plugins, no base/form tricks; styles inline; only our script.
    ``images``: allow images embedded in the page itself (data: URIs, the run report's
    synthetic-image grids), still nothing fetched."""
    digest = base64.b64encode(hashlib.sha256(script.encode("utf-8")).digest()).decode("ascii")
    img_src = "data:" if images else "'none'"
    return (
        "default-src 'none'; "
        f"script-src 'sha256-{digest}'; "
        "style-src 'unsafe-inline'; "
        f"img-src {img_src}; font-src 'none'; connect-src 'none'; "
        "base-uri 'none'; form-action 'none'"
    )


def _finite(value: Any) -> bool:
    return value is not None and isinstance(value, (int, float)) and math.isfinite(value)


#: Between "±" and the deviation: a no-break space, so a narrow column breaks a cell only
#: before the "±" (mean on one line, "± std" on the next), never between "±" and its number.
NBSP = "\u00a0"


def fmt_mean_std(mean: float, std: float, spec: str = ".2f") -> str:
    """``60.00 ± 10.00``; ``60.00 ± –`` for one seed; ``–`` when there is no mean. The
    space after ``±`` is a no-break space (see :data:`NBSP`)."""
    if not _finite(mean):
        return "–"
    spread = format(std, spec) if _finite(std) else "–"
    return f"{format(mean, spec)} ±{NBSP}{spread}"


def _sort_key(value: float) -> str | None:
    """The ``data-sort`` attribute of a numeric cell ("" = missing, sorted last)."""
    return repr(float(value)) if _finite(value) else ""


def _cell(
    text: str, sort: str | None = None, cls: str = "", title: str = ""
) -> dict[str, str | None]:
    return {"text": text, "sort": sort, "cls": cls, "title": title}


def _metric_cell(row: Any, metric: str, spec: str = ".2f") -> dict[str, str | None]:
    """mean ± std; for a compared metric (registry.COMPARED) the tooltip gives its 95 % CI
    and its standing against the best row."""
    mean, std = float(row[f"{metric}_mean"]), float(row[f"{metric}_std"])
    title = comparison_title(row, metric) if metric in registry.COMPARED else ""
    return _cell(fmt_mean_std(mean, std, spec), _sort_key(mean), "num", title)


def comparison_title(row: Any, metric: str) -> str:
    """``95 % CI ±24.84; paired t, 3 seeds vs the best: Holm p = 0.43, indistinguishable``
    (the tooltip of a compared metric), or "" without a mean."""
    from cfl_bench.leaderboard.significance import ci_text

    if not _finite(float(row[f"{metric}_mean"])):
        return ""
    ci = ci_text(row, metric)
    return f"95 % CI {ci}; {vs_best_text(row, metric)}" if ci != "one seed" else ci


def vs_best_text(row: Any, metric: str) -> str:
    """How a row stands against the best of its protocol: ``▲ best``, ``≈ indistinguishable
    (Holm p = 0.43, paired t, 3 seeds)``, ``differs (...)``, ``one seed``, ``not tested (the
    best has one seed)`` or "" (no mean)."""
    from cfl_bench.leaderboard.significance import (
        BEST,
        BEST_MARK,
        BEST_ONE_SEED,
        ONE_SEED,
        TIED_MARK,
    )

    test, p = str(row[f"{metric}_test"]), float(row[f"{metric}_p_vs_best"])
    untested = {
        "": "",
        BEST: f"{BEST_MARK} best",
        ONE_SEED: "one seed",
        BEST_ONE_SEED: "not tested (the best has one seed)",
    }
    if test in untested:
        return untested[test]
    tied = row[f"{metric}_tied_best"] == "true"
    verdict = f"{TIED_MARK} indistinguishable" if tied else "differs"
    return f"{verdict} (Holm p = {p:.3g}, {test})"


def comparison_columns(metric: str) -> list[tuple[str, str, Callable[..., Any]]]:
    """The ranked metric's 95 % CI and vs-best columns of the HTML tables."""
    from cfl_bench.leaderboard.significance import ci_text

    return [
        (
            "95 % CI",
            f"half-width of the 95 % confidence interval of the mean {metric} (Student t, "
            f"n − 1 degrees of freedom, sample std)",
            lambda r: _cell(ci_text(r, metric), _sort_key(float(r[f"{metric}_ci95"])), "num"),
        ),
        (
            "vs best",
            f"{metric} against the best row: two-sided t-test paired by seed (Welch's without "
            f"2 shared seeds), Holm-corrected, α = 0.05",
            lambda r: _cell(vs_best_text(r, metric), _vs_best_sort(r, metric), "flag"),
        ),
    ]


def _vs_best_sort(row: Any, metric: str) -> str | None:
    """Sorting by ``vs best`` puts the best first (-1), then rows by adjusted p, untested
    rows last."""
    from cfl_bench.leaderboard.significance import BEST

    return "-1.0" if row[f"{metric}_test"] == BEST else _sort_key(row[f"{metric}_p_vs_best"])


def _target_cell(row: Any) -> dict[str, str | None]:
    from cfl_bench.leaderboard.targets import target_text

    rounds = float(row["rounds_to_target_mean"])
    title = ""
    if _finite(rounds) and _finite(float(row["rounds_to_target_std"])):
        title = f"std {float(row['rounds_to_target_std']):.3g} rounds"
    return _cell(target_text(row), _sort_key(rounds), "num", title)


def _bytes_cell(row: Any, spec: MetricSpec, kind: str = DEFAULT_STD) -> dict[str, str | None]:
    """Mean bytes; the tooltip splits a sum into its parts (up / down) and gives the std
    (named)."""
    mean, std = float(row[f"{spec.column}_mean"]), float(row[f"{spec.column}_std"])
    if not _finite(mean):
        return _cell("–", _sort_key(mean), "num")
    parts = [registry.metric(p) for p in spec.parts]
    title = ", ".join(
        f"{p.label.removeprefix('bytes ')} {human_bytes(float(row[f'{p.column}_mean']))}"
        for p in parts
    )
    if _finite(std):
        title += f"; {STD_TEXT[kind][0]} std {std:.0f} B"
    return _cell(human_bytes(mean), _sort_key(mean), "num", title)


def _time_cell(row: Any, spec: MetricSpec) -> dict[str, str | None]:
    mean, std = float(row[f"{spec.column}_mean"]), float(row[f"{spec.column}_std"])
    text = "–" if not _finite(mean) else f"{fmt_mean_std(mean, std, spec.fmt)}{NBSP}s"
    return _cell(text, _sort_key(mean), "num")


def metric_column(
    spec: MetricSpec, scenario_label: str, std: str = DEFAULT_STD
) -> tuple[str, str, Callable[..., Any]]:
    """(header, tooltip, cell builder) of one registry metric: the header carries ``(%)``
    for percentages and, for the headline, the stream's scenario; the cell is formatted by
    the metric's unit."""
    label = spec.label
    if spec.label_names_scenario and scenario_label != "unknown":
        label = f"{label} {scenario_label}"
    header = f"{label} (%)" if spec.unit == "percent" else label
    if spec.unit == "bytes":
        return header, spec.column_tooltip, lambda r: _bytes_cell(r, spec, std)
    if spec.unit == "seconds":
        return header, spec.column_tooltip, lambda r: _time_cell(r, spec)
    return header, spec.column_tooltip, lambda r: _metric_cell(r, str(spec.column), spec.fmt)


def table_columns(
    task_il: bool,
    scenario_label: str,
    std: str = DEFAULT_STD,
    notes: bool = True,
    target: float | None = None,
) -> list[tuple[str, str, Callable[..., Any]]]:
    """(header, tooltip, cell builder) for one protocol's table: strategy, seeds, then the
    registry's ``board`` metrics (task-IL ones when ``task_il``), each beside its task-IL
    twin, the ranked metric followed by its 95 % CI and its standing against the best row;
    ``std`` names the std kind in the bytes tooltip. ``notes=False`` leaves out the
    notes column (no row has any): an empty column only took width from the numbers on
    class-IL streams. ``target`` (``--target``) adds the rounds-to-target column."""
    columns: list[tuple[str, str, Callable[..., Any]]] = [
        ("strategy", "strategy composition", lambda r: _cell(str(r["strategy"]), cls="name")),
        (
            "seeds",
            "number of finished seeds (their list)",
            lambda r: _cell(
                f"{r['n_seeds']} ({r['seeds']})" if r["seeds"] else "0", str(int(r["n_seeds"]))
            ),
        ),
    ]
    shown = registry.metrics_for("class-il" if task_il else None, "board")
    for spec in registry.display_order(shown):
        columns.append(metric_column(spec, scenario_label, std))
        if spec.key == registry.RANK_BY:
            columns += comparison_columns(registry.RANK_BY)
    if target is not None:
        columns.append(
            (
                f"to {target:g} %",
                f"rounds (and bytes up + down) until the average accuracy over the tasks seen "
                f"reached {target:g} %, mean over seeds",
                _target_cell,
            )
        )
    if notes:
        columns.append(
            (
                "notes",
                "runs kept out of the means; provenance disagreements",
                lambda r: _cell(row_notes(r), None, "flag"),
            )
        )
    return columns


def board_target(rows: pd.DataFrame) -> float | None:
    """The ``--target`` the board was made with (its ``target`` column), None without."""
    targets = [float(t) for t in rows["target"] if _finite(t)]
    return targets[0] if targets else None


def significance_legend(rows: pd.DataFrame) -> str:
    """The legend under a protocol's table: what ▲ and ≈ mean, which test, which
    correction over how many rows, and what the CI is."""
    from cfl_bench.leaderboard.significance import BEST_MARK, TIED_MARK

    rank = registry.RANK_BY
    tested = int(rows[f"{rank}_p_vs_best"].notna().sum())
    others = ", ".join(registry.metric(m).label for m in registry.COMPARED if m != rank)
    return (
        f"{BEST_MARK} best {rank}; {TIED_MARK} statistically indistinguishable from the best: "
        f"two-sided t-test of the difference, paired by seed when the two rows share at least "
        f"2 seeds (seed k gives every strategy the same tasks and client split), Welch's "
        f"t-test otherwise, p values Holm–Bonferroni-corrected over the {tested} "
        f"row{'' if tested == 1 else 's'} compared with the best, α = 0.05. 95 % CI: "
        f"Student-t half-width of the mean (n − 1 degrees of freedom). One seed: no interval "
        f"and no test. The tooltips of {others} give the same for those metrics (CSV: "
        f"<metric>_ci95, _test, _p_vs_best, _tied_best)."
    )


def _anchor(index: int, protocol_hash: str) -> str:
    """An HTML id that is safe whatever the hash text is."""
    return f"protocol-{index + 1}-" + re.sub(r"[^A-Za-z0-9_-]", "", protocol_hash)[:16]


def protocol_sections(
    board: pd.DataFrame, runs: pd.DataFrame, std: str = DEFAULT_STD
) -> list[dict[str, Any]]:
    """The context of every protocol section: its table rows and its figures (bands and
    error bars use the same std kind as the table)."""
    from markupsafe import Markup

    word = STD_TEXT[std][0]
    sections: list[dict[str, Any]] = []
    order = list(dict.fromkeys(board["protocol_hash"]))
    for index, protocol_hash in enumerate(order):
        rows = board[board["protocol_hash"] == protocol_hash]
        first = rows.iloc[0]
        scenario = first["scenario"] if isinstance(first["scenario"], str) else None
        label = SCENARIOS.get(scenario or "", scenario or "unknown")
        marker = registry.metric(registry.TASK_IL_MARKER).column
        task_il = bool(rows[f"{marker}_mean"].notna().any()) or scenario == "class-il"
        notes = any(row_notes(r) for _, r in rows.iterrows())
        columns = table_columns(task_il, label, std, notes, board_target(rows))
        protocol: dict[str, Any] = next(
            (p for p in runs.loc[runs["protocol_hash"] == protocol_hash, "protocol"] if p), {}
        )
        series = strategy_series(runs, rows, std)
        prefix = f"fig{index + 1}"
        figures = [
            (curves_svg(series, f"{prefix}-curves"), "Acc_t and Fgt_t (%) after each task, mean "
             f"over seeds with a ±1 {word}-std band."),
            (curves_svg(series, f"{prefix}-curves-til", task_il=True) if task_il else None,
             "Task-IL Acc_t and Fgt_t (%) (same runs, logits masked to each task's classes)."),
            (heatmaps_svg(series, f"{prefix}-matrix"), "Accuracy matrix a[t][i] (%), mean over "
             "seeds: row t = after training task t, column i = evaluated task (blank: not "
             "measured). Cells right of the diagonal are tasks evaluated before they were "
             "trained, for FWT only; no other metric reads them."),
            (drift_svg(series, f"{prefix}-drift"), "Memory drift MD_t: mean KL between the "
             "model's predictions right after each old task and after task t (mean over "
             f"seeds, ±1 {word}-std band)."),
            (scatter_svg(series, f"{prefix}-scatter"), f"Final accuracy Acc_T (± {word} std) "
             "against total bytes communicated (up + down)."),
        ]  # fmt: skip
        sections.append(
            {
                "anchor": _anchor(index, str(protocol_hash)),
                "hash": str(protocol_hash),
                "stream": str(first["stream"]),
                "scenario_label": label,
                "summary": str(first["protocol"]),
                "legend": f"Cells: mean ± {STD_TEXT[std][1]} over the finished seeds.",
                "significance": significance_legend(rows),
                "protocol_json": protocol_json(protocol),
                "columns": [{"label": c[0], "title": c[1]} for c in columns],
                "rows": [[c[2](r) for c in columns] for _, r in rows.iterrows()],
                "figures": [
                    {"id": figure_id_of(svg), "svg": Markup(svg), "caption": caption}
                    for svg, caption in figures
                    if svg is not None
                ],
            }
        )
    return sections


def figure_id_of(svg: str) -> str:
    """The figure id that :func:`leaderboard.plots.to_svg` put into aria-labelledby."""
    match = re.search(r'aria-labelledby="([^"]*)-t"', svg)
    return match.group(1) if match else "figure"


def _text(value: Any) -> str:
    """A cell's text; None, NaN and pandas' NA read as empty."""
    import pandas as pd

    if value is None or (not isinstance(value, (str, dict, list)) and pd.isna(value)):
        return ""
    return str(value)


#: CSS class suffix of a status cell, where it differs from the status: a damaged run is
#: shown in the failed style (red), so the page's CSS, and with it the bytes of every
#: board without damaged runs, stay as they were.
STATUS_STYLE: dict[str, str] = {"damaged": "failed"}


def run_rows(runs: pd.DataFrame, problems_only: bool) -> list[dict[str, Any]]:
    """Context rows for the runs tables (problems first by status, then all runs)."""
    out = []
    for _, r in runs.iterrows():
        if problems_only and r["status"] == "finished":
            continue
        acc = float(r["Acc_T"])
        out.append(
            {
                "path": r["path"],
                "status": r["status"],
                "status_style": STATUS_STYLE.get(r["status"], r["status"]),
                "stream": _text(r["stream"]),
                "strategy": _text(r["strategy"]),
                "seed": _text(r["seed"]),
                "protocol_hash": _text(r["protocol_hash"]),
                "message": r["message"],
                "acc": f"{acc:.2f}" if _finite(acc) else "–",
                "acc_sort": _sort_key(acc),
                "git_commit": _text(r["git_commit"]) or "unknown",
            }
        )
    return out


def provenance_context(board: pd.DataFrame, runs: pd.DataFrame) -> dict[str, Any]:
    """Flagged rows, and commits / package sets / machines with their run counts."""
    flagged = [
        {
            "flag": r["provenance_flag"],
            "strategy": r["strategy"],
            "stream": r["stream"],
            "hash": r["protocol_hash"],
            "git_commit": r["git_commit"],
            "packages": r["packages"],
        }
        for _, r in board.iterrows()
        if r["provenance_flag"]
    ]
    commits = Counter("unknown" if c is None else str(c) for c in runs["git_commit"])
    names = sorted({name for p in runs["packages"] for name in p})
    package_sets = Counter(
        tuple("?" if p.get(n) is None else str(p.get(n)) for n in names)
        if p
        else tuple("" for _ in names)
        for p in runs["packages"]
    )
    machines = Counter(
        tuple(_text(env.get(key)) for key in MACHINE_KEYS) for env in runs["environment"]
    )
    return {
        "flagged": flagged,
        "commits": [{"value": c, "count": n} for c, n in sorted(commits.items())],
        "package_names": names,
        "package_rows": [
            {"versions": list(v), "count": n} for v, n in sorted(package_sets.items())
        ],
        "machine_keys": list(MACHINE_KEYS),
        "machine_rows": [{"cells": list(v), "count": n} for v, n in sorted(machines.items())],
    }


def render_html(board: pd.DataFrame, runs: pd.DataFrame, std: str = DEFAULT_STD) -> str:
    """The whole report as one HTML string (a pure function of its two frames and ``std``,
    the std kind the board was aggregated with, which the header and legends name)."""
    import jinja2
    from markupsafe import Markup

    env = jinja2.Environment(
        autoescape=True, undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True
    )
    kind = std_kind(std)  # refuses an unknown kind before rendering anything
    if len(board) and set(board["std_kind"]) != {kind}:
        # The page would state one convention while its cells hold another.
        raise ValueError(
            f"the board holds std_kind {sorted(set(board['std_kind']))} but the page was "
            f"asked to describe {kind!r}; aggregate and render with the same std"
        )
    script = SORT_JS
    problems = run_rows(runs, problems_only=True)
    context = {
        "std_kind": std,
        "std_text": STD_TEXT[std][1],
        "csp": content_security_policy(script),
        "css": Markup(CSS),
        "script": Markup(script),
        "counts": {
            "runs": len(runs),
            "protocols": board["protocol_hash"].nunique() if len(board) else 0,
            "rows": len(board),
            "problems": len(problems),
        },
        "any_damaged": bool((runs["status"] == "damaged").any()),
        "protocols": protocol_sections(board, runs, std) if len(board) else [],
        "problems": problems,
        "all_runs": run_rows(runs, problems_only=False),
        **provenance_context(board, runs),
    }
    return env.from_string(TEMPLATE).render(context)


def write_board_html(
    board: pd.DataFrame, runs: pd.DataFrame, out_dir: Path, std: str = DEFAULT_STD
) -> Path:
    """Write ``out_dir/leaderboard.html`` atomically; returns its path."""
    path = out_dir / HTML_NAME
    atomic_write_text(path, render_html(board, runs, std))
    return path
