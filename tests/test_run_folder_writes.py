"""Issue 39, section 1: no command but the run's own writes into a run directory.

Only ``cfl-bench run`` (and its ``report``, for that same run) writes into a run directory:
its files are the run's record, and anything else in there would mix with them (and be read
as that run's). Every command that writes a folder or a file refuses a target that is a run
directory or lies inside one, in one line, exit 2, nothing written — the same way for every
command. Each case runs the real command line in a fresh process against a tiny finished run.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli_helpers import cli, tree_digest

TINY = ["--stream", "rot-digits", "--tasks", "1", "--rounds-per-task", "1", "--clients", "2"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two tiny finished runs, ``a`` and ``b``, in one folder."""
    root = tmp_path_factory.mktemp("runs")
    for name, seed in (("a", "0"), ("b", "1")):
        result = cli(["run", *TINY, "--seed", seed, "--threads", "1", "--out", name], root)
        assert result.returncode == 0, result.stderr
    return root


CASES: dict[str, tuple[list[str], str]] = {
    "report_into_another_run": (
        ["report", "a", "--out", "b/report.html"],
        "is inside the cfl-bench run directory",
    ),
    "carla_record_inside_a_run": (
        ["carla", "record", "--out", "a/frames", "--data-root", "."],
        "is inside the cfl-bench run directory",
    ),
    "leaderboard_inside_a_run": (
        ["leaderboard", "a", "--out", "a/board"],
        "is inside the cfl-bench run directory",
    ),
    "sweep_inside_a_run": (
        ["sweep", "--out", "a/sweep", *TINY],
        "is inside the cfl-bench run directory",
    ),
    "sweep_into_a_run": (["sweep", "--out", "a", *TINY], "is a cfl-bench run directory"),
    "pilot_inside_a_run": (
        ["pilot", "boundary", "--out", "a/pilot"],
        "is inside the cfl-bench run directory",
    ),
    "compare_report_inside_a_run": (
        ["reproduce", "fedgp-table1-mnist", "--compare", ".", "--out", "a/cmp"],
        "run directory",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_run_directory_is_written_only_by_its_run(runs: Path, case: str) -> None:
    args, words = CASES[case]
    before = tree_digest(runs)
    result = cli(args, runs, wide=True)
    assert result.returncode == 2, result.stdout + result.stderr
    lines = (result.stdout + result.stderr).strip().splitlines()
    assert len(lines) == 1 and words in lines[0], lines
    assert tree_digest(runs) == before


def test_a_report_may_go_below_its_own_run(runs: Path, tmp_path: Path) -> None:
    """The run's own report, in a folder of the user's inside that run, is no foreign write."""
    (runs / "a" / "mine").mkdir(exist_ok=True)
    result = cli(["report", "a", "--out", "a/mine/report.html"], runs)
    assert result.returncode == 0, result.stderr
    assert (runs / "a" / "mine" / "report.html").is_file()
    (runs / "a" / "mine" / "report.html").unlink()
    (runs / "a" / "mine").rmdir()


def test_a_failed_sweep_point_writes_nothing_among_the_users_files(tmp_path: Path) -> None:
    """A point refused because its folder holds the user's files is recorded as failed in
    sweep.json, but its summary.json is not written among those files (it was)."""
    from cfl_bench.sweeps.grid import build_spec, expand

    out = tmp_path / "sweep"
    args = ["--threads", "1", *TINY]
    (point,) = expand(build_spec(None, args, str(out)))
    (out / point.name).mkdir(parents=True)
    (out / point.name / "NOTES.md").write_text("mine\n")
    before = tree_digest(out)
    result = cli(["sweep", "--out", str(out), *args], tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    log = (out / ".sweep" / f"{point.name}.log").read_text()
    assert "holds files a run does not write (NOTES.md)" in log
    assert {k: v for k, v in tree_digest(out).items() if k.startswith(point.name)} == before
    manifest = json.loads((out / "sweep.json").read_text())
    assert [e["status"] for e in manifest["points"]] == ["failed"]
