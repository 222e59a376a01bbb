"""Ctrl-C and SIGTERM everywhere: `run` (also before round 1), `sweep` and `carla demo` end
with exit code 130 and one line saying what was kept and how to resume, leave no process
behind, and the same command resumes. The interrupted command is a process of its own (a
real signal); its rerun, which nothing interrupts, runs in this process (``in_process``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
from typer.testing import CliRunner

from cfl_bench.cli import app
from cfl_bench.runner.round_keeper import RoundKeeper, interruption
from cfl_bench.sweeps import ledger
from tests.conftest import requires_shared_data
from tests.sweep_helpers import summaries, sweep_command

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
# 16 rounds: a SIGTERM at round 3 lands with 13 rounds (seconds) still to run
RUN = ["--tasks", "2", "--rounds-per-task", "8", "--clients", "4", "--threads", "1"]
RUN += ["--train-size", "300", "--test-size", "100", "--checkpoint-every", "1"]


def start(argv: list[str]) -> subprocess.Popen[str]:
    """``cfl-bench ARGV`` in a child whose stdout we read line by line."""
    return subprocess.Popen(
        [sys.executable, "-m", "cfl_bench.cli", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
    )


def signal_at(proc: subprocess.Popen[str], ready: Callable[[str], bool], sig: int) -> str:
    """Send ``sig`` once a stdout line satisfies ``ready``; returns the child's stderr."""
    assert proc.stdout is not None
    for line in proc.stdout:
        if ready(line):
            proc.send_signal(sig)
            break
    else:
        pytest.fail("the command ended before the line to interrupt it at")
    _, err = proc.communicate(timeout=120)
    return err


def assert_one_line(code: int | None, err: str, *fragments: str) -> str:
    assert code == 130, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def wait_for(condition: Callable[[], bool], proc: subprocess.Popen[str], what: str) -> None:
    deadline = time.monotonic() + 120
    while not condition():
        assert proc.poll() is None, f"the command ended before {what}"
        assert time.monotonic() < deadline, f"no {what} within 2 minutes"
        time.sleep(0.02)


# --- the line itself ----------------------------------------------------------------------


def test_the_line_says_what_the_checkpoint_keeps() -> None:
    assert str(interruption(40, 0, 0)) == (
        "interrupted at round 1 of 40; kept nothing (no checkpoint yet); rerun the same "
        "command to start again"
    )
    assert str(interruption(40, 3, 3)) == (
        "interrupted at round 4 of 40; kept rounds 1-3 (checkpoint); rerun the same command "
        "to resume"
    )
    assert "kept the checkpoint of round 3 (round 4 run again)" in str(interruption(40, 4, 3))
    assert "(rounds 4-7 run again)" in str(interruption(40, 7, 3))
    assert str(interruption(40, 3, 3, (4, 10))).startswith(
        "interrupted at round 4 of 40 (4 of 10 clients done, the round runs again); kept "
        "rounds 1-3 (checkpoint)"
    )


def test_an_interrupt_inside_a_round_names_that_round_and_its_clients(tmp_path: Path) -> None:
    from cfl_bench.core.errors import RunInterruptedError
    from cfl_bench.engine.progress import ClientsReport, RoundReport
    from cfl_bench.runner.config import make_config
    from cfl_bench.runner.run import execute

    class Display:
        def __call__(self, report: RoundReport) -> None:
            pass

        def clients_done(self, report: ClientsReport) -> None:
            if (report.round_index, report.done) == (3, 2):
                raise KeyboardInterrupt

    values = {"tasks": 2, "rounds_per_task": 2, "clients": 4, "threads": 1}
    values |= {"train_size": 300, "test_size": 100, "checkpoint_every": 1, "out": str(tmp_path)}
    with pytest.raises(RunInterruptedError) as caught:
        execute(make_config(values), Display())
    assert str(caught.value) == (
        "interrupted at round 3 of 4 (2 of 4 clients done, the round runs again); kept rounds "
        "1-2 (checkpoint); rerun the same command to resume"
    )


# --- `run` ----------------------------------------------------------------------------------


def in_process(*args: str) -> Any:
    return CliRunner().invoke(app, list(args))


def test_run_interrupted_while_loading_data_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import cfl_bench.runner.plan

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(cfl_bench.runner.plan, "build_stream", interrupted)
    result = in_process("run", *RUN, "--out", str(tmp_path / "r"))
    assert result.exit_code == 130
    assert result.output.strip().splitlines() == [
        "interrupted before round 1 (loading the data and the model); nothing was written; "
        "rerun the same command to start (or resume) the run"
    ]
    assert not (tmp_path / "r").exists()


def test_run_interrupted_in_the_cost_probe_keeps_nothing_then_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import cfl_bench.runner.cost

    real = cfl_bench.runner.cost.announce

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(cfl_bench.runner.cost, "announce", interrupted)
    out = tmp_path / "r"
    result = in_process("run", *RUN, "--out", str(out))
    assert result.exit_code == 130
    assert "interrupted at round 1 of 16; kept nothing" in result.output
    assert list(out.iterdir()) == []  # nothing half-written
    monkeypatch.setattr(cfl_bench.runner.cost, "announce", real)
    result = in_process("run", *RUN, "--out", str(out))
    assert result.exit_code == 0, result.output
    assert json.loads((out / "summary.json").read_text())["status"] == "finished"


def test_run_interrupted_while_resuming_keeps_its_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.test_resume import kill_after

    out = tmp_path / "r"
    values = {"tasks": 2, "rounds_per_task": 2, "clients": 2, "threads": 1}
    values |= {"train_size": 300, "test_size": 100, "checkpoint_every": 1, "out": str(out)}
    kill_after(values, 2)
    before = (out / "checkpoint.pt").read_bytes()

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(RoundKeeper, "resume", interrupted)
    argv = ["run", "--tasks", "2", "--rounds-per-task", "2", "--clients", "2", "--threads", "1"]
    argv += ["--train-size", "300", "--test-size", "100", "--checkpoint-every", "1"]
    result = in_process(*argv, "--out", str(out))
    assert result.exit_code == 130
    assert "interrupted while resuming" in result.output
    assert "kept the checkpoint; rerun the same command to resume" in result.output
    assert (out / "checkpoint.pt").read_bytes() == before


def test_sigterm_before_round_1_exits_130_in_one_line_and_the_rerun_runs(
    tmp_path: Path,
) -> None:
    out = tmp_path / "r"
    # 100 local epochs: round 1 takes seconds, so the signal lands before it ends.
    argv = ["run", "--tasks", "2", "--rounds-per-task", "1", "--clients", "4", "--threads", "1"]
    argv += ["--train-size", "300", "--test-size", "100", "--epochs", "100", "--out", str(out)]
    proc = start(argv)
    # config.json is written once the directory is claimed and the federation built: waiting
    # for the directory alone raced the claim itself (CI, stop 45), whose interruption is
    # the "before round 1" line of the test above.
    wait_for((out / "config.json").exists, proc, "the run's config.json")
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert_one_line(proc.returncode, err, "interrupted at round 1 of 2; kept nothing")
    assert not (out / "checkpoint.pt").exists() and not (out / "summary.json").exists()
    rerun = in_process(*argv)
    assert rerun.exit_code == 0, rerun.output
    assert "resuming" not in rerun.output
    assert json.loads((out / "summary.json").read_text())["status"] == "finished"


def test_sigterm_mid_run_keeps_the_checkpoint_and_the_rerun_resumes(tmp_path: Path) -> None:
    out = tmp_path / "r"
    argv = ["run", *RUN, "--out", str(out)]
    proc = start(argv)
    err = signal_at(proc, lambda line: line.startswith("round 3/"), signal.SIGTERM)
    assert_one_line(proc.returncode, err, "kept", "rerun the same command to resume")
    rerun = in_process(*argv)
    assert rerun.exit_code == 0, rerun.output
    assert "resuming after round" in rerun.output


# --- `sweep` --------------------------------------------------------------------------------

SWEEP = ["--seed", "0", "--seed", "1", "--threads", "1", "--checkpoint-every", "1", "--tasks", "2"]
SWEEP += ["--rounds-per-task", "6", "--train-size", "300", "--test-size", "100"]


def round_logged(out: Path, text: str) -> bool:
    folder = out / ledger.BOOKKEEPING
    logs = folder.glob("*.log") if folder.is_dir() else []
    return any(text in log.read_text() for log in logs)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_sweep_stops_in_one_line_leaves_no_process_and_resumes(
    tmp_path: Path, sig: signal.Signals
) -> None:
    out = tmp_path / "s"
    proc = subprocess.Popen(
        sweep_command(out, *SWEEP), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=ENV,
        # A background job may inherit SIGINT ignored (see test_resume): restore the default.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    wait_for(lambda: round_logged(out, "round 3/"), proc, "round 3 of the first point")
    family = psutil.Process(proc.pid).children(recursive=True)  # fork server, run child
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    line = assert_one_line(proc.returncode, err, "sweep interrupted: 0 of 2 runs done")
    assert "rerun the same sweep command to resume" in line
    assert "stopped rot-digits_fedavg_s0-" in line and "not started rot-digits_fedavg_s1-" in line
    _, alive = psutil.wait_procs(family, timeout=15)
    assert not [p for p in alive if _running(p)], "a process of the sweep is still alive"
    manifest = json.loads((out / "sweep.json").read_text())
    assert [p["status"] for p in manifest["points"]] == ["interrupted", "pending"]

    rerun = in_process("sweep", "--out", str(out), *SWEEP, "--no-leaderboard")
    assert rerun.exit_code == 0, rerun.output
    assert round_logged(out, "resuming after round")
    assert [s["status"] for s in summaries(out).values()] == ["finished"] * 2


def _running(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


# --- `carla demo` ---------------------------------------------------------------------------


@pytest.mark.shared_data
def test_carla_demo_sigterm_keeps_its_rounds_and_resumes(tmp_path: Path) -> None:
    """SIGTERM in round 2 keeps round 1; the same command resumes and writes the demo's
    run and page (what the page shows is checked on the resumed run, so one demo serves
    both checks)."""
    root = requires_shared_data()
    out = tmp_path / "demo"
    argv = ["carla", "demo", "--source", "replay", "--data-root", str(root), "--clients", "2"]
    argv += ["--rounds", "2", "--shift-round", "1", "--strategy", "fedavg", "--epochs", "1"]
    argv += ["--batch-size", "8", "--threads", "1", "--out", str(out)]
    proc = start(argv)
    err = signal_at(proc, lambda line: line.startswith("round 1/"), signal.SIGTERM)
    line = assert_one_line(proc.returncode, err, "interrupted at round 2 of 2", "kept round 1")
    assert line.endswith("rerun the same command to resume")
    assert not (out / "summary.json").exists() and (out / "checkpoint.pt").exists()
    rerun = in_process(*argv)
    assert rerun.exit_code == 0, rerun.output
    assert "resuming after round" in rerun.output
    assert "round 2/2" in rerun.output and "mAP50" in rerun.output  # the plain live view
    page = (out / "carla_demo.html").read_text(encoding="utf-8")
    assert page.count("<svg") == 1 and page.count("data:image/png;base64,") == 3
    for domain in ("urban (Town01–03)", "highway (Town04)", "Town05 (test town)"):
        assert domain in page
    config = json.loads((out / "config.json").read_text())["config"]
    assert (config["stream"], config["rounds_per_task"], config["lead_rounds"]) == (
        "carla-highway", 1, 0,
    )  # fmt: skip
    assert (out / "model.pt").exists()


def test_run_interrupted_inside_flower_says_how_to_resume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("flwr")
    import cfl_bench.flower.launch

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(cfl_bench.flower.launch, "run_in_flower", interrupted)
    result = in_process("run", *RUN, "--executor", "flower", "--out", str(tmp_path / "r"))
    assert result.exit_code == 130
    *said, line = result.output.strip().splitlines()
    assert said == ["starting a Flower simulation (Flower and Ray take about a minute to start)"]
    assert line.startswith("interrupted during the Flower simulation")
    assert line.endswith("rerun the same command to resume")
