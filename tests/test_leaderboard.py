"""Leaderboard aggregation, CSV, CLI errors and ``--check`` exit codes, on hand-made run
directories with numbers checkable by hand, plus one end-to-end pass over two real runs."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from cfl_bench.core.errors import UserError
from cfl_bench.core.metrics import summarize
from cfl_bench.leaderboard.aggregate import BOARD_COLUMNS, aggregate, mean_std
from cfl_bench.leaderboard.check import check_targets, read_targets
from cfl_bench.leaderboard.protocol import describe_protocol
from cfl_bench.leaderboard.runs import load_runs
from cfl_bench.leaderboard.table import board_csv
from cfl_bench.runner.config import canonical_hash
from tests.leaderboard_fixtures import (
    IMG_INJECTION,
    PACKAGES,
    protocol,
    rows_for,
    standard_runs,
    summary_metrics,
    write_run,
)
from tests.sweep_helpers import TINY
from tests.test_cli import in_process

INJECTION = "<script>alert(1)</script>"
HASH_A = canonical_hash(protocol())
HASH_B = canonical_hash(protocol(clients=8))


def board_of(*paths: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    runs = load_runs(list(paths))
    return runs, aggregate(runs)


def row(board: pd.DataFrame, protocol_hash: str, strategy: str) -> pd.Series:
    rows = board[(board.protocol_hash == protocol_hash) & (board.strategy == strategy)]
    assert len(rows) == 1, rows
    return rows.iloc[0]


def flat(output: str) -> str:
    return " ".join(output.split())


def test_means_sample_std_and_seed_lists(tmp_path: Path) -> None:
    _, board = board_of(standard_runs(tmp_path))
    fedavg = row(board, HASH_A, "fedavg")
    assert fedavg.Acc_T_mean == 60.0 and fedavg.Acc_T_std == 10.0  # 50, 60, 70 by hand
    assert fedavg.n_seeds == 3 and fedavg.seeds == "0 1 2"
    assert fedavg.bytes_total_mean == 4000.0 and fedavg.bytes_total_std == 0.0
    der = row(board, HASH_A, "der+fedgp")  # seeds 0, 1 finished: 80, 90
    assert der.Acc_T_mean == 85.0
    assert der.Acc_T_std == pytest.approx(math.sqrt(50.0), abs=1e-12)  # ddof = 1
    assert der.seeds == "0 1" and der.n_seeds == 2
    single = row(board, HASH_B, "fedavg")
    assert single.Acc_T_mean == 30.0 and math.isnan(single.Acc_T_std)  # one seed: no std
    assert list(board.columns) == list(BOARD_COLUMNS)


POPULATION_STD_50_60_70 = math.sqrt(200.0 / 3.0)  # ((-10)² + 0² + 10²) / 3, ≈ 8.1650


def test_mean_std_sample_and_population_by_hand() -> None:
    assert mean_std([50.0, 60.0, 70.0]) == (60.0, 10.0)  # 200 / 2 = 100 → 10
    mean, std = mean_std([50.0, 60.0, 70.0], ddof=0)
    assert mean == 60.0 and std == pytest.approx(POPULATION_STD_50_60_70, abs=1e-12)
    assert round(std, 4) == 8.165
    assert mean_std([80.0, 90.0], ddof=0) == (85.0, 5.0)
    for ddof in (0, 1):  # one seed has no spread under either convention: NaN, never 0.0
        mean, std = mean_std([42.0], ddof=ddof)
        assert mean == 42.0 and math.isnan(std)
        assert all(math.isnan(v) for v in mean_std([1.0, math.nan], ddof=ddof))


def test_population_std_and_std_kind_column(tmp_path: Path) -> None:
    runs = load_runs([standard_runs(tmp_path)])
    sample, population = aggregate(runs), aggregate(runs, "population")
    assert (sample.std_kind == "sample (ddof=1)").all()
    assert (population.std_kind == "population (ddof=0)").all()
    assert list(population.columns) == list(BOARD_COLUMNS)
    fedavg = row(population, HASH_A, "fedavg")
    assert fedavg.Acc_T_mean == 60.0
    assert fedavg.Acc_T_std == pytest.approx(POPULATION_STD_50_60_70, abs=1e-12)
    assert row(sample, HASH_A, "fedavg").Acc_T_std == 10.0
    assert row(population, HASH_A, "der+fedgp").Acc_T_std == 5.0  # 80, 90
    assert fedavg.bytes_total_std == 0.0  # equal values: a real 0, not "no spread known"
    assert math.isnan(row(population, HASH_B, "fedavg").Acc_T_std)  # one seed: no std
    means = [c for c in BOARD_COLUMNS if c.endswith("_mean")]
    pd.testing.assert_frame_equal(sample[means], population[means])
    with pytest.raises(UserError, match=r"'sample'.*'population'"):
        aggregate(runs, "bogus")


def test_std_option_on_the_command_line(tmp_path: Path) -> None:
    root = standard_runs(tmp_path / "runs")
    code, output = in_process("leaderboard", str(root), "--out", str(tmp_path / "s"))
    assert code == 0, output
    assert "sample (ddof=1)" in flat(output) and "60.00±10.00" in output
    sample = pd.read_csv(tmp_path / "s" / "leaderboard.csv", keep_default_na=False)
    assert set(sample.std_kind) == {"sample (ddof=1)"}
    html = (tmp_path / "s" / "leaderboard.html").read_text()
    assert "sample standard deviation (ddof = 1)" in flat(html) and "population" not in html

    for out in ("p1", "p2"):
        args = ("leaderboard", str(root), "--out", str(tmp_path / out), "--std", "population")
        code, output = in_process(*args)
        assert code == 0, output
    assert "population (ddof=0)" in flat(output) and "60.00±8.16" in output
    assert "sample (ddof=1)" not in flat(output)
    for name in ("leaderboard.csv", "leaderboard.html"):  # deterministic under --std too
        assert (tmp_path / "p1" / name).read_bytes() == (tmp_path / "p2" / name).read_bytes()
    population = pd.read_csv(tmp_path / "p1" / "leaderboard.csv", keep_default_na=False)
    assert set(population.std_kind) == {"population (ddof=0)"}
    fedavg = population[(population.protocol_hash == HASH_A) & (population.strategy == "fedavg")]
    assert float(fedavg.Acc_T_std.iloc[0]) == pytest.approx(POPULATION_STD_50_60_70, abs=1e-12)
    single = population[population.protocol_hash == HASH_B]
    assert single.Acc_T_std.iloc[0] == ""  # one seed: empty cell under population std too
    html = (tmp_path / "p1" / "leaderboard.html").read_text()
    assert "population standard deviation (ddof = 0, np.std)" in flat(html)
    assert "sample standard deviation" not in html
    # only the std cells and the std_kind column differ from the default board
    stds = {c for c in BOARD_COLUMNS if c.endswith("_std")} | {"std_kind"}
    same = [c for c in BOARD_COLUMNS if c not in stds]
    pd.testing.assert_frame_equal(sample[same], population[same])


def test_std_bogus_exits_2_with_one_line(tmp_path: Path) -> None:
    root = standard_runs(tmp_path / "runs")
    out = tmp_path / "o"
    code, output = in_process("leaderboard", str(root), "--out", str(out), "--std", "bogus")
    assert code == 2 and "Traceback" not in output, output
    lines = [line for line in output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), output
    assert "--std 'bogus'" in output and "'population'" in output
    assert not out.exists()  # refused before anything was written


def test_check_compares_std_targets_with_the_chosen_kind(tmp_path: Path) -> None:
    root = standard_runs(tmp_path / "runs")
    targets = write_targets(
        tmp_path / "t.csv",
        f"protocol_hash,strategy,metric,target,tolerance\n{HASH_A},fedavg,Acc_T_std,8.1650,1e-4\n",
    )
    args = ("leaderboard", str(root), "--out", str(tmp_path / "o"), "--check", targets)
    code, output = in_process(*args, "--std", "population")
    assert code == 0 and "all 1 targets met" in flat(output), output
    code, output = in_process(*args)  # sample std is 10: the same target misses
    assert code == 1 and "off by 1.835" in flat(output), output


# The second worked example of docs/metrics.md and the numbers a summary.json written
# before the forgetting fix holds for it (a[0][1] = 95, measured before task 1 was trained,
# leaked into the max: Fgt_3 = 25 instead of 20).
STALE_MATRIX: list[list[float | None]] = [
    [90.0, 95.0, None],
    [70.0, 85.0, 40.0],
    [60.0, 75.0, 80.0],
]
STALE_TASK_IL: list[list[float | None]] = [
    [50.0, 99.0, None],
    [40.0, 80.0, 99.0],
    [60.0, 70.0, 75.0],
]
STALE_KEYS: dict[str, object] = {
    "acc_matrix": STALE_MATRIX,
    "Fgt_T": 25.0,
    "fgt_acc_T": 25.0,
    "Fgt_T_clipped": 25.0,
    "fgt_clipped_acc_T": 25.0,
    "fgt_acc_t": [None, 20.0, 25.0],
    "acc_task_il_matrix": STALE_TASK_IL,
    "fgt_acc_task_il_T": 9.5,
    "fgt_clipped_acc_task_il_T": 14.5,
    "fgt_acc_task_il_t": [None, 10.0, 9.5],
}


def test_forgetting_of_a_stale_summary_is_rederived(tmp_path: Path) -> None:
    """A finished run written before the fix: the leaderboard shows the right forgetting."""
    c = protocol("seq-cifar10", model="cifar-cnn")
    hand = {**summary_metrics(60.0, 3, task_il=True), **STALE_KEYS}
    rows = rows_for(hand, c["rounds_per_task"], initial=True)  # the records behind the matrices
    stale = {k: v for k, v in STALE_KEYS.items() if not k.endswith("matrix")}
    for seed in (0, 1):
        write_run(tmp_path, f"s{seed}", seed=seed, proto=c, scenario="class-il", records=rows,
                  metrics=stale)  # fmt: skip
    runs, board = board_of(tmp_path)
    run = runs.iloc[0]
    assert run.Fgt_T == 20.0 and run.Fgt_T_clipped == 20.0  # ((90-60) + (85-75)) / 2
    assert math.isnan(run.fgt_t[0]) and run.fgt_t[1:] == [20.0, 20.0]
    # task-IL: Chaudhry ((50-60) + (80-70)) / 2 = 0; clipped ((60-60) + (80-70)) / 2 = 5
    assert run.Fgt_T_task_il == 0.0 and run.Fgt_T_clipped_task_il == 5.0
    assert run.fgt_task_il_t[1:] == [10.0, 0.0]
    got = board.iloc[0]
    assert (got.Fgt_T_mean, got.Fgt_T_clipped_mean) == (20.0, 20.0)
    assert (got.Fgt_T_task_il_mean, got.Fgt_T_clipped_task_il_mean) == (0.0, 5.0)
    assert got.BWT_mean == -20.0  # ((60-90) + (75-85)) / 2: BWT never read the upper triangle


def test_rederived_forgetting_is_bit_identical_for_current_summaries(tmp_path: Path) -> None:
    """For a summary written by today's code, re-deriving changes no bit (so CSV bytes of
    current runs are unchanged); non-round random values make float noise visible."""
    rng = np.random.default_rng(7)
    records = []
    for t in range(4):
        for i in range(min(t + 1, 3) + 1):  # tasks 0..t+1, as the engine evaluates
            for metric in ("acc", "acc_task_il"):
                value = float(rng.uniform(0.0, 100.0))
                records.append((2 * t + 1, t, i, "global", metric, value))
    frame = pd.DataFrame(
        records, columns=["round", "trained_task", "eval_task", "scope", "metric", "value"]
    )
    summary = summarize(frame, num_tasks=4)
    write_run(tmp_path, "r", proto=protocol(tasks=4), scenario="class-il", records=records)
    run = load_runs([tmp_path]).iloc[0]
    for name, key in [
        ("Fgt_T", "Fgt_T"),
        ("Fgt_T_clipped", "Fgt_T_clipped"),
        ("Fgt_T_task_il", "fgt_acc_task_il_T"),
        ("Fgt_T_clipped_task_il", "fgt_clipped_acc_task_il_T"),
    ]:
        assert run[name] == summary[key], name
    assert run.fgt_t[1:] == summary["fgt_acc_t"][1:]
    assert run.fgt_task_il_t[1:] == summary["fgt_acc_task_il_t"][1:]


def test_protocols_are_kept_apart(tmp_path: Path) -> None:
    _, board = board_of(standard_runs(tmp_path))
    assert board.protocol_hash.nunique() == 3
    assert sorted(board[board.strategy == "fedavg"].protocol_hash) == sorted([HASH_A, HASH_B])
    assert "4 clients" in row(board, HASH_A, "fedavg").protocol
    assert "8 clients" in row(board, HASH_B, "fedavg").protocol
    # within a protocol, rows are ranked by mean accuracy
    order = list(board[board.protocol_hash == HASH_A].strategy)
    assert order == ["der+fedgp", "fedavg", INJECTION]


def test_unfinished_runs_are_counted_listed_and_kept_out(tmp_path: Path) -> None:
    runs, board = board_of(standard_runs(tmp_path))
    der = row(board, HASH_A, "der+fedgp")
    assert (der.n_diverged, der.n_failed, der.n_incomplete) == (1, 1, 1)
    status = dict(zip(runs.path.map(lambda p: Path(p).name), runs.status, strict=True))
    assert status["der_s2"] == "diverged" and status["der_s3"] == "failed"
    assert status["der_s4"] == "incomplete" and status["der_s1"] == "finished"
    messages = dict(zip(runs.status, runs.message, strict=False))
    assert messages["diverged"] == "loss became NaN in round 3"
    assert messages["failed"].startswith("RuntimeError: out of memory")
    assert "no summary.json" in messages["incomplete"]


def test_provenance_disagreement_is_flagged(tmp_path: Path) -> None:
    standard_runs(tmp_path / "std")
    other = {**PACKAGES, "torch": "2.99.0"}
    write_run(tmp_path / "pk", "s0", strategy="er", seed=0, acc=10.0)
    write_run(tmp_path / "pk", "s1", strategy="er", seed=1, acc=20.0, packages=other)
    _, board = board_of(tmp_path)
    evil = row(board, HASH_A, INJECTION)
    assert evil.provenance_flag == "git commits differ"
    assert len(evil.git_commit.split(" | ")) == 2
    er = row(board, HASH_A, "er")
    assert er.provenance_flag == "package versions differ"
    assert "torch=2.99.0" in er.packages and "torch=2.15.0" in er.packages
    assert row(board, HASH_A, "fedavg").provenance_flag == ""


def test_scenario_columns(tmp_path: Path) -> None:
    _, board = board_of(standard_runs(tmp_path))
    er = board[board.strategy == "er"].iloc[0]
    assert er.scenario == "class-il" and er.Acc_T_task_il_mean == 42.0  # 40 and 44
    assert er.Acc_T_mean == 22.0 and er.FWT_task_il_mean == 1.0
    domain = board[board.scenario == "domain-il"]
    assert domain.Acc_T_task_il_mean.isna().all() and domain.BWT_task_il_mean.isna().all()


def test_discovery_at_any_depth_without_double_counting(tmp_path: Path) -> None:
    root = standard_runs(tmp_path / "runs")
    shutil.copytree(root / "a" / "fedavg_s0", root / "z_copy_of_fedavg_s0")
    # the same directories reached through overlapping arguments are loaded once
    runs, board = board_of(root / "a", root / "a" / "nested", root)
    assert runs.path.map(lambda p: Path(p).resolve()).is_unique
    fedavg = row(board, HASH_A, "fedavg")
    assert fedavg.n_seeds == 3 and fedavg.Acc_T_mean == 60.0
    copy = runs[runs.path.str.endswith("z_copy_of_fedavg_s0")].iloc[0]
    assert copy.status == "duplicate" and "fedavg_s0" in copy.message
    assert row(board, HASH_A, "der+fedgp").n_seeds == 2  # der_s1 sits one level deeper


def test_finished_rerun_beats_earlier_failed_attempt(tmp_path: Path) -> None:
    write_run(tmp_path, "a_attempt1", seed=0, status="failed", message="killed")
    write_run(tmp_path, "b_attempt2", seed=0, acc=55.0)
    runs, board = board_of(tmp_path)
    assert list(runs.status) == ["duplicate", "finished"]
    assert board.iloc[0].Acc_T_mean == 55.0 and board.iloc[0].n_failed == 0


def test_sweep_failure_without_config_is_listed_not_ranked(tmp_path: Path) -> None:
    """The sweep writes only a failed summary.json when a child dies before config.json."""
    crashed = tmp_path / "runs" / "p3"
    crashed.mkdir(parents=True)
    failed = {
        "status": "failed",
        "message": "exit code -9\nKilled",
        "returncode": -9,
        "stream": "rot-digits",
        "strategy": "der",
        "seed": 3,
        "request_hash": "abc",
        "sweep_point": "p3",
    }
    (crashed / "summary.json").write_text(json.dumps(failed))
    write_run(tmp_path / "runs", "ok", seed=0)
    code, output = in_process("leaderboard", str(tmp_path / "runs"), "--out", str(tmp_path / "o"))
    assert code == 0, output
    assert "exit code -9" in output and "failed" in output
    runs, board = board_of(tmp_path / "runs")
    assert list(runs.status) == ["finished", "failed"] and len(board) == 1
    html = (tmp_path / "o" / "leaderboard.html").read_text()
    assert "exit code -9\nKilled" in html  # shown with its line break (pre-wrap)


def test_rows_without_finished_runs_and_boards_without_rows(tmp_path: Path) -> None:
    write_run(tmp_path / "one", "s0", strategy="der", status="failed", message="boom")
    write_run(tmp_path / "one", "s1", strategy="der", seed=1, status=None)
    code, output = in_process("leaderboard", str(tmp_path / "one"), "--out", str(tmp_path / "o"))
    assert code == 0, output
    csv = pd.read_csv(tmp_path / "o" / "leaderboard.csv")
    assert (csv.n_seeds[0], csv.n_failed[0], csv.n_incomplete[0]) == (0, 1, 1)
    assert math.isnan(csv.Acc_T_mean[0])
    (tmp_path / "two" / "x").mkdir(parents=True)
    (tmp_path / "two" / "x" / "summary.json").write_text(json.dumps({"status": "failed"}))
    code, output = in_process("leaderboard", str(tmp_path / "two"), "--out", str(tmp_path / "p"))
    assert code == 0 and "no run could be placed" in output
    assert pd.read_csv(tmp_path / "p" / "leaderboard.csv").empty


def test_missing_metric_makes_the_mean_missing(tmp_path: Path) -> None:
    write_run(tmp_path, "s0", seed=0, initial=False)  # no initial accuracy: FWT unknown
    write_run(tmp_path, "s1", seed=1)
    _, board = board_of(tmp_path)
    assert math.isnan(board.iloc[0].FWT_mean) and board.iloc[0].Acc_T_mean == 60.0


def test_cli_writes_identical_files_for_the_same_runs(tmp_path: Path) -> None:
    root = standard_runs(tmp_path / "runs")
    code, output = in_process("leaderboard", str(root), "--out", str(tmp_path / "one"))
    assert code == 0, output
    assert "leaderboard written to" in flat(output) and "85.00±7.07" in output
    assert INJECTION in flat(output)  # printed as text, not as rich markup
    code, _ = in_process("leaderboard", str(root), "--out", str(tmp_path / "two"))
    assert code == 0
    for name in ("leaderboard.csv", "leaderboard.html"):
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes()
    csv = pd.read_csv(tmp_path / "one" / "leaderboard.csv", keep_default_na=False)
    assert list(csv.columns) == list(BOARD_COLUMNS) and len(csv) == 5
    # argument order does not change the CSV (it holds no paths)
    _, shuffled = board_of(root / "c", root / "b", root / "a")
    assert board_csv(shuffled).encode() == (tmp_path / "one" / "leaderboard.csv").read_bytes()


def test_damaged_run_files_are_listed_not_fatal(tmp_path: Path) -> None:
    """A damaged record no longer stops the board: the run is listed as ``damaged`` with
    the file and the reason (every kind of damage: tests/test_leaderboard_inputs.py)."""
    write_run(tmp_path / "runs", "good", seed=0, acc=50.0)
    (write_run(tmp_path / "runs", "r", seed=1) / "summary.json").write_text("{not json")
    code, output = in_process("leaderboard", str(tmp_path / "runs"), "--out", str(tmp_path / "o"))
    assert code == 0 and "Traceback" not in output, output
    assert "damaged" in output and "summary.json is not valid JSON" in flat(output)
    csv = pd.read_csv(tmp_path / "o" / "leaderboard.csv")
    assert (csv.n_seeds[0], csv.Acc_T_mean[0], csv.n_damaged[0]) == (1, 50.0, 1)


def test_bad_arguments_exit_2(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    write_run(tmp_path / "runs", "r")
    (tmp_path / "file").write_text("x")
    cases = [
        (["leaderboard", str(tmp_path / "empty"), "--out", "o"], "no run directories"),
        (["leaderboard", str(tmp_path / "nowhere"), "--out", "o"], "does not exist"),
        (["leaderboard", str(tmp_path / "file"), "--out", "o"], "is a file, not a folder"),
        (["leaderboard", str(tmp_path / "runs"), "--out", str(tmp_path / "file")], "is a file"),
    ]
    for args, fragment in cases:
        code, output = in_process(*args)
        assert code == 2 and "Traceback" not in output and fragment in flat(output), output


def write_targets(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def test_check_exit_codes(tmp_path: Path) -> None:
    write_run(tmp_path / "runs", "s0", seed=0, acc=50.0)
    write_run(tmp_path / "runs", "s1", seed=1, acc=70.0)

    def check(text: str) -> tuple[int, str]:
        targets = write_targets(tmp_path / "t.csv", text)
        out = str(tmp_path / "out")
        return in_process("leaderboard", str(tmp_path / "runs"), "--out", out, "--check", targets)

    code, output = check(
        "# reproduction table\n"
        "protocol_hash,stream,strategy,metric,target,tolerance,note\n"
        f"{HASH_A[:6]},,fedavg,Acc_T,60.4,0.5,prefix of the hash\n"
        f",rot-digits,fedavg,Acc_T_std,14.1421356,1e-6,\n"
        f"{HASH_A},rot-digits,,n_seeds,2,0,\n"
    )
    assert code == 0 and "all 3 targets met" in flat(output), output
    code, output = check("strategy,metric,target,tolerance\nfedavg,Acc_T,61,0.5\n")
    assert code == 1 and "missed targets" in output
    assert "check failed: 1 of 1 targets missed" in flat(output)
    code, output = check("strategy,metric,target,tolerance\nnosuch,Acc_T,1,1\n")
    assert code == 1 and "check failed: 1 of 1" in flat(output)


def test_check_reasons(tmp_path: Path) -> None:
    _, board = board_of(standard_runs(tmp_path))
    targets = tmp_path / "t.csv"
    targets.write_text(
        "protocol_hash,stream,strategy,metric,target,tolerance\n"
        f"{HASH_A},,fedavg,Acc_T,61,0.5\n"
        ",,nosuch,Acc_T,1,1\n"
        ",rot-digits,fedavg,Acc_T,60,1\n"
        f"{HASH_A},,fedavg,FWT_task_il,0,1\n"
        f"{HASH_B},,fedavg,Acc_T_std,0,1\n"
        f"{HASH_B},,fedavg,Acc_T_mean,30,0\n"
    )
    outcomes = check_targets(board, read_targets(targets))
    assert [o.met for o in outcomes] == [False, False, False, False, False, True]
    assert outcomes[0].reason == "off by 1 > tolerance 0.5" and outcomes[0].value == 60.0
    assert outcomes[1].reason == "no leaderboard row matches"
    assert outcomes[2].reason.startswith("ambiguous: 2 rows match")
    assert outcomes[3].reason.startswith("no value")  # domain-IL has no task-IL metric
    assert outcomes[4].reason.startswith("no value")  # one seed has no sample std
    assert [o.target.line for o in outcomes] == [2, 3, 4, 5, 6, 7]


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("strategy,metric,target\nfedavg,Acc_T,60\n", "needs metric, target, tolerance"),
        ("metric,target,tolerance\nAcc_T,60,1\n", "at least one of protocol_hash"),
        ("strategy,metric,target,tolerance,tolerence\nfedavg,Acc_T,6,1,1\n", "has columns"),
        ("strategy,metric,target,tolerance\nfedavg,Acc_T,sixty,1\n", "'sixty' is not a number"),
        ("strategy,metric,target,tolerance\nfedavg,Acc_T,60,-1\n", "tolerance must be ≥ 0"),
        ("strategy,metric,target,tolerance\nfedavg,accuracy,60,1\n", "unknown metric 'accuracy'"),
        ("strategy,metric,target,tolerance\nfedavg,Acc_T,60\n", "3 cells for 4 columns"),
        ("strategy,metric,target,tolerance\n", "no targets"),
        ("", "is empty"),
    ],
)
def test_malformed_targets_exit_2_before_any_work(tmp_path: Path, text: str, fragment: str) -> None:
    write_run(tmp_path / "runs", "r")
    targets = write_targets(tmp_path / "t.csv", text)
    code, output = in_process(
        "leaderboard", str(tmp_path / "runs"), "--out", str(tmp_path / "o"), "--check", targets
    )
    assert code == 2 and "Traceback" not in output and fragment in flat(output), output
    assert not (tmp_path / "o").exists()


def test_missing_targets_file_exits_2(tmp_path: Path) -> None:
    write_run(tmp_path / "runs", "r")
    code, output = in_process(
        "leaderboard",
        str(tmp_path / "runs"),
        "--out",
        str(tmp_path / "o"),
        "--check",
        str(tmp_path / "none.csv"),
    )
    assert code == 2 and "does not exist" in flat(output)


def test_end_to_end_two_real_runs(tmp_path: Path) -> None:
    """Two real runs of the embedded default stream → the CSV row is their mean."""
    tiny = [*TINY, "--probe-size", "50", "--threads", "1"]
    summaries = []
    for seed in (0, 1):
        out = tmp_path / "runs" / f"s{seed}"
        code, output = in_process("run", *tiny, "--seed", str(seed), "--out", str(out))
        assert code == 0, output
        summaries.append(json.loads((out / "summary.json").read_text()))
    code, output = in_process("leaderboard", str(tmp_path / "runs"), "--out", str(tmp_path / "lb"))
    assert code == 0, output
    csv = pd.read_csv(tmp_path / "lb" / "leaderboard.csv")
    assert len(csv) == 1
    got = csv.iloc[0]
    assert got.n_seeds == 2 and got.seeds == "0 1" and got.stream == "rot-digits"
    for column, key in [
        ("Acc_T", "Acc_T"),
        ("Fgt_T", "Fgt_T"),
        ("BWT", "BWT"),
        ("FWT", "FWT"),
        ("MD_T", "MD_T"),
        ("bytes_up", "bytes_up_total"),
        ("wall_time_s", "wall_time_s"),
    ]:
        values = [float(s[key]) for s in summaries]
        assert got[f"{column}_mean"] == pytest.approx(sum(values) / 2, rel=1e-12, abs=1e-12)
        assert got[f"{column}_std"] == pytest.approx(abs(values[0] - values[1]) / math.sqrt(2))
    html = (tmp_path / "lb" / "leaderboard.html").read_text()
    assert "rot-digits" in html and summaries[0]["protocol_hash"] in html
    assert IMG_INJECTION not in html


def test_protocol_line_names_the_data_briefly() -> None:
    """The data identity is part of the protocol; its one-line form keeps the base name,
    the sizes and 8 hex digits of the digest, not the raw JSON with all 64."""
    digest = "671ef426" + "0" * 56
    data = {"base": "digits", "sizes": {"train": 1437, "test": 360}, "sha256": digest}
    line = describe_protocol({"stream": "rot-digits", "tasks": 5, "data": data}, "domain-il")
    assert line == "rot-digits (domain-il) · 5 tasks · data digits 1437+360 (sha256 671ef426)"
    odd = describe_protocol({"stream": "s", "data": [1, 2]})
    assert odd == "s · data=[1,2]"
