"""Issue 39, the Flower parts: the Flower commands touch only what they own.

Classes, each through the real command line in a fresh process (exit code 2, one line, no
traceback, nothing written, pre-existing files byte-identical), unless marked otherwise:

* ``flower app --app-dir`` that is a run directory, lies inside one, is the run's own
  ``--out`` or holds it;
* ``flower node --socket PATH`` where PATH or the starter's ``PATH.starter`` is already
  something the node would replace (a regular file, a folder, a symbolic link, a socket
  another process listens on, a path too long for a socket); a dead socket is reused, and a
  helper removes only the socket it made;
* ``flower node --root-certificates`` that is not a PEM certificate;
* a finished run rerun with ``--executor flower``: refused at once, as with every executor;
* the run directory's lock in a Flower simulation: the launcher claims it before Flower
  starts and hands it to the ServerApp, so a second run is refused while Flower starts, a
  ServerApp whose launcher is gone writes nothing, and after ``kill -9`` of the launcher
  nothing changes in the run directory any more.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

pytest.importorskip("flwr")

from tests.cli_helpers import tree_digest as digest
from tests.sweep_helpers import in_process

REPO = Path(__file__).resolve().parents[1]
TINY = ["--stream", "rot-digits", "--tasks", "1", "--rounds-per-task", "1", "--clients", "2",
        "--threads", "1"]  # fmt: skip
ANSWER_SECONDS = 60  # every refusal must answer in seconds; a hang fails here


def cli(
    args: list[str], cwd: Path, timeout: float = ANSWER_SECONDS, tmpdir: Path | None = None
) -> subprocess.CompletedProcess:
    """``cfl-bench ARGS``; ``tmpdir``: its temporary folder (where Flower homes are made), so
    a test can look for its own without seeing other tests' running in parallel."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    if tmpdir is not None:
        env["TMPDIR"] = str(tmpdir)
    return subprocess.run(
        [sys.executable, "-m", "cfl_bench.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        timeout=timeout,
    )


def refused(result: subprocess.CompletedProcess, expected: str) -> str:
    """The one line of a refusal (exit 2), checked."""
    out = (result.stdout + result.stderr).decode(errors="replace")
    lines = [line for line in out.splitlines() if line.strip()]
    assert result.returncode == 2, out
    assert len(lines) == 1 and "Traceback" not in out, out
    assert expected in lines[0], out
    return lines[0]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One tiny finished run (sequential executor), made once for the module, in this
    process (it is what the refusals meet, no test of a process: one import of torch fewer)."""
    out = tmp_path_factory.mktemp("finished") / "run"
    code, output = in_process("run", *TINY, "--out", str(out))
    assert code == 0, output
    return out


# -- flower app: never into a run directory ---------------------------------------------------

APP_DIRS: dict[str, tuple[Callable[[Path, Path], list[str]], str]] = {
    "the run directory": (lambda root, run: ["--app-dir", str(run)], "is a cfl-bench run"),
    "a new folder in it": (lambda root, run: ["--app-dir", str(run / "app")], "is inside the"),
    "an existing folder in it": (
        lambda root, run: ["--app-dir", str(run / "plots" / "app")],
        "is inside the cfl-bench run directory",
    ),
    "the app's own --out": (
        lambda root, run: ["--app-dir", str(root / "o"), "--out", str(root / "o")],
        "is the run's --out",
    ),
    "inside the app's own --out": (
        lambda root, run: ["--app-dir", str(root / "o" / "app"), "--out", str(root / "o")],
        "is the run's --out",
    ),
    "--out inside the app": (
        lambda root, run: ["--app-dir", str(root / "a"), "--out", str(root / "a" / "run")],
        "is inside --app-dir",
    ),
}


@pytest.mark.parametrize("case", APP_DIRS)
def test_flower_app_never_writes_into_a_run_directory(
    case: str, finished_run: Path, tmp_path: Path
) -> None:
    (finished_run / "plots").mkdir(exist_ok=True)  # a folder of the user's in the run
    make_args, expected = APP_DIRS[case]
    before, run_before = digest(tmp_path), digest(finished_run)
    result = cli(["flower", "app", *TINY, *make_args(tmp_path, finished_run)], tmp_path)
    refused(result, expected)
    assert digest(tmp_path) == before and digest(finished_run) == run_before


# -- flower node: the socket paths ------------------------------------------------------------


def stale_socket(path: Path) -> None:
    """A socket file nothing listens on (what a node killed with SIGKILL leaves)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.bind(str(path))


def node_args(socket_path: Path | str) -> list[str]:
    return ["flower", "node", "--superlink", "127.0.0.1:9", "--partition-id", "0",
            "--socket", str(socket_path)]  # fmt: skip


SOCKET_PATHS: dict[str, tuple[Callable[[Path], Path], str]] = {
    "a regular file": (lambda d: write(d / "notes.txt"), "exists and is a regular file"),
    "an empty file": (lambda d: write(d / "empty", b""), "exists and is a regular file"),
    "a folder": (lambda d: mkdir(d / "plots"), "exists and is a folder"),
    "a link to a file": (lambda d: link(d / "l", write(d / "t.txt")), "is a symbolic link"),
    "a dangling link": (lambda d: link(d / "l", d / "nowhere"), "is a symbolic link"),
    "a file at PATH.starter": (
        lambda d: write(d / "w.sock.starter").with_name("w.sock"),
        "starter socket (--socket + .starter) '",
    ),
    "a folder at PATH.starter": (
        lambda d: mkdir(d / "w.sock.starter").with_name("w.sock"),
        "exists and is a folder",
    ),
    "a path too long for a socket": (lambda d: d / ("s" * 110), "longer than the 107 bytes"),
}


def write(path: Path, data: bytes = b"the user's own bytes\n") -> Path:
    path.write_bytes(data)
    return path


def mkdir(path: Path) -> Path:
    path.mkdir()
    (path / "keep.txt").write_text("kept")
    return path


def link(path: Path, target: Path) -> Path:
    path.symlink_to(target)
    return path


@pytest.mark.parametrize("case", SOCKET_PATHS)
def test_flower_node_never_replaces_what_is_at_its_socket_path(case: str, tmp_path: Path) -> None:
    make, expected = SOCKET_PATHS[case]
    path = make(tmp_path)
    before = digest(tmp_path)
    refused(cli(node_args(path), tmp_path), expected)
    assert digest(tmp_path) == before


def test_flower_node_refuses_a_socket_another_process_listens_on(tmp_path: Path) -> None:
    path = tmp_path / "busy.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as live:
        live.bind(str(path))
        live.listen(1)
        refused(cli(node_args(path), tmp_path), "another process is listening on")
        assert path.is_socket()
        starter = tmp_path / "w.sock"  # a live socket at the starter's path counts the same
        os.link(path, starter.with_name("w.sock.starter"))
        refused(cli(node_args(starter), tmp_path), "starter socket")


def test_a_dead_socket_is_reused_and_only_the_nodes_own_socket_is_removed(tmp_path: Path) -> None:
    """Not the command line: ``flower.sockets`` as the worker and the starter use it. A
    socket left by a dead node (nothing listens) is taken over; on exit the helper removes
    the path only while it is still the socket it bound."""
    from cfl_bench.flower import sockets

    path = tmp_path / "w.sock"
    stale_socket(path)
    assert sockets.socket_problem(path) is None
    listener, identity = sockets.bind_own(path, backlog=1)
    assert sockets.listening(path)
    listener.close()
    path.unlink()
    write(path)  # someone put a file there since
    sockets.remove_own(path, identity)
    assert path.read_bytes() == b"the user's own bytes\n"
    with pytest.raises(FileExistsError):
        sockets.bind_own(path, backlog=1)  # a helper started late refuses too
    assert path.read_bytes() == b"the user's own bytes\n"
    path.unlink()
    listener, identity = sockets.bind_own(path, backlog=1)
    listener.close()
    sockets.remove_own(path, identity)
    assert not os.path.lexists(path)


# -- flower node: the root certificates -------------------------------------------------------

CERTIFICATES: dict[str, bytes] = {
    "text": b"hello\n",
    "an empty file": b"",
    "random bytes": bytes(range(256)) * 4,
    "a private key only": b"-----BEGIN PRIVATE KEY-----\nMIIBVQIBADANBgkqhkiG9w0BAQEFAASC\n"
    b"-----END PRIVATE KEY-----\n",
    "a truncated certificate": b"-----BEGIN CERTIFICATE-----\nMIIBszCCAVmgAwIBAgIU\n"
    b"-----END CERTIFICATE-----\n",
}


@pytest.mark.parametrize("case", CERTIFICATES)
def test_flower_node_refuses_root_certificates_that_are_not_a_certificate(
    case: str, tmp_path: Path
) -> None:
    cert = write(tmp_path / "ca.pem", CERTIFICATES[case])
    before = digest(tmp_path)
    args = ["flower", "node", "--superlink", "127.0.0.1:9", "--partition-id", "0",
            "--root-certificates", str(cert)]  # fmt: skip
    line = refused(cli(args, tmp_path), "holds no PEM certificate")
    assert "--root-certificates" in line
    assert digest(tmp_path) == before


def test_root_certificates_that_raise_a_value_error_are_refused_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ValueError from the parser has neither ``reason`` nor ``strerror``: the refusal names
    its type (reading ``exc.strerror`` raised an AttributeError instead)."""
    import ssl

    from cfl_bench.core.errors import UserError
    from cfl_bench.flower.node import check_root_certificates

    def refuse(**_: object) -> ssl.SSLContext:
        raise ValueError("unreadable")

    monkeypatch.setattr(ssl, "create_default_context", refuse)
    cert = write(tmp_path / "ca.pem", CERTIFICATES["text"])
    with pytest.raises(
        UserError, match=r"holds no PEM certificate that can be read \(valueerror\)"
    ):
        check_root_certificates(str(cert))


# -- a finished run rerun with --executor flower ----------------------------------------------


def test_a_finished_run_rerun_with_flower_is_refused_at_once(
    finished_run: Path, tmp_path: Path
) -> None:
    """The same refusal as every executor's, before Flower starts (it took 32 s to start
    Flower and then said "the run failed inside Flower"). The command gets a temporary
    folder of its own: another test's simulation, running in parallel, makes its Flower
    home in the shared one."""
    before = digest(finished_run)
    private = tmp_path / "tmp"
    private.mkdir()
    started = time.monotonic()
    args = ["run", *TINY, "--executor", "flower", "--out", str(finished_run)]
    result = cli(args, REPO, tmpdir=private)
    seconds = time.monotonic() - started
    refused(result, "already holds a finished run; pass --overwrite")
    assert seconds < 20, f"{seconds:.0f} s: Flower was started"
    assert list(private.glob("cfl-flower-*")) == []
    assert digest(finished_run) == before


# -- the run directory's lock in a Flower simulation ------------------------------------------


class FakeContext:
    def __init__(self, config_path: Path) -> None:
        self.run_config = {"cfl-config": str(config_path)}


def test_a_serverapp_whose_launcher_is_gone_writes_nothing(tmp_path: Path) -> None:
    """Not the command line: the ServerApp as Flower calls it, with the files its launcher
    wrote but no launcher serving the run directory's lock (it was killed): it must not
    claim the directory itself (it did, and wrote summary.json after the launcher died)."""
    from cfl_bench.flower.launch import write_app
    from cfl_bench.flower.server_app import main
    from cfl_bench.runner.config import RunConfig

    out = tmp_path / "run"
    config = RunConfig(stream="rot-digits", tasks=1, rounds_per_task=1, clients=2, threads=1,
                       executor="flower", out=str(out))  # fmt: skip
    home = tmp_path / "home"
    write_app(home, config)
    main(object(), FakeContext(home / "run" / "config.json"))  # type: ignore[arg-type]
    assert not out.exists()
    outcome = json.loads((home / "run" / "outcome.json").read_text())
    assert not outcome["ok"] and "launcher of this Flower simulation is gone" in outcome["error"]


def flower_processes() -> set[int]:
    pids = set()
    for proc in psutil.process_iter(["pid"]):
        try:
            if "cfl-flower-" in proc.environ().get("FLWR_HOME", ""):
                pids.add(proc.pid)
        except (psutil.Error, OSError):
            continue
    return pids


def lock_is_free(folder: Path) -> bool:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


@pytest.mark.slow(
    reason="CI runs the same checks on the same kind of killed simulation, sharing its one "
    "Flower start-up with the resume: tests/test_flower.py::"
    "test_a_launcher_killed_mid_run_leaves_no_simulation_behind_and_resumes"
)
def test_a_flower_run_holds_its_directory_from_the_start_and_nothing_writes_after_kill(
    tmp_path: Path,
) -> None:
    """Slow: ~40 s of CI for a Flower start-up that test_flower.py's killed-launcher test
    shares (it makes every check below too).

    ``cfl-bench run --executor flower``: the directory is locked before Flower starts
    (a second run into it is refused at once, while Flower is still starting); after
    ``kill -9`` of the launcher mid-run the reaper ends the simulation, the lock is free,
    and nothing in the directory changes afterwards (a surviving ServerApp wrote
    summary.json 9 s after its launcher died)."""
    before = flower_processes()
    homes = set(Path(tempfile.gettempdir()).glob("cfl-flower-*"))
    out = tmp_path / "run"
    run = ["--stream", "rot-digits", "--clients", "2", "--threads", "1", "--tasks", "2",
           "--rounds-per-task", "6", "--checkpoint-every", "1"]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "cfl_bench", "run", *run, "--executor", "flower"]
    launcher = subprocess.Popen(
        [*command, "--out", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    assert launcher.stdout is not None
    said = [launcher.stdout.readline()]  # "starting a Flower simulation": claimed by now
    assert said[0].startswith("starting a Flower simulation"), said
    second = cli(["run", *run, "--out", str(out)], tmp_path)
    refused(second, "another cfl-bench process is running in --out")
    for line in launcher.stdout:
        said.append(line)
        if line.startswith("round 2/"):
            break
    assert launcher.poll() is None, "".join(said)
    launcher.kill()
    launcher.wait()
    deadline = time.monotonic() + 60

    def left() -> tuple[set[int], set[Path]]:
        folders = set(Path(tempfile.gettempdir()).glob("cfl-flower-*")) - homes
        return flower_processes() - before, folders

    while left() != (set(), set()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert left() == (set(), set())
    assert lock_is_free(out)
    written = digest(out)
    assert "config.json" in written and "summary.json" not in written
    time.sleep(10.0)  # the surviving writer wrote 9 s after the kill
    assert digest(out) == written
