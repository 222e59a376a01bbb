"""``cfl-bench report RUN_DIR``: the single-run page without a browser.

What a reader must be able to trust: the numbers are those of the run's records (a finished
run's page agrees with its summary.json), an unfinished run still gets a page that says so
and shows what exists, the page is self-contained, escapes what comes from the data and is
the same bytes every time, and every bad input is refused with one line, exit 2 and nothing
written. Hand-made records (tests/leaderboard_fixtures.py: ``write_recorded_run``) keep the
numbers predictable; one tiny real run on the embedded digits stream checks that the page
reads what the engine really writes. The browser side (layout at 1280 px, console, network)
is in tests/test_report_browser.py.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from cfl_bench.core.errors import UserError
from cfl_bench.leaderboard.plots import padded_limits
from cfl_bench.leaderboard.report import build_report, render_report
from cfl_bench.leaderboard.run_data import load_run_data
from tests.leaderboard_fixtures import resummarize, write_recorded_run, write_run
from tests.sweep_helpers import TINY
from tests.test_cli import in_process
from tests.test_leaderboard_html import Page
from tests.test_leaderboard_inputs import assert_refused, listing

INJECTION = "<script>alert(1)</script>"


def flat(text: str) -> str:
    return " ".join(text.split())


def text_of(html: str) -> str:
    return flat(re.sub(r"<[^>]+>", " ", html))


def metric_cell(page: Page, label: str) -> str:
    """The value cell of one row of the results table (its row header is a <th>)."""
    (rows,) = page.table("metrics")
    labels = [label for label in re.findall(r'<th scope="row">([^<]*)</th>', page.source)]
    return rows[labels.index(label)][0]


class ReportPage(Page):
    def __init__(self, text: str) -> None:
        self.source = text
        super().__init__(text)


def report(path: Path, **kwargs: str) -> tuple[str, ReportPage]:
    out, _ = build_report(str(path), **kwargs)
    html = out.read_text(encoding="utf-8")
    return html, ReportPage(html)


# ------------------------------------------------------------------------------------------
# What the page shows
# ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, ReportPage]:
    """One finished domain-IL run (3 tasks, 4 clients) whose strategy name is hostile,
    rendered once to its default --out (rendering is the slow part)."""
    run = write_recorded_run(tmp_path_factory.mktemp("runs"), "run", strategy=INJECTION)
    html, page = report(run)
    return run, html, page


def test_finished_domain_il_run(finished: tuple[Path, str, ReportPage]) -> None:
    run, html, page = finished
    summary = json.loads((run / "summary.json").read_text())
    assert (run / "report.html").is_file()  # the default --out
    status = next(a for t, a in page.tags if a.get("id") == "run-status")
    assert status["data-status"] == "finished"
    assert metric_cell(page, "Acc_T domain-IL") == f"{summary['Acc_T']:.2f}"
    assert metric_cell(page, "MD_T") == f"{summary['MD_T']:.4f}"
    assert metric_cell(page, "bytes up") == "24 KB"  # 6 rounds × 4 clients × 1000 B
    assert "Acc_T task-IL" not in html  # domain-IL: no task-IL rows or figures
    ids = {a["id"] for t, a in page.tags if t == "svg" and "id" in a} | {
        a["aria-labelledby"][:-2] for t, a in page.tags if t == "svg" and "aria-labelledby" in a
    }
    for figure in ("r-curves", "r-matrix", "r-drift", "r-rounds", "r-clients", "r-buffer"):
        assert figure in ids
    assert "r-classes" in ids and "r-curves-til" not in ids
    # the exact client × class counts of every task, as config.json holds them
    tables = json.loads((run / "config.json").read_text())["client_class_counts"]
    class_tables = page.table("class-table")
    assert len(class_tables) == 3
    first = class_tables[0]
    present = [c for c in range(10) if any(row[c] for row in tables["1"])]  # 4 clients: 0-4
    assert present == [0, 1, 2, 3, 4]
    assert [int(c) for c in first[1][1:]] == [*(tables["1"][1][c] for c in present), 9]
    # per-client accuracy at every task end (client 3 after task 2: 20 + 9 + 1)
    (client_rows,) = page.table("client-acc")
    assert client_rows[3] == ["3", "29.00", "30.00", "31.00"]
    assert "not finished" not in text_of(html) and "unfinished-notice" not in html


def test_class_il_run_has_both_scenarios(tmp_path: Path) -> None:
    run = write_recorded_run(
        tmp_path, "run", tasks=2, clients=2, rounds_per_task=1, scenario="class-il", strategy="er"
    )
    target = tmp_path / "reports" / "deep" / "run.html"  # missing folders are created
    html, page = report(run, out=str(target))
    assert target.is_file() and not (run / "report.html").exists()
    assert metric_cell(page, "Acc_T class-IL") != "–"
    assert metric_cell(page, "Acc_T task-IL") != "–"
    assert 'aria-labelledby="r-curves-til-t"' in html
    # the heat map figure has one panel per scenario, titled so
    matrix = html[html.index('aria-labelledby="r-matrix-t"') :]
    matrix = matrix[: matrix.index("</svg>")]
    assert "class-IL" in matrix and "task-IL" in matrix
    # class-IL tasks hold two classes each: only those are columns of a task's table
    heads = re.findall(r'data-task="2">.*?<thead><tr><th>client</th>(.*?)<th>total', html, re.S)
    assert re.findall(r"<th>(\d+)</th>", heads[0]) == ["2", "3"]


def test_unfinished_run_is_labelled_and_shows_what_exists(tmp_path: Path) -> None:
    """No summary.json, records up to round 3 of 6 (task 1 ended at round 2) and a last line
    cut in half: the page says unfinished, keeps task 1's numbers, leaves task 2's row of the
    accuracy matrix empty although round 3 measured nothing of it, and drops the cut line."""
    run = write_recorded_run(tmp_path, "run", tasks=3, clients=2, finished=False)
    lines = (run / "records.csv").read_text().splitlines(keepends=True)
    kept = [line for line in lines[1:] if int(line.split(",")[0]) <= 3]
    (run / "records.csv").write_text(lines[0] + "".join(kept) + "4,1,-1,glo")
    html, page = report(run)
    status = next(a for t, a in page.tags if a.get("id") == "run-status")
    assert status["data-status"] == "unfinished"
    text = text_of(html)
    assert "This run has not finished" in text
    assert "round 3 of 6, 1 of 3 tasks ended" in text
    assert "The last line of records.csv was cut off" in text
    assert metric_cell(page, "Acc_T domain-IL") == "–"
    assert metric_cell(page, "Acc_t after task 1") == "40.00"
    (client_rows,) = page.table("client-acc")
    assert client_rows[0] == ["0", "20.00"]  # one task end so far


def test_eval_every_round_does_not_fill_a_running_task(tmp_path: Path) -> None:
    """An accuracy measured in round 3 (task 2 still running, --eval-every-round) is not
    task 2's end-of-task evaluation: the matrix row stays empty until round 4."""
    run = write_recorded_run(tmp_path, "run", tasks=3, finished=False)
    lines = (run / "records.csv").read_text().splitlines(keepends=True)
    kept = [line for line in lines[1:] if int(line.split(",")[0]) <= 3]
    extra = "3,1,0,global,acc,99.0\n3,1,1,global,acc,99.0\n"
    (run / "records.csv").write_text(lines[0] + "".join(kept) + extra)
    data = load_run_data(str(run))
    assert data.metrics["acc_matrix"][1] == [None, None, None]
    assert data.metrics["acc_t"][:2] == [40.0, None]


def test_real_run_on_digits(tmp_path: Path) -> None:
    """What the engine really writes (records, task clock, class tables) reads back, and the
    numbers recomputed from records.csv are exactly its summary's."""
    out = tmp_path / "run"
    code, output = in_process(
        "run", *TINY, "--probe-size", "50", "--threads", "1", "--strategy", "der", "--out",
        str(out),
    )  # fmt: skip
    assert code == 0, output
    summary = json.loads((out / "summary.json").read_text())
    data = load_run_data(str(out))
    assert (data.status, data.rounds_done, data.tasks_done, data.notes) == ("finished", 2, 2, [])
    for key in ("acc_T", "fgt_acc_T", "bwt_acc", "fwt_acc", "MD_T", "bytes_up_total"):
        assert data.metrics[key] == summary[key]
    assert data.metrics["acc_matrix"] == summary["acc_matrix"]
    assert data.class_tables is not None and len(data.class_tables) == 2
    assert data.eval_rounds == [1, 2] and data.total_rounds == 2


def test_summary_that_disagrees_with_the_records_is_refused(tmp_path: Path) -> None:
    run = write_recorded_run(tmp_path, "run")
    summary = json.loads((run / "summary.json").read_text())
    (run / "summary.json").write_text(json.dumps({**summary, "acc_T": 99.0}))
    with pytest.raises(UserError, match=r"is damaged: summary\.json says acc_T is 99 but"):
        load_run_data(str(run))


def test_page_is_self_contained_and_escaped(finished: tuple[Path, str, ReportPage]) -> None:
    _, html, page = finished
    assert INJECTION not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert [t for t, _ in page.tags].count("script") == 1
    # data: only where the policy allows images embedded in the page (a run's synthetic
    # images; this run has none, so no image either)
    assert "://" not in html and html.count("data:") == 1 and "img-src data:;" in html
    assert "@import" not in html
    assert not re.search(r"url\((?!#)", html)
    assert not [tag for tag, attrs in page.tags if "src" in attrs or tag in ("link", "img")]
    hrefs = [attrs["href"] for _, attrs in page.tags if "href" in attrs]
    assert hrefs and all(h.startswith("#") for h in hrefs)
    csp = next(
        a["content"] for _, a in page.tags if a.get("http-equiv") == "Content-Security-Policy"
    )
    assert csp is not None and "default-src 'none'" in csp and "connect-src 'none'" in csp
    ids = re.findall(r'\bid="([^"]*)"', html)
    assert len(ids) == len(set(ids))


def test_same_run_same_bytes(finished: tuple[Path, str, ReportPage]) -> None:
    run, html, _ = finished
    assert render_report(load_run_data(str(run))) == html  # no clock, no random ids


def test_diverged_run(tmp_path: Path) -> None:
    run = write_recorded_run(tmp_path, "run", tasks=2, rounds_per_task=1, finished=False)
    lines = (run / "records.csv").read_text().splitlines(keepends=True)
    kept = [line for line in lines[1:] if int(line.split(",")[0]) == 0]
    kept += ["1,0,-1,global,bytes_up,4000.0\n", "1,0,-1,global,train_loss,nan\n"]
    write_run(tmp_path, "run", status="diverged", message="training loss became nan in round 1",
              proto=json.loads((run / "config.json").read_text())["protocol"], strategy="der",
              metrics={"wall_time_s": 0.1})  # fmt: skip
    (run / "records.csv").write_text(lines[0] + "".join(kept))
    resummarize(run)
    config = json.loads((run / "config.json").read_text())
    assert "task_clock" not in config  # write_run rewrote it: old runs have no clock either
    html, page = report(run)
    status = next(a for t, a in page.tags if a.get("id") == "run-status")
    assert status["data-status"] == "diverged"
    assert "This run diverged : training loss became nan in round 1." in text_of(html)
    assert "No task has ended yet" in text_of(html)
    assert 'aria-labelledby="r-rounds-t"' in html and "loss not finite (diverged)" in html


def test_axis_limits_have_a_minimum_span() -> None:
    """One seed at 10 % used to get an axis 9.6–10.4; now at least 20 points, inside 0–100."""
    assert padded_limits([10.0, 10.0], min_span=20, bounds=(0, 100)) == (0.0, 20.0)
    assert padded_limits([99.0], min_span=20, bounds=(0, 100)) == (80.0, 100.0)
    low, high = padded_limits([20.0, 80.0], min_span=20, bounds=(0, 100))  # type: ignore[misc]
    assert low < 20 and high > 80 and high - low < 70
    assert padded_limits([0.004], min_span=0, include=(0.0,))[0] < 0.0001  # type: ignore[index]
    assert padded_limits([], min_span=10, include=(0.0,)) == (-5.0, 5.0)
    assert padded_limits([float("nan")], min_span=10) is None


# ------------------------------------------------------------------------------------------
# Refused inputs: exit 2, one line, nothing written
# ------------------------------------------------------------------------------------------


def _records(edit: Callable[[str], str]) -> Callable[[Path], None]:
    def damage(run: Path) -> None:
        path = run / "records.csv"
        path.write_text(edit(path.read_text()))

    return damage


def _json(name: str, **changes: object) -> Callable[[Path], None]:
    def damage(run: Path) -> None:
        path = run / name
        path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))

    return damage


def _append(line: str) -> Callable[[str], str]:
    return lambda text: text + line + "\n"


@dataclass(frozen=True)
class Refusal:
    """``damage(run)`` spoils the run directory; ``args(tmp, run)`` are the arguments after
    ``report``; ``fragment`` must appear in the one line printed."""

    id: str
    fragment: str
    damage: Callable[[Path], None] = lambda run: None
    args: Callable[[Path, Path], list[str]] = lambda tmp, run: [str(run)]


REFUSALS = [
    Refusal("missing_dir", "does not exist", args=lambda tmp, run: [str(tmp / "nope")]),
    Refusal("empty_dir_arg", "RUN_DIR is empty", args=lambda tmp, run: [""]),
    Refusal(
        "config_file_as_dir",
        "pass the run directory that holds it",
        args=lambda tmp, run: [str(run / "config.json")],
    ),
    Refusal(
        "sweep_folder",
        "is not a run directory but holds 1 below it",
        args=lambda tmp, run: [str(tmp)],
    ),
    Refusal("no_records", "records.csv is missing", lambda run: (run / "records.csv").unlink()),
    Refusal("records_folder", "records.csv is not a file", lambda run: _folder(run)),
    Refusal("bad_header", "not the header", _records(lambda t: "a,b,c\n" + t.split("\n", 1)[1])),
    Refusal("value_text", "cannot be parsed", _records(_append("9,0,-1,global,acc,high"))),
    Refusal("too_many_cells", "cannot be parsed", _records(_append("9,0,-1,global,acc,1,2"))),
    Refusal("acc_150", "acc 150.0 is outside", _records(_append("6,2,0,global,acc,150.0"))),
    Refusal("acc_nan", "acc nan is outside", _records(_append("6,2,0,global,acc,nan"))),
    Refusal("bytes_negative", "bytes_up -1.0 is", _records(_append("6,2,-1,global,bytes_up,-1"))),
    Refusal("task_9", "'trained_task' 9 is no task", _records(_append("6,9,0,global,acc,1.0"))),
    Refusal("round_text", "'round' is not an integer", _records(_append("x,2,0,global,acc,1"))),
    Refusal(
        "scope", "scope 'client_99' is not", _records(_append("6,2,-1,client_99,client_acc,1"))
    ),
    Refusal("round_beyond", "round 99 of a 6-round run", _records(_append("99,2,-1,global,acc,1"))),
    Refusal("cut_line_finished", "ends in the middle of a line", _records(lambda t: t + "6,2")),
    Refusal("not_utf8", "not UTF-8", lambda run: (run / "records.csv").write_bytes(b"\xff\xfe")),
    Refusal("config_nan", "config.json holds NaN", _json("config.json", lr=float("nan"))),
    Refusal(
        "summary_status", "'status' is the text 'bogus'", _json("summary.json", status="bogus")
    ),
    Refusal("bad_clock", "'task_clock' is not a valid", _json("config.json", task_clock={"x": 1})),
    Refusal(
        "bad_counts", "'client_class_counts' is not", _json("config.json", client_class_counts=[])
    ),
    Refusal("out_folder", "is a folder", args=lambda tmp, run: [str(run), "--out", str(tmp)]),
    Refusal("out_empty", "--out is empty", args=lambda tmp, run: [str(run), "--out", ""]),
    Refusal(
        "out_not_html", "does not end in .html", args=lambda tmp, run: [str(run), "--out", "x.txt"]
    ),
    Refusal(
        "out_records",
        "does not end in .html",
        args=lambda tmp, run: [str(run), "--out", str(run / "records.csv")],
    ),
    Refusal(
        "out_below_file",
        "which is a file",
        args=lambda tmp, run: [str(run), "--out", str(run / "config.json" / "r.html")],
    ),
]


def _folder(run: Path) -> None:
    (run / "records.csv").unlink()
    (run / "records.csv").mkdir()


@pytest.mark.parametrize("case", REFUSALS, ids=[r.id for r in REFUSALS])
def test_refused_input_exits_2_with_one_line_and_writes_nothing(
    tmp_path: Path, case: Refusal
) -> None:
    run = write_recorded_run(tmp_path, "run")
    case.damage(run)
    before = listing(tmp_path)
    code, output = in_process("report", *case.args(tmp_path, run))
    assert_refused(code, output, case.fragment)
    assert listing(tmp_path) == before


def test_out_naming_a_record_file_is_refused(tmp_path: Path) -> None:
    """Even through a link: the report must never replace the run's own records."""
    run = write_recorded_run(tmp_path, "run")
    os.symlink(run / "records.csv", tmp_path / "link.html")
    before = (run / "records.csv").read_bytes()
    code, output = in_process("report", str(run), "--out", str(tmp_path / "link.html"))
    assert_refused(code, output, "is one of the run's own record files")
    assert (run / "records.csv").read_bytes() == before
