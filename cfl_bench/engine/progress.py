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


@dataclass(frozen=True)
class ClientsReport:
    """What the engine tells a display after each client update within a round."""

    round_index: int  # 1-based, the round in progress
    total_rounds: int
    done: int  # client updates of this round received so far
    clients: int  # participants of this round


def clock(seconds: float) -> str:
    """``h:mm:ss``."""
    whole = max(0, round(seconds))
    return f"{whole // 3600}:{whole % 3600 // 60:02d}:{whole % 60:02d}"


# Inside a round, a line on the clients done is printed once the last line is this old.
QUIET_ROUND_SECONDS = 30.0


class RoundLog:
    """Formats one line per round and estimates the time left from this process's rounds.

    Inside a long round it also says how many clients are done (``clients_done``), at most
    one line every ``QUIET_ROUND_SECONDS``: a ResNet-18 round on a CPU takes many minutes,
    and without it the run looked stuck.
    """

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream
        self.started = time.monotonic()
        self.first_round: int | None = None  # the first round this process ran
        self.last_line = self.started

    def line(self, report: RoundReport) -> str:
        acc = "" if report.latest_acc is None else f" · Acc {report.latest_acc:.2f}%"
        return (
            f"round {report.round_index}/{report.total_rounds} · task {report.task + 1}/"
            f"{report.num_tasks}{acc} · {self.timing(report)}"
        )

    def timing(self, report: RoundReport) -> str:
        """``0:01:12 elapsed · ETA 0:02:10`` after ``report``'s round."""
        elapsed, eta = self.estimate(report)
        return f"{clock(elapsed)} elapsed · ETA {clock(eta)}"

    def estimate(self, report: RoundReport) -> tuple[float, float]:
        """Seconds elapsed and left after ``report``'s round, from the rounds this process
        ran (a resumed run's earlier rounds took time this clock never saw)."""
        if self.first_round is None:
            self.first_round = report.round_index
        self.last_line = time.monotonic()
        elapsed = self.last_line - self.started
        done_here = report.round_index - self.first_round + 1
        left = report.total_rounds - report.round_index
        return elapsed, elapsed / done_here * left

    def clients_line(self, report: ClientsReport) -> str:
        """``round 3/40 · clients 4/10 done · 0:12:00 elapsed`` (a round in progress)."""
        self.last_line = time.monotonic()
        return (
            f"round {report.round_index}/{report.total_rounds} · clients {report.done}/"
            f"{report.clients} done · {clock(self.last_line - self.started)} elapsed"
        )

    def __call__(self, report: RoundReport) -> None:
        self.print(self.line(report))

    def clients_done(self, report: ClientsReport) -> None:
        """A line on the round in progress, once the last line is old enough."""
        if report.done < report.clients and self.due():
            self.print(self.clients_line(report))

    def due(self) -> bool:
        return time.monotonic() - self.last_line >= QUIET_ROUND_SECONDS

    def print(self, text: str) -> None:
        print(text, file=self.stream or sys.stdout, flush=True)
