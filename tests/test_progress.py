"""The plain progress line a run prints per round when its output is not a terminal."""

from __future__ import annotations

import io

import pytest

from cfl_bench.engine.progress import RoundLog, RoundReport, clock


def test_clock_formats_hours_minutes_seconds() -> None:
    assert clock(0) == "0:00:00"
    assert clock(3725.4) == "1:02:05"


def test_one_line_per_round_with_eta_from_this_process(monkeypatch: pytest.MonkeyPatch) -> None:
    now = iter([100.0, 130.0, 160.0])  # start, after round 9, after round 10
    monkeypatch.setattr("cfl_bench.engine.progress.time.monotonic", lambda: next(now))
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


def test_a_long_round_says_how_many_clients_are_done(monkeypatch: pytest.MonkeyPatch) -> None:
    """Inside a round, a line at most every QUIET_ROUND_SECONDS, never for the last client
    (the round's own line follows)."""
    from cfl_bench.engine.progress import QUIET_ROUND_SECONDS, ClientsReport

    now = [100.0]
    monkeypatch.setattr("cfl_bench.engine.progress.time.monotonic", lambda: now[0])
    sink = io.StringIO()
    log = RoundLog(sink)
    for done, at in ((1, 110.0), (2, 100.0 + QUIET_ROUND_SECONDS), (3, 140.0), (4, 200.0)):
        now[0] = at
        log.clients_done(ClientsReport(1, 40, done, 4))
    assert sink.getvalue().splitlines() == ["round 1/40 · clients 2/4 done · 0:00:30 elapsed"]


def test_the_engine_reports_every_client_of_every_round(tmp_path: object) -> None:
    from cfl_bench.engine.progress import ClientsReport
    from cfl_bench.runner.config import make_config
    from cfl_bench.runner.run import execute

    seen: list[ClientsReport] = []

    class Display:
        def __call__(self, report: RoundReport) -> None:
            pass

        def clients_done(self, report: ClientsReport) -> None:
            seen.append(report)

    values = {"tasks": 2, "rounds_per_task": 1, "clients": 4, "participation": 0.5}
    values |= {"train_size": 300, "test_size": 100, "threads": 1, "out": f"{tmp_path}/r"}
    execute(make_config(values), Display())
    assert [(r.round_index, r.done, r.clients) for r in seen] == [
        (1, 1, 2), (1, 2, 2), (2, 1, 2), (2, 2, 2),
    ]  # fmt: skip
    assert {r.total_rounds for r in seen} == {2}


def test_the_live_bar_shows_the_clients_of_the_round_in_progress() -> None:
    from rich.console import Console

    from cfl_bench.engine.progress import ClientsReport
    from cfl_bench.run_display import round_display

    console = Console(file=io.StringIO(), force_terminal=True, width=80)
    with round_display(console, "rot-digits · fedavg") as on_round:
        on_round.clients_done(ClientsReport(1, 40, 2, 4))  # type: ignore[attr-defined]
        during = on_round.progress.tasks[0].fields["acc"]  # type: ignore[attr-defined]
        on_round(RoundReport(1, 40, 0, 2, 50.0))
        after = on_round.progress.tasks[0].fields["acc"]  # type: ignore[attr-defined]
    assert (during, after) == ("clients 2/4", "Acc 50.00%")


def test_the_live_bar_keeps_the_run_name_and_shows_an_eta() -> None:
    from rich.console import Console

    from cfl_bench.run_display import round_display

    console = Console(file=io.StringIO(), force_terminal=True, width=120)
    with round_display(console, "rot-digits · fedavg") as on_round:
        on_round(RoundReport(1, 4, 0, 2, 50.0))
        task = on_round.progress.tasks[0]  # type: ignore[attr-defined]
    assert task.description == "rot-digits · fedavg · task 1/2"
    # One round of four took t seconds here, so three are left: ETA 3t (t < 1 s: 0:00:0x).
    assert task.fields["eta"].startswith("ETA 0:00:0")
