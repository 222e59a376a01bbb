"""A Flower *deployment*: a real ``flower-superlink`` and one ``flower-supernode`` per client
on loopback (insecure), the app written by ``cfl-bench flower app`` and started with ``flwr
run APP deploy``. The records must equal the sequential executor's byte for byte, and every
process the test started (with its children) must be gone afterwards.

~50 s on 2 busy cores: each message phase pays Flower's deployment latency floor (a new
ClientApp process per message, importing torch; a 3 s SuperNode poll), ~35-45 s for identify
+ 2 train phases.
"""

from __future__ import annotations

import json
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest

pytest.importorskip("flwr")

from cfl_bench.cli import main as cli_main
from cfl_bench.flower.launch import environment, flower_pids, stop

RUN_OPTIONS = [
    "--stream", "rot-digits", "--strategy", "fedavg", "--model", "mlp", "--clients", "2",
    "--tasks", "1", "--rounds-per-task", "2", "--threads", "1", "--device", "cpu",
]  # fmt: skip


def cli(args: list[str]) -> int:
    """``cfl-bench ARGS``'s exit code."""
    with pytest.raises(SystemExit) as exc:
        cli_main(args)
    return int(exc.value.code or 0)


def options(**changed: str) -> list[str]:
    """RUN_OPTIONS with some values replaced (a repeated option would be refused)."""
    out = list(RUN_OPTIONS)
    for name, value in changed.items():
        out[out.index(f"--{name}") + 1] = value
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for_port(port: int, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.5)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port} after {seconds:.0f} s")


def tree(pids: list[int]) -> set[int]:
    """``pids`` and all their descendants now."""
    found = set(pids)
    for pid in pids:
        try:
            found |= {c.pid for c in psutil.Process(pid).children(recursive=True)}
        except psutil.Error:
            continue
    return found


def running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


@contextmanager
def deployment(home: Path, clients: int, seen: set[int]) -> Iterator[dict[str, str]]:
    """A SuperLink and ``clients`` SuperNodes (partition-id=K) on free loopback ports; yields
    the environment for ``flwr``. Afterwards every process started here is stopped by PID;
    ``seen`` receives all of them (and their children) for the caller to check."""
    env = environment(home)
    (home / "flwr").mkdir(parents=True)
    link = free_port()
    (home / "flwr" / "config.toml").write_text(
        f'[superlink]\ndefault = "deploy"\n\n[superlink.deploy]\n'
        f'address = "127.0.0.1:{link}"\ninsecure = true\n'
    )
    logs = home / "logs"
    logs.mkdir()
    started: list[subprocess.Popen[bytes]] = []

    def start(name: str, *args: str) -> None:
        with (logs / f"{name}.log").open("wb") as log:
            started.append(subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT))

    try:
        start("superlink", "flower-superlink", "--insecure", "--host", "127.0.0.1", "--port",
              str(link), "--disable-runtime-dependency-installation")  # fmt: skip
        wait_for_port(link)
        for k in range(clients):
            start(f"supernode{k}", "flower-supernode", "--insecure", "--superlink",
                  f"127.0.0.1:{link}", "--port", str(free_port()),
                  "--node-config", f"partition-id={k}")  # fmt: skip
        yield env
    finally:
        pids = tree([p.pid for p in started]) | set(flower_pids(home))
        seen |= pids
        stop(sorted(pids))
        for p in started:
            p.wait(timeout=10)


def test_deployment_records_equal_the_sequential_executor(tmp_path: Path) -> None:
    app_dir, run_dir, seq_dir = tmp_path / "app", tmp_path / "run", tmp_path / "seq"
    assert (
        cli(["flower", "app", "--app-dir", str(app_dir), "--out", str(run_dir), *RUN_OPTIONS]) == 0
    )
    assert (app_dir / "pyproject.toml").exists() and not run_dir.exists()
    seen: set[int] = set()
    home = tmp_path / "home"
    with deployment(home, 2, seen) as env:
        flwr = ["flwr", "run", str(app_dir), "deploy", "--stream"]
        subprocess.run(flwr, env=env, capture_output=True, timeout=400, check=False)
        listed = subprocess.run(
            ["flwr", "ls", "deploy", "--format", "json"], env=env, capture_output=True, text=True
        )  # `flwr run --stream` exits 0 even for a failed run: ask the SuperLink
        runs = json.loads(listed.stdout)["runs"]
    assert [r["status"] for r in runs] == ["finished:completed"], runs
    assert seen and not [pid for pid in seen if running(pid)]  # every process we started
    assert cli(["run", "--out", str(seq_dir), *RUN_OPTIONS]) == 0
    assert (run_dir / "records.csv").read_bytes() == (seq_dir / "records.csv").read_bytes()


def test_flower_app_refuses_what_flower_does_not_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    joint = options(strategy="joint")
    assert cli(["flower", "app", "--app-dir", str(tmp_path / "a"), *joint]) == 2
    assert "joint" in capsys.readouterr().err and not (tmp_path / "a").exists()
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "x").write_text("")
    assert cli(["flower", "app", "--app-dir", str(tmp_path / "b"), *RUN_OPTIONS]) == 2
    assert "not empty" in capsys.readouterr().err


def test_flower_app_carries_the_whole_configuration(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The app's run config holds the run's JSON (SuperNodes may be on other machines) with
    an absolute --out and the flower executor; the file path key stays empty."""
    import tomllib

    monkeypatch.chdir(tmp_path)
    assert cli(["flower", "app", "--app-dir", "app", "--out", "rel", *RUN_OPTIONS]) == 0
    toml = tomllib.loads((tmp_path / "app" / "pyproject.toml").read_text())
    config = toml["tool"]["flwr"]["app"]["config"]
    assert config["cfl-config"] == ""
    run = json.loads(config["cfl-config-json"])
    assert run["out"] == str(tmp_path / "rel") and run["executor"] == "flower"
    assert run["clients"] == 2 and run["stream"] == "rot-digits"
