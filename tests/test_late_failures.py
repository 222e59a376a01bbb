"""Issue 39, section 3: inputs that hung, or failed late with a traceback, now answer at once.

Four classes, each through the real command line in a fresh process with a timeout (a hang
fails here instead of waiting), except addresses whose text alone is wrong: no connection is
tried for them, so they go through the same entry point (``cfl_bench.cli.main``) in this
process, where going on to join Ray fails at once (``refused_here``):

- a Ray cluster address (``sweep --backend ray``, ``--address`` or ``RAY_ADDRESS``) where a
  server listens that is not Ray: refused within seconds (it hung for minutes);
- an address not of a form Ray documents (``bogus``, ``:``, ``garbage``): refused before the
  sweep folder is written (a traceback after it was);
- a YAML file nested thousands of levels deep, in any style, for every command that reads
  YAML: refused in one line (a RecursionError traceback);
- stdout a closed pipe (``| head -c1``): a line on stderr saying what happened and how to
  resume, exit 141, and the rerun resumes (the run stopped with exit 1 and said nothing).

Refusals: exit 2, one line naming the problem and the fix, no traceback, nothing written
under the test folder, its pre-existing file byte-identical.
"""

from __future__ import annotations

import contextlib
import http.server
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import pytest

from cfl_bench.core.errors import UserError
from cfl_bench.sweeps import ray_backend
from tests.cli_helpers import main_here
from tests.sweep_helpers import in_process
from tests.test_bad_inputs_classes import HANG_SECONDS, REPO, TINY, cli, digest, listing

OUTPUT_CLOSED = 141  # cfl_bench.cli.OUTPUT_CLOSED: 128 + SIGPIPE


def refused(args: list[str], root: Path, *fragments: str, env: dict[str, str] | None = None):
    """Run the CLI in ``root`` (which holds one file of the user's) and check the refusal:
    exit 2, one line holding every fragment, nothing written, the file unchanged."""
    (root / "keep.txt").write_text("the user's own file\n")
    before, files = listing(root), digest(root)
    started = time.monotonic()
    result = run_cli(args, root, env)
    elapsed = time.monotonic() - started
    text = result.stderr.decode("utf-8", "replace") + result.stdout.decode("utf-8", "replace")
    line = one_line_refusal(result.returncode, text, *fragments)
    assert listing(root) == before and digest(root) == files
    return line, elapsed


def one_line_refusal(code: int | None, text: str, *fragments: str) -> str:
    """Exit 2 and one line (no traceback) holding every fragment; that line."""
    lines = [line for line in text.splitlines() if line.strip()]
    assert code == 2, text
    assert "Traceback" not in text and len(lines) == 1, text
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def refused_here(
    args: list[str],
    root: Path,
    here: tuple[pytest.MonkeyPatch, pytest.CaptureFixture[str]],
    *fragments: str,
    env: dict[str, str] | None = None,
) -> str:
    """``refused``, for an address whose text alone is wrong, through the command line's
    entry point in this process (``here``: the test's monkeypatch and capsys), in ``root``
    with ``env`` set. Why not a fresh process: no connection is tried, so the refusal
    cannot hang, and a process start costs more than the check. A sweep that goes on to
    join Ray fails at once (a fresh process joined, or hung, there)."""
    monkeypatch, capsys = here

    def joined(*args: object, **kwargs: object) -> None:
        raise AssertionError("the sweep went on to join Ray: the address was not refused")

    monkeypatch.setattr(ray_backend, "RayBackend", joined)
    (root / "keep.txt").write_text("the user's own file\n")
    before, files = listing(root), digest(root)
    # run from root: a file written relative to the working folder shows too
    result = main_here(args, root, monkeypatch, capsys, env=env)
    line = one_line_refusal(result.returncode, result.stderr + result.stdout, *fragments)
    assert listing(root) == before and digest(root) == files
    return line


def run_cli(
    args: list[str], cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    if env is None:
        return cli(args, cwd)
    full = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), **env}
    command = [sys.executable, "-m", "cfl_bench.cli", *args]
    return subprocess.run(command, cwd=cwd, env=full, capture_output=True, timeout=HANG_SECONDS)


def ray_sweep(root: Path, *address: str) -> list[str]:
    return ["sweep", "--out", str(root / "sw"), "--backend", "ray", *address, *TINY]


# -- 1. a listening server that is not Ray -------------------------------------------------
@contextlib.contextmanager
def silent_server() -> Iterator[int]:
    """A TCP server on loopback that accepts every connection and never says a word."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            with contextlib.suppress(OSError):
                held.append(server.accept()[0])

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield int(server.getsockname()[1])
    finally:
        stop.set()
        thread.join()
        for conn in held:
            conn.close()
        server.close()


@contextlib.contextmanager
def http_server() -> Iterator[int]:
    """An HTTP server on loopback (answers, but not in Ray's protocol)."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()


@contextlib.contextmanager
def grpc_server(health: bytes | None) -> Iterator[int]:
    """A gRPC server on loopback: with ``health``, it answers the standard health check
    with those bytes (as a Ray GCS answers SERVING); without, it has no health service (as
    a Ray Client server)."""
    import grpc

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    if health is not None:
        answer = grpc.unary_unary_rpc_method_handler(lambda request, context: health)
        handler = grpc.method_handlers_generic_handler("grpc.health.v1.Health", {"Check": answer})
        server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield port
    finally:
        server.stop(None)


SERVERS = {"silent": silent_server, "http": http_server}


@pytest.mark.parametrize("scheme", ["", "ray://"])
@pytest.mark.parametrize("kind", sorted(SERVERS))
def test_a_listening_server_that_is_not_ray_is_refused_within_seconds(
    kind: str, scheme: str, tmp_path: Path
) -> None:
    """It passed the connection check and then hung for minutes inside ray.init."""
    with SERVERS[kind]() as port:
        address = f"{scheme}127.0.0.1:{port}"
        line, elapsed = refused(
            ray_sweep(tmp_path, "--address", address), tmp_path, address, "not a Ray cluster"
        )
    assert "fix --address" in line
    assert elapsed < 20, f"{elapsed:.1f} s"


def test_ray_address_of_a_server_that_is_not_ray_is_refused_too(tmp_path: Path) -> None:
    with silent_server() as port:
        env = {"RAY_ADDRESS": f"127.0.0.1:{port}"}
        line, elapsed = refused(ray_sweep(tmp_path), tmp_path, "RAY_ADDRESS", env=env)
    assert "does not answer in 5 s, not a Ray cluster" in line and elapsed < 20


def test_the_health_check_tells_a_ray_gcs_and_its_client_server_from_other_servers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Stand-ins for the two Ray servers (a real cluster passes in tests/test_sweep_ray.py):
    a GCS answers the gRPC health check SERVING, a Ray Client server (``ray://``) has no
    health service but speaks gRPC; other answers are refused, naming the likely fix."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with grpc_server(ray_backend.SERVING) as port:
        ray_backend.check_reachable(f"127.0.0.1:{port}")
    with grpc_server(None) as port:
        ray_backend.check_reachable(f"ray://127.0.0.1:{port}")
        with pytest.raises(UserError, match=r"if it is a Ray Client server, write ray://127"):
            ray_backend.check_reachable(f"127.0.0.1:{port}")
    with grpc_server(b"\x08\x02") as port, pytest.raises(UserError, match="not serving yet"):
        ray_backend.check_reachable(f"127.0.0.1:{port}")


# -- 2. an address not of a form Ray documents ---------------------------------------------
BAD_ADDRESSES = {
    "bogus": "is not HOST:PORT",
    ":": "is not HOST:PORT",
    "": "is not HOST:PORT",
    "localhost:": "is not HOST:PORT",
    ":6379": "is not HOST:PORT",
    "a:b:c": "'a:b:c' is not HOST:PORT",
    "::1:6379": "is not HOST:PORT",
    "host name:6379": "is not HOST:PORT",
    "127.0.0.1:x": "is not HOST:PORT",
    "ray://h": "is not HOST:PORT",
    "ray://:": "is not HOST:PORT",
    "://h:1": "is not a Ray cluster address",
    "http://127.0.0.1:8265": "is a web address (Ray's dashboard",
    "nosuchmodule://h:1": "no installed Ray client module",
    "os://h:1": "no installed Ray client module",
    "127.0.0.1:0": "has no valid port (1-65535)",
    "127.0.0.1:65536": "has no valid port (1-65535)",
}


@pytest.fixture
def here(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> tuple[pytest.MonkeyPatch, pytest.CaptureFixture[str]]:
    """What ``refused_here`` runs the command line with."""
    return monkeypatch, capsys


@pytest.mark.parametrize("address", sorted(BAD_ADDRESSES))
def test_an_address_not_of_a_documented_form_is_refused_before_anything(
    address: str, tmp_path: Path, here: tuple[pytest.MonkeyPatch, pytest.CaptureFixture[str]]
) -> None:
    """``bogus`` and ``:`` passed the old check and failed in ray.init after the sweep
    folder was written, with a traceback."""
    args = ray_sweep(tmp_path, "--address", address)
    line = refused_here(args, tmp_path, here, "--address", BAD_ADDRESSES[address])
    if "HOST:PORT" in BAD_ADDRESSES[address]:
        assert "ray://HOST:PORT of its Ray Client server, auto or local" in line


@pytest.mark.parametrize("value", ["garbage", ":", "ray://", "localhost:abc"])
def test_ray_address_not_of_a_documented_form_is_refused_too(
    value: str, tmp_path: Path, here: tuple[pytest.MonkeyPatch, pytest.CaptureFixture[str]]
) -> None:
    env = {"RAY_ADDRESS": value}
    refused_here(ray_sweep(tmp_path), tmp_path, here, "RAY_ADDRESS", "is not HOST:PORT", env=env)
    # --address auto takes RAY_ADDRESS too (Ray's rule), and is checked the same way
    auto = ray_sweep(tmp_path, "--address", "auto")
    refused_here(auto, tmp_path, here, "RAY_ADDRESS", env=env)


def test_the_forms_ray_resolves_itself_are_left_to_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """``auto``, ``local`` and none (with an empty RAY_ADDRESS, which Ray ignores): no
    connection is tried, no refusal; ``--address local`` ignores RAY_ADDRESS, as Ray does."""
    monkeypatch.setenv("RAY_ADDRESS", "")
    for address in (None, "auto", "local"):
        ray_backend.check_reachable(address)
    monkeypatch.setenv("RAY_ADDRESS", "garbage")
    ray_backend.check_reachable("local")
    monkeypatch.setenv("RAY_ADDRESS", "local")
    ray_backend.check_reachable(None)


# -- 3. YAML nested thousands of levels deep -----------------------------------------------
def nested_block_mapping(depth: int) -> str:
    return "".join(f"{'  ' * i}k{i}:\n" for i in range(depth)) + "  " * depth + "x\n"


def nested_block_sequence(depth: int) -> str:
    return "seed:\n" + "".join(f"{'  ' * i}-\n" for i in range(1, depth)) + "  " * depth + "- 1\n"


DEEP = {
    "flow list": "[" * 5000 + "]" * 5000 + "\n",
    "flow mapping": "{a: " * 3000 + "1" + "}" * 3000 + "\n",
    "block mapping": nested_block_mapping(3000),
    "block sequence": nested_block_sequence(3000),
    "mixed, under a key": "lr: " + "[{a: " * 2000 + "1" + "}]" * 2000 + "\n",
    "complex keys": "? " * 2000 + "a\n",
    "just past the limit": "seed: " + "[" * 40 + "]" * 40 + "\n",
}


@pytest.mark.parametrize("command", ["run", "sweep"])
@pytest.mark.parametrize("name", sorted(DEEP))
def test_yaml_nested_thousands_deep_is_refused_in_one_line(
    name: str, command: str, tmp_path: Path
) -> None:
    """A RecursionError traceback before; every command reads YAML through one reader."""
    path = tmp_path / "deep.yaml"
    path.write_text(DEEP[name], encoding="utf-8")
    if command == "run":
        args = ["run", "--config", str(path), *TINY, "--out", str(tmp_path / "o")]
    else:
        args = ["sweep", "--config", str(path), "--out", str(tmp_path / "sw")]
    line, _ = refused(args, tmp_path, str(path), "levels deep", "write it flatter")
    assert "RecursionError" not in line


# -- 4. stdout a closed pipe ---------------------------------------------------------------
# The command whose reader exits is a process of its own (a real pipe); the rerun, whose
# stdout is open, runs in this process (``in_process``), as a user's rerun in a terminal.
def started(args: list[str], cwd: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "cfl_bench.cli", *args]
    return subprocess.Popen(
        command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )


def stderr_lines(proc: subprocess.Popen[bytes]) -> list[str]:
    _, err = proc.communicate(timeout=300)
    text = err.decode("utf-8", "replace")
    assert "Traceback" not in text, text
    return [line for line in text.splitlines() if line.strip()]


def test_a_run_whose_reader_exits_says_so_and_the_rerun_resumes(tmp_path: Path) -> None:
    """`cfl-bench run … | head -1`: the run stops at the first line it cannot print (after
    a round's checkpoint), says so on stderr with how to resume, exits 141; the same
    command resumes it."""
    args = ["run", *TINY[:4], "--rounds-per-task", "3", *TINY[6:], "--out", str(tmp_path / "o")]
    proc = started(args, tmp_path)
    assert proc.stdout is not None
    first = proc.stdout.readline()  # the size line; the reader then exits, as `head -1` does
    proc.stdout.close()
    lines = stderr_lines(proc)
    assert first and proc.returncode == OUTPUT_CLOSED, lines
    assert len(lines) == 1, lines
    assert "stdout closed (the pipe's reader exited" in lines[0]
    assert "rerun the same command to resume it" in lines[0]
    assert (tmp_path / "o" / "checkpoint.pt").is_file()
    code, output = in_process(*args)
    assert code == 0, output
    # round 1's line may still have fit in the pipe before the reader exited
    assert re.search(r"resuming after round [12] of 3", output), output


def test_a_run_whose_reader_exits_at_once_says_to_rerun(tmp_path: Path) -> None:
    """`cfl-bench run … | head -c0`: stopped before anything could be printed."""
    args = ["run", *TINY, "--out", str(tmp_path / "o")]
    proc = started(args, tmp_path)
    assert proc.stdout is not None
    proc.stdout.close()
    lines = stderr_lines(proc)
    assert proc.returncode == OUTPUT_CLOSED and len(lines) == 1, lines
    assert "stdout closed" in lines[0] and "rerun the same command" in lines[0]
    code, output = in_process(*args)
    assert code == 0, output


def test_sweep_and_leaderboard_whose_reader_exits_say_so(tmp_path: Path) -> None:
    """`sweep … | head -c1` and `leaderboard … | head -c1`: one line on stderr, exit 141,
    no traceback; the sweep's rerun finishes (or skips) its points."""
    sweep = ["sweep", "--out", str(tmp_path / "sw"), *TINY, "--seed", "0", "--seed", "1"]
    proc = started(sweep, tmp_path)
    assert proc.stdout is not None
    proc.stdout.close()
    lines = stderr_lines(proc)
    assert proc.returncode == OUTPUT_CLOSED and len(lines) == 1, lines
    assert "the sweep stopped" in lines[0] and "rerun the same command to resume" in lines[0]
    code, output = in_process(*sweep)
    assert code == 0, output
    board = started(["leaderboard", str(tmp_path / "sw"), "--out", str(tmp_path / "lb")], tmp_path)
    assert board.stdout is not None
    board.stdout.close()
    lines = stderr_lines(board)
    assert board.returncode == OUTPUT_CLOSED and len(lines) == 1, lines
    assert "stdout closed" in lines[0]


def test_a_refusal_while_joining_ray_comes_before_the_sweep_folder(tmp_path: Path) -> None:
    """Joining Ray can still refuse after the address checks (``auto`` finds no cluster; no
    node of this machine's Ray can hold a point): the backend is joined before the sweep
    folder is written, so the refusal leaves nothing behind (it left a prepared folder)."""
    pytest.importorskip("ray")
    args = ray_sweep(tmp_path, "--cpus-per-run", "4096")
    env = {"RAY_ADDRESS": "", "RAY_USAGE_STATS_ENABLED": "0"}
    refused(args, tmp_path, "this machine's Ray has", "too few for a point's", env=env)


def test_without_grpcio_the_transport_handshake_tells_ray_from_other_servers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``pip install ray`` alone brings no grpcio: then a server must at least answer gRPC's
    HTTP/2 handshake (a silent or an HTTP/1 server does not; any gRPC server does)."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with grpc_server(None) as port:
        monkeypatch.setitem(sys.modules, "grpc", None)  # import grpc now fails
        ray_backend.check_reachable(f"127.0.0.1:{port}")
        ray_backend.check_reachable(f"ray://127.0.0.1:{port}")
    with silent_server() as port, pytest.raises(UserError, match="does not answer in 5 s"):
        ray_backend.check_reachable(f"127.0.0.1:{port}")
    with http_server() as port, pytest.raises(UserError, match=r"protocol \(gRPC: UNAVAILABLE"):
        ray_backend.check_reachable(f"ray://127.0.0.1:{port}")


@pytest.mark.parametrize("args", [["list", "strategies"], ["run", "--help"]])
def test_any_command_whose_reader_exits_says_so(args: list[str], tmp_path: Path) -> None:
    """Outside a command's own handling (help, a command of another group) the same line:
    Click and rich each exited 1 in silence."""
    proc = started(args, tmp_path)
    assert proc.stdout is not None
    proc.stdout.close()
    lines = stderr_lines(proc)
    assert proc.returncode == OUTPUT_CLOSED and len(lines) == 1, lines
    assert "stdout closed (the pipe's reader exited" in lines[0]


def test_a_broken_pipe_that_is_not_stdout_is_not_called_a_closed_stdout() -> None:
    """A BrokenPipeError from a pipe to a child process (stdout still open) must not be
    reported as the user's `| head`."""
    from cfl_bench.cli import is_closed_output

    assert not is_closed_output(BrokenPipeError(32, "Broken pipe"))
    try:
        try:
            raise BrokenPipeError(32, "Broken pipe")
        except BrokenPipeError:
            raise SystemExit(1) from None
    except SystemExit as exc:
        assert not is_closed_output(exc)
    assert not is_closed_output(SystemExit(1)) and not is_closed_output(OSError(5, "EIO"))
