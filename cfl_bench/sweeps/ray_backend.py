"""Sweep points as Ray tasks: ``cfl-bench sweep --backend ray [--address ADDR]``.

Why Ray and not code of ours: a benchmark's daily work is many runs, and a Ray cluster
already schedules tasks by the resources they declare, across machines, retries them when
a worker or node is lost, and is what ``ray job submit`` and most university clusters
offer. The sweep stays the same program: it expands the grid, checks every point's names,
prepares its folder and bookkeeping, skips finished points and records every outcome as a
local sweep does (``sweep.scheduler``); only where a point runs changes.

Each point is one Ray task declaring ``--cpus-per-run`` CPUs (its torch threads, also its
``OMP_NUM_THREADS``) and ``--gpus-per-run`` GPUs. The task starts
``python -m cfl_bench.sweeps.point`` (``sweep.point``) in the sweep's working directory and
returns its exit code: the point runs through the same ``worker.run_point`` as locally, so
its records are the same, it takes the point's lock on the shared sweep folder, and an
interrupted attempt resumes from its checkpoint. The sweep folder must therefore be on a
file system every node sees at the same path (as on a cluster's shared home or scratch).

Retries: Ray re-runs a task whose worker or node died (``RETRIES`` times); the new attempt
resumes from the point's last checkpoint. A task that fails for good reads as a crashed
run: the sweep writes its failed summary with the tail of its log, as for a local child.
Ctrl-C cancels every running task (``ray.cancel(force=True)`` kills the worker, and the
point's process dies with it: ``worker.die_with_sweep``'s ``PR_SET_PDEATHSIG``).

Without ``--address`` Ray's own rule applies: ``RAY_ADDRESS`` (set by ``ray job submit``)
or, when unset, a Ray instance started on this machine for the sweep.
"""

from __future__ import annotations

import importlib
import os
import re
import socket
import subprocess
import sys
import warnings
from typing import Any

from cfl_bench.core.errors import UserError
from cfl_bench.sweeps import worker
from cfl_bench.sweeps.point import job_from_json, job_json

# How many times Ray re-runs a point whose worker or node was lost.
RETRIES = 3


def require_ray() -> Any:
    """The ``ray`` module, or one line saying how to install it."""
    try:
        import ray
    except ImportError:
        raise UserError(
            "--backend ray needs Ray: pip install 'ray>=2.40' (or pip install "
            "'cfl-bench[flower]', which brings it); or drop --backend ray."
        ) from None
    return ray


#: Seconds to wait for the cluster's address to accept a connection, and then to answer a
#: health check, before refusing it. Why: ``ray.init`` keeps retrying an address where
#: nothing listens, with a warning every few seconds (measured: still retrying after 2.5 min
#: for 127.0.0.1:1), and one where a server listens that is not Ray (measured: a silent
#: socket server or an HTTP server, still waiting after 40 s and 74 s).
REACH_SECONDS = 5.0

#: The address forms ``ray.init`` resolves itself (its documentation): ``local`` starts a
#: Ray instance on this machine; ``auto`` (like no address) takes ``RAY_ADDRESS`` or the
#: latest cluster started on this machine.
SELF_RESOLVED = ("auto", "local")

#: The standard gRPC health check (grpc.health.v1, the gRPC project's documented protocol):
#: a Ray cluster's GCS serves it, answering SERVING; the request message is empty.
HEALTH_CHECK = "/grpc.health.v1.Health/Check"
SERVING = b"\x08\x01"  # HealthCheckResponse{status: SERVING}, protobuf wire form

_HOST = re.compile(r"[A-Za-z0-9_.-]+|\[[0-9A-Fa-f:.]+(?:%[A-Za-z0-9_.-]+)?\]")
_SCHEME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")


def check_reachable(address: str | None) -> None:
    """Refuse, in one line and within seconds, a cluster address (``--address`` or else
    ``RAY_ADDRESS``) that ``ray.init`` would fail on after the sweep folder is written, or
    wait on for minutes: one not of a form Ray documents, one where nothing listens, and
    one where a server listens that does not answer as a Ray cluster. ``auto``, ``local``
    and none (a Ray instance on this machine) are Ray's own to resolve."""
    target, where = effective_address(address)
    if target is None:
        return
    scheme, host, port = split_address(target, where)
    if scheme not in (None, "ray"):
        return  # a client module of its own (Ray's module://inner form), found by split
    try:
        with socket.create_connection((host.strip("[]"), port), timeout=REACH_SECONDS):
            pass
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise UserError(
            f"no Ray cluster answers at {target} ({where}: {reason}); start it "
            f"(ray start --head) or fix {where}."
        ) from None
    if os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true"):
        return  # a TLS cluster: the plain check below cannot speak to it; Ray's own call will
    check_answers_as_ray(target, where, f"{host}:{port}", client=scheme == "ray")


def effective_address(address: str | None) -> tuple[str | None, str]:
    """The address ``ray.init(address=...)`` will use, and the option it came from; None
    when Ray resolves it itself. Ray's rule: ``RAY_ADDRESS`` replaces none and ``auto``."""
    env = os.environ.get("RAY_ADDRESS")
    if address is None or (address == "auto" and env):
        target, where = env, "RAY_ADDRESS"
    else:
        target, where = address, "--address"
    if target is None or target in SELF_RESOLVED or (not target and where == "RAY_ADDRESS"):
        return None, where
    return target, where


def split_address(target: str, where: str) -> tuple[str | None, str, int]:
    """``[scheme://]HOST:PORT`` as (scheme or None, HOST, PORT), or one line saying which
    forms a cluster address takes. A scheme other than ``ray`` names a Python module with
    Ray's ``ClientBuilder`` (Ray's ``module://inner`` form): it must be installed, and its
    inner address is its own (returned as ``""``, 0)."""
    forms = (
        "give HOST:PORT of the Ray head (its GCS, e.g. 127.0.0.1:6379, as `ray start "
        "--head` prints it), ray://HOST:PORT of its Ray Client server, auto or local"
    )
    scheme, sep, rest = target.partition("://")
    if not sep:
        scheme, rest = "", target
    elif not _SCHEME.fullmatch(scheme):
        raise UserError(f"{where} '{target}' is not a Ray cluster address; {forms}.")
    elif scheme in ("http", "https"):
        raise UserError(
            f"{where} '{target}' is a web address (Ray's dashboard, for `ray job submit`); a "
            f"sweep joins the cluster itself: {forms}."
        )
    elif scheme != "ray":
        check_client_module(scheme, target, where, forms)
        return scheme, "", 0
    host, colon, port = rest.rstrip("/").rpartition(":")
    if not colon or not _HOST.fullmatch(host) or not port.isdigit() or len(port) > 5:
        raise UserError(f"{where} '{target}' is not HOST:PORT; {forms}.")
    if not 0 < int(port) < 65536:
        raise UserError(f"{where} {target} has no valid port (1-65535); fix {where}.")
    return scheme or None, host, int(port)


def check_client_module(scheme: str, target: str, where: str, forms: str) -> None:
    """Ray reads ``module://inner`` as "import module, use its ``ClientBuilder``" (as Ray
    does, the module is imported): refuse a module that is missing or has none."""
    try:
        module = importlib.import_module(scheme)
    except Exception:  # any failure to import means the same to the user
        module = None
    if not hasattr(module, "ClientBuilder"):
        raise UserError(
            f"{where} '{target}' names '{scheme}', which is no installed Ray client module; "
            f"{forms}."
        )


def check_answers_as_ray(target: str, where: str, host_port: str, client: bool) -> None:
    """Refuse an address whose server does not answer the gRPC health check as Ray does:
    a cluster's GCS answers SERVING; its Ray Client server (``ray://``) answers
    UNIMPLEMENTED (it has no health service, but it speaks gRPC). A server that says
    nothing, or speaks another protocol (HTTP), is not Ray."""
    status, reply = grpc_health(host_port, REACH_SECONDS)
    if status == "OK" and (client or reply == SERVING):
        return
    if status == "UNIMPLEMENTED" and client:
        return
    if status in ("UNAUTHENTICATED", "PERMISSION_DENIED"):
        return  # a cluster with authentication: Ray's own call carries the token
    fix = f"give the address of a Ray cluster (ray start --head prints it) or fix {where}"
    if status == "UNIMPLEMENTED":
        fix = f"if it is a Ray Client server, write ray://{host_port}; else {fix}"
    if status == "OK":
        problem = "a Ray cluster that is not serving yet"
        fix = f"wait until `ray status --address {host_port}` answers, or {fix}"
    elif status == "DEADLINE_EXCEEDED":
        problem = f"a server that accepts connections but does not answer in {REACH_SECONDS:g} s"
    elif status == "UNIMPLEMENTED":
        problem = "a gRPC server that is not a Ray cluster's GCS"
    else:
        problem = f"a server that does not speak Ray's protocol (gRPC: {status})"
    raise UserError(f"{where} {target} is {problem}, not a Ray cluster; {fix}.")


def grpc_health(host_port: str, seconds: float) -> tuple[str, bytes | None]:
    """The gRPC health check's status name at ``host_port``, and its reply when OK; within
    ``seconds`` (``DEADLINE_EXCEEDED`` when the server says nothing in time). Without
    grpcio (``pip install ray`` alone does not bring it), gRPC's transport handshake only
    (``http2_handshake``): a server that completes it passes as OK and SERVING."""
    try:
        import grpc
    except ImportError:
        status = http2_handshake(host_port, seconds)
        return status, (SERVING if status == "OK" else None)
    with grpc.insecure_channel(host_port) as channel:
        # no (de)serializers: bytes in, bytes out
        check: grpc.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(HEALTH_CHECK)
        try:
            return "OK", check(b"", timeout=seconds)
        except grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else None
            return (code.name if code is not None else "UNKNOWN"), None


#: An HTTP/2 client's connection preface and an empty SETTINGS frame (RFC 9113, 3.4).
HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"


def http2_handshake(host_port: str, seconds: float) -> str:
    """``OK`` when the server at ``host_port`` answers an HTTP/2 preface with its SETTINGS
    frame (every gRPC server does, a Ray GCS and Ray Client server included), within
    ``seconds``; ``DEADLINE_EXCEEDED`` when it says nothing; ``UNAVAILABLE`` otherwise."""
    host, _, port = host_port.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=seconds) as conn:
            conn.sendall(HTTP2_PREFACE)
            header = conn.recv(9)
    except TimeoutError:
        return "DEADLINE_EXCEEDED"
    except OSError:
        return "UNAVAILABLE"
    return "OK" if len(header) >= 4 and header[3] == 4 else "UNAVAILABLE"


def point_env(threads: int) -> dict[str, str]:
    """The point process's environment: this one without ``RAY_ADDRESS`` (a run that starts
    Ray itself, a Flower simulation, must not join the sweep's cluster) and with its
    thread count for OpenMP and MKL."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    return env


def run_point_process(job_text: str, cwd: str) -> int:
    """The body of a point's Ray task: the point in its own interpreter; its exit code."""
    job = job_from_json(job_text)
    command = [sys.executable, "-m", "cfl_bench.sweeps.point", job_text]
    return subprocess.run(command, cwd=cwd, env=point_env(job.threads), check=False).returncode


def check_placeable(ray: Any, cpus: int, gpus: float, local: bool) -> None:
    """A point's task needs one node with ``cpus`` CPUs and ``gpus`` GPUs; Ray keeps a task
    that no node can hold pending for ever (measured: a sweep with --cpus-per-run 64 on a
    2-core machine waited silently). The Ray instance a sweep starts on this machine cannot
    grow: refuse there; a cluster may add nodes (an autoscaler): say so and go on."""
    sizes = [node["Resources"] for node in ray.nodes() if node.get("Alive")]
    if any(r.get("CPU", 0) >= cpus and r.get("GPU", 0) >= gpus for r in sizes):
        return
    largest: dict[str, Any] = max(
        sizes, key=lambda r: (r.get("CPU", 0), r.get("GPU", 0)), default={}
    )
    have = f"{largest.get('CPU', 0):g} CPUs and {largest.get('GPU', 0):g} GPUs"
    want = f"--cpus-per-run {cpus} and --gpus-per-run {gpus:g}"
    if local:
        ray.shutdown()
        raise UserError(
            f"this machine's Ray has {have}, too few for a point's {want}; lower them, or "
            "give --address of a cluster with a node that large."
        )
    print(
        f"note: no node of the Ray cluster has room for a point's {want} now (the largest "
        f"has {have}); the points wait until such a node joins (Ctrl-C stops the sweep).",
        file=sys.stderr,
        flush=True,
    )


class RayBackend:
    """The sweep's ``Backend`` on a Ray cluster (``sweep.launcher.Backend``)."""

    def __init__(self, address: str | None, cpus_per_run: int, gpus_per_run: float) -> None:
        self.ray = require_ray()
        self.cpus = cpus_per_run
        try:
            with warnings.catch_warnings():  # Ray 2.5x's tip about a future default
                warnings.simplefilter("ignore", FutureWarning)
                self.ray.init(address=address, logging_level="ERROR", log_to_driver=False)
        except ConnectionError as exc:
            raise UserError(
                f"could not reach the Ray cluster at {address or 'RAY_ADDRESS'}: "
                f"{str(exc).rstrip('. ')}; "
                "start it (ray start --head) or fix --address."
            ) from None
        local = address is None and not os.environ.get("RAY_ADDRESS")
        check_placeable(self.ray, cpus_per_run, gpus_per_run, local)
        task = self.ray.remote(run_point_process)
        self.task = task.options(num_cpus=cpus_per_run, num_gpus=gpus_per_run, max_retries=RETRIES)
        self.cwd = os.getcwd()

    def threads(self, jobs: int, requested: int | None) -> int:
        """The grid's ``threads`` if it sets one, else the CPUs each task holds."""
        return requested if requested is not None else self.cpus

    def start(self, job: worker.RunJob) -> Any:
        return self.task.remote(job_json(job), self.cwd)

    def wait(self, handles: list[Any], timeout: float) -> list[Any]:
        ready, _ = self.ray.wait(handles, num_returns=len(handles), timeout=timeout)
        return list(ready)

    def exit_code(self, handle: Any) -> int | None:
        try:
            return int(self.ray.get(handle))
        except self.ray.exceptions.RayError:  # lost for good after the retries
            return None

    def kill(self, handle: Any) -> None:
        self.ray.cancel(handle, force=True)

    def describe(self, handle: Any) -> dict[str, Any]:
        return {"ray_task": handle.task_id().hex()[:16]}

    def close(self) -> None:
        """Disconnect from the cluster (and stop a Ray instance the sweep started)."""
        self.ray.shutdown()
