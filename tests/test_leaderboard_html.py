"""The HTML report without a browser: escaping, self-containment, structure, SVG ids, and
that plotting leaves matplotlib's global state alone."""

from __future__ import annotations

import base64
import hashlib
import re
import sys
from html.parser import HTMLParser
from pathlib import Path

import matplotlib
import numpy as np
import pytest

from cfl_bench.core.errors import UserError
from cfl_bench.leaderboard.aggregate import StrategySeries, aggregate, strategy_series
from cfl_bench.leaderboard.html import render_html
from cfl_bench.leaderboard.plots import (
    curves_svg,
    dodge,
    drift_svg,
    heatmaps_svg,
    legend_columns,
    scatter_svg,
    series_style,
)
from cfl_bench.leaderboard.runs import load_runs
from tests.leaderboard_fixtures import IMG_INJECTION, standard_runs

INJECTION = "<script>alert(1)</script>"


class Page(HTMLParser):
    """Every start tag with its attributes, and the cell texts of every table by class."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.tables: list[tuple[str, list[list[str]]]] = []
        self._cell: list[str] | None = None
        self._in_body = False
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        if tag == "table":
            self.tables.append((dict(attrs).get("class") or "", []))
        elif tag == "tbody":
            self._in_body = True
        elif tag == "tr" and self._in_body:
            self.tables[-1][1].append([])
        elif tag == "td" and self._in_body:
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag == "td" and self._cell is not None:
            self.tables[-1][1][-1].append(" ".join("".join(self._cell).split()))
            self._cell = None
        elif tag == "tbody":
            self._in_body = False

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)

    def table(self, cls: str) -> list[list[list[str]]]:
        return [rows for c, rows in self.tables if cls in c.split()]


@pytest.fixture(scope="module")
def html(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = standard_runs(tmp_path_factory.mktemp("runs"))
    runs = load_runs([root])
    return render_html(aggregate(runs), runs)


def test_injection_strings_are_text(html: str) -> None:
    assert INJECTION not in html and IMG_INJECTION not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html  # table, legend, titles, message
    page = Page(html)
    assert [t for t, _ in page.tags].count("script") == 1  # only the sorting script
    assert "img" not in [t for t, _ in page.tags]
    assert not [a for _, attrs in page.tags for a in attrs if a.startswith("on")]
    all_runs = page.table("all-runs")[0]
    assert any(IMG_INJECTION in row[0] for row in all_runs)  # the directory name, as text


def test_page_is_self_contained(html: str) -> None:
    assert "://" not in html and "data:" not in html and "@import" not in html
    assert not re.search(r"url\((?!#)", html)
    page = Page(html)
    assert not [tag for tag, attrs in page.tags if "src" in attrs or tag in ("link", "img")]
    hrefs = [attrs["href"] for _, attrs in page.tags if "href" in attrs]
    assert hrefs and all(h.startswith("#") for h in hrefs)  # in-page anchors only
    # the Content-Security-Policy allows exactly the page's own script, by hash
    script = re.search(r"<script>(.*?)</script>", html, re.S).group(1)  # type: ignore[union-attr]
    digest = base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()
    csp = next(
        a["content"] for t, a in page.tags if a.get("http-equiv") == "Content-Security-Policy"
    )
    assert csp is not None and f"script-src 'sha256-{digest}'" in csp
    assert "default-src 'none'" in csp


def test_structure(html: str) -> None:
    page = Page(html)
    boards = page.table("leaderboard")
    assert [len(rows) for rows in boards] == [1, 3, 1]  # protocols B, A, C (by hash)
    assert [row[0] for row in boards[1]] == ["der+fedgp", "fedavg", INJECTION]
    assert boards[1][0][2] == "85.00 ± 7.07" and boards[1][1][2] == "60.00 ± 10.00"
    assert boards[1][0][1] == "2 (0 1)" and boards[1][1][1] == "3 (0 1 2)"
    assert boards[0][0][2] == "30.00 ± –"  # one seed: no deviation
    assert "1 diverged; 1 failed; 1 incomplete" in boards[1][0]
    assert "git commits differ" in boards[1][2][-1]
    problems = page.table("problems")[0]
    assert sorted(r[1] for r in problems) == ["diverged", "failed", "incomplete"]
    assert any(INJECTION in r[-1] for r in problems)  # the failed run's message, as text
    assert len(page.table("commits")[0]) == 2
    sections = [a for t, a in page.tags if t == "section" and a.get("class") == "protocol"]
    assert len(sections) == 3
    # class-IL protocol has task-IL columns and figures, domain-IL ones do not
    assert html.count("Acc_T task-IL (%)") == 1 and html.count("task-IL average accuracy") == 1
    assert html.count("<svg") == 3 * 4 + 1  # curves, matrices, drift, scatter (+ task-IL)


def test_header_and_legends_name_the_sample_std(html: str) -> None:
    page = Page(html)
    header = flat(re.sub(r"<[^>]+>", "", html.split("<nav>")[0]))
    assert "mean ± sample standard deviation (ddof = 1) over the finished seeds" in header
    assert "std_kind" in header  # points to the CSV column saying the same
    legends = [a for t, a in page.tags if t == "p" and "legend" in (a.get("class") or "")]
    assert [a["data-std-kind"] for a in legends] == ["sample"] * 3  # one per protocol table
    assert html.count("Cells: mean ± sample standard deviation (ddof = 1)") == 3
    assert "±1 sample-std band" in html and "(± sample std)" in html
    assert "population" not in html
    # the heat map caption says what the cells right of the diagonal are for
    assert "evaluated before they were trained, for FWT only" in flat(html)


@pytest.fixture(scope="module")
def population_html(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = standard_runs(tmp_path_factory.mktemp("runs"))
    runs = load_runs([root])
    return render_html(aggregate(runs, "population"), runs, "population")


def test_population_std_page(population_html: str) -> None:
    html = population_html
    text = flat(re.sub(r"<[^>]+>", "", html))
    assert "mean ± population standard deviation (ddof = 0, np.std) over the finished" in text
    for wrong in ("sample std", "sample-std", "sample standard", "ddof = 1"):
        assert wrong not in text
    page = Page(html)
    boards = page.table("leaderboard")
    assert boards[1][1][2] == "60.00 ± 8.16"  # 50, 60, 70: sqrt(200 / 3)
    assert boards[1][0][2] == "85.00 ± 5.00"  # 80, 90
    assert boards[0][0][2] == "30.00 ± –"  # one seed: no deviation under population std either
    assert html.count("Cells: mean ± population standard deviation (ddof = 0, np.std)") == 3
    assert "±1 population-std band" in html and "(± population std)" in html
    assert 'title="up 1 KB, down 3 KB; population std 0 B"' in html


def test_curve_bands_follow_the_std_kind(tmp_path: Path) -> None:
    runs = load_runs([standard_runs(tmp_path)])
    for kind, ddof in (("sample", 1), ("population", 0)):
        board = aggregate(runs, kind)
        fedavg = board[(board.strategy == "fedavg") & (board.n_seeds == 3)]
        (series,) = strategy_series(runs, fedavg, kind)
        assert series.acc_t is not None
        finals = np.array([[60.0, 60.0, 50.0], [70.0, 70.0, 60.0], [80.0, 80.0, 70.0]])
        # Acc_t of the fixture runs (acc 50, 60, 70): [acc+10, acc+10, acc]
        np.testing.assert_allclose(series.acc_t[1], finals.std(axis=0, ddof=ddof), atol=1e-12)
        assert series.acc_final[1] == float(fedavg.Acc_T_std.iloc[0])
    with pytest.raises(UserError, match="bogus"):
        render_html(aggregate(runs), runs, "bogus")
    with pytest.raises(ValueError, match="same std"):  # the text must match the cells
        render_html(aggregate(runs), runs, "population")


def flat(text: str) -> str:
    return " ".join(text.split())


def test_svg_ids_are_unique_and_resolve(html: str) -> None:
    ids = re.findall(r'\bid="([^"]*)"', html)
    assert len(ids) == len(set(ids))
    refs = set(re.findall(r"url\(#([^)]*)\)", html)) | set(re.findall(r'href="#([^"]*)"', html))
    assert refs and refs <= set(ids)


def series(name: str, acc: float = 50.0) -> StrategySeries:
    curve = (np.array([acc + 10, acc]), np.array([1.0, 2.0]))
    return StrategySeries(
        strategy=name,
        n_seeds=2,
        acc_t=curve,
        fgt_t=(np.array([np.nan, 5.0]), np.array([np.nan, 1.0])),
        acc_matrix=np.array([[acc + 10, 10.0], [acc, acc]]),
        acc_final=(acc, 2.0),
        bytes_total=(1e6, 0.0),
    )


def test_plot_text_is_escaped_and_literal() -> None:
    names = [INJECTION, "cost $x^2$ & <b>", "_underscored"]
    data = [series(n, 40.0 + 10 * i) for i, n in enumerate(names)]
    for svg in (curves_svg(data, "t1"), heatmaps_svg(data, "t2"), scatter_svg(data, "t3")):
        assert svg is not None and "<script" not in svg and "<b>" not in svg
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in svg
        assert "cost $x^2$ &amp; &lt;b&gt;" in svg  # no mathtext: dollars shown as written
    assert "_underscored" in curves_svg(data, "t4")  # type: ignore[operator]


def test_rendering_is_deterministic_and_leaves_matplotlib_alone() -> None:
    had_pyplot = "matplotlib.pyplot" in sys.modules
    before = matplotlib.rcParams.copy()  # copy(): reading "backend" would import pyplot
    data = [series("a"), series("b", 70.0)]
    assert curves_svg(data, "x") == curves_svg(data, "x")
    assert heatmaps_svg(data, "y") == heatmaps_svg(data, "y")
    assert ("matplotlib.pyplot" in sys.modules) == had_pyplot
    assert matplotlib.rcParams.copy() == before


def test_render_twice_same_bytes(tmp_path: Path) -> None:
    root = standard_runs(tmp_path)
    runs = load_runs([root / "b"])
    board = aggregate(runs)
    assert render_html(board, runs) == render_html(board, load_runs([root / "b"]))


def test_no_unfinished_section_when_every_run_finished(tmp_path: Path) -> None:
    """The "Runs not finished" heading (and its link) only appear when some run is not."""
    root = standard_runs(tmp_path)
    runs = load_runs([root / "b", root / "c"])  # three finished runs
    html = render_html(aggregate(runs), runs)
    assert 'id="runs"' not in html and 'href="#runs"' not in html
    assert "not finished" not in html.lower()
    assert "all 3 runs finished." in flat(html)
    assert 'id="all-runs"' in html and len(Page(html).table("all-runs")[0]) == 3


def test_equal_series_are_told_apart() -> None:
    """der and der+fedgp often have the same memory drift: every series gets its own marker
    and line style and a sideways offset, so the later line cannot hide the earlier."""
    styles = [series_style(i) for i in range(4)]
    assert len({(s["marker"], s["linestyle"]) for s in styles}) == 4
    offsets = [dodge(i, 3) for i in range(3)]
    assert offsets[0] < offsets[1] == 0.0 < offsets[2] and offsets[2] - offsets[0] <= 0.25
    same = [series("der", 50.0), series("der+fedgp", 50.0)]
    for s in same:
        s.md_t = (np.array([np.nan, 0.01]), np.array([np.nan, np.nan]))
    svg = drift_svg(same, "eq")
    assert svg is not None and svg.count("<path") > 4  # both lines and their markers
    # a legend never gets more columns than fit its figure (long names: one)
    assert legend_columns(["der", "fedavg", "er"], 5.6) == 3
    assert legend_columns(["der:alpha=0.5+fedgp:gref_samples=all,gref_mode=eval"] * 3, 5.6) == 1
