"""The single-run report and the pilot figure explain what they draw: no FedNTD diagnostic
rows in a run that did not record them, headroom above the bytes curve, a key to the
pilot's dashed lines, hollow points and "area" / "data" numbers."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from cfl_bench.leaderboard.report import report_command
from cfl_bench.runner.config import make_config
from cfl_bench.runner.run import execute

TINY = {"tasks": 2, "rounds_per_task": 1, "clients": 2, "train_size": 300, "test_size": 100}


def test_diagnostic_rows_only_for_runs_that_recorded_them(tmp_path: Path) -> None:
    plain, measured = tmp_path / "plain", tmp_path / "measured"
    execute(make_config({**TINY, "threads": 1, "out": str(plain)}))
    execute(
        make_config(
            {
                **TINY,
                "threads": 1,
                "out": str(measured),
                "diagnostics": True,
                "eval_every_round": True,
            }
        )
    )
    for run in (plain, measured):
        report_command(str(run), str(run / "report.html"))
    assert "in-local acc" not in (plain / "report.html").read_text(encoding="utf-8")
    assert "in-local acc" in (measured / "report.html").read_text(encoding="utf-8")


def test_the_bytes_curve_has_headroom_under_the_top_edge() -> None:
    from matplotlib.figure import Figure

    from cfl_bench.leaderboard.report_plots import _bytes_panel

    ax = Figure().subplots()
    flat = pd.Series([7e5] * 10, index=range(1, 11))
    _bytes_panel(ax, flat, flat, "o")
    assert ax.get_ylim()[1] >= 1.2 * 7e5


def test_the_pilot_legend_explains_lines_points_and_numbers() -> None:
    from types import SimpleNamespace

    from cfl_bench.pilot.plot import KEY, legend_handles

    result = SimpleNamespace(points=SimpleNamespace(class_names=("a", "b", "c")))
    labels = [h.get_label() for h in legend_handles(result)]  # type: ignore[arg-type,attr-defined]
    assert labels[:3] == ["a", "b", "c"]
    assert any("boundary" in label for label in labels)
    assert any("public points" in label for label in labels)
    assert '"area"' in KEY and '"data"' in KEY
