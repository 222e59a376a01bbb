"""The pieces of a Flower node (``cfl-bench flower node``) that the deployment tests
(tests/test_flower_deploy.py) do not isolate: the ClientApp imports no torch, the local
socket's framing and retry, the lean ``flwr-clientapp`` and the command's refusals."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("flwr")

from cfl_bench.cli import main as cli_main
from cfl_bench.flower import clientapp_process, wire
from cfl_bench.flower.node import lean_clientapp_folder, node_environment


def test_the_client_app_imports_no_torch() -> None:
    """A ClientApp process starts per message: torch there would cost seconds each time."""
    code = "import sys, cfl_bench.flower.client_app; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def serve_once(listener: socket.socket, reply: object) -> None:
    import pickle

    conn, _ = listener.accept()
    with conn:
        request = pickle.loads(wire.recv_frame(conn))
        wire.send_frame(conn, pickle.dumps((request, reply)))


def test_a_call_waits_for_a_worker_that_is_not_listening_yet(tmp_path: Path) -> None:
    """The ClientApp retries until the (re)started worker listens; a large frame arrives
    whole."""
    path = tmp_path / "w.sock"
    big = b"x" * (3 << 20)

    def late_worker() -> None:
        time.sleep(0.5)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
            listener.bind(str(path))
            listener.listen(1)
            serve_once(listener, "answer")

    thread = threading.Thread(target=late_worker)
    thread.start()
    assert wire.call(str(path), ("train", big), wait_s=30) == (("train", big), "answer")
    thread.join()


def test_a_call_gives_up_in_one_sentence_when_no_worker_comes(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match=r"did not answer within 0 s.*cfl-bench flower node"):
        wire.call(str(tmp_path / "none.sock"), "x", wait_s=0.3)


def test_the_lean_clientapp_is_used_only_for_the_flower_it_mirrors(tmp_path: Path) -> None:
    """Under the locked Flower the node's PATH starts with the lean ``flwr-clientapp``,
    which accepts what SuperExec passes (``--runtime-api-address``, ``--token``,
    ``--insecure``, ``--parent-pid``)."""
    assert clientapp_process.mirrors_installed_flower()
    folder = lean_clientapp_folder(tmp_path / "bin")
    assert folder is not None and (folder / "flwr-clientapp").stat().st_mode & 0o111
    env = node_environment({"PATH": "/usr/bin"}, folder)
    assert env["PATH"].split(":")[0] == str(folder)
    assert env["FLWR_SUPEREXEC_TASK_POLL_INTERVAL"] == "0.5"
    assert env["FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION"] == "1"
    script = (folder / "flwr-clientapp").read_text()
    assert script.startswith(f"#!{sys.executable}\n") and "clientapp_process import main" in script


def test_the_lean_clientapp_calls_flowers_run_clientapp_with_superexecs_arguments(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The arguments SuperExec's subprocess executor passes reach ``run_clientapp`` as
    Flower's own ``flwr-clientapp`` passes them."""
    import flwr.supernode.runtime.run_clientapp as runtime

    calls: list[dict[str, object]] = []
    monkeypatch.setattr(runtime, "run_clientapp", lambda **kw: calls.append(kw))
    argv = ["flwr-clientapp", "--runtime-api-address", "127.0.0.1:9094", "--token", "t0",
            "--insecure", "--parent-pid", "42"]  # fmt: skip
    monkeypatch.setattr(sys, "argv", argv)
    clientapp_process.main()
    assert calls == [
        {
            "runtime_api_address": "127.0.0.1:9094",
            "token": "t0",
            "insecure": True,
            "certificates": None,
            "parent_pid": 42,
            "runtime_dependency_install": False,
        }
    ]


def test_flower_node_refuses_bad_options(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def cli(args: list[str]) -> int:
        with pytest.raises(SystemExit) as exc:
            cli_main(args)
        return int(exc.value.code or 0)

    base = ["flower", "node", "--superlink", "127.0.0.1:1"]
    assert cli([*base, "--partition-id", "-1"]) == 2
    assert "--partition-id must be 0 or more" in capsys.readouterr().err
    missing = str(tmp_path / "no" / "w.sock")
    assert cli([*base, "--partition-id", "0", "--socket", missing]) == 2
    assert "its folder does not exist" in capsys.readouterr().err
    # Flower would start these and then fail (or retry a malformed address for ever).
    refused = {
        ("--superlink", "nonsense"): "--superlink 'nonsense' is not HOST:PORT",
        ("--superlink", ":9092"): "--superlink ':9092' is not HOST:PORT",
        ("--superlink", "127.0.0.1:70000"): "is not HOST:PORT",
        ("--port", "70000"): "--port must be between 1 and 65535 (got 70000)",
        ("--root-certificates", str(tmp_path / "ca.pem")): "is not a file",
    }
    for (flag, value), message in refused.items():
        args = ["flower", "node", "--partition-id", "0", flag, value]
        if flag != "--superlink":
            args += ["--superlink", "127.0.0.1:1"]
        assert cli(args) == 2, (flag, value)
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err, err
