"""The local socket between a node's ClientApp and its long-lived worker: one request and
one reply per connection, each a length-prefixed pickle. Imports no torch (the ClientApp
process starts per message; see ``flower.client_app``).

Why pickle: both ends are this package on the same machine and user (the socket file is
private to the user, mode 0600), and Flower's records pickle exactly; the alternative, Flower's
internal protobuf serialisation, is not a public API.

Why the caller retries: the node's supervisor (``cfl-bench flower node``) restarts a worker
that died, so a missing socket or a connection cut before the reply means "wait for the new
worker and ask again" until ``wait_s`` has passed. Asking again is safe: the new worker holds
no client state, so it answers "stale" and the server sends the state (``node_work``).
"""

from __future__ import annotations

import pickle
import socket
import struct
import time
from typing import Any

HEADER = struct.Struct("!Q")

#: Seconds a ClientApp waits for its node's worker (a restart imports torch: a few seconds).
WORKER_WAIT_S = 120.0


def send_frame(sock: socket.socket, data: bytes) -> None:
    sock.sendall(HEADER.pack(len(data)))
    sock.sendall(data)


def recv_exact(sock: socket.socket, size: int) -> bytes:
    chunks, left = [], size
    while left:
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            raise ConnectionError("the connection closed mid-frame")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def recv_frame(sock: socket.socket) -> bytes:
    (size,) = HEADER.unpack(recv_exact(sock, HEADER.size))
    return recv_exact(sock, size)


def call_once(path: str, request: Any) -> Any:
    """Send ``request`` to the worker at ``path``; its reply (raises ``OSError`` when the
    worker is not there or went away before replying)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(path)
        send_frame(sock, pickle.dumps(request, protocol=pickle.HIGHEST_PROTOCOL))
        return pickle.loads(recv_frame(sock))


def call(path: str, request: Any, wait_s: float = WORKER_WAIT_S) -> Any:
    """``call_once``, again every 0.2 s while the worker is missing, up to ``wait_s``."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return call_once(path, request)
        except OSError as exc:
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"the node's worker at {path} did not answer within {wait_s:.0f} s "
                    f"({exc}); is `cfl-bench flower node` running for this SuperNode?"
                ) from None
            time.sleep(0.2)
