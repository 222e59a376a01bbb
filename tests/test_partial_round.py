"""Inside a round: an interrupt keeps the finished client updates (``partial-round/``), and
the rerun replays them in their clients' places, ending with records.csv byte-identical to
an uninterrupted run's (docs/protocols.md, "Partial rounds").

Small real runs on the embedded rot-digits stream (4 clients, 2 tasks × 2 rounds). The
tests switch the "only once a round has run 60 s" policy off with the tests' environment
variable (``partial_round.KEEP_EVERY_CLIENT``), which changes what is written, never results.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from cfl_bench.core.errors import RunInterruptedError
from cfl_bench.engine import checkpoint
from cfl_bench.engine.client_update import ClientJob, LocalTrainer
from cfl_bench.engine.executor import ResultSink
from cfl_bench.engine.kept_clients import KeptLoader, KeptUpdate
from cfl_bench.engine.progress import ClientsReport, RoundReport
from cfl_bench.runner import partial_round, round_keeper
from cfl_bench.runner.config import make_config
from cfl_bench.runner.round_keeper import interruption
from cfl_bench.runner.run import execute, resuming_line
from tests.helpers import digits_federation

CPU = torch.device("cpu")
BASE: dict[str, Any] = {"tasks": 2, "rounds_per_task": 2, "clients": 4, "threads": 1}
BASE |= {"train_size": 300, "test_size": 100, "checkpoint_every": 1}


@pytest.fixture
def keep_every_client(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(partial_round.KEEP_EVERY_CLIENT, "1")


class StopAt:
    """A progress display that presses Ctrl-C once ``done`` clients of round ``at`` ended."""

    def __init__(self, at: int, done: int) -> None:
        self.at, self.done = at, done

    def __call__(self, report: RoundReport) -> None:
        pass

    def clients_done(self, report: ClientsReport) -> None:
        if (report.round_index, report.done) == (self.at, self.done):
            raise KeyboardInterrupt


def values(out: Path, **extra: Any) -> dict[str, Any]:
    return {**BASE, "out": str(out), **extra}


def whole_records(tmp_path: Path, **extra: Any) -> bytes:
    out = tmp_path / "whole"
    execute(make_config(values(out, **extra)))
    return (out / "records.csv").read_bytes()


def interrupted(out: Path, at: int, done: int, **extra: Any) -> str:
    with pytest.raises(RunInterruptedError) as caught:
        execute(make_config(values(out, **extra)), StopAt(at, done))
    return str(caught.value)


def resumed(
    out: Path, monkeypatch: pytest.MonkeyPatch, **extra: Any
) -> tuple[list[str], list[tuple[int, int]]]:
    """Rerun into ``out``: what it said, and the (round, client) updates it trained."""
    trained: list[tuple[int, int]] = []
    real = LocalTrainer.update

    def update(self: LocalTrainer, job: Any) -> Any:
        trained.append((job.broadcast.round_index, job.client.index))
        return real(self, job)

    monkeypatch.setattr(LocalTrainer, "update", update)
    said: list[str] = []
    execute(make_config(values(out, **extra)), notify=said.append)
    monkeypatch.setattr(LocalTrainer, "update", real)
    return said, trained


def kept_files(out: Path) -> list[str]:
    folder = out / "partial-round"
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


# --- in-process interrupts --------------------------------------------------------------------


@pytest.mark.usefixtures("keep_every_client")
def test_a_ctrl_c_in_round_3_keeps_its_finished_clients_and_the_rerun_matches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    want = whole_records(tmp_path, strategy="der+fedgp")
    out = tmp_path / "cut"
    line = interrupted(out, 3, 2, strategy="der+fedgp")
    assert line == (
        "interrupted at round 3 of 4 (2 of 4 clients done and kept); kept rounds 1-2 "
        "(checkpoint); rerun the same command to resume"
    )
    assert kept_files(out) == ["client-0.pt", "client-1.pt"]
    said, trained = resumed(out, monkeypatch, strategy="der+fedgp")
    assert said == ["resuming round 3 of 4 with 2 of 4 clients done"]
    # Round 3 trains only the 4 − 2 clients not kept; round 4 all of them.
    assert trained == [(3, 2), (3, 3), (4, 0), (4, 1), (4, 2), (4, 3)]
    assert (out / "records.csv").read_bytes() == want
    assert kept_files(out) == [] and not (out / "partial-round").exists()


@pytest.mark.usefixtures("keep_every_client")
def test_round_1_keeps_its_clients_without_a_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    want = whole_records(tmp_path)
    out = tmp_path / "cut"
    line = interrupted(out, 1, 3)
    assert line == (
        "interrupted at round 1 of 4 (3 of 4 clients done and kept); no round ended yet; "
        "rerun the same command to resume"
    )
    assert not (out / "checkpoint.pt").exists()
    assert kept_files(out) == ["client-0.pt", "client-1.pt", "client-2.pt"]
    said, trained = resumed(out, monkeypatch)
    assert said == ["resuming round 1 of 4 with 3 of 4 clients done"]
    assert trained[:2] == [(1, 3), (2, 0)] and len(trained) == 1 + 3 * 4
    assert (out / "records.csv").read_bytes() == want


@pytest.mark.usefixtures("keep_every_client")
def test_a_replacement_stopped_in_round_1_keeps_its_clients_and_the_old_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # --overwrite writes into .replacement/ (core/run_dir.py): with kept clients and no
    # checkpoint yet, that folder must survive the interrupt and resume, the old run stay.
    want = whole_records(tmp_path, seed=1)
    out = tmp_path / "r"
    execute(make_config(values(out)))
    old = (out / "records.csv").read_bytes()
    interrupted(out, 1, 2, seed=1, overwrite=True)
    assert kept_files(out / ".replacement") == ["client-0.pt", "client-1.pt"]
    assert (out / "records.csv").read_bytes() == old
    said, _ = resumed(out, monkeypatch, seed=1, overwrite=True)
    assert said == ["resuming round 1 of 4 with 2 of 4 clients done"]
    assert (out / "records.csv").read_bytes() == want
    assert not (out / ".replacement").exists()


@pytest.mark.usefixtures("keep_every_client")
def test_damaged_and_foreign_kept_files_are_ignored_with_a_note(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    want = whole_records(tmp_path, strategy="derpp+fedntd")
    out = tmp_path / "cut"
    interrupted(out, 3, 3, strategy="derpp+fedntd")
    folder = out / "partial-round"
    (folder / "client-0.pt").write_bytes(b"half a file")
    foreign = torch.load(folder / "client-2.pt", weights_only=True)
    foreign["state"]["tag"]["config_hash"] = "0123abcd"
    torch.save(foreign, folder / "client-2.pt")
    said, trained = resumed(out, monkeypatch, strategy="derpp+fedntd")
    assert said == [
        "note: ignored partial-round/client-0.pt (not readable); partial-round/client-2.pt "
        "(written with another config hash); those clients train again in round 3.",
        "resuming round 3 of 4 with 1 of 4 clients done",
    ]
    # Client 1 is replayed between clients 0 and 2, which train: the order is the job order.
    assert [c for r, c in trained if r == 3] == [0, 2, 3]
    assert (out / "records.csv").read_bytes() == want


@pytest.mark.usefixtures("keep_every_client")
def test_a_round_that_does_not_start_at_a_checkpoint_keeps_nothing(tmp_path: Path) -> None:
    # Checkpoints after rounds 2 and 4: round 4's clients would replay on round 3's end,
    # which no checkpoint holds, so none is written and the round runs again.
    out = tmp_path / "cut"
    line = interrupted(out, 4, 2, checkpoint_every=2)
    assert line.startswith(
        "interrupted at round 4 of 4 (2 of 4 clients done, the round runs again); kept the "
        "checkpoint of round 2 (round 3 run again)"
    )
    assert kept_files(out) == []


@pytest.mark.usefixtures("keep_every_client")
def test_the_vectorized_executor_keeps_no_clients(tmp_path: Path) -> None:
    out = tmp_path / "cut"
    line = interrupted(out, 3, 2, executor="vectorized", clients_per_chunk=2)
    assert "(2 of 4 clients done, the round runs again)" in line
    assert kept_files(out) == []


def test_a_short_round_writes_nothing_by_default(tmp_path: Path) -> None:
    # Without the tests' switch a round writes only once it has run KEEP_AFTER_S (60 s).
    out = tmp_path / "cut"
    line = interrupted(out, 3, 3)
    assert "(3 of 4 clients done, the round runs again)" in line
    assert kept_files(out) == []


# --- the engine replays exactly: BatchNorm's step counter and dropout -----------------------


class NormedMLP(nn.Module):
    """BatchNorm with a cumulative average (momentum None): its statistics depend on
    num_batches_tracked, which runs on across clients; dropout draws from torch's default
    generator."""

    def __init__(self, features: int, classes: int) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Flatten(),
            nn.Linear(features, 16),
            nn.BatchNorm1d(16, momentum=None),
            nn.ReLU(),
            nn.Dropout(0.3),
            nn.Linear(16, classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def normed(name: str, shape: tuple[int, ...], classes: int) -> nn.Module:
    return NormedMLP(int(torch.tensor(shape).prod()), classes)


class Kept:
    """An in-memory RoundWork keeping the updates of ``clients`` in round ``at``."""

    def __init__(self, folder: Path, at: int, clients: set[int]) -> None:
        self.folder, self.at, self.clients = folder, at, clients
        self.round = 0
        self.paths: dict[int, Path] = {}

    def opened(self, round_index: int) -> dict[int, KeptLoader]:
        self.round = round_index
        if round_index != self.at:
            return {}
        return {k: (lambda p=p: checkpoint.load(p, CPU)) for k, p in self.paths.items()}

    def finished(self, client: int, keep: Any) -> None:
        if self.round == self.at and client in self.clients:
            self.paths[client] = self.folder / f"{client}.pt"
            update: KeptUpdate = keep()
            checkpoint.save(self.paths[client], update)


def test_replayed_clients_between_trained_ones_give_the_same_records(tmp_path: Path) -> None:
    options: dict[str, Any] = {"train_size": 200, "test_size": 60, "module_factory": normed}
    want = digits_federation("der", **options).run().records
    start: dict[str, Any] = {}
    first = digits_federation("der", **options)
    first.round_work = kept = Kept(tmp_path, 3, {0, 2})

    def at_round_end(out: Any) -> None:
        if first.server.round_index == 2:
            checkpoint.save(tmp_path / "start.pt", first.state_dict())
            start["records"] = len(out.records)

    def stop(report: ClientsReport) -> None:
        if (report.round_index, report.done) == (3, 3):
            raise KeyboardInterrupt

    first.on_client = stop
    with pytest.raises(KeyboardInterrupt):
        first.run(on_round_end=at_round_end)
    assert sorted(kept.paths) == [0, 2]
    again = digits_federation("der", **options)
    again.load_state_dict(checkpoint.load(tmp_path / "start.pt", CPU))
    again.round_work = kept
    trained: list[int] = []
    real = again.executor.train

    def train(jobs: Sequence[ClientJob], sink: ResultSink) -> None:
        trained.extend(job.client.index for job in jobs if job.broadcast.round_index == 3)
        real(jobs, sink)

    again.executor.train = train  # type: ignore[method-assign]
    got = again.run().records
    assert trained == [1, 3]  # clients 0 and 2 replayed, in their places
    assert got == want[start["records"] :]


# --- the lines ----------------------------------------------------------------------------------


def test_the_lines_say_what_was_kept_inside_the_round() -> None:
    assert str(interruption(6, 2, 2, (4, 10), 4)) == (
        "interrupted at round 3 of 6 (4 of 10 clients done and kept); kept rounds 1-2 "
        "(checkpoint); rerun the same command to resume"
    )
    assert str(interruption(6, 2, 2, (4, 10), 3)).startswith(
        "interrupted at round 3 of 6 (4 of 10 clients done, 3 of them kept); kept rounds 1-2"
    )
    assert resuming_line(2, 6, 4, 10) == "resuming round 3 of 6 with 4 of 10 clients done"
    assert resuming_line(2, 6) == "resuming after round 2 of 6 (next: round 3)"


def test_a_long_round_is_followed_by_a_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under the default policy a round of KEEP_AFTER_S or more is checkpointed even when
    the write-time ratio says not yet, so the next long round can keep its clients."""
    from cfl_bench.core.run_dir import RunDirectory

    fed = digits_federation("fedavg", train_size=100, test_size=40)
    keeper = round_keeper.RoundKeeper(
        RunDirectory(tmp_path), fed, every=None, fingerprint={}, keep_last=False
    )
    keeper.checkpoints_written, keeper._last_write = 1, 1e9
    keeper._since_write = keeper._round_start = time.perf_counter()
    assert not keeper._due()
    keeper._round_start -= partial_round.KEEP_AFTER_S
    assert keeper._due()
    fed.keeps_clients = False  # nothing to keep: the ratio alone decides
    assert not keeper._due()


# --- real processes -------------------------------------------------------------------------

ARGV = ["run", "--tasks", "2", "--rounds-per-task", "1", "--clients", "4", "--threads", "1"]
ARGV += ["--train-size", "300", "--test-size", "100", "--checkpoint-every", "1"]
ARGV += ["--epochs", "40"]  # each client update takes a good fraction of a second


def cli(argv: list[str], **popen: Any) -> subprocess.Popen[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", partial_round.KEEP_EVERY_CLIENT: "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "cfl_bench.cli", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        **popen,
    )


def stop_once_kept(proc: subprocess.Popen[str], out: Path, sig: int, clients: int) -> None:
    """Send ``sig`` as soon as ``clients`` updates of round 2 are kept (after the line of
    round 1, whose own kept files are gone by then)."""
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("round 1/"):
            break
    else:
        pytest.fail("the run ended before round 1's line")
    deadline = time.monotonic() + 240
    while len(list((out / "partial-round").glob("client-*.pt"))) < clients:
        assert proc.poll() is None, proc.communicate()[1]
        assert time.monotonic() < deadline, "no kept client within 4 minutes"
        time.sleep(0.005)
    proc.send_signal(sig)


def finish(argv: list[str]) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "cfl_bench.cli", *argv], capture_output=True, text=True, env=env
    )
    assert done.returncode == 0, done.stderr
    return done


def test_kill_9_inside_a_round_resumes_from_the_kept_clients(tmp_path: Path) -> None:
    whole = tmp_path / "whole"
    finish([*ARGV, "--out", str(whole)])
    out = tmp_path / "cut"
    proc = cli([*ARGV, "--out", str(out)])
    stop_once_kept(proc, out, signal.SIGKILL, 1)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    kept = len(list((out / "partial-round").glob("client-*.pt")))  # not a killed write's temp
    assert kept >= 1 and not (out / "summary.json").exists()
    rerun = finish([*ARGV, "--out", str(out)])
    assert f"resuming round 2 of 2 with {kept} of 4 clients done" in rerun.stdout
    assert (out / "records.csv").read_bytes() == (whole / "records.csv").read_bytes()


def test_sigint_inside_a_round_says_its_clients_were_kept(tmp_path: Path) -> None:
    out = tmp_path / "cut"
    # A background job may inherit SIGINT ignored (see test_resume): restore the default.
    proc = cli(
        [*ARGV, "--out", str(out)],
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    stop_once_kept(proc, out, signal.SIGINT, 2)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("interrupted at round 2 of 2 (")
    assert (
        "clients done and kept); kept round 1 (checkpoint); rerun the same command to resume"
        in (lines[0])
    )
    assert len(list((out / "partial-round").glob("client-*.pt"))) >= 2


def test_the_disk_check_counts_a_round_of_kept_clients(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Beside two checkpoints, the disk must hold a round's kept clients: per participant
    a replay buffer and two models (an upload and its payloads), as for a checkpoint."""
    from cfl_bench.core.errors import UserError
    from cfl_bench.runner import plan as planning

    plan = planning.plan_run(make_config(values(tmp_path / "r", strategy="der")))
    model_bytes = 4 * sum(p.numel() for p in plan.model.parameters())
    buffer = (plan.config.buffer_size + 1) * (4 * 64 + 4 * 10 + 16)  # 1×8×8 digits, 10 classes
    two = 2 * (4 * (buffer + 2 * model_bytes) + 8 * model_bytes + 2**20)
    kept = 4 * (buffer + 2 * model_bytes)
    monkeypatch.setattr(planning, "free_bytes", lambda folder: two + kept)
    planning.check_disk(plan, tmp_path)
    monkeypatch.setattr(planning, "free_bytes", lambda folder: two + kept - 1)
    with pytest.raises(UserError, match="free but the run needs about"):
        planning.check_disk(plan, tmp_path)
    vectorized = planning.plan_run(
        make_config(values(tmp_path / "v", strategy="der", executor="vectorized"))
    )
    planning.check_disk(vectorized, tmp_path)  # it keeps no clients: two checkpoints fit
