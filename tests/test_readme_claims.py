"""The README's numbers that can drift are checked against the project itself.

Why: a fresh user tried the README and found "seven tests skip without the datasets" while
62 did; a claim nobody checks goes stale with the next test added. Each number here is
recomputed from the source of truth (the suite's markers, the lock file, the CI script).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
PYTEST_COLLECT = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"]


def readme_number(pattern: str) -> int:
    found = re.search(pattern, README)
    assert found, f"README.md no longer says {pattern!r}"
    return int(found.group(1))


def collected(marker: str) -> int:
    """How many fast tests ``-m marker`` collects (a collection only: nothing runs)."""
    done = subprocess.run(
        [*PYTEST_COLLECT, "-m", f"({marker}) and not slow", "tests"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    found = re.search(r"^(\d+)/\d+ tests? collected", done.stdout, re.MULTILINE)
    assert found, done.stdout[-2000:] + done.stderr[-2000:]
    return int(found.group(1))


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
