"""A Ray cluster of real nodes on this machine's loopback, owned by PID.

Why: ``tests/test_sweep_ray.py`` and ``bench/ray_sweep.py`` need the multi-node cluster a
``cfl-bench sweep --backend ray`` user has, without touching any other Ray on the machine.
``ray stop`` would stop every Ray process of the user; here each node is a ``ray start
--block`` child in its own process group, started with the CPUs asked for, and stopped by
signalling that group (``--block`` stops what it started when it ends).

The nodes get a private ``RAY_TMPDIR``, removed afterwards. Why: a head writes its address
to ``$RAY_TMPDIR/ray/ray_current_cluster`` (``/tmp/ray`` by default) and a cluster stopped
by signal leaves that file behind, after which any later ``ray.init()`` without an address
on the machine tries the dead address and hangs (measured: still waiting after 90 s).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence


def ray_env() -> dict[str, str]:
    """This environment without ``RAY_ADDRESS``, Ray's usage reporting off."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(RAY_USAGE_STATS_ENABLED="0", RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO="0")
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def ray_node(temp: str, *args: str) -> subprocess.Popen[bytes]:
    """``ray start ... --block`` as a child of ours, in its own process group, its Ray
    files under ``temp``."""
    command = [sys.executable, "-m", "ray.scripts.scripts", "start", "--block", *args]
    return subprocess.Popen(
        command,
        env={**ray_env(), "RAY_TMPDIR": temp},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def wait_for_nodes(address: str, count: int, seconds: float = 120.0) -> None:
    """Until the cluster at ``address`` has ``count`` live nodes (asked by a driver in a
    child process, so this process never joins the cluster)."""
    probe = (
        "import ray, sys; ray.init(address=sys.argv[1], logging_level='ERROR'); "
        "print(sum(n['Alive'] for n in ray.nodes()))"
    )
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        done = subprocess.run(
            [sys.executable, "-c", probe, address],
            env=ray_env(),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if done.returncode == 0 and done.stdout.strip().splitlines()[-1:] == [str(count)]:
            return
        time.sleep(1.0)
    raise RuntimeError(f"the Ray cluster at {address} did not reach {count} live nodes")


def stop(nodes: Sequence[subprocess.Popen[bytes]]) -> None:
    """SIGTERM each node's process group, the head last; SIGKILL what is left after 60 s."""
    for node in reversed(nodes):
        if node.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(node.pid, signal.SIGTERM)
    for node in nodes:
        try:
            node.wait(timeout=60)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(node.pid, signal.SIGKILL)
            node.wait()


@contextlib.contextmanager
def loopback_cluster(
    cpus: Sequence[int],
    dashboard_port: int | None = None,
    nodes: list[subprocess.Popen[bytes]] | None = None,
) -> Iterator[str]:
    """A head and ``len(cpus) - 1`` more nodes on 127.0.0.1, ``cpus[i]`` CPUs each and no
    GPU; yields the address ``127.0.0.1:PORT``; every node is stopped on exit. With
    ``dashboard_port`` the head serves Ray's dashboard and job server there (needs
    ``ray[default]``); ``nodes``, if given, receives each node's ``ray start`` process (the
    head first), for a caller that wants to take one away."""
    port = free_port()
    address = f"127.0.0.1:{port}"
    nodes = [] if nodes is None else nodes
    temp = tempfile.mkdtemp(prefix="ray-loopback-")
    if dashboard_port is None:
        dashboard: tuple[str, ...] = ("--include-dashboard=false",)
    else:
        dashboard = ("--include-dashboard=true", "--dashboard-host", "127.0.0.1")
        dashboard += ("--dashboard-port", str(dashboard_port))
    try:
        for i, count in enumerate(cpus):
            common = ("--num-cpus", str(count), "--num-gpus", "0", "--disable-usage-stats")
            where = ("--node-ip-address", "127.0.0.1")
            if i == 0:
                head = ("--head", "--port", str(port), *dashboard)
                nodes.append(ray_node(temp, *head, *where, *common))
            else:
                nodes.append(ray_node(temp, "--address", address, *where, *common))
            wait_for_nodes(address, i + 1)
        yield address
    finally:
        stop(nodes)
        shutil.rmtree(temp, ignore_errors=True)
