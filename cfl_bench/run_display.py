"""How a run shows its progress: a live bar on a terminal, one plain line per round
otherwise (``engine.progress.RoundLog``). Shared by `cfl-bench run` and ``cfl_bench.run``.

The bar keeps the run's name (stream · strategy) beside the task it is in, and an ETA from
the same clock as the plain lines, so a terminal and a log file never disagree on the time
left; inside a long round it counts the clients done.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

if TYPE_CHECKING:
    from rich.console import Console

    from cfl_bench.engine.progress import ClientsReport, RoundReport


@contextlib.contextmanager
def round_display(console: Console, title: str) -> Iterator[Callable[[Any], None]]:
    """A live progress bar on a terminal; one plain line per round otherwise. Both also
    show the clients done inside a long round (``clients_done``)."""
    from cfl_bench.engine.progress import RoundLog

    if not console.is_terminal:
        yield RoundLog()
        return
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("rounds"),
        TimeElapsedColumn(),
        TextColumn("{task.fields[eta]}"),
        TextColumn("{task.fields[acc]}"),
        console=console,
        transient=False,
    ) as progress:
        yield LiveRounds(progress, progress.add_task(title, total=None, acc="", eta=""), title)


class LiveRounds:
    """The live bar's callbacks: a round ended (``__call__``), a client of the round in
    progress is done (``clients_done``: "clients 3/10" beside the bar until the round ends)."""

    def __init__(self, progress: Progress, bar: Any, title: str) -> None:
        from cfl_bench.engine.progress import RoundLog

        self.progress, self.bar, self.title = progress, bar, title
        self.log = RoundLog()  # the plain form's clock: both show the same ETA
        self.acc = ""

    def __call__(self, report: RoundReport) -> None:
        from cfl_bench.engine.progress import clock

        _, left = self.log.estimate(report)
        self.acc = "" if report.latest_acc is None else f"Acc {report.latest_acc:.2f}%"
        self.progress.update(
            self.bar,
            total=report.total_rounds,
            completed=report.round_index,
            description=f"{self.title} · task {report.task + 1}/{report.num_tasks}",
            acc=self.acc,
            eta=f"ETA {clock(left)}",
        )

    def clients_done(self, report: ClientsReport) -> None:
        clients = f"clients {report.done}/{report.clients}"
        shown = clients if report.done < report.clients else ""
        self.progress.update(self.bar, total=report.total_rounds, acc=f"{self.acc} {shown}".strip())
