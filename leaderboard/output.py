"""Where the leaderboard goes: checks on ``--out`` and writing both files together.

Why a module of its own: the rules are the project's rule for bad input applied to
``--out`` — one sentence naming the problem and the fix, and nothing left on disk that was
not there before — and they need the run directories found by :mod:`leaderboard.runs`,
which :func:`cfl_bench.core.run_dir.check_out_path` (shared with ``cfl-bench run``) cannot know.

* Path problems (a name too long, a path below a file, a broken link, a folder that cannot
  be written) are refused by :func:`cfl_bench.core.run_dir.check_out_path` before any run is
  read; its sentences name ``--out`` and fit this command too.
* A run directory is never a leaderboard folder: ``--out`` holding ``config.json`` or
  ``summary.json``, or lying in a run directory being read, is refused. Two files that
  ``cfl-bench run`` did not write would make a later run or sweep refuse that directory,
  and the board would sit among the very records it summarizes.
* Both files are staged under hidden temporary names first and renamed into place only when
  both are complete, so a full disk or a read-only file system never leaves a new CSV next
  to an old HTML page. Any OSError becomes one sentence, after the staged files and the
  folders this call created are removed again.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from cfl_bench.core.atomic import atomic_write_text
from cfl_bench.core.errors import UserError
from cfl_bench.core.run_dir import check_out_path, os_problem
from cfl_bench.core.run_dir import refuse_run_directory as refuse_any_run_directory
from cfl_bench.leaderboard.runs import CONFIG, SUMMARY


def check_board_out(out_dir: str | Path, names: Sequence[str]) -> Path:
    """``--out`` as a Path, after refusing one that cannot hold the board files ``names``
    (an empty text would silently mean the current folder)."""
    if str(out_dir) == "":
        raise UserError("--out is empty; give a folder for leaderboard.csv and leaderboard.html.")
    out = Path(out_dir)
    try:
        if os.path.isdir(out) and not os.access(out, os.W_OK | os.X_OK):
            raise UserError(f"--out '{out}' is not writable; choose a folder you can write to.")
        check_out_path(out)
        taken = [n for n in names if os.path.lexists(out / n) and not (out / n).is_file()]
    except OSError as exc:  # a path too long as a whole, a folder that cannot be entered
        raise UserError(
            f"--out '{out}' cannot be used ({os_problem(exc)}); choose another folder."
        ) from None
    if taken:
        raise UserError(
            f"--out '{out}' holds '{taken[0]}', which is not a file; remove it or choose "
            f"another folder."
        )
    return out


def refuse_run_directory(out: Path, run_dirs: Sequence[tuple[Path, str]]) -> None:
    """Refuse an ``--out`` that is a run directory, or lies inside one: any run's (in the
    words every command uses, :func:`cfl_bench.core.run_dir.refuse_run_directory`), or one of
    ``run_dirs`` reached through a link (the (real path, shown path) pairs of
    :func:`leaderboard.runs.find_run_dirs`)."""
    for name in (CONFIG, SUMMARY):
        if os.path.lexists(out / name):
            raise UserError(
                f"--out '{out}' is a cfl-bench run directory (it holds {name}), and the "
                f"leaderboard would mix into that run's files; choose a folder of its own."
            )
    refuse_any_run_directory(out, "--out", "the leaderboard")
    target = Path(os.path.realpath(out))
    for real, shown in run_dirs:
        if target == real or real in target.parents:
            raise UserError(
                f"--out '{out}' is inside the cfl-bench run directory '{shown}', and the "
                f"leaderboard would mix into that run's files; choose a folder outside it."
            )


def _missing_folders(out: Path) -> list[Path]:
    """``out`` and its ancestors that do not exist yet, outermost first."""
    missing = []
    folder = out
    while not os.path.lexists(folder):
        missing.append(folder)
        folder = folder.parent
    return missing[::-1]


def write_board_files(
    out: Path, files: Mapping[str, str], what: str = "the leaderboard"
) -> list[Path]:
    """Write every ``name → text`` of ``files`` into ``out`` (created if needed), all or
    nothing as far as the file system allows; returns the paths written. ``what`` names the
    files in the error sentence (``cfl-bench report`` writes "the report" with it).

    Each file is first written atomically (fsync, see :mod:`cfl_bench.core.atomic`) under a
    hidden staging name in ``out``, then all are renamed into place. On an OSError the
    staged files and the folders made here are removed and a UserError names the reason.
    """
    made: list[Path] = []
    staged: list[tuple[Path, Path]] = []
    try:
        for folder in _missing_folders(out):
            folder.mkdir()
            made.append(folder)
        for name, text in files.items():
            fd, staging_name = tempfile.mkstemp(prefix=f".{name}.", suffix=".staged", dir=out)
            os.close(fd)
            staged.append((Path(staging_name), out / name))
            atomic_write_text(Path(staging_name), text)
        for staging, final in staged:
            os.replace(staging, final)
    except OSError as exc:
        for staging, _ in staged:
            with contextlib.suppress(OSError):
                staging.unlink(missing_ok=True)
        for folder in reversed(made):
            with contextlib.suppress(OSError):
                folder.rmdir()
        raise UserError(
            f"cannot write {what} to --out '{out}' ({os_problem(exc)}); choose another folder."
        ) from None
    return [final for _, final in staged]
