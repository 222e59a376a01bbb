"""Issue 39, part 2: one judgement of a run, everywhere.

A run is finished only when its files exist and agree (the summary is what the records give);
otherwise it is damaged — never ranked, never skipped, never scored — with the same one-line
reason in every command. One test drives all five readers of a run directory over each class
of damage: ``leaderboard`` (lists it as damaged, ranks nothing), ``report`` and ``clients``
(refuse it, exit 2), ``reproduce --compare`` (does not count it) and a sweep's skip rule (runs
the point again, saying why, and ends with a finished run). The expected reason is the one
:func:`cfl_bench.core.run_reader.read_run` gives, so the five must print exactly that text.

The four readers run in this process, through the console script's own ``main``
(``tests.cli_helpers.main_here``: its exit code, stdout and stderr as a process would give
them): each only reads a run directory, and
a fresh process per reader cost ~2 s of imports, four per class of damage, 24 in all. The
sweeps stay real processes: a sweep starts a fork server and children, process state this
test must not leave in the test's own process.
"""

from __future__ import annotations

import functools
import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pytest

from cfl_bench.core.run_reader import DAMAGED, read_run
from tests.cli_helpers import cli, main_here

GRID = [
    "--stream", "rot-digits", "--strategy", "fedavg", "--seed", "0", "--tasks", "2",
    "--rounds-per-task", "1", "--clients", "2", "--train-size", "300", "--test-size", "100",
]  # fmt: skip


@pytest.fixture(scope="module")
def finished_sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A one-point sweep, finished once for the module."""
    out = tmp_path_factory.mktemp("judgement") / "sweep"
    result = cli(["sweep", "--out", str(out), "--threads", "1", *GRID], out.parent, wide=True)
    assert result.returncode == 0, result.stdout + result.stderr
    return out


def _edit_summary(run: Path) -> None:
    summary = json.loads((run / "summary.json").read_text())
    (run / "summary.json").write_text(json.dumps({**summary, "Acc_T": 99.0}))


def _edit_records(run: Path) -> None:
    """One accuracy of the records changed, the summary left as it was."""
    lines = (run / "records.csv").read_text().splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if ",global,acc," in line and line[0] != "0")
    fields = lines[at].split(",")
    lines[at] = ",".join([*fields[:5], "12.5\n"])
    (run / "records.csv").write_text("".join(lines))


DAMAGE: dict[str, tuple[Callable[[Path], None], str]] = {
    "summary_edited": (_edit_summary, "summary.json says Acc_T is 99 but records.csv gives"),
    "records_edited": (_edit_records, "but records.csv gives"),
    "records_missing": (lambda r: (r / "records.csv").unlink(), "records.csv is missing"),
    "config_missing": (lambda r: (r / "config.json").unlink(), "config.json is missing"),
    "records_garbage": (
        lambda r: (r / "records.csv").write_bytes(bytes(range(256)) * 4),
        "records.csv is not UTF-8",
    ),
    "swap_stopped": (
        lambda r: (r / ".replaced").mkdir(),
        "an --overwrite of this run was stopped while it swapped the new run in",
    ),
}


@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_five_commands_give_one_status_and_reason(
    finished_sweep: Path,
    tmp_path: Path,
    kind: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reader = functools.partial(main_here, monkeypatch=monkeypatch, capsys=capsys)
    sweep = tmp_path / "sweep"
    shutil.copytree(finished_sweep, sweep)
    (run,) = sweep.glob("rot-digits_*")
    damage, words = DAMAGE[kind]
    damage(run)
    reading = read_run(run)
    assert reading.status == DAMAGED and words in reading.reason, reading.reason
    reason = reading.reason

    board = reader(
        ["leaderboard", str(sweep), "--out", str(tmp_path / "board")], tmp_path, wide=True
    )
    assert board.returncode == 0, board.stderr
    assert "damaged" in board.stdout and reason in board.stdout, board.stdout
    ranked = pd.read_csv(tmp_path / "board" / "leaderboard.csv")
    assert ranked["n_seeds"].sum() == 0 and ranked["Acc_T_mean"].isna().all()  # nothing ranked
    assert ranked["n_damaged"].sum() == (0 if ranked.empty else 1)

    for command in ("report", "clients"):
        refused = reader([command, str(run)], tmp_path)
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert refused.stderr.strip().splitlines() == [
            f"error: run directory '{run}' is damaged: {reason}; re-run that run or pass "
            f"another run directory."
        ]

    compare = ["--compare", str(sweep), "--scale", "smoke", "--out", str(tmp_path / "compared")]
    compared = reader(["reproduce", "fedgp-table1-mnist", *compare], tmp_path)
    assert compared.returncode in (0, 1), compared.stderr
    notes = (tmp_path / "compared" / "report.md").read_text()
    assert f"{run.name}: not counted (damaged: {reason})" in notes

    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    rerun = cli(["sweep", "--out", str(sweep), "--threads", "1", *GRID], tmp_path, wide=True)
    assert "runs already done" not in rerun.stdout  # never skipped
    if kind != "config_missing":
        assert rerun.returncode == 0, rerun.stdout + rerun.stderr
        assert f"{run.name}: damaged ({reason}); running it again" in rerun.stdout
        assert read_run(run).status == "finished"  # the rerun replaced it
        return
    # Without config.json the folder is no run (cfl_bench.core.run_dir), so the sweep replaces
    # nothing in it: the point fails and says what to do; every file is left as it was.
    assert rerun.returncode == 1, rerun.stdout + rerun.stderr
    assert f"{run.name}: damaged ({reason}); without a run's config.json" in rerun.stdout
    assert before == {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
