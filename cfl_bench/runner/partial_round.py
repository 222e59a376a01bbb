"""The finished client updates of the round in progress, on disk: ``partial-round/`` in
the run directory, one file per client (``client-<k>.pt``), so an interrupt inside a long
round keeps every client but the one in flight (docs/protocols.md, "Partial rounds").

Why one file per client, written as the client finishes: each write is atomic (temp +
rename, ``engine.checkpoint.save``), so a ``kill -9`` at any moment leaves whole files
only, and no update waits in memory for a later write. Each file is tagged with the run's
fingerprint (configuration hash, git commit, torch) and its round; the files are valid
only on top of the state the round started from — the checkpoint of the round before, or
the freshly built federation in round 1 — which ``RoundKeeper`` guarantees by writing them
only in rounds that start there. The folder is removed at every round end, after that
round's checkpoint (a file of an ended round found later is dropped as stale).

When writing pays (``KEEP_AFTER_S``): only once the round has run 60 s, and never more
than 1/``AUTO_RATIO`` of the round's time so far (5 %); a finished client not written is
simply trained again on resume, so the policy never changes results. Disk: one upload plus
one client state (its replay buffer included) per kept client, at most one round's worth.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from cfl_bench.core.flat import FlatModel
from cfl_bench.core.run_dir import KEPT_CLIENT_FILES
from cfl_bench.engine import checkpoint
from cfl_bench.engine.kept_clients import KeptUpdate, kept_problem

# A round writes its finished clients only once it has run this long: a shorter round is
# cheap to run again, and its writes would cost more than they save.
KEEP_AFTER_S = 60.0
# The most of a round's time its writes may take (1/20: 5 %), as for checkpoints.
AUTO_RATIO = 20.0
# Tests only: "1" writes every finished client at once (a tiny round never runs 60 s).
KEEP_EVERY_CLIENT = "CFL_BENCH_KEEP_EVERY_CLIENT"
MATCHED = ("config_hash", "git_commit", "torch")


def keeps_every_client() -> bool:
    """Whether the tests' switch writes every finished client (never changes results)."""
    return os.environ.get(KEEP_EVERY_CLIENT) == "1"


class PartialRound:
    """The ``partial-round/`` folder of one run directory."""

    def __init__(self, folder: Path, fingerprint: dict[str, Any], model: FlatModel) -> None:
        self.folder = folder
        self.fingerprint = fingerprint  # the keeper's (its thread count may be adopted)
        self.model = model
        self.loaded: dict[int, Path] = {}  # checked on resume, for round loaded_round
        self.loaded_round = 0
        self.loaded_threads: object = None  # the thread count the loaded files were made with
        self.round = 0  # the round in progress (1-based); 0 between rounds
        self.active = False  # whether its finished clients may be written
        self.kept = 0  # its client updates on disk (replayed ones included)
        self._started = 0.0
        self._writing = 0.0  # seconds this round spent writing its files

    # -- the round in progress ----------------------------------------------------------------
    def open(self, round_index: int, usable: bool) -> dict[int, Callable[[], KeptUpdate]]:
        """Round ``round_index`` starts; ``usable``: it starts from the state its files
        would be replayed on. Returns the loaders of its updates checked on resume."""
        paths = self.loaded if self.loaded_round == round_index else {}
        self.loaded, self.loaded_round = {}, 0
        self.round, self.active, self.kept = round_index, usable, len(paths)
        self._started, self._writing = time.perf_counter(), 0.0
        return {client: self.reader(path) for client, path in paths.items()}

    def finished(self, client: int, keep: Callable[[], KeptUpdate]) -> None:
        """Write client ``client``'s update when that pays (see the module docstring)."""
        if not self.active or not self._pays():
            return
        started = time.perf_counter()
        tag = {**{key: self.fingerprint.get(key) for key in MATCHED}, "round": self.round}
        tag["threads"] = self.fingerprint.get("threads")
        checkpoint.save(self.path(client), {"tag": tag, "client": client, **keep()})
        self._writing += time.perf_counter() - started
        self.kept += 1

    def _pays(self) -> bool:
        if keeps_every_client():
            return True
        elapsed = time.perf_counter() - self._started
        return elapsed >= KEEP_AFTER_S and self._writing <= elapsed / AUTO_RATIO

    def path(self, client: int) -> Path:
        return self.folder / f"client-{client}.pt"

    def close(self) -> None:
        """The round ended (its updates are in the aggregate): its files go."""
        self.round, self.active, self.kept = 0, False, 0
        self.remove()

    def remove(self) -> None:
        remove(self.folder)

    # -- resuming -----------------------------------------------------------------------------
    def load(self, round_index: int, notify: Callable[[str], None]) -> int:
        """Check the kept updates of round ``round_index`` (the one a resumed run plays
        next); returns how many are usable. Files of an ended round are dropped quietly (a
        kill between a checkpoint and the folder's removal leaves them); a file that cannot
        stand in for its client's update (damaged, another run's, another model's) is
        dropped with one note, and that client trains again: never a wrong update folded
        in, never a refusal for what only costs time. Only the paths are held: each update
        is read again when it is replayed, so memory holds one at a time."""
        kept: dict[int, Path] = {}
        dropped: list[str] = []
        if self.folder.is_dir() and not self.folder.is_symlink():
            for path in sorted(self.folder.iterdir()):
                client, problem = self._check(path, round_index)
                if client is not None:
                    kept[client] = path
                    continue
                if problem is not None:
                    dropped.append(f"{self.folder.name}/{path.name} ({problem})")
                remove(path)  # stale, unusable, or a temporary file of a killed write
        elif os.path.lexists(self.folder):
            self.remove()
        if dropped:
            who = "that client trains" if len(dropped) == 1 else "those clients train"
            notify(f"note: ignored {'; '.join(dropped)}; {who} again in round {round_index}.")
        self.loaded, self.loaded_round = kept, round_index
        return len(kept)

    def _check(self, path: Path, round_index: int) -> tuple[int | None, str | None]:
        """(its client, None) when usable, (None, why not) when not, (None, None) when
        stale or not a client file at all."""
        if not path.match(KEPT_CLIENT_FILES) or not path.is_file() or path.is_symlink():
            return None, None
        try:  # checked on the CPU: only its replay needs it on the run's device
            update = checkpoint.load(path, torch.device("cpu"))
        except ValueError:
            return None, "not readable"
        tag, client = update.get("tag"), update.get("client")
        if not isinstance(tag, dict) or not isinstance(client, int):
            return None, "not a kept client update"
        for key in MATCHED:
            if tag.get(key) != self.fingerprint.get(key):
                return None, f"written with another {key.replace('_', ' ')}"
        if tag.get("round") != round_index:
            return None, None
        problem = kept_problem(self.model, update)
        if problem is not None:
            return None, problem
        self.loaded_threads = tag.get("threads")
        return client, None

    def reader(self, path: Path) -> Callable[[], KeptUpdate]:
        """A kept update's loader, for its replay."""
        return lambda: checkpoint.load(path, self.model.params.device)


def remove(path: Path) -> None:
    """A file, link or folder in ``partial-round/`` (only the run's own files live there)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)
