"""The reproduction report: CSV (one line per cell), Markdown (for docs/reproductions.md),
a self-contained HTML page and a terminal table — the same numbers in each.

Why hand-written HTML and not the leaderboard's page: a reproduction is a different table
(paper vs ours per printed cell, with verdicts and the paper's claims), and a static page
without scripts opens from a file anywhere.
"""

from __future__ import annotations

import csv
import html
import io
from pathlib import Path

from rich.console import Console
from rich.table import Table

from cfl_bench.core.atomic import atomic_write_text
from cfl_bench.reproduce.other_methods import cell_text, html_others, markdown_others, print_others
from cfl_bench.reproduce.outcome import Reproduction
from cfl_bench.reproduce.targets import Target
from cfl_bench.reproduce.verdict import (
    DIFFERS,
    MISSING,
    SAME_DIRECTION,
    VERDICTS,
    WITHIN,
    CellVerdict,
    ClaimResult,
    Ours,
)

CSV_COLUMNS = (
    "table",
    "paper",
    "paper_table",
    "column",
    "row",
    "strategy",
    "metric",
    "paper_value",
    "paper_pm",
    "paper_n_seeds",
    "ours_mean",
    "ours_sd",
    "ours_n",
    "ours_values",
    "scale",
    "difference",
    "combined_spread",
    "verdict",
    "failed_claims",
    "shipped_mean",
    "shipped_sd",
    "shipped_n",
)
COLOURS = {WITHIN: "green", SAME_DIRECTION: "yellow", DIFFERS: "red", MISSING: "bright_black"}
HTML_COLOURS = {WITHIN: "#d7f5dd", SAME_DIRECTION: "#fff3c4", DIFFERS: "#fbd5d5", MISSING: "#eee"}


def _num(value: float | None, digits: int = 2) -> str:
    return "" if value is None else f"{value:.{digits}f}"


def ours_text(ours: Ours | None) -> str:
    """``mean ± sd (n=k)``, as every section of the report writes our values."""
    return cell_text(ours)


def paper_text(target: Target) -> str:
    """The printed value as printed (``90.00`` stays ``90.00``), its ± and seeds."""
    pm = f" ± {target.pm:g}" if target.pm is not None else ""
    seeds = f" (n={target.n_seeds})" if target.n_seeds else ""
    return f"{target.text}{pm}{seeds}"


def _signed(value: float | None) -> str:
    return "—" if value is None else f"{value:+.2f}"


def claim_ours(c: ClaimResult) -> str:
    """Our difference with its standard error over the shared seeds, when there is one."""
    if c.ours_se is None:
        return _signed(c.ours_difference)
    return f"{_signed(c.ours_difference)} ± {c.ours_se:.2f}"


def claim_holds(c: ClaimResult, bold: bool) -> str:
    """yes, no (why: reversed, inside noise, one seed) or — when a cell has no run."""
    if c.holds is None:
        return "—"
    if c.holds:
        return "yes"
    return f"{'**no**' if bold else 'no'} ({c.status})"


def csv_text(rep: Reproduction) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    rows = {r.label: r for r in rep.table.rows}
    columns = {c.label: c for c in rep.table.columns}
    for v in rep.verdicts:
        row, column = rows[v.cell.row], columns[v.cell.column]
        target = rep.table.target(row, column)
        ours, shipped = v.cell.ours, rep.reference.get((v.cell.row, v.cell.column))
        writer.writerow(
            [
                rep.table.name,
                rep.table.paper,
                rep.table.table,
                column.label,
                row.label,
                rep.table.strategy_at(row, rep.scale),
                column.metric,
                target.text,
                _num(target.pm, 3),
                target.n_seeds or "",
                _num(ours.mean if ours else None, 4),
                _num(ours.sd if ours else None, 4),
                ours.n if ours else 0,
                " ".join(f"{x:.4f}" for x in ours.values) if ours else "",
                rep.scale,
                _num(v.difference, 4),
                _num(v.spread, 4),
                v.verdict,
                "; ".join(v.failed_claims),
                _num(shipped.mean if shipped else None, 4),
                _num(shipped.sd if shipped else None, 4),
                shipped.n if shipped else "",
            ]
        )
    return out.getvalue()


def counts_line(rep: Reproduction) -> str:
    c = rep.counts()
    held, judged = rep.claim_counts()
    parts = [f"{c[name]} {name}" for name in VERDICTS if c[name] or name != MISSING]
    return f"{len(rep.verdicts)} cells: {', '.join(parts)}; paper's claims holding: {held}/{judged}"


def _target(rep: Reproduction, v: CellVerdict) -> Target:
    rows = {r.label: r for r in rep.table.rows}
    columns = {c.label: c for c in rep.table.columns}
    return rep.table.target(rows[v.cell.row], columns[v.cell.column])


def markdown_head(title: str, scale: str, about: str, source: str) -> list[str]:
    """The first lines of a table's or a figure's Markdown report."""
    return [f"### {title}", "", f"Scale **{scale}**: {about}", "", f"Source: {source}.", ""]


def markdown(rep: Reproduction) -> str:
    """The report as Markdown: headline counts, one table per column, claims, notes."""
    t = rep.table
    lines = markdown_head(t.title, rep.scale, t.scales[rep.scale].about, rep.source)
    lines += [f"**{counts_line(rep)}.**", ""]
    for column in t.columns:
        tau = rep.taus.get(column.label)
        lines += [f"#### {column.label} ({column.metric})", ""]
        if column.reading:
            lines += [f"Reading: {column.reading}", ""]
        if tau is not None:
            lines += [f"Ranking agreement (Kendall τ-a, paper vs ours): {tau:+.2f}", ""]
        header = "| row | paper | ours | ours − paper | verdict |"
        lines += [header, "|---|---|---|---|---|"]
        for v in rep.column_verdicts(column.label):
            lines.append(
                f"| {v.cell.row} | {paper_text(_target(rep, v))} | {ours_text(v.cell.ours)} "
                f"| {_signed(v.difference)} | {v.verdict} |"
            )
        lines.append("")
    lines += markdown_others(rep)
    lines += [
        "#### The paper's claims",
        "",
        "A claim holds when our difference has the paper's sign and is resolved: a one-sided "
        "paired t-test at 5 % over the seeds both rows ran (± here is the standard error).",
        "",
        "| column | claim | kind | paper | ours | holds |",
        "|---|---|---|---|---|---|",
    ]
    for c in rep.claims:
        lines.append(
            f"| {c.claim.column} | {c.claim.shown()} | {c.claim.kind} "
            f"| {_signed(c.paper_difference)} | {claim_ours(c)} | {claim_holds(c, True)} |"
        )
    if rep.notes:
        lines += ["", "Notes:", ""] + [f"- {note}" for note in rep.notes]
    return "\n".join(lines) + "\n"


def _html_cell(v: CellVerdict, rep: Reproduction, shipped: bool) -> str:
    style = f' style="background:{HTML_COLOURS[v.verdict]}"'
    extra = ""
    if shipped:
        extra = f"<td>{html.escape(ours_text(rep.reference.get((v.cell.row, v.cell.column))))}</td>"
    failed = (
        f"<br><small>fails: {html.escape('; '.join(v.failed_claims))}</small>"
        if (v.failed_claims)
        else ""
    )
    return (
        f"<tr><td>{html.escape(v.cell.row)}</td><td>{html.escape(paper_text(_target(rep, v)))}"
        f"</td>{extra}<td>{html.escape(ours_text(v.cell.ours))}</td>"
        f"<td>{_signed(v.difference)}</td><td>{_num(v.spread)}</td>"
        f"<td{style}>{html.escape(v.verdict)}{failed}</td></tr>"
    )


def html_page(rep: Reproduction) -> str:
    t = rep.table
    shipped = bool(rep.reference)
    head = "<th>shipped</th>" if shipped else ""
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>{html.escape(t.title)}</title><style>body{{font-family:sans-serif;"
        "max-width:70em;margin:2em auto}td,th{border:1px solid #ccc;padding:.25em .5em}"
        "table{border-collapse:collapse;margin-bottom:1.5em}</style></head><body>",
        f"<h1>{html.escape(t.title)}</h1>",
        f"<p>Scale <b>{rep.scale}</b>: {html.escape(t.scales[rep.scale].about)}</p>",
        f"<p>Source: {html.escape(rep.source)}.</p>",
        f"<p><b>{html.escape(counts_line(rep))}</b></p>",
    ]
    for column in t.columns:
        tau = rep.taus.get(column.label)
        parts.append(f"<h2>{html.escape(column.label)} ({html.escape(column.metric)})</h2>")
        if column.reading:
            parts.append(f"<p>Reading: {html.escape(column.reading)}</p>")
        if tau is not None:
            parts.append(f"<p>Ranking agreement (Kendall τ-a, paper vs ours): {tau:+.2f}</p>")
        parts.append(
            f"<table><tr><th>row</th><th>paper</th>{head}<th>ours</th><th>ours − paper</th>"
            "<th>combined spread</th><th>verdict</th></tr>"
        )
        parts += [_html_cell(v, rep, shipped) for v in rep.column_verdicts(column.label)]
        parts.append("</table>")
    parts.append(html_others(rep))
    parts.append(
        "<h2>The paper's claims</h2><table><tr><th>column</th><th>claim</th>"
        "<th>kind</th><th>paper</th><th>ours</th><th>holds</th></tr>"
    )
    for c in rep.claims:
        parts.append(
            f"<tr><td>{html.escape(c.claim.column)}</td><td>{html.escape(c.claim.shown())}</td>"
            f"<td>{c.claim.kind}</td><td>{_signed(c.paper_difference)}</td>"
            f"<td>{claim_ours(c)}</td><td>{claim_holds(c, False)}</td></tr>"
        )
    parts.append("</table>")
    if rep.notes:
        items = "".join(f"<li>{html.escape(n)}</li>" for n in rep.notes)
        parts.append(f"<h2>Notes</h2><ul>{items}</ul>")
    if rep.provenance:
        items = "".join(
            f"<li>{html.escape(str(k))}: {html.escape(str(v))}</li>"
            for k, v in rep.provenance.items()
        )
        parts.append(f"<h2>Provenance</h2><ul>{items}</ul>")
    parts.append(_legend())
    return "".join(parts) + "</body></html>\n"


def _legend() -> str:
    return (
        "<h2>Verdicts</h2><ul><li><b>within noise</b>: |ours − paper| ≤ √(paper ±² + our "
        "seeds' sd²)</li><li><b>same direction</b>: outside the noise, but every claim of the "
        "paper with this cell (with vs without, upper bound) holds in ours: our difference has "
        "the paper's sign and is resolved by a one-sided paired t-test at 5 % over the seeds "
        "both rows ran (a claim fails as reversed, inside noise, or one seed)</li>"
        "<li><b>differs</b>: outside the noise and a claim with the cell fails, or none can be "
        "judged yet</li></ul>"
    )


def write(rep: Reproduction, folder: Path) -> dict[str, Path]:
    """report.csv, report.md and report.html in ``folder`` (each written atomically)."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = {
        "csv": folder / "report.csv",
        "md": folder / "report.md",
        "html": folder / "report.html",
    }
    atomic_write_text(paths["csv"], csv_text(rep))
    atomic_write_text(paths["md"], markdown(rep))
    atomic_write_text(paths["html"], html_page(rep))
    return paths


def print_terminal(rep: Reproduction, console: Console) -> None:
    """One rich table per column, then the counts line."""
    shipped = bool(rep.reference)
    for column in rep.table.columns:
        table = Table(
            title=f"{column.label} — {rep.table.table} ({rep.scale} scale)",
            caption=f"Reading: {column.reading}" if column.reading else None,
        )
        for name in ("row", "paper", *(["shipped"] if shipped else []), "ours", "Δ", "verdict"):
            table.add_column(name, overflow="fold")
        for v in rep.column_verdicts(column.label):
            extra = [ours_text(rep.reference.get((v.cell.row, v.cell.column)))] if shipped else []
            table.add_row(
                v.cell.row,
                paper_text(_target(rep, v)),
                *extra,
                ours_text(v.cell.ours),
                _signed(v.difference),
                f"[{COLOURS[v.verdict]}]{v.verdict}[/]",
            )
        console.print(table)
    print_others(rep, console)
    console.print(counts_line(rep), highlight=False)
