"""The report's section on methods that are no row of the table: your own method (or a
built-in one the paper did not run) on the table's protocol, beside the table's rows.

Why apart from the verdicts: the paper printed no number for them, so there is nothing to
judge; what a reader needs is the method's value per column, on the same tasks, splits and
scale as the rows above it, with its seeds' spread — the line a paper's baseline table
would give it.
"""

from __future__ import annotations

import html
from typing import TYPE_CHECKING

from rich.table import Table

from cfl_bench.reproduce.verdict import Ours

if TYPE_CHECKING:
    from rich.console import Console

    from cfl_bench.reproduce.outcome import Reproduction

TITLE = "Other methods on this table's protocol"
ABOUT = (
    "Runs of methods that are no row of the table, with a column's options at this scale: "
    "mean ± sd over their seeds (n), on the same protocol as the rows; not judged, as the "
    "paper printed no number for them."
)


def cell_text(ours: Ours | None) -> str:
    if ours is None:
        return "—"
    spread = "" if ours.sd is None else f" ± {ours.sd:.2f}"
    return f"{ours.mean:.2f}{spread} (n={ours.n})"


def _columns(rep: Reproduction) -> list[str]:
    return [c.label for c in rep.table.columns]


def print_others(rep: Reproduction, console: Console) -> None:
    """The section as a rich table (nothing when no other method ran)."""
    if not rep.others:
        return
    table = Table(title=f"{TITLE} ({rep.scale} scale)", caption=ABOUT)
    table.add_column("method", overflow="fold")
    for label in _columns(rep):
        table.add_column(label, overflow="fold")
    for strategy, values in rep.others.items():
        table.add_row(strategy, *(cell_text(values.get(label)) for label in _columns(rep)))
    console.print(table)


def markdown_others(rep: Reproduction) -> list[str]:
    if not rep.others:
        return []
    labels = _columns(rep)
    lines = [f"#### {TITLE}", "", ABOUT, ""]
    lines += ["| method | " + " | ".join(labels) + " |", "|---" * (len(labels) + 1) + "|"]
    for strategy, values in rep.others.items():
        cells = " | ".join(cell_text(values.get(label)) for label in labels)
        lines.append(f"| {strategy} | {cells} |")
    return [*lines, ""]


def html_others(rep: Reproduction) -> str:
    if not rep.others:
        return ""
    labels = _columns(rep)
    head = "".join(f"<th>{html.escape(label)}</th>" for label in labels)
    rows = "".join(
        f"<tr><td>{html.escape(strategy)}</td>"
        + "".join(f"<td>{html.escape(cell_text(values.get(label)))}</td>" for label in labels)
        + "</tr>"
        for strategy, values in rep.others.items()
    )
    return (
        f"<h2>{html.escape(TITLE)}</h2><p>{html.escape(ABOUT)}</p>"
        f"<table><tr><th>method</th>{head}</tr>{rows}</table>"
    )
