"""The reproduction report of the shipped FedGP Table 1 results in a real headless Chromium.

Why a browser: the report is what a reader opens, and a page that parses as text can still
show an empty table or fetch something from the network. This loads the page made from the
shipped results (no datasets needed), checks what a reader sees — every cell with its
verdict, the counts, the claims with why they fail — and saves a screenshot to
``test-artifacts/reproduction-fedgp-table1-mnist.png`` for a person to look at. It skips
(or, under ``.ci/run``, fails) like the leaderboard's browser test when Chromium is missing.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from cfl_bench.reproduce.command import Request, reproduce
from tests.test_report_browser import browser, open_page, screenshot  # noqa: F401


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("shipped")
    console = Console(file=io.StringIO(), width=100)
    request = Request("fedgp-table1-mnist", scale="cpu", shipped=True, out=str(out))
    assert reproduce(request, console=console) == 0
    return out / "report.html"


def test_the_shipped_reproduction_report_in_headless_chromium(
    browser: Any,  # noqa: F811 - the imported fixture
    page: Path,
) -> None:
    from selenium.webdriver.common.by import By

    open_page(browser, page)
    tables = browser.find_elements(By.TAG_NAME, "table")
    # rotated-MNIST, permuted-MNIST (11 rows each), then the 30 claims
    assert [len(t.find_elements(By.TAG_NAME, "tr")) - 1 for t in tables] == [11, 11, 30]
    body = browser.find_element(By.TAG_NAME, "body").text
    assert "22 cells: 0 within noise, 11 same direction, 11 differs" in body
    verdicts = [
        row.find_elements(By.TAG_NAME, "td")[-1].text
        for row in tables[1].find_elements(By.CSS_SELECTOR, "tr")[1:]
    ]
    assert all(v.startswith("differs") for v in verdicts)
    assert "inside noise" in tables[2].text and "+5.88 ± 1.48" in tables[2].text
    screenshot(browser, "reproduction-fedgp-table1-mnist.png")
