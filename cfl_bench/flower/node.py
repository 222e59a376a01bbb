"""``cfl-bench flower node``: one Flower SuperNode and its long-lived worker, supervised.

What a deployment runs on each client machine (docs/executors.md, "Flower deployment"). It
starts the worker (``flower.node_worker``) on a private local socket, waits until it
listens, then starts ``flower-supernode`` with ``--node-config "partition-id=K
cfl-worker='SOCKET'"`` so that the ClientApp (``flower.client_app``) hands every message to
the worker. The SuperNode's environment cuts Flower's polling and start-up where Flower
lets it be set: SuperExec polls for ClientApp tasks every ``FLWR_SUPEREXEC_TASK_POLL_INTERVAL``
s (0.05 here, Flower's default 1 s), the runtime installation of app dependencies is off,
telemetry and the update check are off, and the ClientApp process SuperExec starts per
message is Flower's own minus an import of 0.9 s of CPU (``flower.clientapp_process``).

A worker that dies is restarted (a line says so); the next message finds no state in it, so
the server sends the client's state again and the run goes on (``node_work``). When the
SuperNode exits, the worker is stopped and the command exits with the SuperNode's code;
SIGTERM / SIGINT stop both (and every process they started).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

import psutil

from cfl_bench.errors import UserError

#: SuperExec's poll for ClientApp tasks (s) unless the environment sets it.
TASK_POLL_S = "0.5"

#: Seconds a new worker may take to listen (it imports torch first).
WORKER_START_S = 120.0


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

    def worker_command(self) -> list[str]:
        return [sys.executable, "-m", "cfl_bench.flower.node_worker", "--socket", str(self.socket)]


def supernode_program() -> str:
    """``flower-supernode`` of this environment (next to this Python, else on PATH)."""
    beside = Path(sys.executable).with_name("flower-supernode")
    return str(beside) if beside.exists() else shutil.which("flower-supernode") or str(beside)


def node_environment(base: dict[str, str], bin_dir: Path | None = None) -> dict[str, str]:
    """The SuperNode's and the worker's environment (see the module docstring); with
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
    return env


def lean_clientapp_folder(folder: Path) -> Path | None:
    """A folder holding ``flwr-clientapp`` = ``flower.clientapp_process`` for this Python,
    or None when the installed Flower is not the release that script mirrors."""
    from cfl_bench.flower.clientapp_process import mirrors_installed_flower

    if not mirrors_installed_flower():
        return None
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "flwr-clientapp"
    script.write_text(
        f"#!{sys.executable}\nfrom cfl_bench.flower.clientapp_process import main\n\nmain()\n"
    )
    script.chmod(0o755)
    return folder


def listening(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        return s.connect_ex(str(path)) == 0


def start_worker(spec: NodeSpec, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """Start the worker and return once it listens; refuse in one line if it cannot."""
    worker = subprocess.Popen(spec.worker_command(), env=env)
    deadline = time.monotonic() + WORKER_START_S
    while not listening(spec.socket):
        if worker.poll() is not None:
            raise UserError(
                f"the node's worker exited with code {worker.returncode} before listening on "
                f"{spec.socket}; see its error above."
            )
        if time.monotonic() > deadline:
            stop_tree([worker.pid])
            raise UserError(f"the node's worker did not listen within {WORKER_START_S:.0f} s.")
        time.sleep(0.05)
    return worker


def stop_tree(pids: list[int]) -> None:
    """Terminate ``pids`` and all their descendants (kill what is left after 5 s)."""
    procs: list[psutil.Process] = []
    for pid in pids:
        try:
            root = psutil.Process(pid)
            procs += [*root.children(recursive=True), root]
        except psutil.Error:
            continue
    for proc in procs:
        try:
            proc.terminate()
        except psutil.Error:
            continue
    _, alive = psutil.wait_procs(procs, timeout=5)
    for proc in alive:
        try:
            proc.kill()
        except psutil.Error:
            continue


def supervise(spec: NodeSpec, say: Callable[[str], None], bin_dir: Path | None) -> int:
    """Run the node until the SuperNode exits or a signal comes; its exit code."""
    env = node_environment(dict(os.environ), bin_dir)
    stopping: list[int] = []

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        stopping.append(signum)

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    worker = start_worker(spec, env)
    supernode = subprocess.Popen(spec.supernode_command(), env=env)
    say(f"node partition-id={spec.partition}: worker pid {worker.pid}, SuperNode pid "
        f"{supernode.pid}, SuperLink {spec.superlink}")  # fmt: skip
    try:
        while not stopping and supernode.poll() is None:
            if worker.poll() is not None:
                say(f"the node's worker exited with code {worker.returncode}; restarting it")
                worker = start_worker(spec, env)
            time.sleep(0.2)
        return 0 if stopping else int(supernode.returncode)
    finally:
        stop_tree([supernode.pid, worker.pid])
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def run_node(
    superlink: str,
    partition: int,
    socket_path: str | None,
    port: int | None,
    root_certificates: str | None,
) -> int:
    """``cfl-bench flower node``'s work: check the options, supervise, clean up."""
    if partition < 0:
        raise UserError(f"--partition-id must be 0 or more (got {partition}).")
    if socket_path is not None and not Path(socket_path).resolve().parent.is_dir():
        raise UserError(f"--socket '{socket_path}': its folder does not exist; create it.")
    scratch = Path(tempfile.mkdtemp(prefix="cfl-node-"))
    path = scratch / "worker.sock" if socket_path is None else Path(socket_path).resolve()
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
