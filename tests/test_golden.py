"""Golden records: refactors of the engine keep every result bit for bit.

Each case of ``tests/golden_runs.py`` runs through the CLI in a fresh process with one torch
thread; its ``records.csv`` must have the stored sha256 and its ``summary.json`` the stored
deterministic keys. The digests were made before the engine gained checkpoints (and are
re-made only when a change is *meant* to alter results, with the reason in the commit). They
are compared only on a CPU with the stored vector capability: other kernels round
differently.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests import golden_runs

STORED = json.loads(golden_runs.DIGESTS.read_text())


@pytest.mark.parametrize("name", sorted(golden_runs.CASES))
def test_golden_records(name: str, tmp_path: Path) -> None:
    if golden_runs.cpu_capability() != STORED["cpu_capability"]:
        pytest.skip(f"digests were made on a {STORED['cpu_capability']} CPU")
    needs_data, _ = golden_runs.CASES[name]
    if needs_data and not golden_runs.SHARED_DATA.is_dir():
        pytest.skip(f"needs {golden_runs.SHARED_DATA}")
    want = STORED["cases"][name]
    got = golden_runs.run_case(name, tmp_path / "run")
    assert got["records_sha256"] == want["records_sha256"]
    assert got["summary"] == want["summary"]
