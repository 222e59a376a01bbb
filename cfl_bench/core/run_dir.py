"""The on-disk home of one run: path checks, creation, an exclusive lock, resume or restart.

Files of a run directory, in the order they are written::

    config.json      first, atomically: the resolved configuration and its hashes
    records.csv      appended as rounds finish (see ``cfl_bench.core.records``)
    costs.csv        appended as rounds finish
    checkpoint.pt    replaced atomically at round ends; removed when the run finishes
    partial-round/   inside a long round: one file per finished client update, written
                     atomically, removed at the round's end (``runner.round_keeper``)
    summary.json     last, atomically: a run is complete exactly when it exists with
                     status "finished" or "diverged"

and, when asked for, ``tensorboard/``, ``mlflow.db`` and ``mlruns/`` (``--log``), ``model.pt``
(``--save-model``), ``report.html`` (``cfl-bench report``'s page of this run) and
``carla_demo.html`` (``carla demo``'s). These names
are the run's own entries (:data:`RUN_OUTPUTS`, the one list of them): **a folder is a
cfl-bench run only when its config.json says so** (a JSON object with a string
``config_hash``), and only a run's own entries are ever replaced or removed. Anything else in
``--out`` (the user's ``NOTES.md``, ``plots/``, another command's report folder, a run
nested in a subfolder) is kept where it is; a non-empty folder that is not a run is refused
with nothing changed, whatever the names in it (a user's ``records.csv`` or ``mlruns/``
are theirs). The one exception is the record a sweep writes for a point that failed before
its config.json (``cfl_bench.sweeps.ledger.failed_summary``): a folder holding only that
summary.json is the sweep's, and the point's rerun replaces it.

Why a lock on the directory itself (``flock`` on its file descriptor): two identical
commands started into the same ``--out`` would interleave their rows in one file. The kernel
drops the lock when the process dies, even on SIGKILL, so a killed run never leaves a stale
lock behind, and no lock file is left in the directory.

Everything that can be refused about ``--out`` (a path below a file, a name too long, a
read-only or full disk) is refused before anything is created, and a directory this
process created is removed again if it cannot be used.

**Replacing a run** (``--overwrite``, ``--restart``, or a leftover of a run killed before
its first checkpoint): nothing of the old run is touched until the new one is complete.
The new run is written into a hidden staging folder inside ``--out`` (``.replacement/``)
and, once its ``summary.json`` is written, swapped in: every one of the old run's own
entries (:data:`RUN_OUTPUTS`: ``model.pt`` and ``report.html`` of the old run included) moves
into ``.replaced/``, a marker (``.replaced/.moved``) records that all of them did, the staged
entries move up into ``--out``, and ``.replaced/`` is deleted. Every other entry of
``--out`` stays where it is throughout. Why this design rather than moving the old run
aside at the start and back on failure:

* A failure at any point before the swap (the cost probe's allocation, a data error, an
  exception, Ctrl-C, even ``kill -9``) leaves the old run exactly where it was, byte for
  byte: there is nothing to restore, so a restore that itself fails or never runs (SIGKILL)
  cannot lose it. ``leaderboard`` and ``report`` (which skip hidden folders) keep showing
  the old run until the new one is complete.
* The staging folder lives inside ``--out``, so the directory lock taken on ``--out``
  covers it, every rename stays on one file system, and the parent folder (perhaps a
  sweep's, perhaps not writable) gains nothing.
* A replacement is resumable like any run: a failed or interrupted one keeps its staging
  folder only when it holds a checkpoint, and rerunning the same command (with the same
  ``--overwrite``) resumes it there; otherwise the staging folder is removed again.
* The swap is a few renames inside one directory; a crash in the middle of it is rolled
  forward by the next claim (the staged run was complete when the swap began; the marker
  tells whether the run's entries in ``--out`` are old or new; entries that are not the
  run's are never moved, so they are neither).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shutil
import stat
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

from cfl_bench.core.atomic import atomic_write_json, path_kind
from cfl_bench.core.errors import UserError

CONFIG = "config.json"
SUMMARY = "summary.json"
CHECKPOINT = "checkpoint.pt"
# The finished client updates of the round in progress (``runner.round_keeper``): a run
# killed inside its first round resumes from them alone (no checkpoint yet).
PARTIAL_ROUND = "partial-round"
KEPT_CLIENT_FILES = "client-*.pt"
# A component's image sets for a person to look at (``runner.image_sets``: TARGET's
# synthetic images after each task), one PNG grid each.
IMAGE_SETS = "synthetic-images"
RUN_FILES = (
    "config.json",
    "records.csv",
    "costs.csv",
    CHECKPOINT,
    PARTIAL_ROUND,
    SUMMARY,
    IMAGE_SETS,
)
# What --log trackers write into a run directory (cfl_bench.runner.trackers): kept when a run
# resumes, removed with the run files when it starts over.
TRACKER_OUTPUTS = ("tensorboard", "mlflow.db", "mlruns")
# Written into the run directory beside them: the final model (--save-model, cfl_bench.runner.run),
# `cfl-bench report`'s default page and `carla demo`'s page (carla_bridge.demo_page), which
# describe this run (stale once it is replaced).
RUN_EXTRAS = ("model.pt", "report.html", "carla_demo.html")
# The manifest of a run's own entries: the only names --overwrite/--restart replace.
RUN_OUTPUTS = RUN_FILES + TRACKER_OUTPUTS + RUN_EXTRAS
DONE = ("finished", "diverged")
# The hidden folders of a replacement (see the module docstring): the run being written,
# the old run's entries during the swap, and the marker that all of them were moved.
STAGING = ".replacement"
ASIDE = ".replaced"
MOVED = ".moved"
REPLACEMENT_FOLDERS = (STAGING, ASIDE)


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
    """A file ``cfl_bench.core.atomic`` writes before renaming it (``.<name>.<random>.tmp``)."""
    return name.startswith(".") and name.endswith(".tmp")


def is_regular_file(path: Path) -> bool:
    """A regular file itself, not a link to one (nor a folder, a pipe or a device)."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def free_bytes(path: Path) -> int:
    return shutil.disk_usage(path).free


def folder_complete(folder: Path) -> bool:
    """Whether ``folder`` holds a run its engine ended (summary status finished/diverged)."""
    try:
        summary = json.loads((folder / SUMMARY).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(summary, dict) and summary.get("status") in DONE


def folder_config_hash(folder: Path) -> str | None:
    """The ``config_hash`` of ``folder``'s config.json, None when there is none."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        value = json.loads((folder / CONFIG).read_text()).get("config_hash")
        return value if isinstance(value, str) else None
    return None


def is_sweep_record(folder: Path) -> bool:
    """Whether ``folder``'s summary.json is the record a sweep writes for a point whose run
    failed (``cfl_bench.sweeps.ledger.failed_summary``: status "failed", its point's name)."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        summary = json.loads((folder / SUMMARY).read_text())
        return summary.get("status") == "failed" and isinstance(summary.get("sweep_point"), str)
    return False


def listed_entries(folder: Path) -> list[str]:
    """The names in ``folder`` that someone put there: all but the temporary files of a
    killed atomic write and a replacement's hidden folders (cfl-bench's own leftovers)."""
    return sorted(
        p.name
        for p in folder.iterdir()
        if p.name not in REPLACEMENT_FOLDERS and not is_temporary(p.name)
    )


def refuse_foreign_folder(folder: Path, label: str) -> None:
    """Refuse a non-empty ``folder`` that is not a cfl-bench run, whatever its names.

    Why names do not count: a user's ``records.csv``, a PyTorch ``checkpoint.pt`` or an
    MLflow ``mlruns/`` carry a run file's name and were replaced or deleted when they did.
    Only a run's config.json makes a folder a run; a folder holding nothing but a sweep's
    record of a failed point is the sweep's (its rerun replaces it). ``label``: how the
    message names the folder (``--out 'X'``).
    """
    if folder_config_hash(folder) is not None:
        return
    names = listed_entries(folder)
    if not names or (names == [SUMMARY] and is_sweep_record(folder)):
        return
    shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
    raise UserError(
        f"{label} is not a cfl-bench run directory (it has no config.json of a run) but holds "
        f"{shown}; nothing was changed; choose an empty or new folder, or move those away."
    )


def is_run_directory(folder: Path) -> bool:
    """Whether ``folder`` holds a cfl-bench run: a config.json with a config hash, or a
    summary.json with a status (a sweep's record of a run that failed early)."""
    if folder_config_hash(folder) is not None:
        return True
    with contextlib.suppress(OSError, ValueError, AttributeError):
        return isinstance(json.loads((folder / SUMMARY).read_text()).get("status"), str)
    return False


def refuse_run_directory(path: Path, option: str, why: str) -> None:
    """Refuse an output folder of another command that is a run directory or lies inside
    one: only ``cfl-bench run`` writes into a run directory (its files are the run's
    record, and a rerun with --overwrite would delete anything else). ``why``: what the
    command writes there, for the message."""
    if is_run_directory(path.absolute()):
        raise UserError(
            f"{option} '{path}' is a cfl-bench run directory, and {why} would mix into "
            f"that run's files; choose a folder of its own."
        )
    refuse_inside_run_directory(path, option, why)


def refuse_inside_run_directory(path: Path, option: str, why: str) -> None:
    """Refuse a ``path`` below a run directory (any of its ancestors is one). ``cfl-bench
    run`` checks only this: its --out being a run directory is the resume/overwrite case,
    but a run nested inside another run would be replaced with it or mixed into it."""
    for folder in path.absolute().parents:
        if is_run_directory(folder):
            raise UserError(
                f"{option} '{path}' is inside the cfl-bench run directory '{folder}', and "
                f"{why} would mix into that run's files; choose a folder outside it."
            )


def sync_folder(folder: Path) -> None:
    """fsync a directory, so renames in it survive a power loss."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class RunFolder:
    """The folder a run writes and what it holds: its paths, the folders this process
    created, the lock on ``out``, the run's own entries and their removal, and the files
    written into it. :class:`RunDirectory` decides, from these, whether a run may start,
    resumes or replaces another."""

    def __init__(self, path: str | Path) -> None:
        self.out = Path(path)
        self.path = self.out
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

    @property
    def staging(self) -> Path:
        return self.out / STAGING

    @property
    def replacing(self) -> bool:
        """Whether this run is written into the staging folder, to replace the old run."""
        return self.path != self.out

    def _create(self) -> None:
        missing = []
        p = self.out
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
                    f"--out '{self.out}' cannot be created ({os_problem(exc)}); choose "
                    f"another folder."
                ) from None
            self._created.append(p)

    def _lock(self) -> None:
        self._fd = os.open(self.out, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise UserError(
                f"another cfl-bench process is running in --out '{self.out}'; wait for it "
                f"to end or choose another --out."
            ) from None

    @property
    def lock_fd(self) -> int | None:
        """The locked descriptor of ``out`` while claimed (handed to a Flower ServerApp by
        its launcher: ``flower.handover``)."""
        return self._fd

    @staticmethod
    def _resumable(folder: Path) -> bool:
        """A checkpoint, or finished client updates kept inside a round (in the first
        round there is no checkpoint to resume from, only those)."""
        if is_regular_file(folder / CHECKPOINT):
            return True
        partial = folder / PARTIAL_ROUND
        return (
            partial.is_dir() and not partial.is_symlink() and any(partial.glob(KEPT_CLIENT_FILES))
        )

    def _own_entries(self) -> list[str]:
        """The run's own entries in ``out`` (:data:`RUN_OUTPUTS`): the only ones a
        replacement moves; everything else in ``out`` stays where it is."""
        return [name for name in listed_entries(self.out) if name in RUN_OUTPUTS]

    def _drop_staging(self) -> None:
        staging = self.staging
        if staging.is_symlink() or staging.is_file():
            staging.unlink()
        elif staging.is_dir():
            shutil.rmtree(staging)

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

    # -- files ------------------------------------------------------------------------------
    def write_config(self, config: dict[str, object]) -> None:
        atomic_write_json(self.config_path, config)

    def write_summary(self, summary: dict[str, object]) -> None:
        atomic_write_json(self.summary_path, summary)

    def remove_checkpoint(self) -> None:
        self.checkpoint_path.unlink(missing_ok=True)


class RunReplacement(RunFolder):
    """How a run replaces another in ``out`` without losing it: this run is written into the
    staging folder, and :meth:`commit` swaps its entries in for the old run's (resumably, if
    the process dies in the middle); :meth:`abandon` leaves the old run in place."""

    def _stage(self, config_hash: str, *, restart: bool) -> bool:
        """Write this run into the staging folder; True when it resumes a replacement that
        an earlier process of the same configuration left with a checkpoint."""
        self.path = self.staging
        resume = (
            self.staging.is_dir()
            and not self.staging.is_symlink()
            and folder_config_hash(self.staging) == config_hash
            and not folder_complete(self.staging)
            and not restart
            and self._resumable(self.staging)
        )
        if resume:
            self._remove((SUMMARY,))
            return True
        self._drop_staging()
        self.staging.mkdir()
        return False

    # -- replacing ------------------------------------------------------------------------
    def commit(self) -> None:
        """Swap a complete replacement in for the old run (nothing to do in place)."""
        if not self.replacing:
            return
        (self.out / ASIDE).mkdir(exist_ok=True)
        self._finish_swap()
        self.path = self.out

    def _finish_swap(self) -> None:
        """Complete a swap that :meth:`commit` began (now, or in a process that died in it).

        Idempotent: until the marker exists every run entry (:data:`RUN_OUTPUTS`) of ``out``
        is old and moves aside; after it, every run entry of ``out`` is new and the staged
        ones still missing move up. Other entries of ``out`` are never moved: the run's
        names are all free when the staged entries move up, so none is replaced.
        """
        aside = self.out / ASIDE
        if not aside.is_dir() or aside.is_symlink():
            return
        marker = aside / MOVED
        if not marker.exists() and not self.staging.is_dir():
            # Nothing to swap in (the staging folder was removed by hand): put the old back.
            for entry in aside.iterdir():
                if not os.path.lexists(self.out / entry.name):
                    os.replace(entry, self.out / entry.name)
            shutil.rmtree(aside)
            return
        if not marker.exists():
            for name in self._own_entries() + [
                p.name for p in self.out.iterdir() if is_temporary(p.name)
            ]:
                os.replace(self.out / name, aside / name)
            marker.touch()
            sync_folder(self.out)
        if self.staging.is_dir():
            for entry in self.staging.iterdir():
                if not os.path.lexists(self.out / entry.name):  # a kept entry is never replaced
                    os.replace(entry, self.out / entry.name)
            shutil.rmtree(self.staging)
            sync_folder(self.out)
        shutil.rmtree(aside)

    def abandon(self) -> None:
        """After a failed replacement: the old run stays; the staging folder goes unless
        its checkpoint lets the same command resume it."""
        if (self.out / ASIDE).exists():
            return  # stopped inside the swap: the next claim completes it
        if self.replacing and not self._resumable(self.staging):
            with contextlib.suppress(OSError):
                self._drop_staging()


class RunDirectory(RunReplacement):
    """One run directory, claimed for this process while the object is open.

    ``out`` is the directory the user named; ``path`` is where this run writes: ``out``
    itself, or its staging folder while the run replaces another (see the module
    docstring). Leaving the ``with`` block by an exception abandons a replacement: the old
    run stays, and the staging folder only when it holds a checkpoint to resume from.
    """

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

        Returns True when the run resumes from a checkpoint (same configuration,
        unfinished, a checkpoint present, no ``restart``): the directory's own, or that of
        an earlier replacement of it that was stopped. Otherwise the run starts from
        scratch: in ``out`` when it is empty, else in the staging folder, and the old run is
        replaced only by :meth:`commit`. Refuses a directory holding something else, a
        finished run or another configuration's run (unless ``overwrite``), and a directory
        another process is running in. ``preflight`` runs on the created, locked directory
        before anything in it changes (e.g. a free-space check: a path the OS refuses to
        create is reported as such, not as a full disk).
        """
        self.check_path()
        self._create()
        try:
            self._lock()
            if preflight is not None:
                preflight(self.out)
            self._finish_swap()
            return self._decide(config_hash, overwrite=overwrite, restart=restart)
        except BaseException:
            self.release(remove_created=True)
            raise

    def precheck(self, config_hash: str, *, overwrite: bool, restart: bool) -> None:
        """What :meth:`claim` would refuse, read-only and without the lock: for a run whose
        host (Flower) takes a minute to start before it claims the directory. A folder in
        the middle of a swap is left to the claim, which completes the swap first."""
        self.check_path()
        if self.out.is_dir() and not os.path.lexists(self.out / ASIDE):
            self._check_replaceable(config_hash, overwrite=overwrite, restart=restart)

    def precheck_owner(self) -> None:
        """The part of :meth:`precheck` that needs no configuration (an --out that cannot
        work, lies inside another run, or is a folder that is not a run), read-only.

        Why: `cfl-bench run` calls it before it imports torch and loads the data, so these
        refusals come in a fraction of a second instead of after seconds of loading; the
        claim still checks them all again."""
        self.check_path()
        if self.out.is_dir() and not os.path.lexists(self.out / ASIDE):
            refuse_foreign_folder(self.out, f"--out '{self.out}'")

    def check_path(self) -> None:
        """Refuse an --out that cannot work or lies inside another run, creating nothing."""
        check_out_path(self.out)
        refuse_inside_run_directory(self.out, "--out", "this run")

    @classmethod
    def adopt(cls, out: Path, path: Path, fd: int) -> RunDirectory:
        """The directory another process of the same run claimed, with the locked
        descriptor it handed over (``flower.handover``: the launcher to its ServerApp).
        Sharing the open file description shares the lock; refused when ``fd`` is not
        ``out``'s."""
        same = os.fstat(fd)
        here = os.stat(out)
        if (same.st_dev, same.st_ino) != (here.st_dev, here.st_ino):
            os.close(fd)
            raise UserError(f"the lock handed over is not that of '{out}'; rerun the command.")
        run_dir = cls(out)
        run_dir.path = Path(path)
        run_dir._fd = fd
        return run_dir

    def _decide(self, config_hash: str, *, overwrite: bool, restart: bool) -> bool:
        self._check_replaceable(config_hash, overwrite=overwrite, restart=restart)
        old_hash = folder_config_hash(self.out)
        complete = folder_complete(self.out)
        if old_hash == config_hash and not complete and not restart and self._resumable(self.out):
            self._drop_staging()
            self._remove((SUMMARY,))
            return True
        if not self._own_entries():
            self._drop_staging()
            self._remove(RUN_OUTPUTS)
            return False
        return self._stage(config_hash, restart=restart)

    def _check_replaceable(self, config_hash: str, *, overwrite: bool, restart: bool) -> None:
        """Refuse a folder that is not a run, a finished run or another configuration's
        unfinished run without ``overwrite``, and a checkpoint that is not a file."""
        refuse_foreign_folder(self.out, f"--out '{self.out}'")
        old_hash = folder_config_hash(self.out)
        if old_hash == config_hash and not restart and not folder_complete(self.out):
            self._check_checkpoint()
        if folder_complete(self.out) and not overwrite:
            raise UserError(
                f"--out '{self.out}' already holds a finished run; pass --overwrite to "
                f"replace it or choose another --out."
            )
        if old_hash is not None and old_hash != config_hash and not overwrite:
            raise UserError(
                f"--out '{self.out}' holds an unfinished run of a different configuration; "
                f"pass --overwrite to replace it or choose another --out."
            )

    def _check_checkpoint(self) -> None:
        """Refuse a checkpoint.pt that is not a regular file (a folder, a link, a named
        pipe) in a run that would resume from it: it used to start over from round 1
        without a word. --restart is the way to start over knowingly."""
        path = self.out / CHECKPOINT
        if not os.path.lexists(path) or is_regular_file(path):
            return
        kind = "a symbolic link" if path.is_symlink() else path_kind(path)
        raise UserError(
            f"'{path}' is {kind}, not a checkpoint file, so the run cannot resume from it; "
            f"remove it, or pass --restart to start the run over."
        )

    def __enter__(self) -> RunDirectory:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is not None:
            self.abandon()
        self.release()
