"""``python -m cfl_bench.flower.node_worker --socket PATH``: a node's long-lived worker.

It serves the node's ClientApp (``flower.client_app``), one message per connection on a
local socket: torch is imported once, the run's client side (model, strategy, the node's
data shard) is built once per run, and the client's state stays in memory between messages
(for the two latest runs); only its token is checked (``node_work``: a worker that
restarted holds no state and answers "stale", so the server sends it). Started and
restarted by ``cfl-bench flower node``; it exits on SIGTERM or SIGINT and removes its socket
file (only the socket it made: ``flower.sockets``).
"""

from __future__ import annotations

import argparse
import pickle
import signal
import socket
import traceback
from pathlib import Path
from types import FrameType
from typing import Any

from cfl_bench.flower import node_work, sockets, wire


class Worker:
    """Serves a node's ClientApp; the client states live in ``node_work``'s runtimes."""

    holder = node_work.Nowhere()

    def reply(self, request: Any) -> tuple[str, Any]:
        """``("ok", content)`` or ``("error", text)`` for one ClientApp request."""
        kind, content, run_config, partition = request
        try:
            return "ok", node_work.handle(kind, content, run_config, partition, self.holder)
        except Exception as exc:  # the ClientApp turns it into Flower's error reply
            traceback.print_exc()
            return "error", f"{type(exc).__name__}: {exc}"

    def serve(self, listener: socket.socket) -> None:
        while True:
            conn, _ = listener.accept()
            with conn:
                try:
                    request = pickle.loads(wire.recv_frame(conn))
                    reply = self.reply(request)
                    wire.send_frame(conn, pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL))
                except (ConnectionError, BrokenPipeError):
                    continue  # the ClientApp went away; it asks again if it still cares


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--socket", required=True, type=Path)
    args = parser.parse_args(argv)
    import torch  # noqa: F401  (before the socket exists: the first message finds it loaded)

    listener, identity = sockets.bind_own(args.socket, backlog=16)

    def stop(_signum: int, _frame: FrameType | None) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        Worker().serve(listener)
    finally:
        listener.close()
        sockets.remove_own(args.socket, identity)  # only the socket it made


if __name__ == "__main__":
    main()
