"""Atomic file writes: a temporary file in the same folder, fsync, rename.

Why a module of its own: run records, the embedding cache, the sweep's bookkeeping and the
leaderboard all need the same rule (readers see the old file or the whole new one, never
half of one), and the sweep process must not import torch to get it.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO


def atomic_write(path: Path, write: Callable[[BinaryIO], object]) -> None:
    """``write`` into a temporary file in the same directory, fsync, then rename over
    ``path``: readers see the old file or the whole new one, never a half-written one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        # mkstemp makes the file private (0600); results are meant to be shared, so give
        # it the mode a plain open() would (0666 minus the umask).
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        with os.fdopen(fd, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda fh: fh.write(text.encode("utf-8")))


def atomic_write_json(
    path: Path, obj: object, default: Callable[[Any], object] | None = None
) -> None:
    """Sorted, indented JSON; NaN is refused (it is not JSON). ``default`` as in json.dumps."""
    text = json.dumps(obj, indent=2, sort_keys=True, allow_nan=False, default=default)
    atomic_write_text(path, text + "\n")


def path_kind(path: Path) -> str:
    """What sits at ``path`` (which exists), in words, for "is X, not a folder" messages:
    /dev/zero is "a device" and a FIFO "a named pipe", never "a file" or "does not exist"."""
    import stat

    mode = path.stat().st_mode
    kinds = (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISREG, "a file"),
        (stat.S_ISFIFO, "a named pipe"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a device"),
        (stat.S_ISBLK, "a device"),
    )
    return next((words for test, words in kinds if test(mode)), "a special file")
