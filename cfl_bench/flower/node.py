"""``cfl-bench flower node``: one Flower SuperNode and its long-lived worker, supervised.

What a deployment runs on each client machine (docs/executors.md, "Flower deployment"). It
starts the worker (``flower.node_worker``) on a private local socket, waits until it
listens, then starts ``flower-supernode`` with ``--node-config "partition-id=K
cfl-worker='SOCKET'"`` so that the ClientApp (``flower.client_app``) hands every message to
the worker. The SuperNode's environment cuts Flower's polling and start-up where Flower lets
it be set: SuperExec polls for ClientApp tasks every ``FLWR_SUPEREXEC_TASK_POLL_INTERVAL`` s
(0.5 here, Flower's default 1 s; 0.05 s cost 0.3 of a core for 10 idle nodes), the runtime
installation of app dependencies is off, telemetry and the update check are off, and the
ClientApp process SuperExec starts per message is Flower's own, forked warm by the node's
*starter* (``flower.clientapp_process``): 1-2 s of CPU less per message.

A worker (or starter) that dies is restarted (a line says so); the next message finds no
state in a new worker, so the server sends the client's state again and the run goes on
(``node_work``). When the SuperNode exits, the helpers are stopped and the command exits
with the SuperNode's code; SIGTERM / SIGINT stop them all (and every process they started).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

import psutil

from cfl_bench.core.errors import UserError
from cfl_bench.flower import sockets

#: SuperExec's poll for ClientApp tasks (s) unless the environment sets it.
TASK_POLL_S = "0.5"

#: Seconds a new helper (worker, starter) may take to listen (the worker imports torch).
HELPER_START_S = 120.0


@dataclass(frozen=True)
class Helper:
    """A long-lived process of the node that listens on a local socket: the worker (the
    client's computation) or the starter (warm ClientApp processes)."""

    name: str
    module: str
    flag: str
    socket: Path

    def command(self) -> list[str]:
        return [sys.executable, "-m", self.module, self.flag, str(self.socket)]

    def start(self, env: dict[str, str]) -> subprocess.Popen[bytes]:
        """Start it and return once it listens; refuse in one line if it cannot."""
        proc = subprocess.Popen(self.command(), env=env)
        deadline = time.monotonic() + HELPER_START_S
        while not sockets.listening(self.socket):
            if proc.poll() is not None:
                raise UserError(
                    f"the node's {self.name} exited with code {proc.returncode} before "
                    f"listening on {self.socket}; see its error above."
                )
            if time.monotonic() > deadline:
                stop_tree([proc.pid])
                raise UserError(
                    f"the node's {self.name} did not listen within {HELPER_START_S:.0f} s."
                )
            time.sleep(0.05)
        return proc


@dataclass(frozen=True)
class NodeSpec:
    """One node: which SuperLink, which client, where its worker listens."""

    superlink: str
    partition: int
    socket: Path
    port: int
    root_certificates: str | None = None

    def supernode_command(self) -> list[str]:
        node_config = f"partition-id={self.partition} cfl-worker='{self.socket}'"
        tls = (
            ["--root-certificates", self.root_certificates]
            if self.root_certificates
            else ["--insecure"]
        )
        return [
            supernode_program(), *tls, "--superlink", self.superlink,
            "--port", str(self.port), "--node-config", node_config,
        ]  # fmt: skip

    def helpers(self, warm_clientapps: bool) -> list[Helper]:
        worker = Helper("worker", "cfl_bench.flower.node_worker", "--socket", self.socket)
        if not warm_clientapps:
            return [worker]
        starter = Helper(
            "starter",
            "cfl_bench.flower.clientapp_process",
            "--starter",
            starter_socket(self.socket),
        )
        return [worker, starter]


def supernode_program() -> str:
    """``flower-supernode`` of this environment (next to this Python, else on PATH)."""
    beside = Path(sys.executable).with_name("flower-supernode")
    return str(beside) if beside.exists() else shutil.which("flower-supernode") or str(beside)


def node_environment(base: dict[str, str], bin_dir: Path | None = None) -> dict[str, str]:
    """The SuperNode's and the helpers' environment (see the module docstring); with
    ``bin_dir``, its ``flwr-clientapp`` is found first."""
    env = dict(base)
    front = [str(bin_dir)] if bin_dir is not None else []
    front.append(str(Path(sys.executable).parent))
    env["PATH"] = os.pathsep.join([*front, env.get("PATH", "")])
    env.setdefault("FLWR_SUPEREXEC_TASK_POLL_INTERVAL", TASK_POLL_S)
    env["FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION"] = "1"
    env.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    env.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("OPENBLAS_NUM_THREADS", "1")  # the starter forks: no BLAS threads in it
    return env


def lean_clientapp_folder(folder: Path) -> Path | None:
    """A folder holding the node's ``flwr-clientapp`` (``clientapp_process.LAUNCHER``), or
    None when the installed Flower is not the release it mirrors."""
    from cfl_bench.flower.clientapp_process import launcher_text, mirrors_installed_flower

    if not mirrors_installed_flower():
        return None
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "flwr-clientapp"
    script.write_text(launcher_text())
    script.chmod(0o755)
    return folder


def stop_tree(pids: list[int]) -> None:
    """Terminate ``pids`` and all their descendants (kill what is left after 5 s)."""
    found: list[int] = []
    for pid in pids:
        try:
            root = psutil.Process(pid)
            found += [c.pid for c in root.children(recursive=True)] + [pid]
        except psutil.Error:
            continue
    stop(found)


def signal_each(pids: list[int], send: Callable[[psutil.Process], None]) -> list[psutil.Process]:
    """``send`` (``psutil.Process.terminate`` or ``.kill``) to each of ``pids`` still there;
    the processes it reached."""
    reached = []
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            send(proc)
            reached.append(proc)
        except psutil.Error:
            continue
    return reached


def stop(pids: list[int]) -> None:
    """Terminate ``pids`` (then kill what is left after 5 s)."""
    procs = signal_each(pids, psutil.Process.terminate)
    _, alive = psutil.wait_procs(procs, timeout=5)
    for proc in alive:
        try:
            proc.kill()
        except psutil.Error:
            continue
    psutil.wait_procs(alive, timeout=5)


def supervise(spec: NodeSpec, say: Callable[[str], None], bin_dir: Path | None) -> int:
    """Run the node until the SuperNode exits or a signal comes; its exit code."""
    from cfl_bench.flower.clientapp_process import STARTER_ENV

    helpers = spec.helpers(warm_clientapps=bin_dir is not None)
    env = node_environment(dict(os.environ), bin_dir)
    if len(helpers) > 1:
        env[STARTER_ENV] = str(helpers[1].socket)
    stopping: list[int] = []

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        stopping.append(signum)

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    procs = [helper.start(env) for helper in helpers]
    supernode = subprocess.Popen(spec.supernode_command(), env=env)
    say(f"node partition-id={spec.partition}: worker pid {procs[0].pid}, SuperNode pid "
        f"{supernode.pid}, SuperLink {spec.superlink}")  # fmt: skip
    try:
        while not stopping and supernode.poll() is None:
            for i, (helper, proc) in enumerate(zip(helpers, procs, strict=True)):
                if proc.poll() is not None:
                    say(f"the node's {helper.name} exited with code {proc.returncode}; "
                        f"restarting it")  # fmt: skip
                    procs[i] = helper.start(env)
            time.sleep(0.2)
        return 0 if stopping else int(supernode.returncode)
    finally:
        stop_tree([supernode.pid, *(proc.pid for proc in procs)])
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def check_node_options(
    superlink: str,
    partition: int,
    socket_path: str | None,
    port: int | None,
    root_certificates: str | None,
) -> None:
    """Refuse bad options in one line before anything starts (Flower would start the
    SuperNode and then fail, or retry a malformed address for ever)."""
    host, sep, link_port = superlink.rpartition(":")
    if not sep or not host or not link_port.isdigit() or not 0 < int(link_port) < 65536:
        raise UserError(
            f"--superlink '{superlink}' is not HOST:PORT (the SuperLink's Fleet API, port "
            "9092 by default); fix it."
        )
    if partition < 0:
        raise UserError(f"--partition-id must be 0 or more (got {partition}).")
    if port is not None and not 0 < port < 65536:
        raise UserError(f"--port must be between 1 and 65535 (got {port}).")
    if socket_path is not None:
        check_socket_option(socket_path)
    if root_certificates is not None:
        check_root_certificates(root_certificates)


def check_socket_option(socket_path: str) -> None:
    """Refuse a ``--socket`` the node's sockets cannot take without harm: its folder
    missing, or the path or the starter's ``PATH.starter`` already something other than a
    socket nothing listens on (``flower.sockets``: a user's file there was replaced by a
    socket and then deleted)."""
    if not Path(socket_path).absolute().parent.is_dir():
        raise UserError(f"--socket '{socket_path}': its folder does not exist; create it.")
    worker = socket_file(socket_path)
    starter = ("the node's starter socket (--socket + .starter)", starter_socket(worker))
    for role, path in (("--socket", worker), starter):
        problem = sockets.socket_problem(path)
        if problem is not None:
            raise UserError(
                f"{role} '{path}' {problem}; give --socket another path (a short new name in "
                "a folder of yours)."
            )


def socket_file(socket_path: str) -> Path:
    """Where the worker's socket is bound for ``--socket``: its folder resolved, its own
    name not (a symbolic link there is refused, never followed)."""
    path = Path(socket_path).absolute()
    return path.parent.resolve() / path.name


def check_root_certificates(root_certificates: str) -> None:
    """Refuse a ``--root-certificates`` that is not a file of PEM certificates (Flower
    printed a traceback and the node then hung); the standard library's parser decides."""
    if not Path(root_certificates).is_file():
        raise UserError(
            f"--root-certificates '{root_certificates}' is not a file; give the SuperLink's "
            "CA certificate (PEM), or leave the option out for an insecure connection."
        )
    try:
        ssl.create_default_context(cafile=root_certificates)
    except (ssl.SSLError, OSError, ValueError) as exc:
        # SSLError has ``reason``, OSError ``strerror``, a ValueError neither
        reason = (
            getattr(exc, "reason", None) or getattr(exc, "strerror", None) or type(exc).__name__
        )
        raise UserError(
            f"--root-certificates '{root_certificates}' holds no PEM certificate that can be "
            f"read ({str(reason).lower().replace('_', ' ')}); give the SuperLink's CA "
            "certificate (PEM, '-----BEGIN CERTIFICATE-----'), or leave the option out for an "
            "insecure connection."
        ) from None


def starter_socket(socket_path: Path) -> Path:
    """The starter's socket beside the worker's (``PATH.starter``)."""
    return socket_path.with_name(socket_path.name + ".starter")


def run_node(
    superlink: str,
    partition: int,
    socket_path: str | None,
    port: int | None,
    root_certificates: str | None,
) -> int:
    """``cfl-bench flower node``'s work: check the options, supervise, clean up."""
    check_node_options(superlink, partition, socket_path, port, root_certificates)
    scratch = Path(tempfile.mkdtemp(prefix="cfl-node-"))
    path = scratch / "worker.sock" if socket_path is None else socket_file(socket_path)
    spec = NodeSpec(superlink, partition, path, port or free_port(), root_certificates)
    try:
        bin_dir = lean_clientapp_folder(scratch / "bin")
        return supervise(spec, lambda text: print(text, flush=True), bin_dir)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def free_port() -> int:
    """A TCP port free on loopback now (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
