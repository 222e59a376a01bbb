"""A figure's reproduction report: Markdown, CSV, an HTML page with the curves, a terminal
table — the same numbers in each.

The figure has no printed number, so there is no paper column and no per-cell verdict: the
report gives each row's headlines (mean ± sd over seeds of the windows *before* the shift,
*at the end*, and the *fall*), the claims with their verdicts, the reported "close" pairs,
and the curves (mean over seeds, per round, the windows shaded) drawn as the paper draws
them, so a reader checks the headlines against the shape.
"""

from __future__ import annotations

import csv
import html
import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
from rich.console import Console
from rich.table import Table

from cfl_bench.core.atomic import atomic_write_text
from cfl_bench.reproduce.figure_runs import FigureRuns
from cfl_bench.reproduce.figure_verdict import CloseResult, RowHeadlines, close, judge
from cfl_bench.reproduce.figures import BEFORE, END, FALL, ReproFigure
from cfl_bench.reproduce.outcome import ours_of
from cfl_bench.reproduce.report import (
    _signed,
    claim_holds,
    claim_ours,
    markdown_head,
    ours_text,
)
from cfl_bench.reproduce.verdict import CLAIM_LEVEL, ClaimResult, resolving_t

CSV_COLUMNS = (
    "figure",
    "paper",
    "paper_figure",
    "kind",
    "row",
    "what",
    "mean",
    "sd_or_se",
    "n",
    "values",
    "scale",
    "verdict",
)


@dataclass
class FigureReproduction:
    figure: ReproFigure
    scale: str
    source: str
    headlines: dict[str, RowHeadlines]
    claims: list[ClaimResult]
    close: list[CloseResult]
    curves: dict[str, dict[int, pd.Series]]
    shift: int | None
    notes: list[str]
    reference: dict[str, RowHeadlines] = field(default_factory=dict)
    provenance: dict[str, Any] = field(default_factory=dict)

    def claim_counts(self) -> tuple[int, int]:
        judged = [c for c in self.claims if c.holds is not None]
        return sum(bool(c.holds) for c in judged), len(judged)


def headlines_of(figure: ReproFigure, runs: FigureRuns) -> dict[str, RowHeadlines]:
    got = runs.collected
    return {
        row.label: RowHeadlines(*(ours_of(got, row.label, h) for h in (BEFORE, END, FALL)))
        for row in figure.rows
    }


def build_figure(
    figure: ReproFigure,
    runs: FigureRuns,
    scale: str,
    source: str,
    reference: FigureRuns | None = None,
    provenance: dict[str, Any] | None = None,
) -> FigureReproduction:
    headlines = headlines_of(figure, runs)
    return FigureReproduction(
        figure=figure,
        scale=scale,
        source=source,
        headlines=headlines,
        claims=judge(headlines, figure.claims.drops, figure.claims.holds),
        close=close(headlines, figure.claims.close),
        curves=runs.curves,
        shift=runs.shift,
        notes=list(runs.collected.notes),
        reference=headlines_of(figure, reference) if reference is not None else {},
        provenance=provenance or {},
    )


def claim_text(c: ClaimResult) -> str:
    if c.claim.kind == "falls after the shift":
        return f"{c.claim.column} falls after the shift (before − end > 0)"
    return f"{c.claim.lower} {c.claim.kind} (fall of {c.claim.upper} − fall of {c.claim.lower} > 0)"


def close_text(c: CloseResult) -> str:
    if c.difference is None:
        return f"{c.row} vs {c.bound} at the end: no runs yet"
    if c.se is None:
        return f"{c.bound} − {c.row} at the end: {_signed(c.difference)} (one seed)"
    resolved = abs(c.difference) > resolving_t(c.seeds) * c.se
    how = "resolved" if resolved else "not resolved"
    return (
        f"{c.bound} − {c.row} at the end: {_signed(c.difference)} ± {c.se:.2f} (SE, "
        f"{c.seeds} seeds), {how} at {100 * (1 - CLAIM_LEVEL):.0f} % one-sided"
    )


def _span(first: int, last: int) -> str:
    return f"round {last}" if first == last else f"rounds {first}–{last}"


def window_line(rep: FigureReproduction) -> str:
    k = rep.figure.window(rep.scale)
    options = rep.figure.base_options(rep.scale)
    after = int(options["rounds_per_task"])
    shift = after + int(options.get("lead_rounds", 0))
    return (
        f"Curve: {rep.figure.metric_label} of the global model after every round. Headlines "
        f"over k = {k} round{'s' if k > 1 else ''}: *before* = {_span(shift - k + 1, shift)} "
        f"(the shift follows round {shift}), *end* = "
        f"{_span(shift + after - k + 1, shift + after)}, *fall* = before − end; mean ± sd "
        "over seeds."
    )


def _headline_rows(rep: FigureReproduction) -> list[tuple[str, str, list[str]]]:
    rows = []
    for row in rep.figure.rows:
        h = rep.headlines[row.label]
        cells = [ours_text(h.before), ours_text(h.end), ours_text(h.fall)]
        if rep.reference:
            cells.append(ours_text(rep.reference[row.label].fall))
        rows.append((row.label, rep.figure.strategy_at(row, rep.scale), cells))
    return rows


def _headers(rep: FigureReproduction) -> list[str]:
    return [BEFORE, END, FALL, *(["shipped fall"] if rep.reference else [])]


def counts_line(rep: FigureReproduction) -> str:
    held, judged = rep.claim_counts()
    return f"{rep.figure.figure}: {held} of {judged} judged claims hold ({len(rep.claims)} in all)"


def markdown(rep: FigureReproduction) -> str:
    f = rep.figure
    lines = markdown_head(f.title, rep.scale, f.scales[rep.scale].about, rep.source)
    lines += [
        window_line(rep),
        "",
        f"**{counts_line(rep)}.**",
        "",
        "| row | strategy | " + " | ".join(_headers(rep)) + " |",
        "|---|---|" + "---|" * len(_headers(rep)),
    ]
    for label, strategy, cells in _headline_rows(rep):
        lines.append(f"| {label} | `{strategy}` | " + " | ".join(cells) + " |")
    lines += [
        "",
        "A claim holds when our difference is positive and resolved: a one-sided paired "
        "t-test at 5 % over the seeds (± here is the standard error).",
        "",
        "| claim | ours | holds |",
        "|---|---|---|",
    ]
    for c in rep.claims:
        lines.append(f"| {claim_text(c)} | {claim_ours(c)} | {claim_holds(c, True)} |")
    if rep.close:
        lines += ["", "Reported, not judged (the paper gives no threshold for close):", ""]
        lines += [f"- {close_text(c)}" for c in rep.close]
    if rep.notes:
        lines += ["", "Notes:", ""] + [f"- {note}" for note in rep.notes]
    return "\n".join(lines) + "\n"


def csv_text(rep: FigureReproduction) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    f = rep.figure
    head = [f.name, f.paper, f.figure]
    for row in f.rows:
        h = rep.headlines[row.label]
        for what, ours in ((BEFORE, h.before), (END, h.end), (FALL, h.fall)):
            values = " ".join(f"{x:.4f}" for x in ours.values) if ours else ""
            mean = f"{ours.mean:.4f}" if ours else ""
            spread = f"{ours.sd:.4f}" if ours and ours.sd is not None else ""
            n = ours.n if ours else 0
            writer.writerow(
                [*head, "headline", row.label, what, mean, spread, n, values, rep.scale, ""]
            )
    for c in rep.claims:
        mean = "" if c.ours_difference is None else f"{c.ours_difference:.4f}"
        se = "" if c.ours_se is None else f"{c.ours_se:.4f}"
        writer.writerow(
            [
                *head,
                "claim",
                c.claim.lower,
                claim_text(c),
                mean,
                se,
                c.seeds,
                "",
                rep.scale,
                c.status or "missing",
            ]
        )
    for close_result in rep.close:
        mean = "" if close_result.difference is None else f"{close_result.difference:.4f}"
        se = "" if close_result.se is None else f"{close_result.se:.4f}"
        writer.writerow(
            [
                *head,
                "close",
                close_result.row,
                f"{close_result.bound} - {close_result.row} at the end",
                mean,
                se,
                close_result.seeds,
                "",
                rep.scale,
                "reported",
            ]
        )
    return out.getvalue()


def curves_svg(rep: FigureReproduction) -> str:
    """Mean over seeds per round for each row, ±sd band, the shift and both windows."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(8, 3.8))
    highest = 0.0
    for row in rep.figure.rows:
        by_seed = rep.curves.get(row.label)
        if not by_seed:
            continue
        frame = pd.DataFrame(by_seed).sort_index()
        mean, sd = frame.mean(axis=1), frame.std(axis=1, ddof=1).fillna(0.0)
        ax.plot(mean.index, mean.values, label=f"{row.label} (n={frame.shape[1]})")
        ax.fill_between(mean.index, mean - sd, mean + sd, alpha=0.15)
        highest = max(highest, float((mean + sd).max()))
    if rep.shift is not None:
        k = rep.figure.window(rep.scale)
        last = max((max(c.index) for s in rep.curves.values() for c in s.values()), default=0)
        ax.axvline(rep.shift + 0.5, color="grey", linestyle="--", linewidth=1)
        ax.axvspan(rep.shift - k + 0.5, rep.shift + 0.5, color="grey", alpha=0.1)
        ax.axvspan(last - k + 0.5, last + 0.5, color="grey", alpha=0.1)
    # Whole rounds; the metric from 0, spanning at least 5 points so that a flat start at 0
    # is not drawn in the middle of a ±0.05 axis.
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylim(0.0, max(5.0, highest * 1.1))
    ax.set_xlabel("round")
    ax.set_ylabel(rep.figure.metric_label)
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    buffer = io.StringIO()
    fig.savefig(buffer, format="svg", metadata={"Date": None})
    plt.close(fig)
    text = buffer.getvalue()
    return text[text.index("<svg") :]


def _html_table(headers: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in row) + "</tr>" for row in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def html_page(rep: FigureReproduction) -> str:
    f = rep.figure
    headline_rows = [[label, strategy, *cells] for label, strategy, cells in _headline_rows(rep)]
    claim_rows = [[claim_text(c), claim_ours(c), claim_holds(c, False)] for c in rep.claims]
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>{html.escape(f.title)}</title><style>body{{font-family:sans-serif;"
        "max-width:70em;margin:2em auto}td,th{border:1px solid #ccc;padding:.25em .5em}"
        "table{border-collapse:collapse;margin-bottom:1.5em}</style></head><body>",
        f"<h1>{html.escape(f.title)}</h1>",
        f"<p>Scale <b>{rep.scale}</b>: {html.escape(f.scales[rep.scale].about)}</p>",
        f"<p>Source: {html.escape(rep.source)}.</p>",
        f"<p>{html.escape(window_line(rep).replace('*', ''))}</p>",
        f"<p><b>{html.escape(counts_line(rep))}</b></p>",
        curves_svg(rep) if rep.curves else "<p>No counted run yet: no curve.</p>",
        "<h2>Headlines</h2>",
        _html_table(["row", "strategy", *_headers(rep)], headline_rows),
        "<h2>The paper's claims</h2>",
        _html_table(["claim", "ours (± SE)", "holds"], claim_rows),
    ]
    if rep.close:
        items = "".join(f"<li>{html.escape(close_text(c))}</li>" for c in rep.close)
        parts.append(f"<h2>Reported, not judged</h2><ul>{items}</ul>")
    for title, entries in (("Notes", rep.notes), ("Provenance", _provenance(rep))):
        if entries:
            items = "".join(f"<li>{html.escape(e)}</li>" for e in entries)
            parts.append(f"<h2>{title}</h2><ul>{items}</ul>")
    return "".join(parts) + "</body></html>\n"


def _provenance(rep: FigureReproduction) -> list[str]:
    return [f"{k}: {v}" for k, v in rep.provenance.items()]


def write(rep: FigureReproduction, folder: Path) -> dict[str, Path]:
    """report.csv, report.md and report.html in ``folder`` (each written atomically)."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = {name: folder / f"report.{name}" for name in ("csv", "md", "html")}
    atomic_write_text(paths["csv"], csv_text(rep))
    atomic_write_text(paths["md"], markdown(rep))
    atomic_write_text(paths["html"], html_page(rep))
    return paths


def print_terminal(rep: FigureReproduction, console: Console) -> None:
    table = Table(title=f"{rep.figure.figure} ({rep.scale} scale): {rep.figure.metric_label}")
    for name in ("row", "strategy", *_headers(rep)):
        table.add_column(name, overflow="fold")
    for label, strategy, cells in _headline_rows(rep):
        table.add_row(label, strategy, *cells)
    console.print(table)
    claims = Table(title="claims (one-sided paired t-test at 5 %)")
    for name in ("claim", "ours (± SE)", "holds"):
        claims.add_column(name, overflow="fold")
    for c in rep.claims:
        claims.add_row(claim_text(c), claim_ours(c), claim_holds(c, False))
    console.print(claims)
    for close_result in rep.close:
        console.print(close_text(close_result), highlight=False)
    console.print(counts_line(rep), highlight=False)
