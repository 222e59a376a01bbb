"""Shared pytest fixtures and the report of tests skipped for want of the real datasets.

``shared_data`` points at the real offline datasets that live beside the checkout
(``<checkout>/../shared/data``); CI provides that folder. The environment variable
``CFL_BENCH_SHARED_DATA`` overrides where the tests look (set it to an empty or missing path
to see what a fresh clone without the data runs). Every test that needs the folder skips
with one reason naming it, and the end of the session says how many skipped that way.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

SHARED_DATA_ENV = "CFL_BENCH_SHARED_DATA"
DEFAULT_SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
_override = os.environ.get(SHARED_DATA_ENV)
SHARED_DATA = DEFAULT_SHARED_DATA if _override is None else Path(_override or "/nonexistent")
SHARED_DATA_REASON = (
    f"needs the real datasets folder {SHARED_DATA}, which is absent "
    f"(CI provides it; {SHARED_DATA_ENV} overrides the path)"
)


def requires_shared_data() -> Path:
    """The real datasets folder, or skip the calling test with the one uniform reason."""
    if not SHARED_DATA.is_dir():
        pytest.skip(SHARED_DATA_REASON)
    return SHARED_DATA


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The folder holding MNIST/raw, cifar-10-batches-py, ... in their standard layouts."""
    return requires_shared_data()


def _skip_reason(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2])
    return str(longrepr)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Never skip silently for want of data: count the tests that did, in one line."""
    folders = {str(SHARED_DATA), str(DEFAULT_SHARED_DATA)}
    missing = [
        report
        for report in terminalreporter.stats.get("skipped", [])
        if any(folder in _skip_reason(report) for folder in folders)
    ]
    if missing:
        tests = "test" if len(missing) == 1 else "tests"
        terminalreporter.write_line(
            f"{len(missing)} {tests} skipped because {SHARED_DATA} is absent "
            f"(the real MNIST/CIFAR/text datasets; {SHARED_DATA_ENV} overrides the path)",
            yellow=True,
        )
