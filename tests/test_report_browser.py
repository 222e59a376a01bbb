"""The HTML report in a real headless Chromium (selenium + Debian's chromium-driver).

Asserts what a reader would see: the page loads with no console errors and no network
request besides the file itself, the tables have the expected rows, clicking a header sorts
(numerically, both directions), hostile names are shown as text and run nothing, and a
screenshot is saved to ``test-artifacts/leaderboard.png`` for a person to look at.

Locally the test skips when chromium, chromedriver or selenium is missing; ``.ci/run``
installs them and sets ``CFL_BENCH_REQUIRE_BROWSER=1``, which turns that skip into a failure.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cfl_bench.leaderboard.build import build_leaderboard
from tests.leaderboard_fixtures import (
    IMG_INJECTION,
    protocol,
    standard_runs,
    write_recorded_run,
    write_run,
)

INJECTION = "<script>alert(1)</script>"
ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts"
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
)


def _browser_paths() -> tuple[str, str]:
    """Chromium and chromedriver, or skip (fail when CI requires the browser)."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    missing = [n for n, p in (("chromium", chromium), ("chromedriver", driver)) if not p]
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing.append("selenium (pip install -e '.[test]')")
    if missing:
        reason = (
            f"headless browser test needs {', '.join(missing)} "
            f"(Debian: apt-get install chromium chromium-driver; .ci/run installs them)"
        )
        if os.environ.get("CFL_BENCH_REQUIRE_BROWSER") == "1":
            pytest.fail(reason + "; CFL_BENCH_REQUIRE_BROWSER=1 makes this a failure")
        pytest.skip(reason)
    return str(chromium), str(driver)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    chromium, chromedriver = _browser_paths()
    from selenium import webdriver

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in (*FLAGS, "--window-size=1280,1000"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    # An explicit driver path: selenium then never runs its own driver download manager.
    service = webdriver.ChromeService(executable_path=chromedriver)
    driver = webdriver.Chrome(options=options, service=service)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The standard hand-made runs plus one strategy at 9.5 % (so that only a numeric sort
    puts it below 41 %), rendered to leaderboard.html."""
    root = standard_runs(tmp_path_factory.mktemp("runs"))
    write_run(root / "a", "prox_s0", strategy="fedprox", acc=9.5, proto=protocol())
    out = tmp_path_factory.mktemp("report")
    return build_leaderboard([root], out).html_path


def _strategies(driver: Any, protocol_hash: str) -> list[str]:
    return driver.execute_script(
        "var t = document.querySelector('table.leaderboard[data-protocol-hash=\"' + "
        "arguments[0] + '\"]');"
        "return Array.prototype.map.call(t.tBodies[0].rows, r => r.cells[0].textContent.trim());",
        protocol_hash,
    )


def test_report_in_headless_chromium(browser: Any, report: Path) -> None:
    from selenium.common.exceptions import NoAlertPresentException
    from selenium.webdriver.common.by import By

    from cfl_bench.runner.config import canonical_hash

    url = report.as_uri()
    browser.get(url)
    assert browser.execute_script("return document.readyState") == "complete"
    with pytest.raises(NoAlertPresentException):
        browser.switch_to.alert  # noqa: B018 - touching it raises when no alert fired

    # no console errors (a CSP violation, a script error, a failed load would be SEVERE)
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert errors == []
    # no network requests besides the file itself
    requested = [
        m["params"]["request"]["url"]
        for m in (json.loads(e["message"])["message"] for e in browser.get_log("performance"))
        if m["method"] == "Network.requestWillBeSent"
    ]
    assert requested and set(requested) == {url}

    # tables: rows per protocol, in leaderboard order
    tables = browser.find_elements(By.CSS_SELECTOR, "table.leaderboard")
    assert [len(t.find_elements(By.CSS_SELECTOR, "tbody tr")) for t in tables] == [1, 4, 1]
    hash_a = canonical_hash(protocol())
    assert _strategies(browser, hash_a) == ["der+fedgp", "fedavg", INJECTION, "fedprox"]

    # sorting: click the accuracy header (ascending, numeric), again (descending)
    header = browser.find_element(
        By.XPATH,
        f"//table[@data-protocol-hash='{hash_a}']//th[starts-with(normalize-space(.), 'Acc_T')]",
    )
    header.click()
    assert header.get_attribute("aria-sort") == "ascending"
    assert _strategies(browser, hash_a) == ["fedprox", INJECTION, "fedavg", "der+fedgp"]
    header.click()
    assert header.get_attribute("aria-sort") == "descending"
    assert _strategies(browser, hash_a) == ["der+fedgp", "fedavg", INJECTION, "fedprox"]

    # hostile names are text: visible literally, no element or handler created from them
    assert INJECTION in browser.find_element(By.TAG_NAME, "body").text
    assert IMG_INJECTION in browser.execute_script("return document.body.textContent")
    assert browser.execute_script("return document.images.length") == 0
    assert browser.execute_script("return document.scripts.length") == 1
    with pytest.raises(NoAlertPresentException):
        browser.switch_to.alert  # noqa: B018

    # a full-page screenshot for a person to look at
    height = browser.execute_script("return document.documentElement.scrollHeight")
    browser.set_window_size(1280, min(int(height) + 100, 12000))
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "leaderboard.png"
    assert browser.save_screenshot(str(shot))
    assert shot.stat().st_size > 10_000
    print(f"screenshot: {shot}")


# ------------------------------------------------------------------------------------------
# Page layout at 1280 px: nothing wider than the page, no table overflowing its box, no
# figure text cut off at the figure's edge or drawn over another text
# ------------------------------------------------------------------------------------------

WIDTH = 1280
#: Every layout defect found on the page, as sentences (an empty list: none). Closed
#: <details> are opened first, so the folded tables are checked too.
LAYOUT_JS = """
var problems = [];
Array.prototype.forEach.call(document.querySelectorAll('details'), function (d) {
  d.open = true;
});
var page = document.documentElement;
if (page.scrollWidth > page.clientWidth) {
  problems.push('the page scrolls sideways: ' + page.scrollWidth + ' px');
}
function name(el) { return el.tagName.toLowerCase() + '.' + (el.getAttribute('class') || ''); }
Array.prototype.forEach.call(document.querySelectorAll('table'), function (table) {
  var r = table.getBoundingClientRect();
  var box = table.parentElement.getBoundingClientRect();
  if (r.right > box.right + 0.5 || r.right > page.clientWidth + 0.5) {
    problems.push(name(table) + ' is ' + Math.round(r.right - box.right) + ' px too wide');
  }
  Array.prototype.forEach.call(table.querySelectorAll('th, td'), function (cell) {
    var c = cell.getBoundingClientRect();
    if (c.right > r.right + 0.5 || cell.scrollWidth > cell.clientWidth + 1) {
      problems.push(name(table) + ': cell "' + cell.textContent.trim().slice(0, 40) +
                    '" overflows');
    }
  });
});
Array.prototype.forEach.call(document.querySelectorAll('.table-wrap'), function (wrap) {
  if (wrap.scrollWidth > wrap.clientWidth + 0.5) {
    problems.push('a table needs a scroll bar: ' + wrap.scrollWidth + ' > ' + wrap.clientWidth);
  }
});
Array.prototype.forEach.call(document.querySelectorAll('svg.plot'), function (svg) {
  var b = svg.getBoundingClientRect();
  var label = svg.getAttribute('aria-labelledby');
  if (b.right > page.clientWidth + 0.5) { problems.push(label + ' is wider than the page'); }
  var texts = Array.prototype.filter.call(svg.querySelectorAll('text'), function (t) {
    return t.textContent.trim() !== '' && t.getBoundingClientRect().width > 0;
  });
  var boxes = texts.map(function (t) { return t.getBoundingClientRect(); });
  boxes.forEach(function (r, i) {
    if (r.left < b.left - 1 || r.right > b.right + 1 || r.top < b.top - 1 ||
        r.bottom > b.bottom + 1) {
      problems.push(label + ': "' + texts[i].textContent.trim() + '" is cut off');
    }
    for (var j = i + 1; j < boxes.length; j++) {
      var o = boxes[j];
      var w = Math.min(r.right, o.right) - Math.max(r.left, o.left);
      var h = Math.min(r.bottom, o.bottom) - Math.max(r.top, o.top);
      if (w > 2 && h > 2) {
        problems.push(label + ': "' + texts[i].textContent.trim() + '" overlaps "' +
                      texts[j].textContent.trim() + '"');
      }
    }
  });
});
return problems;
"""


def open_page(driver: Any, path: Path) -> None:
    """Load ``path`` at 1280 px and check it loaded with no console error and no request
    besides the file itself."""
    driver.set_window_size(WIDTH, 1000)
    driver.get_log("browser")  # drop what earlier pages logged
    driver.get_log("performance")
    url = path.as_uri()
    driver.get(url)
    assert driver.execute_script("return document.readyState") == "complete"
    assert [e for e in driver.get_log("browser") if e["level"] == "SEVERE"] == []
    requested = [
        m["params"]["request"]["url"]
        for m in (json.loads(e["message"])["message"] for e in driver.get_log("performance"))
        if m["method"] == "Network.requestWillBeSent"
    ]
    assert requested and set(requested) == {url}


def screenshot(driver: Any, name: str) -> Path:
    """A full-page screenshot at 1280 px in test-artifacts/ for a person to look at."""
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(WIDTH, min(int(height) + 100, 16000))
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / name
    assert driver.save_screenshot(str(shot))
    driver.set_window_size(WIDTH, 1000)
    return shot


#: Long composed names: they must wrap inside the table rather than widen it.
LONG_NAMES = (
    "der:alpha=0.5+fedgp:gref_samples=all,gref_mode=eval+ifa:mode=random",
    "derpp+fedprox:mu=0.01+fedcurv:lam=1.0,samples=500",
    "fedavg",
)


@pytest.fixture(scope="module")
def finished_board(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every run finished, one seed each: a class-IL protocol with three strategies (two
    with long names; two with equal bytes) and a domain-IL one with two."""
    root = tmp_path_factory.mktemp("finished")
    cls = protocol("seq-cifar10", model="cifar-cnn", tasks=2)
    for i, name in enumerate(LONG_NAMES):
        write_run(
            root, f"c{i}", strategy=name, acc=20.0 + 3 * i, proto=cls, scenario="class-il",
            recorded={"bytes_up_total": 1000 * (1 + i // 2)},
        )  # fmt: skip
    for i, name in enumerate(("der", "der+fedgp")):
        write_run(root, f"d{i}", strategy=name, acc=10.0, proto=protocol())
    return build_leaderboard([root], tmp_path_factory.mktemp("board")).html_path


def test_leaderboard_layout_at_1280(browser: Any, report: Path, finished_board: Path) -> None:
    """Several strategies and seeds (with unfinished runs and hostile names), then one seed
    each with every run finished: both fit 1280 px, and the second has no section about
    unfinished runs at all."""
    open_page(browser, report)
    assert browser.execute_script(LAYOUT_JS) == []
    assert browser.execute_script("return document.getElementById('runs') !== null")
    screenshot(browser, "leaderboard-several-seeds.png")

    open_page(browser, finished_board)
    assert browser.execute_script(LAYOUT_JS) == []
    assert browser.execute_script("return document.getElementById('runs')") is None
    headings = browser.execute_script(
        "return Array.prototype.map.call(document.querySelectorAll('h2, nav a'),"
        " function (h) { return h.textContent; })"
    )
    assert not [h for h in headings if "not finished" in h.lower()]
    assert (
        browser.execute_script("return document.querySelectorAll('a[href=\"#runs\"]').length") == 0
    )
    screenshot(browser, "leaderboard-one-seed.png")


@pytest.fixture(scope="module")
def run_reports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Single-run reports: a finished class-IL run with 10 clients, and an unfinished
    domain-IL run stopped after round 3 of 6."""
    from cfl_bench.leaderboard.report import build_report

    root = tmp_path_factory.mktemp("single")
    cls = write_recorded_run(
        root, "cls", strategy=INJECTION, tasks=2, clients=10, rounds_per_task=1,
        scenario="class-il",
    )  # fmt: skip
    unfinished = write_recorded_run(root, "unf", tasks=3, clients=3, finished=False)
    records = unfinished / "records.csv"
    lines = records.read_text().splitlines(keepends=True)
    records.write_text(lines[0] + "".join(r for r in lines[1:] if int(r.split(",")[0]) <= 3))
    return {name: build_report(str(run))[0] for name, run in (("cls", cls), ("unf", unfinished))}


def test_single_run_report_in_chromium(browser: Any, run_reports: dict[str, Path]) -> None:
    from selenium.common.exceptions import NoAlertPresentException

    open_page(browser, run_reports["cls"])  # no SEVERE console entry, no request
    assert browser.execute_script(LAYOUT_JS) == []
    assert browser.execute_script("return document.scripts.length") == 1
    assert INJECTION in browser.execute_script("return document.title")
    with pytest.raises(NoAlertPresentException):
        browser.switch_to.alert  # noqa: B018 - the hostile strategy name ran nothing
    status = browser.execute_script("return document.getElementById('run-status').textContent")
    assert status.strip() == "finished"
    assert browser.execute_script("return document.querySelectorAll('svg.plot').length") == 8
    screenshot(browser, "report-finished.png")

    open_page(browser, run_reports["unf"])
    assert browser.execute_script(LAYOUT_JS) == []
    notice = browser.execute_script(
        "var n = document.getElementById('unfinished-notice'); return n && n.innerText"
    )
    assert notice and "has not finished" in notice and "round 3 of 6" in notice
    screenshot(browser, "report-unfinished.png")


def test_the_synthetic_image_grids_show_in_chromium(
    browser: Any, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A TARGET-like run folder with two synthetic-image grids: the report embeds both as
    data: images, in task order, the page still fetches nothing and logs no error (the CSP
    allows data: images only), and each image decodes at its PNG's size."""
    import torch

    from cfl_bench.leaderboard.report import IMAGE_ZOOM, build_report
    from cfl_bench.runner.image_sets import grid_classes, image_grid, write_png

    root = tmp_path_factory.mktemp("synthetic")
    run = write_recorded_run(
        root, "tgt", tasks=3, clients=2, rounds_per_task=1, scenario="class-il"
    )
    gen = torch.Generator().manual_seed(0)
    for task in (2, 1):  # written out of order: the page sorts by task
        images = torch.randint(0, 256, (12, 3, 32, 32), dtype=torch.uint8, generator=gen)
        labels = torch.arange(12) % (2 * task)
        grid = image_grid(images, labels)
        write_png(run / "synthetic-images" / f"after-task-{task}.png", grid, grid_classes(labels))
    page, _ = build_report(str(run))
    browser.set_window_size(WIDTH, 1000)
    browser.get_log("browser")
    browser.get_log("performance")
    browser.get(page.as_uri())
    assert [e for e in browser.get_log("browser") if e["level"] == "SEVERE"] == []
    requested = {
        m["params"]["request"]["url"]
        for m in (json.loads(e["message"])["message"] for e in browser.get_log("performance"))
        if m["method"] == "Network.requestWillBeSent"
    }
    assert page.as_uri() in requested
    assert all(u == page.as_uri() or u.startswith("data:image/png;base64,") for u in requested)
    shown = browser.execute_script(
        "return Array.prototype.map.call(document.querySelectorAll('#synthetic img'),"
        " function (i) { return [i.closest('figure').id, i.complete, i.naturalWidth,"
        " i.naturalHeight, i.width]; })"
    )
    # 2 classes (task 1) and 4 classes (task 2) a row each; 8 columns of 32 px, 1 px gaps
    width = 8 * 32 + 7
    assert shown == [
        ["synthetic-after-task-1", True, width, 2 * 32 + 1, width * IMAGE_ZOOM],
        ["synthetic-after-task-2", True, width, 4 * 32 + 3, width * IMAGE_ZOOM],
    ]
    captions = browser.execute_script(
        "return Array.prototype.map.call(document.querySelectorAll('#synthetic figcaption'),"
        " function (c) { return c.textContent; })"
    )
    assert captions[1].endswith("rows: classes 0, 1, 2, 3.")
    screenshot(browser, "report-synthetic.png")
