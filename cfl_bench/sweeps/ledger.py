"""What a sweep keeps on disk, and the rule that decides whether a point is already done.

Layout of a sweep folder ``<out>``::

    <out>/<slug>-<hash8>/        one run directory per grid point (written by `cfl-bench run`'s
                                 engine; summary.json carries ``request_hash``)
    <out>/sweep.json             manifest: every point, its directory, request and status
    <out>/sweep.log              append-only: one line per start / finish / skip / failure /
                                 damaged run found (it runs again)
    <out>/.sweep/<name>.yaml     the point's request, to rerun it alone with `cfl-bench run`
    <out>/.sweep/<name>.log      the run child's stdout and stderr
    <out>/.sweep/<name>.lock     flock'ed by the child while it runs the point
    <out>/slurm/                 with --slurm-script only: the array's jobs-<hash8>.jsonl and
                                 its tasks' output (``sweep.slurm``)

The bookkeeping files live outside the run directories because ``RunDirectory.claim``
refuses a non-empty directory without a run's ``config.json``, and a restarted point
replaces the run's own files. **Skip rule**: a point is done exactly when its directory
holds a ``summary.json`` with status "finished" or "diverged" whose ``request_hash``
equals the point's, and the reader of run directories (:mod:`cfl_bench.core.run_reader`) finds
none of its files damaged; anything else (no summary, a failed one, another hash, a damaged
``records.csv``) is run again — resumed from its checkpoint when an interrupted attempt of
the same configuration left one, from scratch otherwise (a damaged finished run is replaced
only once its replacement has finished, as ``--overwrite`` does).

Files are written with ``cfl_bench.core.atomic`` (temp + fsync + rename), which imports no torch:
the sweep process stays light, the engine lives in the children.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from cfl_bench.core import run_dir as run_directory
from cfl_bench.core.atomic import atomic_write_json as write_json
from cfl_bench.core.errors import UserError

BOOKKEEPING = ".sweep"
MANIFEST = "sweep.json"
LOG = "sweep.log"
# What a cfl-bench run directory may contain (a run's own entries, a replacement's hidden
# folders); anything else is refused, though a run's replacement would keep it.
RUN_FILES = frozenset(run_directory.RUN_OUTPUTS + run_directory.REPLACEMENT_FOLDERS)


def atomic_write_json(path: Path, obj: object) -> None:
    """Sweep records may hold paths; they are written as strings."""
    write_json(path, obj, default=str)


def read_summary(run_dir: Path) -> dict[str, Any] | None:
    """The run's summary.json, or None when absent or unreadable."""
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return summary if isinstance(summary, dict) else None


def is_done(run_dir: Path, request_hash: str) -> bool:
    """The skip rule: a run the engine ended (finished or diverged) for this very request,
    with every file intact. The run directory is read by the reader that ``report`` and
    ``leaderboard`` use (:func:`cfl_bench.core.run_reader.read_run`), so a point whose
    ``records.csv`` is damaged runs again instead of being skipped as done."""
    from cfl_bench.core.run_reader import read_run

    reading = read_run(run_dir)
    return reading.done and (reading.summary or {}).get("request_hash") == request_hash


def damage(run_dir: Path) -> str:
    """Why the run in ``run_dir`` is damaged, in the words ``leaderboard``, ``report``,
    ``clients`` and ``reproduce --compare`` use for it; empty when it is not damaged (or
    there is no run yet). A damaged point is never skipped: it runs again, and the sweep says
    why (replacing the damaged run only once the new one has finished)."""
    from cfl_bench.core.run_reader import DAMAGED, read_run

    if not (run_dir / "config.json").exists() and not (run_dir / "summary.json").exists():
        return ""
    reading = read_run(run_dir)
    return reading.reason if reading.status == DAMAGED else ""


def damage_line(run_dir: Path) -> str:
    """What the sweep says of a point whose run is damaged (empty when it is not): the
    reason every command gives, and what happens to it. A damaged run with its config.json
    runs again and is replaced once the new run finishes; without one the folder is no run
    the sweep may replace (``cfl_bench.core.run_dir``: only a config.json makes a folder a run),
    so the point fails until the folder is moved away."""
    reason = damage(run_dir)
    if not reason:
        return ""
    if run_directory.folder_config_hash(run_dir) is not None:
        return f"damaged ({reason}); running it again"
    return (
        f"damaged ({reason}); without a run's config.json the sweep does not replace the "
        f"folder: move it away to run this point again"
    )


def check_run_dir(run_dir: Path) -> None:
    """Refuse to run a point whose directory is not a run, or holds files a run does not
    write.

    The run itself replaces or resumes what it wrote; anything else is refused rather than
    run into, because the sweep folder may be one the user shares with other work. The
    second check is ``cfl-bench run``'s own (:func:`cfl_bench.core.run_dir.refuse_foreign_folder`):
    a folder whose run-named files (a user's ``records.csv``) come with no run's config.json
    is not a run, whatever the names.
    """
    if not run_dir.exists():
        return
    if not run_dir.is_dir():
        raise UserError(f"'{run_dir}' is a file; move it away so the sweep can use that name.")
    foreign = sorted(p.name for p in run_dir.iterdir() if p.name not in RUN_FILES)
    foreign = [n for n in foreign if not (n.startswith(".") and n.endswith(".tmp"))]
    if foreign:
        raise UserError(
            f"'{run_dir}' holds files a run does not write ({', '.join(foreign[:3])}); move "
            f"them away so the sweep can run this point."
        )
    run_directory.refuse_foreign_folder(run_dir, f"'{run_dir}'")


def write_failed_summary(run_dir: Path, summary: dict[str, Any]) -> bool:
    """Write the sweep's record of a failed point into its run directory, only where that
    is safe; returns whether it was written.

    Never into a folder that holds something other than a cfl-bench run (a point refused for
    files of the user's would otherwise get a summary.json among them), never over a run
    that is complete (its summary is that run's record), and only while holding the run
    directory's own lock (``flock`` on the folder, as ``cfl-bench run`` takes it): a run
    still writing there, e.g. a straggler of a killed child, keeps the folder to itself.
    """
    occupied = run_dir.is_dir() and any(run_dir.iterdir())
    if occupied and (
        not run_directory.is_run_directory(run_dir) or run_directory.folder_complete(run_dir)
    ):
        return False
    run_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        atomic_write_json(run_dir / "summary.json", summary)
        return True
    finally:
        os.close(fd)  # closing the descriptor releases the flock


def failed_summary(
    request: dict[str, Any], request_hash: str, name: str, returncode: int | None, message: str
) -> dict[str, Any]:
    """What the leaderboard needs to list a run that never wrote its own summary."""
    return {
        "status": "failed",
        "message": message,
        "returncode": returncode,
        "stream": request.get("stream"),
        "strategy": request.get("strategy"),
        "seed": request.get("seed"),
        "request_hash": request_hash,
        "sweep_point": name,
    }


def tail(path: Path, lines: int = 12, chars: int = 2000) -> str:
    """The last lines of a child's log: where the reason of a failure is."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.rstrip().splitlines()[-lines:])[-chars:]


def timestamp() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="microseconds")


def append_log(out: Path, event: str, name: str, **fields: object) -> None:
    """One line ``time<TAB>sweep-pid<TAB>event<TAB>point<TAB>key=value ...`` in sweep.log.

    One ``os.write`` on an O_APPEND descriptor: lines from concurrent sweeps never interleave
    within a line, and a killed sweep leaves at most its last line missing, never a torn one
    that could be misread.
    """
    extra = " ".join(f"{k}={v}" for k, v in fields.items())
    line = f"{timestamp()}\t{os.getpid()}\t{event}\t{name}\t{extra}\n"
    fd = os.open(out / LOG, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, line.encode("utf-8"))
    finally:
        os.close(fd)


def read_log(out: Path) -> list[dict[str, Any]]:
    """sweep.log parsed back: time, pid, event, point and the key=value fields."""
    rows: list[dict[str, Any]] = []
    with contextlib.suppress(FileNotFoundError):
        for line in (out / LOG).read_text().splitlines():
            parts = line.split("\t")
            if len(parts) != 5:
                continue
            fields = dict(item.split("=", 1) for item in parts[4].split() if "=" in item)
            rows.append(
                {"time": parts[0], "pid": int(parts[1]), "event": parts[2], "point": parts[3]}
                | fields
            )
    return rows


def write_manifest(out: Path, spec: dict[str, Any], points: Iterable[dict[str, Any]]) -> None:
    """``sweep.json``: the grid and every point's directory, request and status."""
    atomic_write_json(
        out / MANIFEST, {"sweep": spec, "updated": timestamp(), "points": list(points)}
    )
