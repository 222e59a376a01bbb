"""One reader of run directories, one verdict: a run whose ``records.csv`` holds garbage, a
NaN where no divergence put it, or a last line cut in half is ``damaged`` for every command.
The leaderboard lists it with its reason and never ranks it as a finished seed; ``report``
and ``clients`` refuse it with one line; a sweep runs the point again instead of skipping it.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from pathlib import Path

import pytest
from rich.console import Console

from cfl_bench.cli import main
from cfl_bench.core.run_reader import DAMAGED, read_run
from cfl_bench.leaderboard.command import leaderboard_command
from cfl_bench.leaderboard.runs import load_runs
from cfl_bench.sweeps import ledger
from tests.leaderboard_fixtures import write_recorded_run

REQUEST = "request-abc"


def replace_value(metric: str, new: str, *, line: int = 0) -> Callable[[Path], None]:
    """Set the value of the ``line``-th row of ``metric`` (0 = the first) to ``new``."""

    def damage(path: Path) -> None:
        lines = path.read_text().splitlines(keepends=True)
        rows = [i for i, text in enumerate(lines) if f",{metric}," in text]
        i = rows[line]
        lines[i] = lines[i].rsplit(",", 1)[0] + f",{new}\n"
        path.write_text("".join(lines))

    return damage


def cut_last_line(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-7])


def garbage(path: Path) -> None:
    path.write_text("lorem ipsum, not a table\n1,2\n")


def binary(path: Path) -> None:
    path.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x01")


#: damage → (how, what the reason names)
DAMAGES: dict[str, tuple[Callable[[Path], None], str]] = {
    "garbage": (garbage, "records.csv starts with 'lorem ipsum"),
    "binary": (binary, "records.csv is not UTF-8 text"),
    "nan accuracy": (replace_value("acc", "nan", line=3), "acc nan is outside its possible range"),
    "nan training loss": (replace_value("train_loss", "nan"), "train_loss nan is not a finite"),
    "infinite bytes": (replace_value("bytes_up", "inf"), "bytes_up inf is not a finite number"),
    "cut last line": (cut_last_line, "records.csv ends in the middle of a line"),
    "not a number": (replace_value("acc", "fast", line=2), "records.csv cannot be parsed"),
}


@pytest.fixture
def runs(tmp_path: Path) -> tuple[Path, Path, Path]:
    """(folder, intact run, run to damage): two seeds of one leaderboard row, both
    finished as a sweep records them (with a request hash)."""
    root = tmp_path / "runs"
    good = write_recorded_run(root, "good", seed=0)
    bad = write_recorded_run(root, "bad", seed=1)
    for run in (good, bad):
        summary = json.loads((run / "summary.json").read_text())
        (run / "summary.json").write_text(json.dumps({**summary, "request_hash": REQUEST}))
    return root, good, bad


def one_error_line(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as stop:
        main(argv)
    err = capsys.readouterr().err
    assert stop.value.code == 2, err
    lines = err.strip().splitlines()
    assert "Traceback" not in err and len(lines) == 1, err
    return " ".join(err.split())


@pytest.mark.parametrize("name", sorted(DAMAGES))
def test_a_damaged_records_file_is_damaged_for_every_command(
    name: str,
    runs: tuple[Path, Path, Path],
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    root, good, bad = runs
    damage, reason = DAMAGES[name]
    damage(bad / "records.csv")
    reading = read_run(bad)
    assert reading.status == DAMAGED and reason in reading.reason, reading.reason
    assert read_run(good).status == "finished"
    # leaderboard: listed as damaged with the reason, one finished seed in the row
    frame = load_runs([root]).set_index("path")
    assert frame.loc[f"{root.as_posix()}/bad", "status"] == DAMAGED
    assert reason in frame.loc[f"{root.as_posix()}/bad", "message"]
    shown = io.StringIO()
    leaderboard_command([str(root)], str(tmp_path / "board"), None, Console(file=shown, width=400))
    board = (tmp_path / "board" / "leaderboard.csv").read_text().splitlines()
    header, row = board[0].split(","), board[1].split(",")
    assert row[header.index("n_seeds")] == "1" and row[header.index("n_damaged")] == "1"
    damaged_lines = [line for line in shown.getvalue().splitlines() if "/bad" in line]
    assert len(damaged_lines) == 1 and DAMAGED in damaged_lines[0], shown.getvalue()
    # report and clients refuse it with the same reason, in one line
    for command in (["report", str(bad), "--out", str(tmp_path / "r.html")], ["clients", str(bad)]):
        error = one_error_line(command, capsys)
        assert f"run directory '{bad}' is damaged: " in error and reason in error, error
    assert not (tmp_path / "r.html").exists()
    # a sweep runs the point again rather than skipping it as done
    assert ledger.is_done(good, REQUEST) and not ledger.is_done(bad, REQUEST)


def test_the_nan_of_a_divergence_is_not_damage(runs: tuple[Path, Path, Path]) -> None:
    """A diverged run records the non-finite training loss of its last round; the same NaN
    one round earlier, or in a finished run, is damage."""
    _, _, run = runs
    summary = json.loads((run / "summary.json").read_text())
    (run / "summary.json").write_text(json.dumps({**summary, "status": "diverged"}))
    records = run / "records.csv"
    intact = records.read_text()
    replace_value("train_loss", "nan", line=-1)(records)
    assert read_run(run).status == "diverged"
    replace_value("train_loss", "-inf", line=-1)(records)
    assert read_run(run).status == "diverged"
    records.write_text(intact)
    replace_value("train_loss", "nan", line=-2)(records)
    reading = read_run(run)
    assert reading.status == DAMAGED and "train_loss nan is not a finite" in reading.reason


def test_an_unfinished_run_cut_mid_line_is_unfinished_with_a_note(tmp_path: Path) -> None:
    """A run killed while appending: the half line is left out, not held against it."""
    run = write_recorded_run(tmp_path, "killed", finished=False)
    cut_last_line(run / "records.csv")
    reading = read_run(run)
    assert reading.status == "unfinished", reading.reason
    assert reading.notes and "cut off" in reading.notes[0]
    assert reading.records is not None and len(reading.records) > 0
