"""`--executor flower` says what it is doing while Flower and Ray start (a minute and more on
2 cores), then passes on the run's own lines, which the ServerApp writes to a file
(``flower.SAID_FILE``): all of them, including those written just before Flower exits
(Flower's own log stream can end before its last upload arrives)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from cfl_bench.flower import launch


def test_relay_says_it_is_starting_then_passes_every_run_line_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(launch, "STARTING_NOTE_SECONDS", 0.2)
    said_file = tmp_path / "said.txt"
    script = (
        "import sys, time\n"
        "print('INFO : Starting Flower SuperLink', flush=True)\n"
        "time.sleep(1.0)\n"
        f"said = open({str(said_file)!r}, 'a', buffering=1)\n"
        "said.write('round 1/2 · task 1/1 · 0:00:01 elapsed · ETA 0:00:01\\n')\n"
        "print('INFO : round 1/2 in Flower log, not passed on twice', flush=True)\n"
        "time.sleep(0.6)\n"
        "said.write('round 2/2 · task 1/1')\n"  # half a line: waits for the rest
        "said.flush(); time.sleep(0.6)\n"
        "said.write(' · 0:00:02 elapsed · ETA 0:00:00\\nnote: last words')\n"
        "said.close()\n"  # and Flower exits at once, the last line without its newline
    )
    said: list[str] = []
    command = [sys.executable, "-c", script]
    output = launch.relay(command, dict(os.environ), said_file, said.append)
    starting = [s for s in said if s.startswith("Flower: starting")]
    assert starting, said  # something was said during the silent start
    assert said[len(starting) :] == [
        "round 1/2 · task 1/1 · 0:00:01 elapsed · ETA 0:00:01",
        "round 2/2 · task 1/1 · 0:00:02 elapsed · ETA 0:00:00",
        "note: last words",
    ]
    assert "Starting Flower SuperLink" in output  # kept for the error message


def test_a_file_tail_returns_complete_lines_once(tmp_path: Path) -> None:
    path = tmp_path / "said.txt"
    tail = launch.FileTail(path)
    assert tail.new_lines() == [] and not tail.seen_any  # no file yet
    path.write_text("a\nb")
    assert tail.new_lines() == ["a"] and tail.seen_any
    with path.open("a") as fh:
        fh.write("c\n\nd\n")
    assert tail.new_lines() == ["bc", "d"]
    assert tail.new_lines(final=True) == []
