"""Hostile inputs to ``cfl-bench leaderboard``, one table row each.

Two outcomes are allowed, and each row says which:

* **refused** — bad arguments (RUN_DIRS, ``--out``, ``--check``): exit 2, exactly one line
  naming the problem and the fix, no traceback, and nothing on disk that was not there
  before;
* **damaged** — a run directory whose records cfl-bench cannot have written: the board is
  still written (exit 0), the run is listed as ``damaged`` with the reason, counted in
  ``n_damaged`` and kept out of every mean. The CSV numbers prove it: the good seeds have
  Acc_T 50 and 70, the damaged one 90, so a mean of 60 over seeds "0 1" means it was not
  averaged.

Why in-process (typer's CliRunner): hundreds of cases in seconds; ``tests/test_cli.py`` keeps
the subprocess checks of the real console script.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from cfl_bench.cli import app
from cfl_bench.leaderboard.runs import load_runs
from tests.leaderboard_fixtures import write_run

GOOD_ACC = {0: 50.0, 1: 70.0}  # the good seeds: mean 60, sample std sqrt(200)
DAMAGED_ACC = 90.0  # seed 2; averaged by mistake it would move the mean to 70
DAMAGED_NAME = "s2"


def invoke(*args: str) -> tuple[int, str]:
    """Run ``cfl-bench`` in this process; any exception but the clean exit is re-raised, so
    a traceback can never pass for a refusal."""
    result = CliRunner().invoke(app, list(args))
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.output


def listing(root: Path) -> set[str]:
    """Every path under ``root`` (files, folders, links), relative: what is on disk."""
    out = set()
    for here, dirs, files in os.walk(root):
        for name in dirs + files:
            out.add(os.path.relpath(os.path.join(here, name), root))
    return out


def flat(text: str) -> str:
    return " ".join(text.split())


def good_runs(root: Path) -> Path:
    """Two finished seeds of fedavg under ``root/runs`` (returned)."""
    for seed, acc in GOOD_ACC.items():
        write_run(root / "runs", f"s{seed}", seed=seed, acc=acc)
    return root / "runs"


def assert_refused(code: int, output: str, fragment: str) -> None:
    assert code == 2, output
    assert "Traceback" not in output, output
    lines = output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), output
    assert fragment in output, output


# ------------------------------------------------------------------------------------------
# Damaged run records: listed, counted, never averaged
# ------------------------------------------------------------------------------------------


def _summary(run: Path) -> Path:
    return run / "summary.json"


def _config(run: Path) -> Path:
    return run / "config.json"


def _set(record: Callable[[Path], Path], **changes: object) -> Callable[[Path], None]:
    """Rewrite a record with ``changes`` (NaN / Infinity written as Python's json does)."""

    def damage(run: Path) -> None:
        path = record(run)
        path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))

    return damage


def _raw(record: Callable[[Path], Path], key: str, text: str) -> Callable[[Path], None]:
    """Replace the value of top-level ``key`` by raw JSON ``text`` (for 1e400 and the like,
    which json.dumps cannot write)."""

    def damage(run: Path) -> None:
        path = record(run)
        data = json.loads(path.read_text())
        data[key] = "@@VALUE@@"
        path.write_text(json.dumps(data).replace('"@@VALUE@@"', text))

    return damage


def _content(record: Callable[[Path], Path], content: bytes) -> Callable[[Path], None]:
    def damage(run: Path) -> None:
        record(run).write_bytes(content)

    return damage


def _truncate(record: Callable[[Path], Path]) -> Callable[[Path], None]:
    def damage(run: Path) -> None:
        path = record(run)
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])

    return damage


def _directory(record: Callable[[Path], Path]) -> Callable[[Path], None]:
    def damage(run: Path) -> None:
        path = record(run)
        path.unlink()
        path.mkdir()
        (path / "inside.txt").write_text("x")

    return damage


def _matrix(rows: list[list[object]]) -> Callable[[Path], None]:
    return _set(_summary, acc_matrix=rows)


def _broken_link(run: Path) -> None:
    _summary(run).unlink()
    _summary(run).symlink_to(run / "nowhere.json")


def _fifo(run: Path) -> None:
    _summary(run).unlink()
    os.mkfifo(_summary(run))


def _deep_but_parsable(run: Path) -> None:
    _set(_summary, extra=json.loads("[" * 60 + "]" * 60))(run)


def _duplicate_key(run: Path) -> None:
    path = _summary(run)
    path.write_text(path.read_text().replace('"Acc_T": 90.0', '"Acc_T": 90.0, "Acc_T": 10.0', 1))


def _no_status(run: Path) -> None:
    data = json.loads(_summary(run).read_text())
    del data["status"]
    _summary(run).write_text(json.dumps(data))


FULL = 3  # tasks of the fixture runs
SQUARE_BAD = [[1.0, None, None], [1.0, 1.0], [1.0, 1.0, 1.0]]


@dataclass(frozen=True)
class Damage:
    id: str
    damage: Callable[[Path], None]
    reason: str


DAMAGES = [
    # num_tasks
    Damage("num_tasks_infinity", _raw(_summary, "num_tasks", "Infinity"), "holds Infinity"),
    Damage("num_tasks_nan", _raw(_summary, "num_tasks", "NaN"), "holds NaN"),
    Damage("num_tasks_1e400", _raw(_summary, "num_tasks", "1e400"), "1e400, too large"),
    Damage("num_tasks_2.7", _set(_summary, num_tasks=2.7), "'num_tasks' must be a positive"),
    Damage("num_tasks_0", _set(_summary, num_tasks=0), "must be a positive integer, not 0"),
    Damage("num_tasks_true", _set(_summary, num_tasks=True), "positive integer, not true"),
    Damage("num_tasks_text", _set(_summary, num_tasks="3"), "not the text '3'"),
    # the file itself
    Damage("deep_recursion", _content(_summary, b"[" * 100_000), "nested far deeper"),
    Damage("deep_parsable", _deep_but_parsable, "nested far deeper"),
    Damage("empty", _content(_summary, b""), "summary.json is empty"),
    Damage("whitespace", _content(_summary, b" \n\t\n"), "summary.json is empty"),
    Damage("truncated", _truncate(_summary), "summary.json is not valid JSON"),
    Damage("binary", _content(_summary, bytes(range(256)) * 4), "not UTF-8 text"),
    Damage("latin1", _content(_summary, '{"status": "finé"}'.encode("latin-1")), "not UTF-8"),
    Damage("json_list", _content(_summary, b"[1, 2]"), "holds a list, not a JSON object"),
    Damage("json_number", _content(_summary, b"42"), "holds 42, not a JSON object"),
    Damage("directory", _directory(_summary), "summary.json is a directory, not a file"),
    Damage("broken_link", _broken_link, "summary.json is a broken link"),
    Damage("fifo", _fifo, "summary.json is not a regular file"),
    Damage("huge_integer", _raw(_summary, "Acc_T", "9" * 5000), "is not valid JSON"),
    Damage("duplicate_key", _duplicate_key, "has the key 'Acc_T' twice"),
    # metric values
    Damage("acc_text", _set(_summary, Acc_T="high"), "'Acc_T' must be a number or null"),
    Damage("acc_list", _set(_summary, Acc_T=[90.0]), "number or null, not a list"),
    Damage("acc_bool", _set(_summary, Acc_T=True), "number or null, not true"),
    Damage("acc_object", _set(_summary, Acc_T={"v": 1}), "not a JSON object"),
    Damage("acc_infinity", _set(_summary, Acc_T=math.inf), "holds Infinity"),
    Damage("acc_minus_infinity", _set(_summary, Acc_T=-math.inf), "holds -Infinity"),
    Damage("acc_nan_finished", _set(_summary, Acc_T=math.nan), "holds NaN"),
    Damage("acc_1e400", _raw(_summary, "Acc_T", "1e400"), "too large for a float"),
    Damage("acc_big_int", _raw(_summary, "Acc_T", "9" * 400), "outside its possible range"),
    Damage("acc_150", _set(_summary, Acc_T=150.0), "'Acc_T' is 150.0, outside"),
    Damage("bytes_negative", _set(_summary, bytes_up_total=-5), "'bytes_up_total' is -5.0"),
    Damage("bytes_text", _set(_summary, bytes_down_total="3 kB"), "'bytes_down_total' must"),
    Damage("wall_time_list", _set(_summary, wall_time_s=[1]), "'wall_time_s' must be a num"),
    # curves and matrices
    Damage("matrix_ragged", _matrix(SQUARE_BAD), "'acc_matrix' has 3 rows of 2/3 entries"),
    Damage("matrix_2x2", _matrix([[1.0, 2.0], [3.0, 4.0]]), "not the 3×3 matrix of 3 tasks"),
    Damage("matrix_4x4", _matrix([[1.0] * 4] * 4), "not the 3×3 matrix"),
    Damage("matrix_empty", _matrix([]), "'acc_matrix' has no rows"),
    Damage("matrix_flat", _set(_summary, acc_matrix=[1.0, 2.0]), "must be a list of rows"),
    Damage("matrix_text", _set(_summary, acc_matrix="a"), "must be a list of rows"),
    Damage("matrix_entry", _matrix([["x", None, None]] * FULL), "not the text 'x'"),
    Damage("matrix_200", _matrix([[200.0, None, None]] * FULL), "'acc_matrix' is 200.0"),
    Damage("curve_length", _set(_summary, acc_t=[1.0, 2.0]), "'acc_t' has 2 entries for 3"),
    Damage("curve_text", _set(_summary, md_t="rising"), "'md_t' must be a list of numbers"),
    # identity and status
    Damage("status_weird", _set(_summary, status="weird"), "'status' is the text 'weird'"),
    Damage("status_list", _set(_summary, status=["finished"]), "'status' is a list"),
    Damage("status_missing", _no_status, "'status' is missing"),
    Damage("strategy_object", _set(_summary, strategy={"a": 1}), "'strategy' must be text"),
    Damage("seed_negative", _set(_summary, seed=-1), "'seed' must be an integer ≥ 0"),
    Damage("seed_float", _set(_summary, seed=2.5), "'seed' must be an integer ≥ 0, not 2.5"),
    Damage("seed_huge", _set(_summary, seed=2**64), "'seed' must be an integer ≥ 0"),
    Damage("hash_number", _set(_summary, protocol_hash=7), "'protocol_hash' must be text"),
    # config.json (the summary is intact, so the run still knows its row)
    Damage("config_empty", _content(_config, b""), "config.json is empty"),
    Damage("config_truncated", _truncate(_config), "config.json is not valid JSON"),
    Damage("config_binary", _content(_config, b"\x89PNG\r\n\x1a\n\x00\xff"), "not UTF-8"),
    Damage("config_list", _content(_config, b"[]"), "config.json holds a list"),
    Damage("config_directory", _directory(_config), "config.json is a directory"),
    Damage("config_nan", _set(_config, git_commit=math.nan), "config.json holds NaN"),
    Damage("config_protocol", _set(_config, protocol=[1]), "'protocol' must be a JSON object"),
    Damage("config_packages", _set(_config, packages="torch"), "'packages' must be a JSON obj"),
    Damage("config_strategy", _set(_config, strategy=5), "'strategy' must be a JSON object"),
]


@pytest.mark.parametrize("case", DAMAGES, ids=[d.id for d in DAMAGES])
def test_damaged_run_is_listed_counted_and_not_averaged(tmp_path: Path, case: Damage) -> None:
    runs = good_runs(tmp_path)
    case.damage(write_run(runs, DAMAGED_NAME, seed=2, acc=DAMAGED_ACC))
    code, output = invoke("leaderboard", str(runs), "--out", str(tmp_path / "lb"))
    assert code == 0, output
    assert "Traceback" not in output
    assert "damaged" in output and case.reason in flat(output), output

    board = pd.read_csv(tmp_path / "lb" / "leaderboard.csv", keep_default_na=False)
    assert len(board) == 1, board
    row = board.iloc[0]
    assert (row.n_seeds, str(row.seeds)) == (2, "0 1")
    assert row.Acc_T_mean == 60.0
    assert row.Acc_T_std == pytest.approx(math.sqrt(200.0), abs=1e-12)
    assert row.bytes_total_mean == 4000.0  # the damaged run's bytes are not in there either
    assert (row.n_damaged, row.n_failed, row.n_incomplete, row.n_diverged) == (1, 0, 0, 0)

    frame = load_runs([runs])
    damaged = frame[frame.path.str.endswith(DAMAGED_NAME)].iloc[0]
    assert damaged.status == "damaged"
    assert case.reason in damaged.message
    assert damaged.message.endswith("re-run that run or remove its directory")
    assert math.isnan(damaged.Acc_T) and damaged.acc_matrix is None

    html = (tmp_path / "lb" / "leaderboard.html").read_text()
    assert '<td class="status-failed">damaged</td>' in html
    assert "n_incomplete / n_damaged columns" in html


def test_both_records_damaged_names_both_and_is_listed_without_a_row(tmp_path: Path) -> None:
    """With neither record intact nothing says which row the run belongs to: it is listed
    (and the board of the good runs still written), but counted in no row."""
    runs = good_runs(tmp_path)
    run = write_run(runs, DAMAGED_NAME, seed=2, acc=DAMAGED_ACC)
    _config(run).write_text("{")
    _summary(run).write_text("NaN")
    code, output = invoke("leaderboard", str(runs), "--out", str(tmp_path / "lb"))
    assert code == 0, output
    message = load_runs([runs]).set_index("path").loc[str(run), "message"]
    assert message.startswith("config.json is not valid JSON")
    assert "; summary.json holds NaN" in message
    board = pd.read_csv(tmp_path / "lb" / "leaderboard.csv")
    assert (board.n_seeds[0], board.Acc_T_mean[0], board.n_damaged[0]) == (2, 60.0, 0)


def test_damaged_run_never_hides_or_replaces_a_good_one(tmp_path: Path) -> None:
    """Same (protocol, strategy, seed) as a finished run: the finished one is averaged, the
    damaged one stays ``damaged`` (not ``duplicate``), so it is not forgotten."""
    runs = good_runs(tmp_path)
    _set(_summary, Acc_T="high")(write_run(runs, "a_damaged_s0", seed=0, acc=DAMAGED_ACC))
    frame = load_runs([runs])
    statuses = dict(zip(frame.path, frame.status, strict=True))
    assert statuses[str(runs / "a_damaged_s0")] == "damaged"
    assert statuses[str(runs / "s0")] == "finished"
    code, output = invoke("leaderboard", str(runs), "--out", str(tmp_path / "lb"))
    assert code == 0, output
    row = pd.read_csv(tmp_path / "lb" / "leaderboard.csv").iloc[0]
    assert (row.n_seeds, row.Acc_T_mean, row.n_damaged) == (2, 60.0, 1)


def test_only_damaged_runs_still_give_a_board(tmp_path: Path) -> None:
    (tmp_path / "runs" / "lonely").mkdir(parents=True)
    (tmp_path / "runs" / "lonely" / "summary.json").write_text("{not json")
    code, output = invoke("leaderboard", str(tmp_path / "runs"), "--out", str(tmp_path / "lb"))
    assert code == 0, output
    assert "no run could be placed" in output and "damaged" in output
    assert pd.read_csv(tmp_path / "lb" / "leaderboard.csv").empty


# ------------------------------------------------------------------------------------------
# Refused inputs: exit 2, one line, nothing left behind
# ------------------------------------------------------------------------------------------


Builder = Callable[[Path, Path], list[str]]


@dataclass(frozen=True)
class Refusal:
    """``build(tmp_path, runs)`` makes the layout and returns the arguments after
    ``leaderboard``; ``fragment`` must appear in the one line printed."""

    id: str
    build: Builder
    fragment: str


def _targets(text: str | bytes) -> Builder:
    def build(tmp: Path, runs: Path) -> list[str]:
        path = tmp / "targets.csv"
        if isinstance(text, bytes):
            path.write_bytes(text)
        else:
            path.write_text(text, encoding="utf-8")
        return [str(runs), "--out", str(tmp / "lb"), "--check", str(path)]

    return build


def _out(relative: str, prepare: Callable[[Path], None] = lambda tmp: None) -> Builder:
    def build(tmp: Path, runs: Path) -> list[str]:
        prepare(tmp)
        return [str(runs), "--out", str(tmp / relative) if relative else ""]

    return build


def _run_dirs(*arguments: str, prepare: Callable[[Path], None] = lambda tmp: None) -> Builder:
    def build(tmp: Path, runs: Path) -> list[str]:
        prepare(tmp)
        return [*(str(tmp / a) if a else "" for a in arguments), "--out", str(tmp / "lb")]

    return build


def _notes(tmp: Path) -> None:
    (tmp / "other" / "deeper").mkdir(parents=True)
    (tmp / "other" / "deeper" / "notes.json").write_text("{}")


def _file(name: str) -> Callable[[Path], None]:
    def prepare(tmp: Path) -> None:
        (tmp / name).write_text("x")

    return prepare


def _folder(name: str) -> Callable[[Path], None]:
    return lambda tmp: (tmp / name).mkdir(parents=True)


def _out_is_a_run(tmp: Path, runs: Path) -> list[str]:
    other = write_run(tmp / "elsewhere", "r", seed=7)
    return [str(runs), "--out", str(other)]


def _out_is_the_run_read(tmp: Path, runs: Path) -> list[str]:
    return [str(runs / "s0"), "--out", str(runs / "s0")]


def _out_inside_a_run_read(tmp: Path, runs: Path) -> list[str]:
    return [str(runs), "--out", str(runs / "s1" / "board")]


def _out_inside_through_a_link(tmp: Path, runs: Path) -> list[str]:
    (tmp / "link").symlink_to(runs / "s1")
    return [str(runs), "--out", str(tmp / "link" / "board")]


def _summary_as_argument(tmp: Path, runs: Path) -> list[str]:
    return [str(runs / "s0" / "summary.json"), "--out", str(tmp / "lb")]


def _broken_link_argument(tmp: Path, runs: Path) -> list[str]:
    (tmp / "gone").symlink_to(tmp / "nowhere")
    return [str(tmp / "gone"), "--out", str(tmp / "lb")]


def _check_directory(tmp: Path, runs: Path) -> list[str]:
    (tmp / "targets").mkdir()
    return [str(runs), "--out", str(tmp / "lb"), "--check", str(tmp / "targets")]


def _check_missing(tmp: Path, runs: Path) -> list[str]:
    return [str(runs), "--out", str(tmp / "lb"), "--check", str(tmp / "none.csv")]


def _check_empty_argument(tmp: Path, runs: Path) -> list[str]:
    return [str(runs), "--out", str(tmp / "lb"), "--check", ""]


HEADER = "strategy,metric,target,tolerance\n"
REFUSALS = [
    # RUN_DIRS
    Refusal("run_dirs_missing", _run_dirs("nowhere"), "nowhere' does not exist"),
    Refusal("run_dirs_file", _run_dirs("afile", prepare=_file("afile")), "is a file, not a"),
    Refusal("run_dirs_summary_file", _summary_as_argument, "pass the run directory that holds"),
    Refusal("run_dirs_empty_folder", _run_dirs("empty", prepare=_folder("empty")), "no run dir"),
    Refusal("run_dirs_no_runs_inside", _run_dirs("other", prepare=_notes), "no run directories"),
    Refusal("run_dirs_empty_text", _run_dirs(""), "a RUN_DIRS argument is empty"),
    Refusal("run_dirs_broken_link", _broken_link_argument, "is a broken link"),
    Refusal("run_dirs_long_name", _run_dirs("r" * 300), "RUN_DIRS '"),
    # --out
    Refusal("out_below_file", _out("afile/lb", _file("afile")), "which is a file"),
    Refusal("out_is_file", _out("afile", _file("afile")), "is a file; give a directory"),
    Refusal("out_long_name", _out("b" * 300), "longer than the 255"),
    Refusal("out_empty_text", _out(""), "--out is empty"),
    Refusal("out_csv_is_folder", _out("lb", _folder("lb/leaderboard.csv")), "which is not a f"),
    Refusal("out_html_is_folder", _out("lb", _folder("lb/leaderboard.html")), "is not a file"),
    Refusal("out_is_a_run_directory", _out_is_a_run, "is a cfl-bench run directory (it holds"),
    Refusal("out_is_the_run_read", _out_is_the_run_read, "is a cfl-bench run directory"),
    Refusal("out_inside_a_run_read", _out_inside_a_run_read, "is inside the cfl-bench run dir"),
    Refusal("out_inside_via_link", _out_inside_through_a_link, "is inside the cfl-bench run dir"),
    # --check
    Refusal("check_directory", _check_directory, "is a directory, not a file"),
    Refusal("check_missing", _check_missing, "does not exist"),
    Refusal("check_empty_argument", _check_empty_argument, "--check is empty"),
    Refusal("check_binary", _targets(b"\x89PNG\r\n\x1a\n\xff\xfe"), "is not UTF-8 text"),
    Refusal("check_nul", _targets(HEADER + "fedavg,Acc_T,60,1\x00\n"), "holds NUL bytes"),
    Refusal("check_empty", _targets(""), "is empty"),
    Refusal("check_comments_only", _targets("# nothing\n\n"), "is empty"),
    Refusal("check_header_only", _targets(HEADER), "has a header but no targets"),
    Refusal("check_no_tolerance", _targets("strategy,metric,target\nx,Acc_T,1\n"), "tolerance is"),
    Refusal(
        "check_no_target_tolerance",
        _targets("strategy,metric\nx,Acc_T\n"),
        "target and tolerance are missing",
    ),
    Refusal("check_no_selector", _targets("metric,target,tolerance\nAcc_T,1,1\n"), "no column"),
    Refusal("check_unknown_column", _targets("strategy,metric,target,tolerance,x\n"), "'x' is"),
    Refusal("check_column_twice", _targets("strategy,strategy,metric,target,tolerance\n"), "tw"),
    Refusal("check_target_inf", _targets(HEADER + "fedavg,Acc_T,inf,1\n"), "target 'inf' is"),
    Refusal("check_target_nan", _targets(HEADER + "fedavg,Acc_T,nan,1\n"), "'nan' is not a fin"),
    Refusal("check_target_1e400", _targets(HEADER + "fedavg,Acc_T,1e400,1\n"), "'1e400' is not"),
    Refusal("check_tol_inf", _targets(HEADER + "fedavg,Acc_T,60,inf\n"), "tolerance 'inf' is"),
    Refusal("check_tol_nan", _targets(HEADER + "fedavg,Acc_T,60,NaN\n"), "tolerance 'NaN' is"),
    Refusal("check_tol_negative", _targets(HEADER + "fedavg,Acc_T,60,-1\n"), "must be ≥ 0, n"),
    Refusal("check_target_text", _targets(HEADER + "fedavg,Acc_T,high,1\n"), "'high' is not a"),
    Refusal("check_short_row", _targets(HEADER + "fedavg,Acc_T,60\n"), "3 cells for 4 columns"),
    Refusal("check_unknown_metric", _targets(HEADER + "fedavg,acc,60,1\n"), "unknown metric"),
]


@pytest.mark.parametrize("case", REFUSALS, ids=[r.id for r in REFUSALS])
def test_refused_input_exits_2_with_one_line_and_leaves_nothing(
    tmp_path: Path, case: Refusal
) -> None:
    runs = good_runs(tmp_path)
    args = case.build(tmp_path, runs)
    before = listing(tmp_path)
    code, output = invoke("leaderboard", *args)
    assert_refused(code, output, case.fragment)
    assert listing(tmp_path) == before


def test_unlistable_folder_is_refused_not_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """os.walk skips a folder it cannot list unless told otherwise; its runs would be
    silently missing from the board. (Simulated: as root every folder can be listed.)"""
    runs = good_runs(tmp_path)
    locked = runs / "locked"
    write_run(locked, "s9", seed=9)
    real_scandir = os.scandir

    def scandir(path: object = ".") -> object:
        if Path(os.fsdecode(path)) == locked:  # type: ignore[arg-type]
            raise PermissionError(13, "Permission denied", str(locked))
        return real_scandir(path)  # type: ignore[arg-type]

    before = listing(tmp_path)
    monkeypatch.setattr(os, "scandir", scandir)
    code, output = invoke("leaderboard", str(runs), "--out", str(tmp_path / "lb"))
    monkeypatch.undo()
    assert_refused(code, output, f"cannot list '{locked}' (permission denied)")
    assert listing(tmp_path) == before


def test_proc_is_refused_in_one_line(tmp_path: Path) -> None:
    if not Path("/proc/self").exists():
        pytest.skip("no /proc on this system")
    runs = good_runs(tmp_path)
    code, output = invoke("leaderboard", str(runs), "--out", "/proc/cfl-bench-leaderboard")
    assert_refused(code, output, "--out '/proc/cfl-bench-leaderboard'")
    assert not os.path.lexists("/proc/cfl-bench-leaderboard")


def test_targets_with_a_byte_order_mark_are_read(tmp_path: Path) -> None:
    """Spreadsheets save "UTF-8 CSV" with a BOM; the first column must keep its name."""
    runs = good_runs(tmp_path)
    targets = tmp_path / "t.csv"
    targets.write_bytes("\ufeffstrategy,metric,target,tolerance\nfedavg,Acc_T,60,0\n".encode())
    code, output = invoke(
        "leaderboard", str(runs), "--out", str(tmp_path / "lb"), "--check", str(targets)
    )
    assert code == 0 and "all 1 targets met" in flat(output), output


# ------------------------------------------------------------------------------------------
# File systems that refuse writes (root only: tmpfs mounts, always unmounted)
# ------------------------------------------------------------------------------------------


@pytest.fixture
def mount_point(tmp_path: Path) -> Iterator[Callable[[str], Path]]:
    """``mount(options)`` mounts a small tmpfs at a fresh folder and returns it; every mount
    is undone at the end, whatever happened."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root")
    mounted: list[Path] = []

    def mount(options: str) -> Path:
        point = tmp_path / f"mnt{len(mounted)}"
        point.mkdir()
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(point)],
            capture_output=True,
            check=False,
        )
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
        mounted.append(point)
        return point

    try:
        yield mount
    finally:
        for point in reversed(mounted):
            subprocess.run(["umount", str(point)], check=False)


def _remount_read_only(point: Path) -> None:
    subprocess.run(["mount", "-o", "remount,ro", str(point)], check=True)


@pytest.mark.parametrize("existing", [False, True], ids=["new_folder", "existing_folder"])
def test_read_only_file_system_is_refused(
    tmp_path: Path, mount_point: Callable[[str], Path], existing: bool
) -> None:
    runs = good_runs(tmp_path)
    point = mount_point("size=64k")
    (point / "old").mkdir()
    _remount_read_only(point)
    out = point / ("old" if existing else "lb")
    before = listing(point)
    code, output = invoke("leaderboard", str(runs), "--out", str(out))
    fragment = f"--out '{out}' is not writable" if existing else "is not writable"
    assert_refused(code, output, fragment)
    assert listing(point) == before


def test_full_disk_leaves_nothing_behind(
    tmp_path: Path, mount_point: Callable[[str], Path]
) -> None:
    """The staged files fill the disk: the folder this call made and both staged files are
    removed again, and the sentence says why."""
    runs = good_runs(tmp_path)
    point = mount_point("size=4k")
    before = listing(point)
    code, output = invoke("leaderboard", str(runs), "--out", str(point / "lb" / "deep"))
    assert_refused(code, output, "(the disk is full); choose another folder.")
    assert listing(point) == before
