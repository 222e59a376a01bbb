"""The plain progress line a run prints per round when its output is not a terminal."""

from __future__ import annotations

import io

import pytest

from cfl_bench.progress import RoundLog, RoundReport, clock


def test_clock_formats_hours_minutes_seconds() -> None:
    assert clock(0) == "0:00:00"
    assert clock(3725.4) == "1:02:05"


def test_one_line_per_round_with_eta_from_this_process(monkeypatch: pytest.MonkeyPatch) -> None:
    now = iter([100.0, 130.0, 160.0])  # start, after round 9, after round 10
    monkeypatch.setattr("cfl_bench.progress.time.monotonic", lambda: next(now))
    sink = io.StringIO()
    log = RoundLog(sink)
    log(RoundReport(9, 25, 1, 5, 71.234))  # a resumed run: its first round here is 9
    log(RoundReport(10, 25, 1, 5, None))
    lines = sink.getvalue().splitlines()
    # 30 s for 1 round here, 16 left → 8 min; then 60 s for 2 rounds, 15 left → 7:30.
    assert lines == [
        "round 9/25 · task 2/5 · Acc 71.23% · 0:00:30 elapsed · ETA 0:08:00",
        "round 10/25 · task 2/5 · 0:01:00 elapsed · ETA 0:07:30",
    ]
