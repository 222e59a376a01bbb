"""Golden records: refactors of the engine keep every result bit for bit.

Each case of ``tests/golden_runs.py`` runs through the CLI in a fresh process with one torch
thread. Under the torch build and CPU capability the digests were made with, its
``records.csv`` must have the stored sha256 and its ``summary.json`` the stored
deterministic keys, exactly. Under another build (a fresh machine resolves whatever torch
the lock names, on whatever CPU it has) the same run is compared numerically with the stored
records: same rows and columns, every value within ``golden_runs.REL_TOL``; a warning names
the build it fell back from. The digests are re-made only when a change is *meant* to alter
results (or torch is upgraded), with the reason in the commit.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from tests import golden_runs

STORED = json.loads(golden_runs.DIGESTS.read_text())


def case_params() -> list[object]:
    marks = {True: [pytest.mark.shared_data], False: []}
    return [
        pytest.param(name, marks=marks[golden_runs.CASES[name][0]])
        for name in sorted(golden_runs.CASES)
    ]


def check_against_store(name: str, got: dict[str, object], build: dict[str, str]) -> str:
    """Compare one run with the store: ``"exact"`` under the stored build, ``"numeric"``
    (with a warning naming both builds) under another; fails the test on a difference."""
    want = STORED["cases"][name]
    stored_build = STORED["build"]
    if build == stored_build:
        assert got["records_sha256"] == want["records_sha256"]
        assert got["summary"] == want["summary"]
        return "exact"
    rel, abs_tol = golden_runs.tolerance(name)
    warnings.warn(
        f"golden {name}: {golden_runs.describe(build)} is not the recorded "
        f"{golden_runs.describe(stored_build)}; compared the records numerically "
        f"(relative {rel:g}, absolute {abs_tol:g}) instead of by sha256",
        stacklevel=2,
    )
    stored_records = (golden_runs.RECORDS / f"{name}.csv").read_text()
    problems = golden_runs.record_differences(stored_records, str(got["records"]), rel, abs_tol)
    problems += golden_runs.summary_differences(want["summary"], got["summary"], tol=(rel, abs_tol))
    assert not problems, "\n".join(problems[:10])
    return "numeric"


@pytest.mark.parametrize("name", case_params())
def test_golden_records(name: str, tmp_path: Path) -> None:
    # Cases that need ../shared/data carry the shared_data marker (case_params), which
    # skips them up front when the folder is absent (tests/conftest.py).
    got = golden_runs.run_case(name, tmp_path / "run")
    check_against_store(name, got, golden_runs.current_build())


def test_every_case_has_stored_records_that_match_its_digest() -> None:
    import hashlib

    assert set(STORED["cases"]) == set(golden_runs.CASES)
    assert set(STORED["build"]) == set(golden_runs.BUILD_KEYS)
    for name, want in STORED["cases"].items():
        text = (golden_runs.RECORDS / f"{name}.csv").read_bytes()
        assert hashlib.sha256(text).hexdigest() == want["records_sha256"], name


def stored_run(name: str) -> dict[str, object]:
    want = STORED["cases"][name]
    records = (golden_runs.RECORDS / f"{name}.csv").read_text()
    return {
        "records_sha256": want["records_sha256"],
        "summary": want["summary"],
        "records": records,
    }


def nudged(records: str, factor: float) -> str:
    """The records with the first accuracy value multiplied by ``factor``."""
    head, rows = golden_runs.read_csv(records)
    row = next(r for r in rows if r[4] == "acc" and float(r[-1]) > 1)
    row[-1] = repr(float(row[-1]) * factor)
    return "\n".join(",".join(r) for r in [head, *rows]) + "\n"


def test_the_stored_build_compares_by_digest_and_refuses_any_changed_bit() -> None:
    run = stored_run("fedavg")
    assert check_against_store("fedavg", run, dict(STORED["build"])) == "exact"
    changed = {**run, "records_sha256": "0" * 64}
    with pytest.raises(AssertionError):
        check_against_store("fedavg", changed, dict(STORED["build"]))


def test_another_build_falls_back_to_numbers_and_says_from_which() -> None:
    other = {**STORED["build"], "torch": "0.0.0+other"}
    run = stored_run("fedavg")
    close = {**run, "records_sha256": "0" * 64, "records": nudged(str(run["records"]), 1 + 3e-5)}
    with pytest.warns(UserWarning, match=r"torch 0\.0\.0\+other .* is not the recorded torch"):
        assert check_against_store("fedavg", close, other) == "numeric"
    far = {**run, "records": nudged(str(run["records"]), 1 + 3e-4)}
    with pytest.warns(UserWarning), pytest.raises(AssertionError, match="instead of"):
        check_against_store("fedavg", far, other)
    fewer = {**run, "records": str(run["records"]).rsplit("\n", 2)[0] + "\n"}
    with pytest.warns(UserWarning), pytest.raises(AssertionError, match="rows instead of"):
        check_against_store("fedavg", fewer, other)


def test_a_run_on_other_kernels_falls_back_and_agrees(tmp_path: Path) -> None:
    # A genuinely different computation: torch's generic kernels instead of the vector
    # unit's (ATEN_CPU_CAPABILITY=default) round differently, as another build would.
    got = golden_runs.run_case("fedavg", tmp_path / "run", env={"ATEN_CPU_CAPABILITY": "default"})
    build = {**golden_runs.current_build(), "cpu_capability": "DEFAULT"}
    with pytest.warns(UserWarning, match="compared the records numerically"):
        assert check_against_store("fedavg", got, build) == "numeric"
