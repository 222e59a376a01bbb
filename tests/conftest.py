"""Shared pytest fixtures and the report of tests skipped for want of the real datasets.

``shared_data`` points at the real offline datasets that live beside the checkout
(``<checkout>/../shared/data``); CI provides that folder. The environment variable
``CFL_BENCH_SHARED_DATA`` overrides where the tests look (set it to an empty or missing path
to see what a fresh clone without the data runs). Every test that needs the folder skips
with one reason naming it, and the end of the session says how many skipped that way.
"""

from __future__ import annotations

import os
from collections.abc import Generator
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


#: The most pytest-xdist workers ``-n auto`` starts (pyproject.toml's addopts).
MAX_TEST_WORKERS = 4


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: one worker per core this process may use, at most ``MAX_TEST_WORKERS``.

    Why not xdist's own count: it asks psutil for the machine's physical cores, which in a
    container are the host's (64 workers on a 2-core CI slot). Why a cap: every worker
    imports torch, and many tests start processes of their own (sweeps, Ray, Flower). On
    2 cores the suite takes ~8 min instead of ~25. ``PYTEST_XDIST_AUTO_NUM_WORKERS`` still
    overrides, and ``-n 0`` runs everything in this process (for a debugger)."""
    override = os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS")
    if override:
        return int(override)
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        usable = os.cpu_count() or 1
    return max(1, min(MAX_TEST_WORKERS, usable))


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The folder holding MNIST/raw, cifar-10-batches-py, ... in their standard layouts."""
    return requires_shared_data()


# The test files whose tests take longest in all, longest first: every file over 30 s of CI
# time on 2026-11-29, 20:00 (`PYTEST_ADDOPTS=--durations=0 bash .ci/run`, summed per file;
# 2,231 s of worker time in all). Why:
# pyproject.toml runs the suite with ``--dist loadfile`` (a file's module fixtures are made
# once) and ``--no-loadscope-reorder``; xdist then hands whole files to the workers in
# collection order. Its default order (most tests first) put the files of a few minute-long
# tests (Flower, the tutorial) last, so one worker ran them alone at the end while the other
# idled. Starting the longest files first leaves only short ones for the end.
LONGEST_FILES_FIRST = (
    "test_golden.py",
    "test_carla_stream.py",
    "test_flower.py",
    "test_reproduce_safety.py",
    "test_flower_deploy.py",
    "test_leaderboard_inputs.py",
    "test_sweep_ray.py",
    "test_tutorial.py",
    "test_sweep.py",
    "test_late_failures.py",
    "test_bad_inputs_classes.py",
    "test_resume.py",
    "test_shipped_prefix.py",
    "test_interrupts.py",
    "test_one_judgement.py",
    "test_run_dir_ownership.py",
    "test_reproduce_run.py",
    "test_leaderboard.py",
    "test_cli.py",
    "test_scale.py",
    "test_reproduce_shipped.py",
    "test_vectorized.py",
    "test_flower_safety.py",
)


def longest_files_first(items: list[pytest.Item]) -> None:
    """Sort ``items`` in place: the files of ``LONGEST_FILES_FIRST`` in that order, then the
    others as collected; a file's own tests keep their order. A listed file that no longer
    exists is an error, so the list cannot silently go stale."""
    here = Path(__file__).resolve().parent
    missing = [name for name in LONGEST_FILES_FIRST if not (here / name).is_file()]
    if missing:
        raise pytest.UsageError(f"tests/conftest.py LONGEST_FILES_FIRST names {missing}")
    rank = {name: index for index, name in enumerate(LONGEST_FILES_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test that uses the ``shared_data`` fixture ``shared_data`` too, so the
    marker alone says which tests need the real datasets (``-m shared_data`` collects them;
    the README's count is checked against that), and skip the marked ones up front when the
    folder is absent. Then start the longest files first (``longest_files_first``)."""
    longest_files_first(items)
    absent = not SHARED_DATA.is_dir()
    for item in items:
        if "shared_data" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.shared_data)
        if absent and item.get_closest_marker("shared_data"):
            item.add_marker(pytest.mark.skip(reason=SHARED_DATA_REASON))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A test that skips for want of the datasets without the ``shared_data`` marker is an
    error: the count of such tests (README) would silently drift."""
    report = yield
    if (
        report.skipped
        and SHARED_DATA_REASON in _skip_reason(report)
        and not item.get_closest_marker("shared_data")
    ):
        report.outcome = "failed"
        report.longrepr = (
            f"{item.nodeid} skipped for want of {SHARED_DATA} but has no "
            "@pytest.mark.shared_data: mark it so the README's count of such tests stays true."
        )
    return report


def _skip_reason(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2])
    return str(longrepr)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Never skip silently: one line for the tests skipped for want of data, and one line
    per other reason, with its count, so every skip of the run is explained."""
    folders = {str(SHARED_DATA), str(DEFAULT_SHARED_DATA)}
    skipped = terminalreporter.stats.get("skipped", [])
    missing = [r for r in skipped if any(folder in _skip_reason(r) for folder in folders)]
    if missing:
        tests = "test" if len(missing) == 1 else "tests"
        terminalreporter.write_line(
            f"{len(missing)} {tests} skipped because {SHARED_DATA} is absent "
            f"(the real MNIST/CIFAR/text datasets; {SHARED_DATA_ENV} overrides the path)",
            yellow=True,
        )
    others: dict[str, int] = {}
    for report in skipped:
        if report not in missing:
            reason = _skip_reason(report).removeprefix("Skipped: ")
            others[reason] = others.get(reason, 0) + 1
    for reason, count in sorted(others.items()):
        tests = "test" if count == 1 else "tests"
        terminalreporter.write_line(f"{count} {tests} skipped: {reason}", yellow=True)
