"""Resumable runs: a run killed at any round end (SIGKILL, a crash, Ctrl-C) and rerun with
the same command ends with records.csv byte-identical to an uninterrupted run, and the same
summary metrics.

Kill points: right after a checkpoint at a task boundary, and in the middle of a task with
the round's records already appended past the last checkpoint (``--checkpoint-every 2``), so
the resume must cut records.csv back and produce those rows again.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

from cfl_bench.core.errors import UserError
from cfl_bench.engine import checkpoint
from cfl_bench.runner.config import make_config
from cfl_bench.runner.run import execute
from tests.golden_runs import VOLATILE

# rot-digits, 3 tasks × 2 rounds: task boundaries after rounds 2 and 4.
BASE: dict[str, Any] = {
    "tasks": 3,
    "rounds_per_task": 2,
    "clients": 4,
    "epochs": 1,
    "threads": 1,
    "checkpoint_every": 1,
}
KILLER = textwrap.dedent(
    """
    import json, os, signal, sys
    from cfl_bench.runner.config import make_config
    from cfl_bench.runner.run import execute
    values, k = json.loads(sys.argv[1]), int(sys.argv[2])

    def on_round(report):
        if report.round_index == k:
            os.kill(os.getpid(), signal.SIGKILL)

    execute(make_config(values), on_round)
    """
)


def options(strategy: str, out: Path, **extra: Any) -> dict[str, Any]:
    return {**BASE, "strategy": strategy, "out": str(out), **extra}


def metrics(run_dir: Path) -> dict[str, Any]:
    summary = json.loads((run_dir / "summary.json").read_text())
    return {k: v for k, v in summary.items() if k not in VOLATILE}


def uninterrupted(tmp_path: Path, strategy: str, **extra: Any) -> Path:
    out = tmp_path / "whole"
    execute(make_config(options(strategy, out, **extra)))
    return out


def kill_after(values: dict[str, Any], k: int) -> subprocess.CompletedProcess[str]:
    """Run in a fresh process that SIGKILLs itself right after round ``k``'s end."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, "-c", KILLER, json.dumps(values), str(k)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert result.returncode == -signal.SIGKILL, result.stderr
    return result


def assert_same_run(resumed: Path, whole: Path) -> None:
    assert (resumed / "records.csv").read_bytes() == (whole / "records.csv").read_bytes()
    assert metrics(resumed) == metrics(whole)
    assert not (resumed / "checkpoint.pt").exists()  # removed when the run finished


class CrashError(Exception):
    """Raised from a round hook to stop a run the way a crash would, after a checkpoint."""


def assert_resumes_after_crash(
    out: Path, strategy: str, whole: Path, crash_round: int = 3, **extra: Any
) -> None:
    """Run ``strategy`` into ``out``, crash it after round ``crash_round`` (in process: the
    component state a checkpoint must keep is what is being tested, not the signal), resume
    it, and check it equals the uninterrupted run ``whole``."""
    crash_and_resume(options(strategy, out, **extra), crash_round)
    assert_same_run(out, whole)


def crash_and_resume(values: dict[str, Any], crash_round: int) -> None:
    """Run ``values`` (a full configuration with its ``out``), crash it in process after
    round ``crash_round``, then run the same configuration again to resume it."""

    def crash(report: object) -> None:
        if getattr(report, "round_index", 0) == crash_round:
            raise CrashError

    with pytest.raises(CrashError):
        execute(make_config(values), crash)
    execute(make_config(values))


def assert_config_resumes_after_crash(
    values: dict[str, Any], tmp_path: Path, crash_round: int = 2
) -> None:
    """``values`` (any stream and model) run whole into ``tmp_path/whole`` and crashed after
    ``crash_round`` then resumed into ``tmp_path/crashed`` give the same run."""
    whole, crashed = tmp_path / "whole", tmp_path / "crashed"
    execute(make_config({**values, "out": str(whole)}))
    crash_and_resume({**values, "out": str(crashed)}, crash_round)
    assert_same_run(crashed, whole)


@pytest.mark.parametrize(
    "strategy",
    ["fedavg", "der+fedgp", "der+fedcurv+fedgp+ifa:generation=3", "fedavg+fedproj"],
)
@pytest.mark.parametrize(
    ("k", "every"),
    [(2, 1), (3, 2)],  # after a task boundary's checkpoint; mid-task, past the checkpoint
    ids=["task-boundary", "mid-task"],
)
def test_sigkilled_run_resumes_to_identical_records(
    tmp_path: Path, strategy: str, k: int, every: int
) -> None:
    whole = uninterrupted(tmp_path, strategy)
    values = options(strategy, tmp_path / "killed", checkpoint_every=every)
    kill_after(values, k)
    killed = tmp_path / "killed"
    assert not (killed / "summary.json").exists()
    rows = (killed / "records.csv").read_text().splitlines()
    assert {int(line.split(",")[0]) for line in rows[1:]} == set(range(k + 1))  # progress shown
    notes: list[str] = []
    execute(make_config(values), notify=notes.append)
    saved = k - (k % every)
    assert notes == [f"resuming after round {saved} of 6 (next: round {saved + 1})"]
    assert_same_run(killed, whole)


@pytest.mark.parametrize(
    ("strategy", "extra"),
    [
        ("agem:agem_fill=task_end+fedprox:mu=0.1", {}),
        ("derpp+fedntd", {}),
        ("er", {"participation": 0.6, "async_shift": 1}),
        ("ideal", {}),
        ("agem+fedgp:gref_samples=all,gref_mode=eval", {"eval_every_round": True}),
        ("der+fedgp", {"buffer_offer": "every_step", "momentum": 0.5}),
        ("derpp+fedgp", {"executor": "vectorized"}),  # stacked buffers restored in place
    ],
)
def test_every_component_resumes_after_a_crash(
    tmp_path: Path, strategy: str, extra: dict[str, Any]
) -> None:
    """A crash in-process leaves the same files as SIGKILL (rows are written through)."""
    whole = uninterrupted(tmp_path, strategy, **extra)
    values = options(strategy, tmp_path / "crashed", **extra)

    class CrashError(Exception):
        pass

    def crash(report: Any) -> None:
        if report.round_index == 3:
            raise CrashError

    with pytest.raises(CrashError):
        execute(make_config(values), crash)
    execute(make_config(values))
    assert_same_run(tmp_path / "crashed", whole)


def test_restart_starts_over_and_keep_checkpoint_keeps_the_last(tmp_path: Path) -> None:
    values = options("der+fedgp", tmp_path / "r")
    kill_after(values, 3)
    notes: list[str] = []
    execute(make_config({**values, "restart": True, "keep_checkpoint": True}), notify=notes.append)
    assert notes == []  # started from scratch
    state = checkpoint.load(tmp_path / "r" / "checkpoint.pt", torch.device("cpu"))
    assert state["federation"]["server"]["round_index"] == 6
    whole = uninterrupted(tmp_path, "der+fedgp")
    assert (tmp_path / "r" / "records.csv").read_bytes() == (whole / "records.csv").read_bytes()


def test_a_checkpoint_from_other_code_is_refused_with_the_fix(tmp_path: Path) -> None:
    values = options("fedavg", tmp_path / "r")
    kill_after(values, 2)
    path = tmp_path / "r" / "checkpoint.pt"
    state = checkpoint.load(path, torch.device("cpu"))
    state["fingerprint"]["git_commit"] = "0" * 40
    checkpoint.save(path, state)
    with pytest.raises(UserError, match=r"another git commit.*--restart"):
        execute(make_config(values))
    path.write_bytes(b"not a checkpoint")
    with pytest.raises(UserError, match=r"not a readable checkpoint.*--restart"):
        execute(make_config(values))
    execute(make_config({**values, "restart": True}))
    assert (tmp_path / "r" / "summary.json").exists()


def test_ctrl_c_exits_130_and_says_how_to_resume(tmp_path: Path) -> None:
    out = tmp_path / "r"
    cmd = [
        sys.executable,
        "-m",
        "cfl_bench.cli",
        "run",
        "--tasks",
        "3",
        "--rounds-per-task",
        "30",
        "--clients",
        "4",
        "--epochs",
        "1",
        "--threads",
        "1",
        "--checkpoint-every",
        "1",
        "--out",
        str(out),
    ]
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # A job started in the background by a shell without job control (as CI may run
        # pytest) inherits SIGINT ignored, and Python then keeps ignoring it: restore the
        # default so the child gets its KeyboardInterrupt as after a Ctrl-C on a terminal.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("round 3/"):
            proc.send_signal(signal.SIGINT)
            break
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "rerun the same command to resume" in lines[0], err
    assert "Traceback" not in err
    resumed = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming after round" in resumed.stdout


def test_a_second_process_in_the_same_out_is_refused(tmp_path: Path) -> None:
    import fcntl

    out = tmp_path / "r"
    out.mkdir()
    fd = os.open(out, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        with pytest.raises(UserError, match="another cfl-bench process is running"):
            execute(make_config(options("fedavg", out)))
    finally:
        os.close(fd)
    assert list(out.iterdir()) == []


def test_pack_round_trips_generators_sets_tuples_and_compacts_views(tmp_path: Path) -> None:
    gen = torch.Generator().manual_seed(7)
    big = torch.arange(1000.0)
    whole = checkpoint.save(tmp_path / "whole.pt", {"v": big})
    view = checkpoint.save(tmp_path / "view.pt", {"v": big[10:12]})
    assert view < whole - 3900  # the view did not drag its 4 kB storage along
    state = {"g": gen, "s": {3, 1}, "t": (big[:3], 2), "v": big[10:12], "n": None}
    checkpoint.save(tmp_path / "c.pt", state)
    back = checkpoint.load(tmp_path / "c.pt", torch.device("cpu"))
    assert back["s"] == {1, 3} and back["n"] is None
    assert torch.equal(back["t"][0], big[:3]) and back["t"][1] == 2
    assert torch.equal(torch.rand(3, generator=back["g"]), torch.rand(3, generator=gen))
