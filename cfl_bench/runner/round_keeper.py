"""What a run keeps on disk as it goes: each round's records, and checkpoints.

Why one object: a checkpoint is only consistent together with the record files. At a round
end the keeper appends that round's rows, and when a checkpoint is due it first flushes the
record files to disk, then writes the federation's state plus the files' byte lengths
atomically. Resuming loads the state and cuts the files back to those lengths, so the rows
written after the checkpoint are produced again, identically.

Checkpoint policy (``--checkpoint-every``): ``k`` rounds, ``0`` never, or by default every
round while a checkpoint costs little: after each write the keeper waits until the run has
spent ``AUTO_RATIO`` times the write's duration on rounds before writing the next, which
bounds the overhead at about 1 / AUTO_RATIO (5 %). The policy never changes results.

Inside a round the keeper also keeps the finished client updates (``runner.partial_round``:
``partial-round/``, one file per client), as the engine's ``RoundWork``. They replay only on
top of the state the round started from, so a round writes them only when it starts at the
last checkpoint (or in round 1, at the freshly built federation); by default a round that
ran ``KEEP_AFTER_S`` or longer is always followed by a checkpoint, so the next long round
starts at one. The folder goes at every round end, after the checkpoint.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from cfl_bench.core.errors import RunInterruptedError
from cfl_bench.core.records import RecordLog, Row, plain_rows
from cfl_bench.core.run_dir import PARTIAL_ROUND, RunDirectory
from cfl_bench.engine import checkpoint
from cfl_bench.engine.kept_clients import KeptLoader, KeptUpdate
from cfl_bench.engine.loop import Federation, RunOutcome
from cfl_bench.runner.partial_round import KEEP_AFTER_S, PartialRound

AUTO_RATIO = 20.0

__all__ = ["RoundKeeper", "RunInterruptedError", "interruption"]


class RoundKeeper:
    def __init__(
        self,
        run_dir: RunDirectory,
        federation: Federation,
        *,
        every: int | None,
        fingerprint: dict[str, Any],
        keep_last: bool,
        observers: Sequence[Callable[[list[Row]], None]] = (),
    ) -> None:
        self.run_dir = run_dir
        # Called with each round's records as plain rows once they are on disk (trackers).
        self.observers = list(observers)
        self.federation = federation
        self.every = every
        self.fingerprint = fingerprint
        self.keep_last = keep_last
        self.log = RecordLog(run_dir.path)
        self.flushed = (0, 0)  # rows of the outcome already written: records, costs
        self.saved_round = 0  # round of the last checkpoint (0: none)
        self.ended_round = 0  # the last round that ended (its rows flushed)
        self.checkpoint_bytes = 0
        self.checkpoint_seconds = 0.0  # total time spent writing checkpoints
        self.checkpoints_written = 0
        self.elapsed_before = 0.0  # run time of earlier processes (resumed runs)
        self._last_write = 0.0
        self._session_start = time.perf_counter()
        self._since_write = self._session_start
        self._round_start = self._session_start
        self.partial = PartialRound(run_dir.path / PARTIAL_ROUND, fingerprint, federation.model)

    # -- start --------------------------------------------------------------------------------
    def start_fresh(self) -> None:
        self.log.start()

    def resume(
        self, device: torch.device, notify: Callable[[str], None], *, adopt_threads: bool = False
    ) -> None:
        """Load the directory's checkpoint into the federation, and check the client updates
        kept inside the round that comes next; ValueError if the checkpoint is unusable.

        ``adopt_threads`` (no ``--threads`` given): the thread count was chosen automatically
        from the machine's load, which may have changed since the checkpoint; records are
        byte-identical only for the same count, so the checkpoint's count is used instead.
        Without a checkpoint the run was stopped inside round 1 with client updates kept:
        the federation as built is that round's start, and the record files start afresh.
        """
        if not self.run_dir.checkpoint_path.is_file():
            self.log.start()
            if self.federation.keeps_clients and self.partial.load(1, notify):
                self.match_threads(self.partial.loaded_threads, notify, adopt_threads)
            return
        state = checkpoint.load(self.run_dir.checkpoint_path, device)
        saved = state.get("fingerprint", {})
        for key in ("config_hash", "git_commit", "torch"):
            if saved.get(key) != self.fingerprint.get(key):
                raise ValueError(
                    f"the checkpoint was written with another {key.replace('_', ' ')} "
                    f"({saved.get(key)} vs {self.fingerprint.get(key)})"
                )
        self.match_threads(saved.get("threads"), notify, adopt_threads)
        self.log.truncate(state["records"])
        self.federation.load_state_dict(state["federation"])
        self.elapsed_before = float(state["elapsed_s"])
        self.saved_round = self.ended_round = self.federation.server.round_index
        if self.federation.keeps_clients:
            self.partial.load(self.saved_round + 1, notify)
        else:
            self.partial.remove()

    def match_threads(
        self, saved_threads: object, notify: Callable[[str], None], adopt_threads: bool
    ) -> None:
        """Use the saved thread count (``adopt_threads``) or note that it differs."""
        chosen = self.fingerprint.get("threads")
        if adopt_threads and isinstance(saved_threads, int) and saved_threads >= 1:
            if saved_threads != chosen:
                torch.set_num_threads(saved_threads)
                self.fingerprint["threads"] = saved_threads
                notify(
                    f"note: using the checkpoint's {saved_threads} thread(s) instead of the "
                    f"automatic choice of {chosen}, so the records match an uninterrupted run "
                    f"(--threads N sets the count)."
                )
        elif saved_threads != chosen:
            notify(
                f"note: the checkpoint was written with {saved_threads} thread(s), this "
                f"process uses {chosen}; records will differ in the last digits from an "
                f"uninterrupted run."
            )

    # -- inside a round (the engine's RoundWork) ------------------------------------------------
    def opened(self, round_index: int) -> dict[int, KeptLoader]:
        """The updates of round ``round_index`` kept by an earlier process. Its finished
        clients are written only when it starts at the last checkpoint (``saved_round`` 0:
        the federation as built, round 1), the state their replay needs."""
        usable = self.every != 0 and self.saved_round == round_index - 1
        return self.partial.open(round_index, usable)

    def finished(self, client: int, keep: Callable[[], KeptUpdate]) -> None:
        self.partial.finished(client, keep)

    # -- every round --------------------------------------------------------------------------
    def round_end(self, out: RunOutcome) -> None:
        """Append the round's rows; write a checkpoint when one is due."""
        self.flush(out)
        self.ended_round = self.federation.server.round_index
        if self._due():
            self.save()
        self.partial.close()  # after the checkpoint: a kill in between finds them stale
        self._round_start = time.perf_counter()

    def flush(self, out: RunOutcome) -> None:
        records, costs = self.flushed
        rows = plain_rows(out.records[records:])
        self.log.append(rows, out.costs[costs:])
        self.flushed = (len(out.records), len(out.costs))
        for observer in self.observers:
            if rows:
                observer(rows)

    def _due(self) -> bool:
        round_index = self.federation.server.round_index
        if self.every == 0:
            return False
        if self.every is not None:
            return round_index % self.every == 0
        if self.checkpoints_written == 0:
            return True
        # A long round is likely followed by another: start that one at a checkpoint, so
        # it can keep its finished clients.
        round_seconds = time.perf_counter() - self._round_start
        if self.federation.keeps_clients and round_seconds >= KEEP_AFTER_S:
            return True
        return time.perf_counter() - self._since_write >= AUTO_RATIO * self._last_write

    def save(self) -> None:
        started = time.perf_counter()
        sizes = self.log.sync()
        state = {
            "fingerprint": self.fingerprint,
            "records": sizes,
            "elapsed_s": self.elapsed(),
            "federation": self.federation.state_dict(),
        }
        self.checkpoint_bytes = checkpoint.save(self.run_dir.checkpoint_path, state)
        self._last_write = time.perf_counter() - started
        self.checkpoint_seconds += self._last_write
        self.checkpoints_written += 1
        self.saved_round = self.federation.server.round_index
        self._since_write = time.perf_counter()

    # -- end ----------------------------------------------------------------------------------
    def elapsed(self) -> float:
        """Run time so far, earlier processes of a resumed run included."""
        return self.elapsed_before + time.perf_counter() - self._session_start

    def finish(self, out: RunOutcome) -> None:
        """Write the last rows and drop the checkpoint (unless asked to keep the last)."""
        self.flush(out)
        self.log.sync()
        self.partial.close()  # a diverged round ends without its round end
        if self.keep_last:
            if self.saved_round != self.federation.server.round_index and self.every != 0:
                self.save()
        else:
            self.run_dir.remove_checkpoint()

    def interrupted(self, total_rounds: int) -> RunInterruptedError:
        """The one line a Ctrl-C or SIGTERM during the rounds ends with."""
        # A checkpoint already removed (the run was ending) keeps nothing.
        saved = self.saved_round if self.run_dir.checkpoint_path.is_file() else 0
        progress = self.federation.round_progress
        kept = self.partial.kept if progress is not None else 0
        return interruption(total_rounds, self.ended_round, saved, progress, kept)


def interruption(
    total: int, done: int, saved: int, progress: tuple[int, int] | None = None, kept: int = 0
) -> RunInterruptedError:
    """What an interrupt keeps, in one line: ``done`` rounds had ended, the checkpoint holds
    ``saved`` of them (records written after it are cut back and run again on resume, so
    the finished records stay identical to an uninterrupted run's). ``progress``: the
    clients done in the round in progress, of which ``kept`` were kept (``partial-round/``;
    the others train again on resume: docs/protocols.md, "Partial rounds")."""
    where = f"interrupted at round {min(done + 1, total)} of {total}"
    if progress is not None and progress[0] > 0:
        where += f" ({progress[0]} of {progress[1]} clients done"
        if kept == 0:
            where += ", the round runs again)"
        elif kept >= progress[0]:
            where += " and kept)"
        else:
            where += f", {kept} of them kept)"
    if saved == 0 and kept > 0:
        return RunInterruptedError(f"{where}; no round ended yet; rerun the same command to resume")
    if saved == 0:
        return RunInterruptedError(
            f"{where}; kept nothing (no checkpoint yet); rerun the same command to start again"
        )
    if saved == done:
        kept_rounds = f"kept round{'s 1-' if saved > 1 else ' '}{saved} (checkpoint)"
    else:
        again = f"round {done}" if done == saved + 1 else f"rounds {saved + 1}-{done}"
        kept_rounds = f"kept the checkpoint of round {saved} ({again} run again)"
    return RunInterruptedError(f"{where}; {kept_rounds}; rerun the same command to resume")
