"""The on-disk home of one run: path checks, creation, an exclusive lock, resume or restart.

Files of a run directory, in the order they are written::

    config.json      first, atomically: the resolved configuration and its hashes
    records.csv      appended as rounds finish (see ``cfl_bench.records``)
    costs.csv        appended as rounds finish
    checkpoint.pt    replaced atomically at round ends; removed when the run finishes
    summary.json     last, atomically: a run is complete exactly when it exists with
                     status "finished" or "diverged"

Why a lock on the directory itself (``flock`` on its file descriptor): two identical
commands started into the same ``--out`` would interleave their rows in one file. The kernel
drops the lock when the process dies, even on SIGKILL, so a killed run never leaves a stale
lock behind, and no lock file is left in the directory.

Everything that can be refused about ``--out`` (a path below a file, a name too long, a
read-only or full disk) is refused before anything is created, and a directory this
process created is removed again if it cannot be used.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

from cfl_bench.atomic import atomic_write_json, path_kind
from cfl_bench.errors import UserError

CONFIG = "config.json"
SUMMARY = "summary.json"
CHECKPOINT = "checkpoint.pt"
RUN_FILES = ("config.json", "records.csv", "costs.csv", "checkpoint.pt", "summary.json")
# What --log trackers write into a run directory (cfl_bench.trackers): kept when a run
# resumes, removed with the run files when it starts over.
TRACKER_OUTPUTS = ("tensorboard", "mlflow.db", "mlruns")
DONE = ("finished", "diverged")


def os_problem(exc: OSError) -> str:
    """A short reason for an OS error, in words a user can act on."""
    reasons = {
        errno.ENOSPC: "the disk is full",
        errno.EDQUOT: "the disk quota is exhausted",
        errno.EROFS: "the file system is read-only",
        errno.EACCES: "permission denied",
        errno.EPERM: "permission denied",
        errno.ENAMETOOLONG: "a name is too long",
        errno.ENOTDIR: "a part of the path is a file",
    }
    return reasons.get(exc.errno or 0, exc.strerror or type(exc).__name__)


def check_out_path(path: Path) -> Path:
    """The nearest existing ancestor of ``path``, after refusing paths that cannot work."""
    name_max = 255
    for part in path.parts:
        if len(os.fsencode(part)) > name_max:
            shown = part if len(part) <= 40 else part[:37] + "..."
            raise UserError(
                f"--out has a name of {len(os.fsencode(part))} bytes ('{shown}'), longer than "
                f"the {name_max} a file system allows; use a shorter name."
            )
    try:
        ancestor = nearest_existing(path)
    except OSError as exc:  # e.g. a whole path longer than PATH_MAX
        raise UserError(
            f"--out cannot be used ({os_problem(exc)}); choose a shorter path."
        ) from None
    if ancestor == path and not path.is_dir():
        raise UserError(f"--out '{path}' is {path_kind(path)}; give a directory path.")
    if not ancestor.is_dir():
        raise UserError(
            f"--out '{path}' is below '{ancestor}', which is a file; choose a path in a folder."
        )
    if not os.access(ancestor, os.W_OK | os.X_OK):
        if ancestor == path:
            raise UserError(f"--out '{path}' is not writable; choose a folder you can write to.")
        raise UserError(
            f"--out '{path}' cannot be created: '{ancestor}' is not writable; choose a folder "
            f"you can write to."
        )
    return ancestor


def nearest_existing(path: Path) -> Path:
    """``path`` or its closest ancestor that exists; a broken link on the way is refused."""
    ancestor = path
    while not ancestor.exists():
        if ancestor.is_symlink():
            raise UserError(f"--out '{path}' goes through a broken link '{ancestor}'; fix it.")
        ancestor = ancestor.parent
    return ancestor


def is_temporary(name: str) -> bool:
    """A file ``cfl_bench.atomic`` writes before renaming it (``.<name>.<random>.tmp``)."""
    return name.startswith(".") and name.endswith(".tmp")


def free_bytes(path: Path) -> int:
    return shutil.disk_usage(path).free


class RunDirectory:
    """One run directory, claimed for this process while the object is open."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._fd: int | None = None
        self._created: list[Path] = []

    @property
    def summary_path(self) -> Path:
        return self.path / SUMMARY

    @property
    def config_path(self) -> Path:
        return self.path / CONFIG

    @property
    def checkpoint_path(self) -> Path:
        return self.path / CHECKPOINT

    def is_complete(self) -> bool:
        try:
            summary = json.loads(self.summary_path.read_text())
        except (OSError, ValueError):
            return False
        return isinstance(summary, dict) and summary.get("status") in DONE

    def stored_config_hash(self) -> str | None:
        with contextlib.suppress(OSError, ValueError, AttributeError):
            value = json.loads(self.config_path.read_text()).get("config_hash")
            return value if isinstance(value, str) else None
        return None

    # -- claiming -------------------------------------------------------------------------
    def claim(
        self,
        config_hash: str,
        *,
        overwrite: bool,
        restart: bool,
        preflight: Callable[[Path], None] | None = None,
    ) -> bool:
        """Create and lock the directory and decide how the run starts.

        Returns True when the run resumes from the directory's checkpoint (same
        configuration, unfinished, a checkpoint present, no ``restart``). Otherwise the old
        run files are removed and the run starts from scratch. Refuses a directory holding
        something else, a finished run or another configuration's run (unless
        ``overwrite``), and a directory another process is running in. ``preflight`` runs
        on the created, locked directory before anything in it changes (e.g. a free-space
        check: a path the OS refuses to create is reported as such, not as a full disk).
        """
        check_out_path(self.path)
        self._create()
        try:
            self._lock()
            if preflight is not None:
                preflight(self.path)
            return self._decide(config_hash, overwrite=overwrite, restart=restart)
        except BaseException:
            self.release(remove_created=True)
            raise

    def _create(self) -> None:
        missing = []
        p = self.path
        while not p.exists():
            missing.append(p)
            p = p.parent
        for p in reversed(missing):
            try:
                p.mkdir()
            except FileExistsError:
                continue
            except OSError as exc:
                self.release(remove_created=True)
                raise UserError(
                    f"--out '{self.path}' cannot be created ({os_problem(exc)}); choose "
                    f"another folder."
                ) from None
            self._created.append(p)

    def _lock(self) -> None:
        self._fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise UserError(
                f"another cfl-bench process is running in --out '{self.path}'; wait for it "
                f"to end or choose another --out."
            ) from None

    def _decide(self, config_hash: str, *, overwrite: bool, restart: bool) -> bool:
        if not any(self.path.iterdir()):
            return False
        old_hash = self.stored_config_hash()
        if old_hash is None:
            foreign = [
                p.name
                for p in self.path.iterdir()
                if p.name not in RUN_FILES + TRACKER_OUTPUTS and not is_temporary(p.name)
            ]
            if foreign or self.config_path.exists():
                raise UserError(
                    f"--out '{self.path}' exists and is not a cfl-bench run directory; "
                    f"choose an empty or new directory."
                )
        if self.is_complete() and not overwrite:
            raise UserError(
                f"--out '{self.path}' already holds a finished run; pass --overwrite to "
                f"replace it or choose another --out."
            )
        if old_hash is not None and old_hash != config_hash and not overwrite:
            raise UserError(
                f"--out '{self.path}' holds an unfinished run of a different configuration; "
                f"pass --overwrite to replace it or choose another --out."
            )
        resume = (
            old_hash == config_hash
            and not self.is_complete()
            and not restart
            and self.checkpoint_path.is_file()
        )
        self._remove((SUMMARY,) if resume else RUN_FILES + TRACKER_OUTPUTS)
        return resume

    def _remove(self, names: tuple[str, ...]) -> None:
        """The named run files, and temporary files a killed atomic write left behind."""
        for name in names:
            target = self.path / name
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target)
            else:
                target.unlink(missing_ok=True)
        for p in self.path.iterdir():
            if is_temporary(p.name) and p.is_file():
                p.unlink(missing_ok=True)

    def release(self, remove_created: bool = False) -> None:
        """Drop the lock; with ``remove_created`` also the folders this process made."""
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor releases the flock
            self._fd = None
        if remove_created:
            for p in reversed(self._created):
                with contextlib.suppress(OSError):
                    p.rmdir()
            self._created = []

    def __enter__(self) -> RunDirectory:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()

    # -- files ------------------------------------------------------------------------------
    def write_config(self, config: dict[str, object]) -> None:
        atomic_write_json(self.config_path, config)

    def write_summary(self, summary: dict[str, object]) -> None:
        atomic_write_json(self.summary_path, summary)

    def remove_checkpoint(self) -> None:
        self.checkpoint_path.unlink(missing_ok=True)
