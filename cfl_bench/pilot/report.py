"""The boundary pilot's files: boundary.png, boundary.svg, pilot.json and index.html.

Every file is written atomically (``cfl_bench.core.atomic``: temporary file, fsync, rename), the
page last, so a page on disk always shows a complete set. pilot.json holds every number and
the whole configuration; index.html embeds the figure (base64 PNG) and the table of
forgetting numbers, so it can be mailed or opened anywhere on its own.
"""

from __future__ import annotations

import base64
import html
from pathlib import Path

from cfl_bench.core.atomic import atomic_write, atomic_write_json, atomic_write_text
from cfl_bench.pilot.boundary import NUM_CLIENTS, Measured, PilotResult, mean_of
from cfl_bench.pilot.iris import DominantClassPartitioner
from cfl_bench.runner import provenance
from cfl_bench.streams.partition import client_class_counts

PAPER = "Chunduru, Morafah et al. 2025 (FedProj), Fig. 1"
MEASURE = (
    "forgetting = mean over clients and rounds of the fraction of the plotting area (an n×n "
    "grid of cell centres over the PCA bounding box widened by `margin` on each side) — and, "
    "separately, of the 150 data points — where the client's model after local training "
    "predicts another class than the global model it started from in that round"
)


def run_record(run: Measured) -> dict[str, object]:
    """One (init, strategy) run's numbers; ``None`` where a run recorded no client update."""
    empty = not any(run.area)
    return {
        "init": run.init,
        "strategy": run.strategy,
        "status": run.status,
        "message": run.message,
        "forgetting_area": None if empty else mean_of(run.area),
        "forgetting_data": None if empty else mean_of(run.points),
        "per_round": {"area": run.area, "data": run.points},
        "final_global_accuracy": run.final_accuracy,
    }


def pilot_record(
    result: PilotResult,
    requested: list[str] | None,
    unavailable: list[dict[str, str]],
    threads: int,
) -> dict[str, object]:
    """pilot.json: the configuration, the data and split, and every run's numbers."""
    config, split, points = result.config, result.split, result.points
    counts = client_class_counts(split.parts, points.y, len(points.class_names))
    held = [] if split.held is None else split.held.tolist()
    return {
        "pilot": "boundary",
        "paper": PAPER,
        "measure": MEASURE,
        "config": {
            **vars(config),
            "strategies": list(config.strategies),
            "clients": NUM_CLIENTS,
            "inits": sorted({run.init for run in result.runs}, key=["random", "pretrained"].index),
            "model": f"MLP 2→{config.hidden}→3, tanh",
            "optimizer": "sgd (momentum 0)",
            "participation": 1.0,
            "weighting": "samples",
            "threads": threads,
        },
        "strategies": {
            "requested": requested,
            "run": list(config.strategies),
            "unavailable_defaults": unavailable,
        },
        "data": {
            "base": "iris (scikit-learn), standardised, 2-D PCA",
            "points": int(points.y.numel()),
            "class_names": list(points.class_names),
            "explained_variance": points.explained_variance,
            "partition": DominantClassPartitioner(config.share).describe(),
            "public_points": len(held),
            "public_indices": held,
            "client_class_counts": counts.tolist(),
            "plot_box": list(result.box.extent),
        },
        "pretrained_accuracy": result.pretrained_accuracy,
        "results": [run_record(run) for run in result.runs],
        "wall_time_s": result.seconds,
        "git_commit": provenance.git_commit(),
        "packages": provenance.package_versions(),
    }


def percent(value: object) -> str:
    return "–" if not isinstance(value, float) else f"{100 * value:.1f} %"


def index_html(record: dict[str, object], png: bytes) -> str:
    """The self-contained page: the figure, the forgetting table, the configuration."""
    results = record["results"]
    assert isinstance(results, list)
    rows = "\n".join(
        "<tr>"
        + "".join(
            f"<td>{html.escape(cell)}</td>"
            for cell in (
                str(r["init"]),
                str(r["strategy"]),
                percent(r["forgetting_area"]),
                percent(r["forgetting_data"]),
                percent(r["final_global_accuracy"]),
                str(r["status"]),
            )
        )
        + "</tr>"
        for r in results
    )
    strategies = record["strategies"]
    assert isinstance(strategies, dict)
    missing = "".join(
        f"<li>default <code>{html.escape(u['strategy'])}</code> was not run: "
        f"{html.escape(u['reason'])}</li>"
        for u in strategies["unavailable_defaults"]
    )
    settings = record["config"]
    assert isinstance(settings, dict)
    config = html.escape(", ".join(f"{k}={v}" for k, v in settings.items()))
    image = base64.b64encode(png).decode("ascii")
    return PAGE.format(
        paper=html.escape(PAPER),
        measure=html.escape(MEASURE),
        image=image,
        rows=rows,
        missing=f"<ul>{missing}</ul>" if missing else "",
        config=config,
    )


PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<title>cfl-bench pilot: decision boundaries</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em; max-width: 1100px; }}
table {{ border-collapse: collapse; margin: 1em 0; }}
td, th {{ border: 1px solid #ccc; padding: 4px 10px; text-align: right; }}
td:nth-child(-n+2), th:nth-child(-n+2) {{ text-align: left; }}
img {{ max-width: 100%; }}
.note {{ color: #555; font-size: 90%; }}
</style></head><body>
<h1>Decision-boundary pilot</h1>
<p>After {paper}: do clients forget the global decision boundary during local training?</p>
<table><thead><tr><th>init</th><th>strategy</th><th>forgetting (area)</th>
<th>forgetting (data)</th><th>final global accuracy</th><th>status</th></tr></thead>
<tbody>
{rows}
</tbody></table>
{missing}
<p class="note">{measure}.</p>
<img alt="decision boundaries" src="data:image/png;base64,{image}">
<p class="note">Configuration: {config}. Files: <a href="boundary.svg">boundary.svg</a>,
<a href="pilot.json">pilot.json</a>.</p>
</body></html>
"""


def write_outputs(out: Path, record: dict[str, object], png: bytes, svg: bytes) -> list[Path]:
    """The four files into ``out``, each atomically, the page last."""
    paths = [out / "boundary.png", out / "boundary.svg", out / "pilot.json", out / "index.html"]
    atomic_write(paths[0], lambda fh: fh.write(png))
    atomic_write(paths[1], lambda fh: fh.write(svg))
    atomic_write_json(paths[2], record)
    atomic_write_text(paths[3], index_html(record, png))
    return paths
