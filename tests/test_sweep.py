"""`cfl-bench sweep`: grid expansion (YAML, command line, order, names), every refusal (exit 2,
nothing written), the skip rule, failure / busy / interrupted points, --jobs parallelism with
cores // N threads, and resumption after SIGKILL (no run done twice, identical results).

The run tests use tiny runs on the embedded rot-digits stream; children fork from a server
that imports the engine once per test session, so each run costs a fraction of a second.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from cfl_bench.core.errors import UserError
from cfl_bench.runner.config import canonical_hash
from cfl_bench.sweeps import ledger, worker
from cfl_bench.sweeps.grid import build_spec, expand, parse_cli
from cfl_bench.sweeps.launcher import threads_per_run, usable_cores
from cfl_bench.sweeps.scheduler import PointState, settle
from tests.leaderboard_fixtures import write_recorded_run
from tests.sweep_helpers import (
    TINY,
    comparable,
    events,
    in_process,
    summaries,
    sweep_command,
)

SWEEP_YAML = """\
out: {out}
jobs: 3
base:
  stream: rot-digits
  rounds-per-task: 1
grid:
  strategy: [fedavg, der+fedgp]
  seed: [0, 1, 2]
  buffer_size: 100
"""


# Two strategies × two seeds of tiny runs: the sweep SIGKILLed and resumed, and the README's
# first command in miniature (its leaderboard). Run once uninterrupted (``strategy_sweep``),
# it is the reference of the first and the sweep whose leaderboard the second reads.
STRATEGY_GRID = ["--strategy", "fedavg", "--strategy", "der", "--seed", "0", "--seed", "1"]
STRATEGY_GRID += ["--threads", "1", *TINY]


@pytest.fixture(scope="module")
def strategy_sweep(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """``STRATEGY_GRID`` swept in this process, uninterrupted (``--jobs 1``): its folder
    and what it printed. Tests only read it."""
    out = tmp_path_factory.mktemp("strategy-sweep") / "sweep"
    code, output = in_process("sweep", "--out", str(out), "--jobs", "1", *STRATEGY_GRID)
    assert code == 0, output
    return out, output


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


# --- the grid ------------------------------------------------------------------------------


def test_yaml_grid_expands_in_key_order_with_normalised_keys(tmp_path: Path) -> None:
    spec = build_spec(str(write(tmp_path / "s.yaml", SWEEP_YAML.format(out="runs/a"))), [])
    assert (spec.out, spec.jobs) == (Path("runs/a"), 3)
    assert list(spec.axes) == ["stream", "rounds_per_task", "strategy", "seed", "buffer_size"]
    points = expand(spec)
    assert [(p.request["strategy"], p.request["seed"]) for p in points] == [
        ("fedavg", 0),
        ("fedavg", 1),
        ("fedavg", 2),
        ("der+fedgp", 0),
        ("der+fedgp", 1),
        ("der+fedgp", 2),
    ]
    assert all(
        p.request["rounds_per_task"] == 1 and p.request["buffer_size"] == 100 for p in points
    )
    assert "out" not in points[0].request and "overwrite" not in points[0].request


def test_command_line_axes_keep_order_types_and_commas_of_strategies() -> None:
    axes = parse_cli(
        [
            "--strategy",
            "der:alpha=0.5+fedgp:gref_samples=all,gref_mode=eval",
            "--seed",
            "0",
            "--set",
            "buffer-size=100,200",
            "--set",
            "strategy=fedavg",
            "--lr=0.05",
            "--no-replay-augment",
            "--eval-task-end",
            "--set",
            "partition=dirichlet:alpha=1,min_size=5",
            "--seed",
            "1",
        ]
    )
    assert axes == {
        "strategy": ["der:alpha=0.5+fedgp:gref_samples=all,gref_mode=eval", "fedavg"],
        "seed": [0, 1],
        "buffer_size": [100, 200],
        "lr": [0.05],
        "replay_augment": [False],
        "eval_every_round": [False],
        "partition": ["dirichlet:alpha=1,min_size=5"],
    }


def test_command_line_wins_over_the_file_per_key(tmp_path: Path) -> None:
    sweep_file = write(tmp_path / "s.yaml", SWEEP_YAML.format(out="runs/a"))
    spec = build_spec(
        str(sweep_file), ["--seed", "7", "--clients", "4", "--stream", "perm-digits"], "runs/b", 1
    )
    assert (spec.out, spec.jobs) == (Path("runs/b"), 1)
    # replaced keys keep their place in the product order, new ones come last
    assert list(spec.axes) == [
        "stream",
        "rounds_per_task",
        "strategy",
        "seed",
        "buffer_size",
        "clients",
    ]
    assert spec.axes["seed"] == [7] and spec.axes["stream"] == ["perm-digits"]
    assert len(expand(spec)) == 2


def test_point_names_are_stable_distinct_readable_and_hash_the_request(tmp_path: Path) -> None:
    args = ["--strategy", "der:alpha=0.5+fedgp", "--strategy", "fedavg", "--seed", "0"]
    args += ["--set", "lr=0.1,0.01", "--tasks", "2"]
    first = expand(build_spec(None, args, str(tmp_path)))
    again = expand(build_spec(None, args, str(tmp_path / "elsewhere")))
    assert [p.name for p in first] == [p.name for p in again]  # `out` is not in the hash
    assert len({p.name for p in first}) == len(first) == 4
    assert first[0].name == f"rot-digits_der-alpha-0.5-fedgp_s0_lr-0.1-{first[0].request_hash[:8]}"
    for p in first:
        assert p.request_hash == canonical_hash(p.request)
        assert p.name.endswith(p.request_hash[:8])
    sweep_file = write(tmp_path / "s.yaml", "base: {momentum: 0}\ngrid: {seed: [0]}\n")
    spelled = [
        expand(build_spec(str(sweep_file), a, str(tmp_path))) for a in ([], ["--momentum", "0.0"])
    ]
    assert spelled[0][0].request_hash == spelled[1][0].request_hash  # YAML 0 == CLI 0.0
    changed = expand(build_spec(None, [*args, "--clients", "5"], str(tmp_path)))
    assert {p.request_hash for p in changed}.isdisjoint(p.request_hash for p in first)


@pytest.mark.parametrize(
    ("args", "sweep_file", "fragment"),
    [
        (["--seed", "0", "--bogus", "1"], None, "unknown option 'bogus'"),
        (
            ["--seed", "0", "--seed", "-1"],
            None,
            "--seed must be an integer in [0, 2^63−1], got -1.",
        ),
        (["--set", "clients=4,0"], None, "--clients must be an integer in [1, 100000], got 0."),
        (["--tasks", "two"], None, "--tasks must be an integer in [1, 1000], got 'two'."),
        (["--seed", "0", "--jobs", "0"], None, "--jobs must be a positive integer, got 0"),
        ([], None, "the sweep grid is empty"),
        (["--seed", "0", "--seed", "0"], None, "lists 0 twice"),
        (["--set", "seed"], None, "must look like KEY=VALUE"),
        (["--set", "overwrite=true"], None, "'overwrite' cannot be a sweep option"),
        (["seed"], None, "unexpected argument 'seed'"),
        (["--tasks"], None, "--tasks needs a value"),
        ([], "base: {strem: rot-digits}\ngrid: {seed: [0]}\n", "unknown option 'strem'"),
        ([], "grid: {seed: []}\n", "grid key 'seed'"),
        ([], "grid: {}\n", "the sweep grid is empty"),
        ([], "jobs: many\ngrid: {seed: [0]}\n", "--jobs must be a positive integer"),
        ([], "runs: 3\n", "unknown key(s) runs"),
        ([], "grid: [seed]\n", "'grid' in sweep file"),
        ([], "base: {seed: 1}\ngrid: {seed: [0]}\n", "'seed' appears twice"),
        ([], "grid: {out: [x]}\n", "'out' cannot be a sweep option"),
        ([], "grid: {seed: [0\n", "is not valid YAML"),
        ([], "grid: {lr: [0.1, -1]}\n", "--lr must be a finite number in (0, 1000], got -1."),
    ],
)
def test_bad_input_exits_2_before_anything_is_written(
    tmp_path: Path, args: list[str], sweep_file: str | None, fragment: str
) -> None:
    out = tmp_path / "sweep"
    extra = ["--config", str(write(tmp_path / "s.yaml", sweep_file))] if sweep_file else []
    code, output = in_process("sweep", "--out", str(out), *extra, *args)
    assert code == 2, output
    assert fragment in " ".join(output.split())
    assert "Traceback" not in output
    assert not out.exists()


def test_missing_folder_and_missing_file_are_refused(tmp_path: Path) -> None:
    code, output = in_process("sweep", "--seed", "0")
    assert code == 2 and "the sweep needs a folder" in output
    code, output = in_process("sweep", "--config", str(tmp_path / "nope.yaml"), "--seed", "0")
    assert code == 2 and "does not exist" in output


def test_bad_names_in_one_point_are_refused_before_any_run(tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    args = ["--strategy", "fedavg", "--strategy", "der+fedgp+fedgp", "--seed", "0", *TINY]
    code, output = in_process("sweep", "--out", str(out), *args)
    assert code == 2, output
    assert "grid point 2 (strategy=der+fedgp+fedgp): " in output and "twice" in output
    assert not out.exists()
    code, output = in_process("sweep", "--out", str(out), "--stream", "mnist-rot", "--seed", "0")
    assert code == 2 and "unknown stream 'mnist-rot'" in output and not out.exists()


# --- threads and the skip rule ---------------------------------------------------------------


def test_threads_per_run_shares_the_cores_unless_the_grid_sets_them() -> None:
    assert threads_per_run(jobs=2, requested=None, cores=8) == 4
    assert threads_per_run(jobs=3, requested=None, cores=8) == 2
    assert threads_per_run(jobs=4, requested=None, cores=2) == 1
    assert threads_per_run(jobs=2, requested=3, cores=8) == 3
    assert threads_per_run(jobs=1, requested=None) == usable_cores() == len(os.sched_getaffinity(0))


def finished_point(folder: Path, request_hash: str) -> dict[str, object]:
    """A finished run in ``folder`` (records.csv, config.json and the summary they give) as a
    sweep point of ``request_hash``; returns its summary."""
    write_recorded_run(folder.parent, folder.name)
    summary = {**json.loads((folder / "summary.json").read_text()), "request_hash": request_hash}
    (folder / "summary.json").write_text(json.dumps(summary))
    return summary


def test_skip_rule_needs_a_finished_summary_with_the_same_request_hash(tmp_path: Path) -> None:
    run = tmp_path / "run"
    assert not ledger.is_done(run, "abc")
    summary = finished_point(run, "abc")
    assert ledger.is_done(run, "abc")
    for status, stored, done in [
        ("finished", "abc", True),
        ("diverged", "abc", True),
        ("failed", "abc", False),
        ("finished", "xyz", False),
    ]:
        (run / "summary.json").write_text(
            json.dumps({**summary, "status": status, "request_hash": stored})
        )
        assert ledger.is_done(run, "abc") is done, (status, stored)
    (run / "summary.json").write_text('{"status": "fini')  # torn by hand: not done
    assert not ledger.is_done(run, "abc")
    (run / "summary.json").write_text(json.dumps({**summary, "Acc_T": 99.0}))  # edited
    assert not ledger.is_done(run, "abc")
    (run / "summary.json").write_text(json.dumps(summary))
    (run / "records.csv").unlink()  # a summary without its records: not done
    assert not ledger.is_done(run, "abc")
    (run / "summary.json").unlink()
    assert not ledger.is_done(run, "abc")  # interrupted: no summary


def test_finished_points_are_skipped_and_others_are_not(tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    args = ["--seed", "0", "--seed", "1", *TINY]
    points = expand(build_spec(None, args, str(out)))
    for p in points:
        finished_point(out / p.name, p.request_hash)
    before = {p.name: (out / p.name / "summary.json").read_bytes() for p in points}
    code, output = in_process("sweep", "--out", str(out), *args)
    assert code == 0, output
    assert events(out, "skip") == {p.name: 1 for p in points}
    assert not events(out, "start")
    assert before == {p.name: (out / p.name / "summary.json").read_bytes() for p in points}
    manifest = json.loads((out / "sweep.json").read_text())
    assert [(e["name"], e["status"], e["skipped"]) for e in manifest["points"]] == [
        (p.name, "finished", True) for p in points
    ]
    # same folder, one hash changed: that point is not skipped (its finished summary is stale)
    (out / points[1].name / "summary.json").write_text(
        json.dumps({"status": "finished", "request_hash": "somethingelse"})
    )
    assert not ledger.is_done(out / points[1].name, points[1].request_hash)


# --- running points ---------------------------------------------------------------------------


def test_a_failing_run_is_recorded_and_does_not_stop_the_sweep(tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    nodata = tmp_path / "no-data"
    args = ["--stream", "rot-mnist", "--stream", "rot-digits", "--data-root", str(nodata)]
    args += ["--threads", "1", *TINY]
    code, output = in_process("sweep", "--out", str(out), *args)
    assert code == 1, output
    assert "1 finished, 1 failed" in " ".join(output.split())
    bad, good = expand(build_spec(None, args, str(out)))
    failed = json.loads((out / bad.name / "summary.json").read_text())
    assert failed["status"] == "failed" and failed["returncode"] == worker.EXIT_USER_ERROR
    assert str(nodata) in failed["message"] and "MNIST" in failed["message"]
    assert (failed["stream"], failed["strategy"], failed["seed"]) == ("rot-mnist", "fedavg", 0)
    assert failed["request_hash"] == bad.request_hash
    assert ledger.is_done(out / good.name, good.request_hash)
    # a rerun retries the failed point only
    code, _ = in_process("sweep", "--out", str(out), *args)
    assert code == 1
    assert events(out, "start") == {bad.name: 2, good.name: 1}
    assert events(out, "skip") == {good.name: 1}


def test_a_child_killed_by_a_signal_is_recorded_failed(tmp_path: Path) -> None:
    (point,) = expand(build_spec(None, ["--seed", "3"], str(tmp_path)))
    state = PointState(point, tmp_path, started=time.monotonic())
    state.log_path.parent.mkdir(parents=True)
    state.log_path.write_text("round 1\nround 2\n")
    settle(state, -signal.SIGKILL)
    summary = json.loads((state.run_dir / "summary.json").read_text())
    assert state.status == summary["status"] == "failed"
    assert summary["returncode"] == -9 and "round 2" in summary["message"]
    assert "killed by SIGKILL" in summary["message"]
    assert (summary["seed"], summary["request_hash"]) == (3, point.request_hash)


def test_a_point_locked_by_another_sweep_is_waited_for_not_left_busy(tmp_path: Path) -> None:
    """The other sweep lets go of the point without finishing it (e.g. it was killed): this
    sweep's child, which waited on the lock, runs the point; nothing ends up "busy"."""
    out = tmp_path / "sweep"
    args = ["--seed", "5", "--threads", "1", *TINY]
    (point,) = expand(build_spec(None, args, str(out)))
    lock = worker.try_lock(out / ledger.BOOKKEEPING / f"{point.name}.lock")
    assert lock is not None
    log = out / ledger.BOOKKEEPING / f"{point.name}.log"
    with lock:
        sweep = subprocess.Popen(sweep_command(out, *args), stdout=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 120
        while "waiting for it" not in (log.read_text() if log.exists() else ""):
            assert sweep.poll() is None and time.monotonic() < deadline, "no child waited"
            time.sleep(0.05)
    output, _ = sweep.communicate(timeout=300)
    assert sweep.returncode == 0, output
    assert ledger.is_done(out / point.name, point.request_hash)
    manifest = json.loads((out / ledger.MANIFEST).read_text())
    assert [p["status"] for p in manifest["points"]] == ["finished"]


def test_two_concurrent_sweeps_share_the_points_and_leave_none_busy(tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    args = ["--seed", "0", "--seed", "1", "--seed", "2", "--threads", "1", *TINY]
    sweeps = [
        subprocess.Popen(sweep_command(out, *args), stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    for sweep in sweeps:
        output, _ = sweep.communicate(timeout=300)
        assert sweep.returncode == 0, output
    manifest = json.loads((out / ledger.MANIFEST).read_text())
    assert {p["status"] for p in manifest["points"]} == {"finished"}
    finishes = events(out, "finish")
    assert sorted(finishes.values()) == [1, 1, 1]  # every point ran exactly once


def test_an_interrupted_run_directory_is_restarted_from_scratch(tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    args = ["--seed", "6", "--threads", "1", *TINY]
    (point,) = expand(build_spec(None, args, str(out)))
    partial = out / point.name
    partial.mkdir(parents=True)
    (partial / "config.json").write_text('{"config_hash": "from-an-older-attempt"}')
    (partial / "records.csv").write_text("round\n")
    (partial / ".records.csv.x1.tmp").write_text("half")
    code, output = in_process("sweep", "--out", str(out), *args)
    assert code == 0, output
    assert ledger.is_done(partial, point.request_hash)
    assert not (partial / ".records.csv.x1.tmp").exists()
    assert json.loads((partial / "config.json").read_text())["config"]["seed"] == 6


def test_jobs_two_runs_two_children_at_once_with_cores_over_two_threads(tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    sweep_file = write(
        tmp_path / "s.yaml",
        f"out: {out}\njobs: 2\nbase: {{tasks: 2, rounds-per-task: 1, train_size: 300, "
        "test_size: 100}\ngrid: {seed: [0, 1]}\n",
    )
    code, output = in_process("sweep", "--config", str(sweep_file))
    assert code == 0, output
    assert len(list(out.glob("*/summary.json"))) == 2
    log = ledger.read_log(out)
    starts = [r for r in log if r["event"] == "start"]
    finishes = [r for r in log if r["event"] == "finish"]
    assert len(starts) == len(finishes) == 2
    expected = max(1, len(os.sched_getaffinity(0)) // 2)
    assert [int(r["threads"]) for r in starts] == [expected, expected]
    # both started before either finished: the two runs overlapped in time
    assert max(r["time"] for r in starts) < min(r["time"] for r in finishes)
    assert len({r["child"] for r in starts}) == 2
    for run in out.glob("*/config.json"):
        assert json.loads(run.read_text())["config"]["threads"] == expected


# --- resumption after SIGKILL ----------------------------------------------------------------


def test_sigkilled_sweep_resumes_without_running_anything_twice(
    tmp_path: Path, strategy_sweep: tuple[Path, str]
) -> None:
    """Killed once two of the four points finished and the third started: the rerun skips
    the finished ones, restarts the interrupted one, runs the rest, and every point ends
    as in the uninterrupted sweep (``strategy_sweep``)."""
    args = STRATEGY_GRID
    out = tmp_path / "killed"
    with open(tmp_path / "first.out", "wb") as sink:
        first = subprocess.Popen(sweep_command(out, "--jobs", "1", *args), stdout=sink, stderr=sink)
    deadline = time.monotonic() + 120
    while first.poll() is None and time.monotonic() < deadline:
        if len(summaries(out)) >= 2 and sum(events(out, "start").values()) >= 3:
            break
        time.sleep(0.01)
    assert first.poll() is None, "the sweep ended before it could be killed"
    family = psutil.Process(first.pid).children(recursive=True)  # fork server, runs, tracker
    killed_at = time.time_ns()
    os.kill(first.pid, signal.SIGKILL)
    first.wait()
    _, alive = psutil.wait_procs(family, timeout=15)
    assert not [p for p in alive if _running(p)], "a child of the killed sweep is still alive"
    run_dirs = [d for d in out.iterdir() if d.is_dir() and d.name != ledger.BOOKKEEPING]
    run_files = [f for d in run_dirs for f in [d, *d.iterdir()]]
    written = [f for f in run_files if f.stat().st_mtime_ns > killed_at]
    assert not written, f"written into a run directory after the kill: {written}"
    log = ledger.read_log(out)
    started = {r["point"] for r in log if r["event"] == "start"}
    finished = {r["point"] for r in log if r["event"] == "finish"}
    running_then = started - finished  # the run the kill interrupted (jobs 1: at most one)
    assert len(finished) >= 2 and len(running_then) <= 1
    done = {name: (out / name / "summary.json") for name in summaries(out)}
    # the only possible extra summary: a run that completed in the instant the sweep died
    assert finished <= set(done) and set(done) - finished <= running_then
    before = {name: (path.read_bytes(), path.stat().st_mtime_ns) for name, path in done.items()}

    second = subprocess.run(
        sweep_command(out, "--jobs", "1", *args), capture_output=True, text=True, timeout=300
    )
    assert second.returncode == 0, second.stdout + second.stderr
    points = [p.name for p in expand(build_spec(None, args, str(out)))]
    starts, finishes = events(out, "start"), events(out, "finish")
    assert events(out, "skip") == {name: 1 for name in done}  # done runs skipped, not redone
    for name in points:  # every point completed exactly once over both sweeps
        assert finishes[name] + (name in set(done) - finished) == 1, name
    assert {n for n in points if starts[n] == 2} == running_then - set(done)  # restarted once
    assert all(starts[n] <= 2 for n in points)
    for name, (blob, mtime) in before.items():  # skipped runs were not touched
        path = out / name / "summary.json"
        assert path.read_bytes() == blob and path.stat().st_mtime_ns == mtime

    reference, _ = strategy_sweep
    resumed, uninterrupted = summaries(out), summaries(reference)
    assert sorted(resumed) == sorted(uninterrupted) == sorted(points)
    for name in points:
        assert comparable(resumed[name]) == comparable(uninterrupted[name]), name
        assert (out / name / "records.csv").read_bytes() == (
            reference / name / "records.csv"
        ).read_bytes()


def test_a_point_killed_mid_run_resumes_from_its_checkpoint(tmp_path: Path) -> None:
    args = ["--seed", "3", "--threads", "1", "--checkpoint-every", "1", "--tasks", "2"]
    # 24 rounds: killed at round 5, 19 rounds (seconds) are left to land the kill in
    args += ["--rounds-per-task", "12", "--train-size", "300", "--test-size", "100"]
    out = tmp_path / "killed"
    (point,) = expand(build_spec(None, args, str(out)))
    log = out / ledger.BOOKKEEPING / f"{point.name}.log"
    first = subprocess.Popen(sweep_command(out, *args), stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while "round 5/" not in (log.read_text() if log.exists() else ""):
        assert first.poll() is None and time.monotonic() < deadline, "the run ended too soon"
        time.sleep(0.01)
    os.kill(first.pid, signal.SIGKILL)
    first.wait()
    time.sleep(0.5)  # the run child dies with the sweep (watchdog)
    assert (out / point.name / "checkpoint.pt").exists()
    second = subprocess.run(sweep_command(out, *args), capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "resuming after round" in log.read_text()
    reference = tmp_path / "reference"
    code, output = in_process("sweep", "--out", str(reference), *args)
    assert code == 0, output
    name = point.name
    assert (out / name / "records.csv").read_bytes() == (
        reference / name / "records.csv"
    ).read_bytes()
    assert comparable(summaries(out)[name]) == comparable(summaries(reference)[name])


def _running(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_log_lines_parse_back(tmp_path: Path) -> None:
    ledger.append_log(tmp_path, "start", "a-1", child=12, threads=2)
    (row,) = ledger.read_log(tmp_path)
    assert (row["event"], row["point"], row["child"], row["threads"]) == ("start", "a-1", "12", "2")
    assert row["pid"] == os.getpid() and dt.datetime.fromisoformat(row["time"]).tzinfo
    with pytest.raises(UserError, match="holds files a run does not write"):
        (tmp_path / "mine").mkdir()
        (tmp_path / "mine" / "notes.txt").write_text("keep")
        ledger.check_run_dir(tmp_path / "mine")


def test_a_sweep_ends_with_the_leaderboard_of_its_runs(
    tmp_path: Path, strategy_sweep: tuple[Path, str]
) -> None:
    """The README's first command in miniature: strategies × 2 seeds → leaderboard files,
    one row per strategy averaging both seeds; --no-leaderboard writes none."""
    import pandas as pd

    out, output = strategy_sweep
    board_dir = out / "leaderboard"
    assert "leaderboard written to" in output and str(board_dir) in output.replace("\n", "")
    board = pd.read_csv(board_dir / "leaderboard.csv")
    assert sorted(board["strategy"]) == ["der", "fedavg"]
    assert board["n_seeds"].tolist() == [2, 2] and set(board["seeds"]) == {"0 1"}
    runs = summaries(out)
    fedavg = [s["Acc_T"] for s in runs.values() if s["strategy"] == "fedavg"]
    row = board[board["strategy"] == "fedavg"].iloc[0]
    assert row["Acc_T_mean"] == pytest.approx(sum(fedavg) / 2)
    assert (board_dir / "leaderboard.html").read_text().startswith("<!DOCTYPE html>")
    other = tmp_path / "quiet"
    code, _ = in_process("sweep", "--out", str(other), *TINY, "--threads", "1", "--no-leaderboard")
    assert code == 0 and not (other / "leaderboard").exists()


def test_a_points_name_survives_new_options_at_their_defaults() -> None:
    """A point's folder name is how a rerun finds its finished run and how ``reproduce``
    matches the shipped runs: options added later (``--arrivals``, ``--heads``) must not
    rename existing points while left at their defaults. The name below is the one this
    configuration had before those options existed (commit 193a67f)."""
    from cfl_bench.runner.config import RunConfig
    from cfl_bench.runner.run_names import point_name, point_request

    request = point_request(RunConfig(stream="rot-mnist", strategy="fedavg", seed=0))
    assert point_name(request, {}, canonical_hash(request)) == "rot-mnist_fedavg_s0-3a9718e5"
    heads = point_request(RunConfig(stream="rot-mnist", strategy="fedavg", heads="per-task"))
    assert heads["heads"] == "per-task" and canonical_hash(heads) != canonical_hash(request)
