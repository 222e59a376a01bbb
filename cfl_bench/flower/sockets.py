"""The local sockets of ``cfl-bench flower node`` (its worker's, its starter's): which path
may become one, and removing only a socket the node itself made.

Why: a node binds its sockets at a path the user names (``--socket PATH`` and the derived
``PATH.starter``). Binding needs the path free, and a helper removes its socket when it
stops. Unlinking whatever was at the path turned a user's regular file into a socket and
then deleted it. The rule: a path may become the node's socket when nothing is there, or
when a socket is there that nothing listens on (left by a node or worker that died: a
socket file holds no data, and with no listener it serves no one). Anything else (a
regular file, a folder, a symlink, a socket another process listens on) is refused, and
on exit a helper removes the path only if it is still the very socket it bound (same
device and inode). No torch and no flwr: the worker and the starter import this.
"""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path

#: The longest path a Unix socket may have on Linux (``sun_path`` is 108 bytes, NUL ended).
MAX_SOCKET_PATH = 107


def listening(path: Path) -> bool:
    """Whether a process accepts connections on the Unix socket at ``path``."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        return s.connect_ex(str(path)) == 0


def kind_of(mode: int) -> str:
    """What an ``lstat`` mode is, in words."""
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISREG(mode):
        return "a regular file"
    return "a special file"


def socket_problem(path: Path) -> str | None:
    """Why ``path`` cannot become a node's socket, or None when it can (nothing there, or
    a socket nothing listens on)."""
    if len(os.fsencode(str(path))) > MAX_SOCKET_PATH:
        return f"is longer than the {MAX_SOCKET_PATH} bytes a local socket's path may have"
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    if not stat.S_ISSOCK(mode):
        return f"exists and is {kind_of(mode)}, which the node would replace"
    if listening(path):
        return "is a socket another process is listening on (another node?)"
    return None


def bind_own(path: Path, backlog: int) -> tuple[socket.socket, tuple[int, int]]:
    """A listening socket at ``path``, private to the user, and its (device, inode) for
    :func:`remove_own`. A dead socket there is replaced; anything else is refused
    (``OSError``: the node checked the path before starting its helpers, so this is a race)."""
    problem = socket_problem(path)
    if problem is not None:
        raise FileExistsError(f"'{path}' {problem}; not replacing it")
    if os.path.lexists(path):
        os.unlink(path)  # a socket nothing listens on (socket_problem said so)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        listener.bind(str(path))
    finally:
        os.umask(old)
    listener.listen(backlog)
    made = os.lstat(path)
    return listener, (made.st_dev, made.st_ino)


def remove_own(path: Path, identity: tuple[int, int]) -> None:
    """Remove ``path`` only if it is still the socket :func:`bind_own` made (not a file or
    a newer socket someone put there since)."""
    try:
        now = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISSOCK(now.st_mode) and (now.st_dev, now.st_ino) == identity:
        os.unlink(path)
