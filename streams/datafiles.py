"""Checks shared by every loader that reads files under ``--data-root`` (or fetches them).

Why one module: MNIST, CIFAR, the text sets and the Avalanche adapter meet the same bad
inputs -- a ``--data-root`` that is a file, a folder where a data file should be, a file
this user may not read, a ``--download`` without network -- and each must become the same
one-sentence :class:`UserError` naming the problem and the fix, never a traceback and never
a misleading "missing". Keeping the checks here keeps the wording identical across datasets
and lets every loader run them *before* anything is read, encoded or fetched.

Downloads go through :func:`fetch_quietly`: torchvision prints progress bars and leaves
half-written files behind when a download fails, so the fetch runs with its output
swallowed, with a bounded socket timeout (an offline machine that drops packets would
otherwise hang forever), and whatever it created under the target folder is removed again
when it fails.
"""

from __future__ import annotations

import contextlib
import errno
import http.client
import io
import os
import re
import shutil
import socket
import ssl
import urllib.error
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from cfl_bench.core.atomic import path_kind
from cfl_bench.core.errors import UserError

# Seconds one socket operation of a download may block. Python's default is "forever", so a
# network that silently drops packets would hang --download instead of failing.
DOWNLOAD_SOCKET_TIMEOUT = 60.0

# errno values that mean "there is no route to the internet", not "the transfer broke".
_OFFLINE_ERRNOS = frozenset({errno.ENETUNREACH, errno.EHOSTUNREACH, errno.ENETDOWN})
# The same, as the texts torchvision's MNIST folds into its RuntimeError message.
_OFFLINE_TEXTS = re.compile(
    r"name or service not known|temporary failure in name resolution|nodename nor servname|"
    r"getaddrinfo failed|no address associated|network is unreachable|no route to host|"
    r"network is down",
    re.IGNORECASE,
)
_URLOPEN_TEXT = re.compile(r"<urlopen error (.*?)>")
_HTTP_TEXT = re.compile(r"HTTP Error (\d+): ([^\n<]*)")
_ERRNO_PREFIX = re.compile(r"^\[Errno -?\d+\]\s*")
# errno values of a failed *write* into the target folder (as opposed to a network failure).
_WRITE_ERRNOS = frozenset(
    {
        errno.ENOSPC,
        errno.EDQUOT,
        errno.EACCES,
        errno.EPERM,
        errno.EROFS,
        errno.EISDIR,
        errno.ENOTDIR,
        errno.EEXIST,
    }
)


def one_line(text: object, limit: int = 200) -> str:
    """``text`` with all whitespace runs collapsed and cut to ``limit`` characters.

    Why: library messages (torchvision's download errors, Hugging Face's) span several
    lines, and a UserError must print as exactly one.
    """
    flat = " ".join(str(text).split()) or "no message"
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def _kind(path: Path) -> str:
    """What sits at ``path`` (which exists), in words, for "is X, not a file" messages."""
    return path_kind(path)


def _first_missing(path: Path) -> tuple[Path, Path]:
    """(the topmost missing folder on the way to ``path``, the entry that exists above it)."""
    missing = path
    for parent in path.parents:
        if os.path.lexists(parent):
            return missing, parent
        missing = parent
    return missing, missing  # pragma: no cover - "/" always exists


def check_data_root(
    root: str | Path, *, holds: str, download_hint: bool = False, may_create: bool = False
) -> Path:
    """``root`` as a Path once it is usable as ``--data-root``; a UserError otherwise.

    ``holds`` says what the folder should contain ("MNIST/raw/*-ubyte.gz ..."), so the
    message names the fix. ``may_create`` (``--download``) accepts a folder that does not
    exist yet, as long as it could be created; ``download_hint`` suggests ``--download``
    for a missing folder. A file, a dangling link or a path through a file is refused
    always: nothing could be read or downloaded there.
    """
    path = Path(root)
    shown = repr(str(root))
    fix = f"pass the folder that holds {holds}"
    if "\0" in str(root):  # possible from a config file; the OS would refuse it anyway
        raise UserError(f"--data-root {shown} contains a NUL character; {fix}")
    try:
        if path.is_dir():
            return path
        if path.exists():
            raise UserError(f"--data-root {shown} is {_kind(path)}, not a folder; {fix}")
        if path.is_symlink():
            raise UserError(
                f"--data-root {shown} is a link to {os.readlink(path)!r}, which does not "
                f"exist; {fix}"
            )
        _, above = _first_missing(path)
        if not above.is_dir():
            raise UserError(
                f"--data-root {shown} cannot exist because {str(above)!r} is "
                f"{_kind(above) if above.exists() else 'a dangling link'}, not a folder; {fix}"
            )
    except OSError as exc:  # e.g. a parent folder this user may not enter
        raise UserError(
            f"--data-root {shown} cannot be inspected ({exc.strerror or one_line(exc)}); "
            f"make it reachable by this user or {fix}"
        ) from exc
    if may_create:
        return path
    hint = ", or add --download to fetch it there" if download_hint else ""
    raise UserError(f"--data-root {shown} does not exist; {fix}{hint}")


def data_file(path: Path, *, title: str, root: str | Path) -> Path | None:
    """``path`` when a regular file (or a link to one) is there, None when nothing is.

    Anything else in its place -- a directory, a dangling link, a named pipe, or a file
    where one of the folders on the way under ``root`` should be -- is a UserError saying
    exactly that, so it is never reported as "missing" (and a pipe is never read, which
    would block).
    """
    try:
        if path.is_file():
            return path
        if path.is_symlink() and not path.exists():
            raise UserError(
                f"{title} file {path} is a link to {os.readlink(path)}, which does not exist; "
                "replace it with the file"
            )
        if path.exists():
            raise UserError(
                f"{title} file {path} is {_kind(path)}, not a file; replace it with the file"
            )
        base = Path(root)
        for parent in reversed(path.parents):
            if len(parent.parts) <= len(base.parts):
                continue  # the data root itself is checked by check_data_root
            if os.path.lexists(parent) and not parent.is_dir():
                raise UserError(
                    f"{title} folder {parent} is "
                    f"{_kind(parent) if parent.exists() else 'a dangling link'}, not a folder; "
                    f"replace it with the folder that holds {path.relative_to(parent)}"
                )
    except OSError as exc:
        raise read_error(path, title, exc) from exc
    return None


def read_error(path: Path, title: str, exc: OSError) -> UserError:
    """The message for a data file that is there but cannot be read."""
    if isinstance(exc, IsADirectoryError):
        return UserError(
            f"{title} file {path} is a directory, not a file; replace it with the file"
        )
    if isinstance(exc, PermissionError):
        return UserError(
            f"{title} file {path} cannot be read (permission denied); make it and its folders "
            "readable by this user, or copy it somewhere readable"
        )
    reason = exc.strerror or one_line(exc)
    return UserError(
        f"{title} file {path} exists but cannot be read ({reason}); check the disk or "
        "replace it with a good copy"
    )


def read_bytes(path: Path, title: str) -> bytes:
    """The whole file, or a one-line UserError saying why it cannot be read."""
    try:
        return path.read_bytes()
    except OSError as exc:
        raise read_error(path, title, exc) from exc


# --------------------------------------------------------------------------------------
# Downloads
# --------------------------------------------------------------------------------------


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and its causes/contexts, each once."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _reason(exc: BaseException) -> str:
    """The human part of a socket/URL error ("Name or service not known")."""
    if isinstance(exc, OSError) and exc.strerror:
        return one_line(exc.strerror)
    text = _ERRNO_PREFIX.sub("", one_line(exc, limit=120))
    return "timed out" if isinstance(exc, TimeoutError) and text == "no message" else text


def classify_download_failure(exc: BaseException) -> tuple[str, str]:
    """(kind, detail) of a failed download; kind is offline, connection, http, write or other.

    Why classify: "no network connection" is the usual cause here, but an HTTP 404, a
    broken TLS handshake or a full disk need other fixes, and the message must not
    mislead. torchvision's MNIST folds the real errors into the text of one RuntimeError,
    so its text is read too.
    """
    for error in _chain(exc):
        if isinstance(error, urllib.error.HTTPError):
            return "http", f"HTTP {error.code} {one_line(error.reason, 60)}"
        if isinstance(error, urllib.error.URLError):
            reason = error.reason
            if isinstance(reason, BaseException):
                return classify_download_failure(reason)
            text = one_line(reason, 120)
            return ("offline" if _OFFLINE_TEXTS.search(text) else "connection"), text
        if isinstance(error, (socket.gaierror, socket.herror)):
            return "offline", _reason(error)
        if isinstance(error, OSError) and error.errno in _OFFLINE_ERRNOS:
            return "offline", _reason(error)
        if isinstance(error, (ConnectionError, TimeoutError, ssl.SSLError)):
            return "connection", _reason(error)
        if isinstance(error, http.client.HTTPException):
            return "connection", f"{type(error).__name__}: {one_line(error, 120)}"
    text = str(exc)
    match = _URLOPEN_TEXT.search(text)
    if match:
        detail = _ERRNO_PREFIX.sub("", one_line(match.group(1), 120))
        return ("offline" if _OFFLINE_TEXTS.search(detail) else "connection"), detail
    match = _HTTP_TEXT.search(text)
    if match:
        return "http", f"HTTP {match.group(1)} {one_line(match.group(2), 60)}"
    for error in _chain(exc):
        if isinstance(error, OSError) and (
            error.errno in _WRITE_ERRNOS or error.filename is not None
        ):
            return "write", _reason(error)
    return "other", f"{type(exc).__name__}: {one_line(exc, 160)}"


def download_error(exc: BaseException, *, title: str, into: Path, by_hand: str) -> UserError:
    """One sentence for a failed download: what went wrong and how to get the files."""
    kind, detail = classify_download_failure(exc)
    head = f"downloading {title} into {into} failed"
    if kind == "offline":
        return UserError(f"{head}: no network connection ({detail}); {by_hand} or run with network")
    if kind == "connection":
        return UserError(
            f"{head}: the network connection failed ({detail}); {by_hand} or try again"
        )
    if kind == "http":
        return UserError(f"{head}: the server answered {detail}; {by_hand} or try again later")
    if kind == "write":
        return UserError(
            f"{head}: the files cannot be written there ({detail}); make the folder writable "
            f"and free some space, or {by_hand}"
        )
    return UserError(f"{head} ({detail}); {by_hand} or try again")


def _snapshot(paths: Sequence[Path], depth: int | None) -> set[str]:
    """Every entry at or under ``paths`` (``depth`` levels below each; None: all)."""
    seen: set[str] = set()
    for top in paths:
        if not os.path.lexists(top):
            continue
        seen.add(str(top))
        if top.is_symlink() or not top.is_dir():
            continue
        base = len(top.parts)
        for folder, dirs, files in os.walk(top):
            here = Path(folder)
            seen.update(str(here / name) for name in (*dirs, *files))
            if depth is not None and len(here.parts) - base + 1 >= depth:
                dirs.clear()
    return seen


def _remove(path: Path) -> None:
    """Delete a file, link or whole folder, best effort (cleanup must not mask the error)."""
    try:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink()
    except OSError:
        pass


def _remove_new(paths: Sequence[Path], before: set[str], depth: int | None) -> None:
    """Remove whatever exists at or under ``paths`` now but was not in ``before``."""
    for top in paths:
        if not os.path.lexists(top):
            continue
        if str(top) not in before:
            _remove(top)
            continue
        if top.is_symlink() or not top.is_dir():
            continue
        base = len(top.parts)
        for folder, dirs, files in os.walk(top):
            here = Path(folder)
            for name in list(dirs):
                if str(here / name) not in before:
                    _remove(here / name)
                    dirs.remove(name)
            for name in files:
                if str(here / name) not in before:
                    _remove(here / name)
            if depth is not None and len(here.parts) - base + 1 >= depth:
                dirs.clear()


@contextlib.contextmanager
def leftovers_removed_on_failure(
    root: Path, watched: Sequence[Path], *, depth: int | None = None
) -> Iterator[None]:
    """Remove what a failing block created at or under ``watched`` (and ``root``, if new).

    Why: a failed fetch leaves empty dataset folders and half-written archives that make
    the next attempt (or a human) believe the data is there. Only entries that did not
    exist before the block are removed; files that were already there are never touched.
    ``depth`` limits how deep pre-existing folders are searched (1: their direct entries).
    """
    if not os.path.lexists(root):
        watched = [_first_missing(root)[0]]  # everything under it will be new
    before = _snapshot(watched, depth)
    try:
        yield
    except BaseException:
        _remove_new(watched, before, depth)
        raise


@contextlib.contextmanager
def _socket_timeout(seconds: float) -> Iterator[None]:
    """A default socket timeout for the block, unless the process already set one."""
    previous = socket.getdefaulttimeout()
    if previous is None:
        socket.setdefaulttimeout(seconds)
    try:
        yield
    finally:
        socket.setdefaulttimeout(previous)


def fetch_quietly(
    fetch: Callable[[], object],
    *,
    title: str,
    root: Path,
    into: Path,
    watched: Sequence[Path],
    by_hand: str,
) -> None:
    """Run a library download quietly; on failure clean up and raise one UserError.

    ``watched`` are the paths the library writes (its dataset folder, its archive);
    whatever it created there is removed when it fails (see
    :func:`leftovers_removed_on_failure`). Its prints and progress bars go nowhere: on
    failure the UserError is the only output, and on success the files speak for
    themselves. ``by_hand`` is the manual alternative, "copy ... into ... by hand (...)".
    """
    sink = io.StringIO()
    try:
        with (
            leftovers_removed_on_failure(root, watched),
            contextlib.redirect_stdout(sink),
            contextlib.redirect_stderr(sink),
            _socket_timeout(DOWNLOAD_SOCKET_TIMEOUT),
        ):
            fetch()
    except UserError:
        raise
    except Exception as exc:  # network, HTTP, checksum, disk and import errors
        raise download_error(exc, title=title, into=into, by_hand=by_hand) from exc
