"""What the user sees: one rich progress bar over the whole grid, a line per ended run, and
a final table.

The bar counts every point that needs no more work from this sweep (skipped, finished,
diverged, failed, busy) and shows the running points by name, so a long sweep can be left
alone and glanced at. On a non-terminal (CI logs, tests) the bar is off and the one-line
messages are what remains.
"""

from __future__ import annotations

from collections import Counter
from types import TracebackType

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from cfl_bench.sweep.scheduler import TERMINAL, PointState

STYLE = {
    "finished": "green",
    "diverged": "yellow",
    "failed": "red",
    "busy": "magenta",
    "interrupted": "yellow",
}


class SweepProgress:
    """Context manager around the rich Progress; ``changed`` is the scheduler's callback."""

    def __init__(self, console: Console, states: list[PointState]) -> None:
        self.console = console
        self.states = states
        self.progress = Progress(
            TextColumn("[bold]sweep"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[counts]}"),
            TimeElapsedColumn(),
            TextColumn("{task.fields[running]}"),
            console=console,
            transient=False,
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
        self.progress.update(
            self.bar,
            completed=sum(counts[s] for s in TERMINAL),
            counts=f"skipped {skipped} · failed {counts['failed']}",
            running=f"running: {escape(shown)}" if running else "",
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


def announce_skipped(console: Console, states: list[PointState]) -> None:
    skipped = [s for s in states if s.skipped]
    if skipped:
        console.print(
            f"{len(skipped)} of {len(states)} runs already done (same request hash): skipped.",
            highlight=False,
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
