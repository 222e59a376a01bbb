"""The README's numbers that can drift are checked against the project itself.

Why: a fresh user tried the README and found "seven tests skip without the datasets" while
62 did; a claim nobody checks goes stale with the next test added. Each number here is
recomputed from the source of truth (the suite's markers, the lock file, the CI script).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
TESTS = ROOT / "tests"
PYTEST_COLLECT = ["--collect-only", "-q", "-p", "no:cacheprovider"]


def readme_number(pattern: str) -> int:
    found = re.search(pattern, README)
    assert found, f"README.md no longer says {pattern!r}"
    return int(found.group(1))


class Selected:
    """A plugin keeping how many tests its session selected: those collected, less those
    ``-m`` deselected (the ``N`` of pytest's "N/M tests collected")."""

    def __init__(self) -> None:
        self.count: int | None = None

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self.count = len(session.items)


def collected(marker: str) -> int:
    """How many fast tests ``-m marker`` collects (a collection only: nothing runs).

    The collection runs in this process (``pytest.main``, as ``pytester`` runs pytest):
    under ``python -m pytest`` each worker has already imported every test module, so it
    costs ~1 s where a new process spent ~20 s of CI importing them again. The rest is the
    command line's: the same options, files, conftest and markers."""
    selected = Selected()
    code = pytest.main(
        [*PYTEST_COLLECT, "-p", "no:faulthandler", "-m", f"({marker}) and not slow", str(TESTS)],
        plugins=[selected],
    )
    assert code == pytest.ExitCode.OK and selected.count is not None, code
    return selected.count


def test_the_count_of_tests_that_need_the_datasets_is_the_suites() -> None:
    said = readme_number(r"(\d+) of the fast tests need the real datasets")
    assert collected("shared_data") == said


def test_the_readme_installs_through_the_lock_and_ci_runs_its_command() -> None:
    command = 'pip install -e ".[test]" -c requirements-lock.txt && python -m pytest'
    assert command in README
    lock = (ROOT / "requirements-lock.txt").read_text()
    pins = dict(re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)$", lock, re.MULTILINE))
    assert {"torch", "torchvision", "numpy", "flwr", "pytest"} <= set(pins)
    assert not [
        line for line in lock.splitlines() if line and not line.startswith("#") and "==" not in line
    ], "every package of the lock has an exact version"
    ci = (ROOT / ".ci" / "run").read_text()
    assert "python3 -m venv" in ci and "mktemp -d" in ci
    assert (
        'pip install --quiet --disable-pip-version-check -e ".[test]" -c requirements-lock.txt'
        in ci
    )
    commands = [line for line in ci.splitlines() if line.strip() and not line.startswith("echo ")]
    assert commands[-1] == "python -m pytest"  # the last command; only its timing follows
