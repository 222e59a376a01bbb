"""``cfl-bench report RUN_DIR``: one self-contained HTML page about a single run.

What the page shows, in order: the run's status (finished / diverged / failed /
unfinished, with the reason), its headline metrics, the per-task figures (Acc_t and Fgt_t
curves, class-IL and task-IL where the stream has both, the accuracy-matrix heat maps and
memory drift MD_t), the per-round figures (training loss, bytes up and down, bytes by
payload), the clients (spread of their local models' accuracy at every task end, per-client
buffer drift, the client × class table of every task), the configuration and the
provenance (git commit, packages, machine, cost).

Why it is built from the leaderboard's parts: the same object-API matplotlib figures
rendered to deterministic inline SVG (:mod:`leaderboard.plots`, with a one-strategy
:class:`~leaderboard.aggregate.StrategySeries` for the per-task figures), the same
stylesheet, sorting script and Content-Security-Policy (:mod:`leaderboard.page`,
:func:`cfl_bench.leaderboard.html.content_security_policy`) and the same writer for ``--out``
(:mod:`leaderboard.output`). So the page is one offline file that makes no request, shows
every string from the data as text, and is a pure function of the run directory (no
clock): the same run always gives the same bytes.

Refused, with one line and nothing written (exit 2): a RUN_DIR that is not a run directory,
damaged records (see :mod:`leaderboard.run_data`), and an ``--out`` that cannot be a
report file — a folder, a name not ending in ``.html``, one of the run's own record files,
a path below a file or in a folder that cannot be written.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cfl_bench.core.errors import UserError
from cfl_bench.core.run_dir import (
    RUN_FILES,
    check_out_path,
    is_run_directory,
    nearest_existing,
    os_problem,
)

if TYPE_CHECKING:
    from cfl_bench.core.metric_registry import MetricSpec
    from cfl_bench.leaderboard.aggregate import StrategySeries
    from cfl_bench.leaderboard.run_data import RunData

REPORT_NAME = "report.html"
#: Suffixes a report file may have (anything else is most likely a mistyped path).
HTML_SUFFIXES = (".html", ".htm")
#: Environment keys shown under provenance (what config.json records).
MACHINE_KEYS: tuple[str, ...] = ("python", "platform", "device", "cuda_device", "torch_threads")


def default_out(run_dir: str) -> Path:
    """Where the report goes without ``--out``: inside the run directory."""
    return Path(run_dir) / REPORT_NAME


def check_report_out(out: str, run_dir: Path) -> Path:
    """``--out`` as a Path, after refusing anything that cannot be the report file."""
    if out == "":
        raise UserError("--out is empty; give a file for the report, e.g. RUN_DIR/report.html.")
    path = Path(out)
    try:
        if path.is_dir():
            raise UserError(
                f"--out '{out}' is a folder; give a file in it, e.g. '{path / REPORT_NAME}'."
            )
        if path.suffix.lower() not in HTML_SUFFIXES:
            raise UserError(
                f"--out '{out}' does not end in .html; give an .html file for the report."
            )
        if os.path.lexists(path) and not path.is_file():
            raise UserError(f"--out '{out}' exists and is not a file; remove it or choose another.")
        ancestor = nearest_existing(path.parent)
        if not ancestor.is_dir():
            raise UserError(
                f"--out '{out}' is below '{ancestor}', which is a file; choose a path in a folder."
            )
        check_out_path(path.parent)
        own = {os.path.realpath(run_dir / name) for name in RUN_FILES}
    except OSError as exc:
        raise UserError(
            f"--out '{out}' cannot be used ({os_problem(exc)}); choose another."
        ) from None
    if os.path.realpath(path) in own:  # e.g. a link named .html to records.csv
        raise UserError(
            f"--out '{out}' is one of the run's own record files; choose another name, "
            f"e.g. '{path.parent / REPORT_NAME}'."
        )
    refuse_other_run(path, run_dir)
    return path


def refuse_other_run(path: Path, run_dir: Path) -> None:
    """Refuse a report file inside another run's directory: only that run's own commands
    write there (a report.html of this run would pass for that run's report, and replace
    it). The run's own directory, and folders of the user's below it, are fine."""
    own = Path(os.path.realpath(run_dir))
    for folder in (path.absolute().parent, *path.absolute().parent.parents):
        real = Path(os.path.realpath(folder))
        if real == own or own in real.parents:
            return
        if is_run_directory(folder):
            raise UserError(
                f"--out '{path}' is inside the cfl-bench run directory '{folder}' of another "
                f"run, and this report would pass for that run's own; choose a folder outside "
                f"it, e.g. '{Path(run_dir) / REPORT_NAME}'."
            )


# --------------------------------------------------------------------------------------------
# Text
# --------------------------------------------------------------------------------------------


def _finite(value: Any) -> bool:
    """A number that can be shown (an integer too large for a float is not one)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(float(value))
    except OverflowError:
        return False


def fmt(value: Any, spec: str = ".2f", unit: str = "") -> str:
    """A number for the page, "–" when missing."""
    return f"{format(float(value), spec)}{unit}" if _finite(value) else "–"


def fmt_bytes(value: Any) -> str:
    from cfl_bench.leaderboard.plots import human_bytes

    return human_bytes(float(value)) if _finite(value) else "–"


def progress_text(data: RunData) -> str:
    """``round 5 of 10, 2 of 5 tasks ended`` (the total is unknown for old config files)."""
    total = f" of {data.total_rounds}" if data.total_rounds is not None else ""
    rounds = f"round {data.rounds_done}{total}" if data.rounds_done else "no round finished"
    return f"{rounds}, {data.tasks_done} of {data.num_tasks} tasks ended"


def report_value(spec: MetricSpec, data: RunData) -> str:
    """One metric as the results table shows it: recomputed from records.csv, or read from
    summary.json for what only the run knows (time), formatted by the metric's unit."""
    source = data.metrics if spec.origin == "summary" else data.summary or {}
    value = source.get(spec.key)
    if spec.unit == "bytes":
        return fmt_bytes(value)
    return fmt(value, spec.fmt, " s" if spec.unit == "seconds" else "")


def metric_rows(data: RunData, scenario: str) -> list[dict[str, str]]:
    """The results table: (label, value, what it is) of the registry's ``report`` metrics,
    each beside its task-IL twin, plus two rows of the report's own (the latest Acc_t of an
    unfinished run after the accuracies, the client spread after memory drift). Every
    number is recomputed from records.csv, except time and memory (only summary.json
    knows them)."""
    from cfl_bench.core import metric_registry as registry

    m = data.metrics
    task_il = registry.TASK_IL_MARKER in m
    label = {"class-il": "class-IL", "domain-il": "domain-IL"}.get(scenario, "")
    extra: dict[str, list[tuple[str, str, str]]] = {"accuracy": [], "drift": []}
    latest = _latest_acc(m.get("acc_t"))
    if latest is not None and data.tasks_done < data.num_tasks:
        row = (
            f"Acc_t after task {latest[0]}",
            fmt(latest[1]),
            "the latest task end reached so far",
        )
        extra["accuracy"].append(row)
    spread = " / ".join(fmt(m.get(f"client_acc_{p}")) for p in ("p10", "p50", "p90"))
    extra["drift"].append(
        ("clients p10 / p50 / p90", spread, "local models' accuracy after the final task")
    )
    shown = registry.display_order(registry.metrics_for("class-il" if task_il else None, "report"))
    rows: list[tuple[str, str, str]] = []
    for index, spec in enumerate(shown):
        name = f"{spec.label} {label}".strip() if spec.label_names_scenario else spec.label
        what = spec.description if spec.origin == "summary" else "from summary.json"
        if not (spec.family == "diagnostics" and _unrecorded(spec, data)):
            rows.append((name, report_value(spec, data), what))
        if index + 1 == len(shown) or shown[index + 1].family != spec.family:
            rows += extra.pop(spec.family, [])
    for rest in extra.values():  # a family with no metric shown: its rows go last
        rows += rest
    return [{"label": a, "text": b, "what": c} for a, b, c in rows]


def _unrecorded(spec: Any, data: RunData) -> bool:
    """A metric recorded only on request that this run did not record: FedNTD's
    diagnostics (static-FL measures, --diagnostics) have no row in a run without them,
    rather than a column of dashes that reads as "measured, no value"."""
    source = data.metrics if spec.origin == "summary" else data.summary or {}
    return source.get(spec.key) is None


def _latest_acc(curve: Any) -> tuple[int, float] | None:
    """(1-based task, Acc_t) of the last task end with a value."""
    if not isinstance(curve, list):
        return None
    found = [(t + 1, v) for t, v in enumerate(curve) if _finite(v)]
    return found[-1] if found else None


# --------------------------------------------------------------------------------------------
# Figures
# --------------------------------------------------------------------------------------------


def run_series(data: RunData) -> StrategySeries:
    """The run as a one-seed :class:`StrategySeries` (std NaN: one run has no spread), so
    the leaderboard's per-task figures draw it unchanged."""
    import numpy as np

    from cfl_bench.leaderboard.aggregate import StrategySeries
    from cfl_bench.leaderboard.runs import CURVES, MATRICES

    m = data.metrics

    def curve(key: str) -> tuple[np.ndarray, np.ndarray] | None:
        values = m.get(key)
        if not isinstance(values, list) or not any(_finite(v) for v in values):
            return None
        mean = np.array([np.nan if v is None else float(v) for v in values])
        return mean, np.full_like(mean, np.nan)

    def matrix(key: str) -> np.ndarray | None:
        values = m.get(key)
        if not isinstance(values, list):
            return None
        array = np.array([[np.nan if v is None else float(v) for v in row] for row in values])
        return array if np.isfinite(array).any() else None

    series = StrategySeries(strategy=str(data.identity.get("strategy") or "?"), n_seeds=1)
    for name, key in CURVES.items():
        setattr(series, name, curve(key))
    for name, key in MATRICES.items():
        setattr(series, name, matrix(key))
    return series


def _figures(items: Sequence[tuple[str | None, str]]) -> list[dict[str, Any]]:
    from markupsafe import Markup

    from cfl_bench.leaderboard.html import figure_id_of

    return [
        {"id": figure_id_of(svg), "svg": Markup(svg), "caption": caption}
        for svg, caption in items
        if svg is not None
    ]


def task_figures(data: RunData, scenario_label: str) -> list[dict[str, Any]]:
    from cfl_bench.leaderboard.plots import curves_svg, drift_svg, matrix_panels_svg

    series = run_series(data)
    panels = [
        (name, matrix)
        for name, matrix in (
            (scenario_label, series.acc_matrix),
            ("task-IL", series.acc_task_il_matrix),
        )
        if matrix is not None
    ]
    return _figures(
        [
            (curves_svg([series], "r-curves"), f"{scenario_label} Acc_t and Fgt_t (%) after "
             "each task (Fgt_t from task 2: nothing can be forgotten before)."),
            (curves_svg([series], "r-curves-til", task_il=True), "Task-IL Acc_t and Fgt_t (%) "
             "(same evaluations, logits masked to each task's classes)."),
            (matrix_panels_svg(panels, "r-matrix"), "Accuracy matrix a[t][i] (%): row t = "
             "after training task t, column i = evaluated task (blank: not measured"
             + (", or the task has not ended yet" if data.tasks_done < data.num_tasks else "")
             + "). Cells right of the diagonal are tasks evaluated before they were trained, "
             "for FWT only; no other metric reads them."),
            (drift_svg([series], "r-drift"), "Memory drift MD_t: mean KL between the global "
             "model's predictions on each old task's probe right after that task and after "
             "task t (nats; from task 2)."),
        ]
    )  # fmt: skip


def round_figures(data: RunData) -> list[dict[str, Any]]:
    from cfl_bench.leaderboard.report_curves import round_accuracy_svg
    from cfl_bench.leaderboard.report_plots import rounds_svg
    from cfl_bench.leaderboard.run_data import per_round

    records = data.records
    ends = [e for e in data.eval_rounds if e <= max(data.rounds_done, 1)]
    curves = round_accuracy_svg(records, ends, "r-round-acc")
    svg = rounds_svg(
        per_round(records, "train_loss"),
        per_round(records, "bytes_up", "sum"),
        per_round(records, "bytes_down", "sum"),
        [e for e in data.eval_rounds if e <= max(data.rounds_done, 1)],
        data.total_rounds or data.rounds_done,
        "r-rounds",
    )
    return _figures(
        [
            (curves, "Accuracy (%) of the global model after every round (--eval-every-round; "
             "the final round's value is Acc_T, never the best round's). With --diagnostics, "
             "right: the round's participants' mean accuracy on the classes they hold and on "
             "those they lack, and the global model's class-wise forgetting (FedNTD eq. 5)."),
            (svg, "Left: training loss per round (mean over the round's local steps). Right: "
             "bytes sent up (clients → server) and down per round, all clients together. "
             "Dotted lines: task ends (where the accuracy matrix is measured)."),
        ]
    )  # fmt: skip


def client_figures(data: RunData) -> list[dict[str, Any]]:
    from cfl_bench.leaderboard.report_plots import (
        buffer_drift_svg,
        class_tables_svg,
        client_spread_svg,
    )
    from cfl_bench.leaderboard.run_data import buffer_drift_matrix, client_values_at_task_ends

    per_task = client_values_at_task_ends(data.records)
    ends = [e for e in data.eval_rounds if e <= max(data.rounds_done, 1)]
    return _figures(
        [
            (client_spread_svg(per_task, data.num_tasks, "r-clients"), "Accuracy (%) of each "
             "client's local model (after local training, before aggregation) at each task "
             "end, averaged over the tasks seen so far: one dot per client, with the p10 / "
             "p50 / p90 percentiles over clients."),
            (buffer_drift_svg(buffer_drift_matrix(data.records), ends,
                              data.total_rounds or data.rounds_done, "r-buffer"),
             "Buffer drift per round: mean KL between the logits stored with each client's "
             "replay-buffer examples and the current global model (median and p10–p90 over "
             "clients; thin lines: single clients). Dotted lines: task ends."),
            (class_tables_svg(data.class_tables or [], "r-classes"), "Training samples each "
             "client holds of each class, per task (only the classes present in the task; "
             "blank: none). Exact counts in the tables below."),
        ]
    )  # fmt: skip


# --------------------------------------------------------------------------------------------
# Tables and facts
# --------------------------------------------------------------------------------------------


def client_table(data: RunData) -> tuple[list[int], list[dict[str, Any]]]:
    """(1-based tasks, rows) of every client's accuracy at each task end."""
    from cfl_bench.leaderboard.run_data import client_values_at_task_ends

    per_task = client_values_at_task_ends(data.records)
    tasks = sorted(per_task)
    clients = sorted({k for values in per_task.values() for k in values})
    rows = []
    for k in clients:
        cells = []
        for t in tasks:
            value = per_task[t].get(k)
            cells.append(
                {"text": fmt(value), "sort": repr(float(value)) if value is not None else ""}
            )
        delay = data.offsets[k] if k < len(data.offsets) else ""
        rows.append({"client": k, "delay": delay, "cells": cells})
    return [t + 1 for t in tasks], rows


def class_table_context(data: RunData) -> list[dict[str, Any]] | None:
    """Every task's exact client × class counts (classes present in the task only)."""
    from cfl_bench.leaderboard.report_plots import present_classes

    if data.class_tables is None:
        return None
    out = []
    for task, table in data.class_tables:
        classes = present_classes(table) or list(range(len(table[0])))
        rows = [
            {"client": k, "counts": [row[c] for c in classes], "total": sum(row)}
            for k, row in enumerate(table)
        ]
        totals = [sum(row[c] for row in table) for c in classes] + [sum(map(sum, table))]
        out.append({"task": task, "classes": classes, "rows": rows, "totals": totals})
    return out


def _json(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, default=str)


def _short_value(value: Any) -> str:
    """An option or stream value in JSON spelling (true, null), floats to 4 digits."""
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    if isinstance(value, float):
        return format(value, ".4g")
    if isinstance(value, (dict, list)):
        text = json.dumps(value, sort_keys=True, separators=(", ", ": "), default=str)
        if isinstance(value, list) and value and all(isinstance(v, float) for v in value):
            text = "[" + ", ".join(format(v, ".4g") for v in value) + "]"
        return text if len(text) <= 300 else text[:297] + "..."
    return str(value)


def components(config: dict[str, Any]) -> list[dict[str, str]]:
    """The strategy's components with their roles and resolved options."""
    strategy = config.get("strategy")
    items = strategy.get("components") if isinstance(strategy, dict) else None
    if not isinstance(items, list):
        return []
    out = []
    for item in items:
        if not isinstance(item, dict):
            continue
        options = item.get("options")
        roles = item.get("roles")
        out.append(
            {
                "name": str(item.get("name", "?")),
                "roles": ", ".join(map(str, roles)) if isinstance(roles, list) else "",
                "options": ", ".join(f"{k}={_short_value(v)}" for k, v in sorted(options.items()))
                if isinstance(options, dict)
                else "",
            }
        )
    return out


def stream_facts(config: dict[str, Any], offsets: Sequence[int]) -> list[tuple[str, str]]:
    """The stream's recorded parameters (rotation angles, sizes, ...) and the task clock."""
    stream = config.get("stream")
    facts = (
        [(str(k), _short_value(v)) for k, v in sorted(stream.items())]
        if isinstance(stream, dict)
        else []
    )
    if any(offsets):
        facts.append(("client delays (rounds)", ", ".join(map(str, offsets))))
    return facts


def provenance(data: RunData) -> dict[str, Any]:
    """Git commit, machine, packages and costs (summary.json) for the last section."""
    identity, summary = data.identity, data.summary or {}
    environment = identity.get("environment") or {}
    packages = identity.get("packages") or {}
    checkpoint = summary.get("checkpoint")
    costs = [
        ("wall time", fmt(summary.get("wall_time_s"), ".1f", " s")),
        ("mean round time", fmt(summary.get("round_time_s_mean"), ".3f", " s")),
        ("training time (total)", fmt(summary.get("train_time_s_total"), ".1f", " s")),
        ("peak memory (RSS)", fmt_bytes(summary.get("peak_rss_bytes"))),
        ("peak CUDA memory", fmt_bytes(summary.get("cuda_peak_bytes"))),
        ("model parameters", fmt(summary.get("num_params"), ",.0f")),
        ("replay buffer per client", fmt_bytes(summary.get("buffer_bytes_per_client"))),
    ]
    if isinstance(checkpoint, dict):
        costs.append(
            (
                "checkpoints",
                f"{fmt(checkpoint.get('written'), '.0f')} written "
                f"({fmt(checkpoint.get('seconds'), '.2f', ' s')}, "
                f"{fmt_bytes(checkpoint.get('bytes'))})",
            )
        )
    return {
        "git_commit": identity.get("git_commit") or "unknown",
        "machine": [(k, str(environment.get(k, "")) or "–") for k in MACHINE_KEYS],
        "packages": [(k, "?" if v is None else str(v)) for k, v in sorted(packages.items())],
        "costs": costs,
    }


# --------------------------------------------------------------------------------------------
# The page
# --------------------------------------------------------------------------------------------


#: How much larger than its pixels a synthetic-image grid is shown (32×32 images are small).
IMAGE_ZOOM = 3


def image_sets(run_path: str) -> list[dict[str, Any]]:
    """The run's synthetic-image grids (``runner.image_sets``), each as a data: URI for the
    self-contained page, in task order; a file that is not a readable PNG is left out."""
    import base64
    import io
    import re

    from PIL import Image, UnidentifiedImageError

    from cfl_bench.core.run_dir import IMAGE_SETS

    folder = Path(run_path) / IMAGE_SETS
    if not folder.is_dir():
        return []
    found = []
    for path in folder.glob("*.png"):
        match = re.fullmatch(r"after-task-(\d+)\.png", path.name)
        if match is None or not path.is_file():
            continue
        raw = path.read_bytes()
        try:
            with Image.open(io.BytesIO(raw)) as image:
                width, height = image.size
                classes = str(image.info.get("classes", ""))
                image.verify()
        except (UnidentifiedImageError, OSError, SyntaxError):
            continue
        task = int(match.group(1))
        found.append((task, {
            "name": path.stem,
            "src": "data:image/png;base64," + base64.b64encode(raw).decode("ascii"),
            "width": width * IMAGE_ZOOM,
            "height": height * IMAGE_ZOOM,
            "caption": f"After task {task}: the pool the clients of task {task + 1} distil on"
            + (f"; rows: classes {classes.replace(',', ', ')}." if classes else "."),
        }))  # fmt: skip
    return [entry for _, entry in sorted(found, key=lambda pair: pair[0])]


def render_report(data: RunData) -> str:
    """The whole page as one HTML string (a pure function of ``data``)."""
    import jinja2
    from markupsafe import Markup

    from cfl_bench.leaderboard.html import SCENARIOS, content_security_policy
    from cfl_bench.leaderboard.page import SORT_JS
    from cfl_bench.leaderboard.protocol import describe_protocol
    from cfl_bench.leaderboard.report_page import FIGURES_MACRO, REPORT_CSS, TEMPLATE
    from cfl_bench.leaderboard.report_plots import payload_rows
    from cfl_bench.leaderboard.runs import INCOMPLETE_MESSAGE

    identity = data.identity
    scenario = identity.get("scenario") or ""
    label = SCENARIOS.get(scenario, scenario or "accuracy")
    client_tasks, client_rows = client_table(data)
    options = data.config.get("config")
    context = {
        "csp": content_security_policy(SORT_JS, images=True),
        "css": Markup(REPORT_CSS),
        "script": Markup(SORT_JS),
        "status": data.status,
        "message": "" if data.message == INCOMPLETE_MESSAGE else data.message.rstrip("."),
        "progress": progress_text(data),
        "notes": data.notes,
        "run": {
            "path": data.path,
            "strategy": identity.get("strategy") or "unknown strategy",
            "stream": identity.get("stream") or "unknown stream",
            "seed": "?" if identity.get("seed") is None else identity["seed"],
            "protocol_hash": identity.get("protocol_hash") or "unknown",
            "config_hash": identity.get("config_hash") or "unknown",
            "protocol_summary": describe_protocol(identity.get("protocol") or {}, scenario),
        },
        "metrics": metric_rows(data, scenario),
        "task_figures": task_figures(data, label),
        "round_figures": round_figures(data),
        "client_figures": client_figures(data),
        "payloads": payload_rows((data.summary or {}).get("bytes_by_payload")),
        "client_tasks": client_tasks,
        "client_rows": client_rows,
        "offsets": any(data.offsets),
        "class_tables": class_table_context(data),
        "components": components(data.config),
        "image_sets": image_sets(data.path),
        "stream_facts": stream_facts(data.config, data.offsets),
        "options_json": _json(options if isinstance(options, dict) else {}),
        "protocol_json": _json(identity.get("protocol") or {}),
        **provenance(data),
    }
    env = jinja2.Environment(
        autoescape=True, undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True
    )
    return env.from_string(FIGURES_MACRO + TEMPLATE).render(context)


def build_report(run_dir: str, out: str | None = None) -> tuple[Path, RunData]:
    """Check, read, render and write the report of ``run_dir``; (file written, the data).

    Order, and why: ``--out`` is checked before the records are read (a typo should not
    wait for a large run to load), the page is rendered in memory, and only then written
    (atomically, creating missing folders, see :func:`leaderboard.output.write_board_files`),
    so a refusal at any step leaves nothing behind."""
    from cfl_bench.core.text_values import utf8_text
    from cfl_bench.leaderboard.output import write_board_files
    from cfl_bench.leaderboard.run_data import check_run_dir, load_run_data

    folder = check_run_dir(run_dir)
    path = check_report_out(str(default_out(run_dir)) if out is None else out, folder)
    data = load_run_data(run_dir)
    html = utf8_text(render_report(data))  # a run folder's name need not be UTF-8
    (written,) = write_board_files(path.parent, {path.name: html}, what="the report")
    return written, data


def report_command(run_dir: str, out: str | None) -> None:
    """The terminal side: build the report and say where it is (data as text, not markup)."""
    from rich.console import Console
    from rich.text import Text

    from cfl_bench.core.text_values import utf8_text

    path, data = build_report(run_dir, out)
    line = Text("report written to ")
    line.append(utf8_text(str(path)), style="bold")
    line.append(f" ({data.status}: {progress_text(data)})")
    Console(soft_wrap=True).print(line)
