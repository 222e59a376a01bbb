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

from leaderboard.build import build_leaderboard
from tests.leaderboard_fixtures import IMG_INJECTION, protocol, standard_runs, write_run

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

    from cfl_bench.config import canonical_hash

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
