"""What the user sees: one rich progress bar over the whole grid, a line per ended run, and
a final table.

The bar counts every point that needs no more work from this sweep (skipped, finished,
diverged, failed, busy) and shows the running points by name, so a long sweep can be left
alone and glanced at. On a non-terminal (CI logs, tests) the bar is off and the one-line
messages are what remains.
"""

from __future__ import annotations

import time
from collections import Counter
from types import TracebackType

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Column, Table
from rich.text import Text

from cfl_bench.engine.progress import clock
from cfl_bench.sweeps.scheduler import TERMINAL, PointState

STYLE = {
    "finished": "green",
    "diverged": "yellow",
    "failed": "red",
    "busy": "magenta",
    "interrupted": "yellow",
}


class SweepProgress:
    """Context manager around the rich Progress; ``changed`` is the scheduler's callback.

    At 80 columns the line keeps its bar, the done/total count, the failures, the elapsed
    time and the ETA; only the names of the running points, last, are cut with "…".
    """

    def __init__(self, console: Console, states: list[PointState], jobs: int = 1) -> None:
        self.console = console
        self.states = states
        self.progress = Progress(
            TextColumn("[bold]sweep"),
            BarColumn(bar_width=16),
            MofNCompleteColumn(),
            TextColumn("{task.fields[counts]}"),
            TimeElapsedColumn(),
            SweepEta(states, jobs),
            TextColumn(
                "{task.fields[running]}",
                table_column=Column(ratio=1, no_wrap=True, overflow="ellipsis"),
            ),
            console=console,
            transient=False,
            expand=True,
            disable=not console.is_terminal,
        )
        self.bar = self.progress.add_task("sweep", total=len(states), counts="", running="")

    def __enter__(self) -> SweepProgress:
        self.progress.start()
        self.refresh()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.refresh()
        self.progress.stop()

    def refresh(self) -> None:
        counts = Counter(s.status for s in self.states)
        skipped = sum(s.skipped for s in self.states)
        running = [s.point.name for s in self.states if s.status == "running"]
        shown = ", ".join(running[:3]) + (f" +{len(running) - 3}" if len(running) > 3 else "")
        parts = [f"{skipped} skipped" if skipped else "", f"{counts['failed']} failed"]
        self.progress.update(
            self.bar,
            completed=sum(counts[s] for s in TERMINAL),
            counts=" · ".join(p for p in parts if p and not p.startswith("0 ")),
            running=f"running {escape(shown)}" if running else "",
        )

    def changed(self, state: PointState) -> None:
        """Announce a point that ended and redraw the bar (interrupted points are named by
        the sweep's closing line)."""
        if state.status not in ("pending", "running", "interrupted"):
            done = sum(s.status in TERMINAL for s in self.states)
            acc = "" if state.final_acc is None else f"  Acc_T {state.final_acc:.2f}%"
            style = STYLE.get(state.status, "white")
            self.console.print(
                f"[{done}/{len(self.states)}] [{style}]{state.status}[/] "
                f"{escape(state.point.name)}{acc}",
                highlight=False,
            )
        self.refresh()


class SweepEta(ProgressColumn):
    """Time left: the mean wall time of the runs this sweep finished, times the runs still
    to go (less what the running ones have done), over the parallel jobs; "ETA …" until a
    first run has finished. Skipped runs count for nothing: they cost no time."""

    def __init__(self, states: list[PointState], jobs: int) -> None:
        super().__init__()
        self.states = states
        self.jobs = max(1, jobs)

    def render(self, task: Task) -> Text:
        timed = [
            s.wall_time_s
            for s in self.states
            if s.status in TERMINAL and not s.skipped and s.wall_time_s is not None
        ]
        if not timed:
            return Text("ETA …")
        mean = sum(timed) / len(timed)
        now = time.monotonic()
        left = sum(
            mean if s.status == "pending" else max(0.0, mean - (now - (s.started or now)))
            for s in self.states
            if s.status in ("pending", "running")
        )
        return Text(f"ETA {clock(left / self.jobs)}")


def announce_skipped(console: Console, states: list[PointState]) -> None:
    """How many points are done, and each point whose run is damaged (it runs again)."""
    skipped = [s for s in states if s.skipped]
    if skipped:
        console.print(
            f"{len(skipped)} of {len(states)} runs already done (same request hash): skipped.",
            highlight=False,
        )
    for state in states:
        if state.damage:
            console.print(
                f"{state.point.name}: {state.damage}",
                highlight=False,
                markup=False,
            )


def results_table(states: list[PointState]) -> Table:
    """One row per grid point: name, status, final accuracy, wall time, note."""
    table = Table(title="sweep results")
    table.add_column("#", justify="right")
    table.add_column("run", overflow="fold")
    table.add_column("status")
    table.add_column("Acc_T %", justify="right")
    table.add_column("time", justify="right")
    table.add_column("note", overflow="fold")
    for s in states:
        note = "skipped (already done)" if s.skipped else _telling_line(s.message)
        table.add_row(
            str(s.point.index + 1),
            escape(s.point.name),
            f"[{STYLE.get(s.status, 'white')}]{s.status}[/]",
            "—" if s.final_acc is None else f"{s.final_acc:.2f}",
            "—" if s.wall_time_s is None else f"{s.wall_time_s:.1f} s",
            escape(note),
        )
    return table


def _telling_line(message: str) -> str:
    """The most telling line of a failure: its last non-empty one (the error itself)."""
    lines = [line for line in message.splitlines() if line.strip()]
    return lines[-1][:120] if lines else ""
