"""`--executor flower` says what it is doing while Flower and Ray start (a minute and more on
2 cores), then passes on the run's own lines from inside the ServerApp."""

from __future__ import annotations

import os
import sys

import pytest

from cfl_bench.flower import launch


def test_run_lines_are_found_behind_flowers_log_prefix() -> None:
    assert launch.run_line("INFO :      round 3/10 · task 1/2 · 0:00:05 elapsed\n") == (
        "round 3/10 · task 1/2 · 0:00:05 elapsed"
    )
    assert launch.run_line("note: --threads 4 is more than the 2 usable cores\n") is not None
    assert launch.run_line("INFO :      Starting Flower SuperLink\n") is None


def test_relay_says_it_is_starting_then_passes_the_run_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(launch, "STARTING_NOTE_SECONDS", 0.2)
    script = (
        "import time\n"
        "print('INFO : Starting Flower SuperLink', flush=True)\n"
        "time.sleep(1.0)\n"
        "print('INFO : round 1/2 · task 1/1 · 0:00:01 elapsed · ETA 0:00:01', flush=True)\n"
        "print('INFO : round 2/2 · task 1/1 · 0:00:02 elapsed · ETA 0:00:00', flush=True)\n"
    )
    said: list[str] = []
    output = launch.relay([sys.executable, "-c", script], dict(os.environ), said.append)
    starting = [s for s in said if s.startswith("Flower: starting")]
    assert starting, said  # something was said during the silent start
    assert said[len(starting) :] == [
        "round 1/2 · task 1/1 · 0:00:01 elapsed · ETA 0:00:01",
        "round 2/2 · task 1/1 · 0:00:02 elapsed · ETA 0:00:00",
    ]
    assert "Starting Flower SuperLink" in output  # kept for the error message
