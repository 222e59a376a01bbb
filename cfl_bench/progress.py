"""Round-by-round progress of a run: a live bar on a terminal, plain lines everywhere else.

Why plain lines: a run inside a batch job, a sweep child or ``> log.txt`` has no terminal,
and a live bar there is either invisible or a stream of control characters, so the run
looked silent for half an hour. One line per round (round, task, latest accuracy, elapsed
time, ETA) can be followed with ``tail -f`` and grepped afterwards. The ETA counts only the
rounds run by this process, so a resumed run does not claim the earlier rounds took no time.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import TextIO


@dataclass(frozen=True)
class RoundReport:
    """What the engine tells the progress display after each round."""

    round_index: int  # 1-based, of the whole run
    total_rounds: int
    task: int  # 0-based global task
    num_tasks: int
    latest_acc: float | None
    # For live views (the CARLA demo): examples each client trained on this round and its
    # buffer fill, and the latest evaluation's headline score per evaluated task ("test" for
    # a held-out test domain).
    client_examples: tuple[int, ...] = ()
    buffer_fill: tuple[int, ...] = ()
    latest_scores: tuple[tuple[str, float], ...] = ()


def clock(seconds: float) -> str:
    """``h:mm:ss``."""
    whole = max(0, round(seconds))
    return f"{whole // 3600}:{whole % 3600 // 60:02d}:{whole % 60:02d}"


class RoundLog:
    """Formats one line per round and estimates the time left from this process's rounds."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream
        self.started = time.monotonic()
        self.first_round: int | None = None  # the first round this process ran

    def line(self, report: RoundReport) -> str:
        if self.first_round is None:
            self.first_round = report.round_index
        elapsed = time.monotonic() - self.started
        done_here = report.round_index - self.first_round + 1
        left = report.total_rounds - report.round_index
        eta = elapsed / done_here * left
        acc = "" if report.latest_acc is None else f" · Acc {report.latest_acc:.2f}%"
        return (
            f"round {report.round_index}/{report.total_rounds} · task {report.task + 1}/"
            f"{report.num_tasks}{acc} · {clock(elapsed)} elapsed · ETA {clock(eta)}"
        )

    def __call__(self, report: RoundReport) -> None:
        stream = self.stream or sys.stdout
        print(self.line(report), file=stream, flush=True)
