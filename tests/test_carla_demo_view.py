"""What the CARLA demo shows while it runs and on its page: elapsed time and ETA, a note
while no box is found, whole-number round ticks on a readable mAP axis."""

from __future__ import annotations

import io

import pandas as pd
from rich.console import Console

from cfl_bench.carla_bridge.demo_page import MIN_Y_SPAN, axis_top, curves_svg, no_box_note
from cfl_bench.carla_demo import DemoOptions, live_view, no_detection_note, view_table
from cfl_bench.engine.progress import RoundReport

OPTIONS = DemoOptions(
    source="replay", data_root="data", host="127.0.0.1", port=2000, timeout=10.0, clients=2,
    rounds=4, shift_round=2, strategy="fedavg", seed=0, out=None, threads=1, epochs=1,
    batch_size=4, lr=None, buffer_size=10,
)  # fmt: skip


def report(round_index: int, scores: tuple[tuple[str, float], ...]) -> RoundReport:
    return RoundReport(round_index, 4, 0, 2, None, (23, 23), (10, 10), scores)


def test_all_zero_scores_get_a_note_and_real_ones_none() -> None:
    assert "no box detected correctly yet" in no_detection_note(report(1, (("task 1", 0.0),)))
    assert no_detection_note(report(2, (("task 1", 0.0), ("test", 1.5)))) == ""
    assert no_detection_note(report(1, ())) == ""  # not evaluated yet: nothing to explain


def test_the_live_table_says_elapsed_eta_and_the_note() -> None:
    table = view_table(report(1, (("task 1", 0.0),)), OPTIONS, "0:00:20 elapsed · ETA 0:01:00")
    caption = str(table.caption)
    assert "ETA 0:01:00" in caption and "no box detected correctly yet" in caption


def test_the_plain_view_prints_one_line_per_round_with_an_eta() -> None:
    sink = io.StringIO()
    console = Console(file=sink, width=200)
    with live_view(console, OPTIONS) as on_round:
        on_round(report(1, (("task 1", 0.0),)))
        on_round(report(2, (("task 1", 3.0),)))
    lines = sink.getvalue().splitlines()
    assert len(lines) == 2 and all("elapsed · ETA" in line for line in lines)
    assert "no box detected correctly yet" in lines[0]
    assert "no box" not in lines[1]


def test_the_page_axis_spans_at_least_min_y_span_and_no_box_is_explained() -> None:
    flat = {"urban": pd.Series([0.0, 0.0, 0.0], index=[1, 2, 3])}
    assert axis_top(flat) == MIN_Y_SPAN
    assert axis_top({"urban": pd.Series([40.0], index=[1])}) == 44.0
    assert "<svg" in curves_svg(flat, 2)
    assert "no predicted box reaches score" in no_box_note(0)
    assert no_box_note(3) == ""
