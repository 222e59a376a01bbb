"""The run directory's lock, handed from the launcher of a Flower simulation to its ServerApp.

Why: the ServerApp writes the run directory, but it is not the launcher's child (``flwr run
... local`` starts a detached SuperLink, which starts the ServerApp), so it cannot inherit
the launcher's lock, and when it claimed the directory itself a ServerApp that outlived a
``kill -9``-ed launcher could claim it after the launcher was gone and write into it (a
``summary.json`` 9 s after the launcher died). Now the launcher claims the directory before
Flower starts (``RunDirectory.claim``: a finished run, another configuration's run or a busy
directory is refused at once, as with every executor) and serves the *locked descriptor*
itself on a Unix socket in the simulation's private folder (``SCM_RIGHTS``). The ServerApp
receives it, and with it the same open file description, so it holds the very lock the
launcher holds (``flock`` belongs to the open file description): its writes are under the
lock for as long as it lives, and a ServerApp that starts after the launcher is gone finds
no one serving the lock and writes nothing. The reaper (``flower.reaper``) ends a ServerApp
that outlives its launcher; until it does, that ServerApp still holds the lock, so no other
process can claim the directory in between.

Standard library only (and two light modules of this package): the ServerApp's imports
stay light.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from cfl_bench.core.errors import UserError
from cfl_bench.flower.sockets import MAX_SOCKET_PATH

#: The socket's file name, beside the run configuration in the simulation's folder.
LOCK_SOCKET = "lock.sock"

#: Seconds the ServerApp waits for the launcher's answer.
RECEIVE_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Claim:
    """What the launcher decided when it claimed the directory: where the run writes
    (``out`` or its staging folder), whether it resumes, and the locked descriptor."""

    out: str
    path: str
    resume: bool
    fd: int


@contextlib.contextmanager
def serving(folder: Path, out: Path, path: Path, resume: bool, fd: int) -> Iterator[Path]:
    """Serve the claim (and a duplicate of the locked ``fd`` per connection) on
    ``folder/lock.sock`` until the block ends; yields the socket's path."""
    where = folder / LOCK_SOCKET
    if len(os.fsencode(str(where))) > MAX_SOCKET_PATH:
        raise UserError(
            f"the Flower simulation's folder '{folder}' is too long a path for a local socket; "
            "set TMPDIR to a shorter folder."
        )
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)  # only this user may connect
    try:
        listener.bind(str(where))
    finally:
        os.umask(old)
    listener.listen(4)
    facts = json.dumps({"out": str(out), "path": str(path), "resume": resume}).encode()
    thread = threading.Thread(target=_serve, args=(listener, facts, fd), daemon=True)
    thread.start()
    try:
        yield where
    finally:
        with contextlib.suppress(OSError):
            listener.shutdown(socket.SHUT_RDWR)
        listener.close()
        thread.join(timeout=5)
        with contextlib.suppress(OSError):
            where.unlink()


def _serve(listener: socket.socket, facts: bytes, fd: int) -> None:
    while True:
        try:
            conn, _ = listener.accept()
        except OSError:
            return  # closed: the launcher is done
        with conn, contextlib.suppress(OSError):
            socket.send_fds(conn, [facts], [fd])


def receive(folder: Path) -> Claim | None:
    """The launcher's claim from ``folder/lock.sock``; None when no launcher serves it (it
    is gone: then the run directory must not be touched). The descriptor is this
    process's own (not inherited by its children)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(RECEIVE_TIMEOUT_S)
        try:
            conn.connect(str(folder / LOCK_SOCKET))
            data, fds, _flags, _addr = socket.recv_fds(conn, 65536, 1)
        except OSError:
            return None
    if len(fds) != 1:
        for fd in fds:
            os.close(fd)
        return None
    os.set_inheritable(fds[0], False)
    facts = json.loads(data.decode())
    return Claim(str(facts["out"]), str(facts["path"]), bool(facts["resume"]), fds[0])
