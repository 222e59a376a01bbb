"""``flwr-clientapp`` for the nodes of ``cfl-bench flower node``: Flower's own ClientApp
process (``flwr.supernode.runtime.run_clientapp``, the same arguments, the same message
path to the SuperNode), started warm.

Why: the SuperNode's SuperExec starts one ``flwr-clientapp`` process per message. Flower's
script imports ``flwr.supernode.cli``, whose ``__init__`` also imports the SuperNode server
(SQLAlchemy, Alembic, FastAPI): 1.9 s of CPU per message on this machine; ``run_clientapp``
alone still costs 1.0 s. With ten nodes on two cores that is 5-10 s of every message phase,
more than everything else in it (measured: the ClientApps of a phase reached the worker
7-9 s after they started). So a node keeps a *starter* (:func:`serve_starter`, started
beside the worker by ``cfl-bench flower node``) that has imported ``run_clientapp`` and the
ClientApp's modules once; the ``flwr-clientapp`` SuperExec finds first on the node's
``PATH`` is :data:`LAUNCHER`, a standard-library script that asks the starter to fork a
child, which runs ``run_clientapp`` with the launcher's arguments, and exits with the
child's exit code (SIGTERM and SIGINT are passed on to the child). Without a starter the
launcher runs :func:`main` itself: the same call, cold.

Only for the Flower release this mirrors (:data:`MIRRORED`): the argument parser and the call
are those of ``flwr.supernode.cli.flwr_clientapp``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import struct
import sys
from pathlib import Path

from cfl_bench.flower import sockets

#: The Flower release whose ``flwr_clientapp`` this mirrors (major.minor).
MIRRORED = "1.42"

#: The environment variable naming the node's starter socket (set by ``cfl-bench flower node``).
STARTER_ENV = "CFL_CLIENTAPP_STARTER"

#: The node's ``flwr-clientapp``: standard library only (it starts per message).
LAUNCHER = """\
#!{python}
# flwr-clientapp of a cfl-bench node (cfl_bench/flower/clientapp_process.py): the node's
# starter forks Flower's ClientApp process warm; this process waits for its exit code.
import json, os, signal, socket, struct, sys

path = os.environ.get("{env}", "")
try:
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(path)
except OSError:
    from cfl_bench.flower.clientapp_process import main

    sys.exit(main())
data = json.dumps(sys.argv).encode()
conn.sendall(struct.pack("!Q", len(data)) + data)


def word():
    got = b""
    while len(got) < 8:
        chunk = conn.recv(8 - len(got))
        if not chunk:
            return None
        got += chunk
    return struct.unpack("!q", got)[0]


child = word()
if child is None:
    sys.exit(1)
for signum in (signal.SIGTERM, signal.SIGINT):
    signal.signal(signum, lambda s, _f: os.kill(child, s))
code = word()
sys.exit(1 if code is None else code)
"""


def mirrors_installed_flower() -> bool:
    """Whether the installed Flower is the release this script mirrors."""
    from importlib.metadata import version

    return ".".join(version("flwr").split(".")[:2]) == MIRRORED


def launcher_text() -> str:
    return LAUNCHER.replace("{python}", sys.executable).replace("{env}", STARTER_ENV)


def main() -> int:
    """Flower's ``flwr_clientapp()``: parse the arguments, run one ClientApp; exit code."""
    from flwr.common.args import add_args_flwr_app_common, try_obtain_flwr_app_token
    from flwr.supercore.tls import validate_and_resolve_root_certificates
    from flwr.supernode.runtime.run_clientapp import run_clientapp

    parser = argparse.ArgumentParser(description="Run a Flower ClientApp")
    parser.add_argument("--runtime-api-address", dest="runtime_api_address", required=True)
    add_args_flwr_app_common(parser=parser)
    args = parser.parse_args()
    run_clientapp(
        runtime_api_address=args.runtime_api_address,
        token=try_obtain_flwr_app_token(args),
        insecure=args.insecure,
        certificates=validate_and_resolve_root_certificates(args.root_certificates, args.insecure),
        parent_pid=args.parent_pid,
        runtime_dependency_install=args.runtime_dependency_install,
    )
    return 0


def read_argv(conn: socket.socket) -> list[str]:
    header = b""
    while len(header) < 8:
        chunk = conn.recv(8 - len(header))
        if not chunk:
            raise ConnectionError("the launcher went away")
        header += chunk
    (size,) = struct.unpack("!Q", header)
    data = b""
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            raise ConnectionError("the launcher went away")
        data += chunk
    return [str(a) for a in json.loads(data)]


def run_child(conn: socket.socket, argv: list[str]) -> None:
    """In the forked child: tell the launcher who runs, run the ClientApp, report, exit."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    code = 1
    try:
        conn.sendall(struct.pack("!q", os.getpid()))
        sys.argv = argv
        code = main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # the launcher exits 1; the traceback goes to the node's log
        import traceback

        traceback.print_exc()
    finally:
        try:
            conn.sendall(struct.pack("!q", code))
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)


def serve_starter(path: str) -> None:
    """Import what a ClientApp needs once, then fork one child per launcher."""
    # run_clientapp's HTTP client imports httpcore (and with it anyio, trio, attrs classes)
    # only when it connects: 1 s of CPU per ClientApp unless done here.
    import httpcore  # noqa: F401
    import httpx
    from flwr.common.args import add_args_flwr_app_common  # noqa: F401
    from flwr.supercore.tls import validate_and_resolve_root_certificates  # noqa: F401
    from flwr.supernode.runtime.run_clientapp import run_clientapp  # noqa: F401

    import cfl_bench.flower.client_app  # noqa: F401  (the app's module imports it)

    httpx.Client().close()

    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
    signal.signal(signal.SIGTERM, lambda _s, _f: sys.exit(0))
    listener, identity = sockets.bind_own(Path(path), backlog=64)
    try:
        while True:
            conn, _ = listener.accept()
            try:
                argv = read_argv(conn)
            except (OSError, ValueError):
                conn.close()
                continue
            if os.fork() == 0:
                listener.close()
                run_child(conn, argv)
            conn.close()
    finally:
        listener.close()
        sockets.remove_own(Path(path), identity)  # only the socket it made


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--starter":
        serve_starter(sys.argv[2])
    else:
        sys.exit(main())
