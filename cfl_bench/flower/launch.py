"""Start a Flower simulation (or a loopback deployment) for one run and leave nothing
running afterwards.

``flwr run <app> local`` (the CLI, not the deprecated ``run_simulation`` API, which gives
an empty ``run_config``) starts a detached local SuperLink in simulation mode (Ray
backend). Everything stays on this machine and offline: telemetry, the update check and
the runtime dependency installation are off, ``FLWR_HOME`` and ``RAY_TMPDIR`` are private
folders, Ray binds to loopback. The app folder is written here (``flwr new`` downloads
templates); its components import ``cfl_bench`` from this checkout (``PYTHONPATH``).
Afterwards every process started with our private ``FLWR_HOME`` (SuperLink, SuperExec,
Ray) is stopped by PID.

:func:`deployment` starts a real ``flower-superlink`` and one ``flower-supernode`` per
client on loopback (insecure) and :func:`run_deployed` runs an app written by
``cfl-bench flower app`` on it: shared by tests/test_flower_deploy.py and
bench/flower_overhead.py.
"""

from __future__ import annotations

import json
import math
import os
import queue
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import psutil
import torch

import cfl_bench
from cfl_bench.core.errors import UserError
from cfl_bench.core.run_dir import RunDirectory
from cfl_bench.flower import SAID_FILE, handover, require_flwr
from cfl_bench.flower.node import free_port, stop
from cfl_bench.flower.reaper import flower_pids
from cfl_bench.runner.config import RunConfig

APP_PYPROJECT = """\
[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "cflbenchflower"
version = "1.0.0"
dependencies = []

[tool.hatch.build.targets.wheel]
packages = ["."]

[tool.flwr.app]
publisher = "cflbench"

[tool.flwr.app.components]
serverapp = "cfl_flower_app.server:serverapp"
clientapp = "cfl_flower_app.client:clientapp"

[tool.flwr.app.config]
cfl-config = ""
cfl-config-json = {config_json}
"""

#: The app's modules: one per component, so that a ClientApp process (one per message)
#: imports only the torch-free ClientApp, never the server side. (``__all__`` because Flower
#: checks the attribute in the module's source before running it.)
APP_MODULES = {
    "__init__.py": "",
    **{
        f"{side}.py": f"from cfl_bench.flower.{side}_app import app as {side}app\n\n"
        f'__all__ = ["{side}app"]\n'
        for side in ("client", "server")
    },
}

FLWR_CONFIG = """\
[superlink]
default = "local"

[superlink.local]
address = ":local:"
"""


def environment(home: Path) -> dict[str, str]:
    """The environment of every Flower process: offline, private, loopback, 1 thread, and
    without ``RAY_ADDRESS`` (a simulation inside a sweep point on a Ray cluster, or under
    ``ray job submit``, starts its own Ray instead of joining that cluster)."""
    root = str(Path(cfl_bench.__file__).resolve().parents[1])
    path = os.environ.get("PYTHONPATH")
    return {
        **{k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"},
        "PYTHONPATH": root if not path else f"{root}{os.pathsep}{path}",
        "FLWR_TELEMETRY_ENABLED": "0",
        "FLWR_DISABLE_UPDATE_CHECK": "1",
        "FLWR_HOME": str(home / "flwr"),
        "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
        "UV_OFFLINE": "1",
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        "RAY_TMPDIR": str(home / "ray"),
        "OMP_NUM_THREADS": "1",
    }


def write_app_folder(app: Path, config_json: str) -> None:
    """The Flower app (pyproject.toml and the module naming the two components) in ``app``;
    ``config_json`` is the run configuration carried in the app's run config (empty: the
    launcher passes a file path instead). ``json.dumps`` of the text is a valid TOML basic
    string (ASCII only; JSON's escapes are TOML's)."""
    (app / "cfl_flower_app").mkdir(parents=True, exist_ok=True)
    toml = APP_PYPROJECT.replace("{config_json}", json.dumps(config_json))
    (app / "pyproject.toml").write_text(toml)
    for name, text in APP_MODULES.items():
        (app / "cfl_flower_app" / name).write_text(text)


def write_deploy_app(config: RunConfig, app: Path) -> Path:
    """The app folder of a deployment run (``cfl-bench flower app``): ``config`` with the
    Flower executor and an absolute ``out`` (on the SuperLink's machine), checked here as
    ``cfl-bench run`` would check it. Returns the app folder."""
    import dataclasses

    from cfl_bench.runner.plan import plan_run

    if app.exists() and any(app.iterdir()):
        raise UserError(f"'{app}' is not empty; choose a new folder for the Flower app.")
    if config.executor not in ("sequential", "flower"):  # sequential: the option's default
        raise UserError(
            f"a Flower app trains its clients as Flower ClientApps (--executor flower), not "
            f"with --executor {config.executor}; drop --executor."
        )
    config = dataclasses.replace(config, executor="flower")
    plan = plan_run(config)  # every refusal of --executor flower, before anything is written
    refuse_overlap(app, plan.out)
    root = config.data_root and str(Path(config.data_root).resolve())
    config = dataclasses.replace(config, out=str(plan.out.resolve()), data_root=root)
    app.mkdir(parents=True, exist_ok=True)
    write_app_folder(app, json.dumps(config.to_dict(), sort_keys=True))
    return app


def refuse_overlap(app: Path, out: Path) -> None:
    """Refuse an app folder that is the run's ``--out``, lies inside it, or holds it: the
    run would find the app's files in its directory and refuse it (or a rerun with
    --overwrite would delete them), and ``flwr run`` would ship the run's files inside the
    app."""
    app_at, out_at = app.resolve(), out.resolve()
    if app_at == out_at or out_at in app_at.parents:
        raise UserError(
            f"--app-dir '{app}' is the run's --out '{out}' or inside it, where only the run's "
            f"own files belong; choose an app folder outside it."
        )
    if app_at in out_at.parents:
        raise UserError(
            f"--out '{out}' is inside --app-dir '{app}', and Flower would ship the run's "
            f"files with the app; choose an --out outside the app folder."
        )


def write_app(
    home: Path, config: RunConfig, annotations: Mapping[str, object] | None = None
) -> Path:
    """The Flower app folder, FLWR_HOME's config, the run configuration file and the
    summary's annotations (``annotations.json``, read by the ServerApp)."""
    app = home / "app"
    (app / "cfl_flower_app").mkdir(parents=True)
    write_app_folder(app, "")
    (home / "flwr").mkdir()
    (home / "ray").mkdir()
    (home / "flwr" / "config.toml").write_text(FLWR_CONFIG)
    (home / "run").mkdir()
    (home / "run" / "config.json").write_text(json.dumps(config.to_dict()))
    (home / "run" / "annotations.json").write_text(json.dumps(dict(annotations or {})))
    return app


def simulation_settings(
    clients: int, device: torch.device, cores: int | None = None, threads: int | None = None
) -> str:
    """The simulation's federation config: one SuperNode per client, 1 CPU per Ray actor
    (more torch threads than free cores is catastrophic on small machines); with
    ``threads`` (the run's ``--threads``, a sweep point's share of the machine) Ray gets that
    many CPUs, so at most that many actors run at once, else all of them; and on CUDA a GPU
    fraction per actor so that the actors Ray runs at once (one per CPU, at most one per
    client) share the GPU: 1 / min(clients, CPUs), rounded down to Ray's 1e-4 grain. Why a
    fraction and not one GPU each: a client update of a small model uses a sliver of a GPU,
    and with whole GPUs Ray would run one client at a time per GPU."""
    settings = f"num-supernodes={clients} client-resources-num-cpus=1"
    if threads is not None:
        settings += f" init-args-num-cpus={threads}"
        cores = threads
    if device.type != "cuda":
        return settings
    concurrent = max(1, min(clients, cores or os.cpu_count() or 1))
    fraction = math.floor(10_000 / concurrent) / 10_000
    return f"{settings} client-resources-num-gpus={fraction:g}"


def run_in_flower(
    config: RunConfig,
    device: torch.device,
    say: Callable[[str], None] | None = None,
    annotations: Mapping[str, object] | None = None,
    *,
    claim: tuple[RunDirectory, bool],
) -> Path:
    """Run ``config`` (already validated, ``out`` resolved) in a Flower simulation with one
    SuperNode per client and 1 CPU (and on CUDA a GPU fraction) per Ray actor; returns the
    run directory. ``annotations`` go into its summary (``run.execute``'s). ``claim``: the
    run directory, claimed and locked by this process, and whether the run resumes; its
    lock is handed to the ServerApp (``flower.handover``) while the simulation runs.

    The simulation's SuperLink listens on free ports of its own (Flower's fixed local ports
    would let only one simulation run on a machine: sweeps run several), and a reaper
    (``flower.reaper``) ends the simulation if this process dies without cleaning up."""
    require_flwr()
    run_dir, resume = claim
    assert run_dir.lock_fd is not None, "the run directory must be claimed first"
    home = Path(tempfile.mkdtemp(prefix="cfl-flower-"))
    reaper = start_reaper(home)
    try:
        app = write_app(home, config, annotations)
        with handover.serving(home / "run", run_dir.out, run_dir.path, resume, run_dir.lock_fd):
            return simulate(home, app, config, device, say)
    finally:
        stop(flower_pids(home))
        shutil.rmtree(home, ignore_errors=True)
        assert reaper.stdin is not None
        reaper.stdin.close()  # the reaper finds nothing left and exits
        reaper.wait(timeout=30)


def simulate(
    home: Path,
    app: Path,
    config: RunConfig,
    device: torch.device,
    say: Callable[[str], None] | None,
) -> Path:
    """``flwr run APP local`` with the simulation's settings; the run directory, once the
    ServerApp reports the run done (its outcome file), else a one-line error."""
    env = {
        **environment(home),
        "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(free_port()),
        "FLWR_LOCAL_CONTROL_API_PORT": str(free_port()),
    }
    settings = simulation_settings(config.clients, device, threads=config.threads)
    command = [
        shutil.which("flwr") or str(Path(sys.executable).with_name("flwr")),
        "run",
        str(app),
        "local",
        "--stream",
        "--run-config",
        f"cfl-config='{home / 'run' / 'config.json'}'",
        "--federation-config",
        settings,
    ]
    said = home / "run" / SAID_FILE
    output = relay(command, env, said, say or (lambda _text: None))
    outcome_file = home / "run" / "outcome.json"
    if not outcome_file.exists():
        raise UserError(
            "the Flower simulation ended without running the run: " + output.strip()[-2000:]
        )
    outcome = json.loads(outcome_file.read_text())
    if not outcome["ok"]:
        raise UserError(f"the run failed inside Flower: {outcome['error']}")
    return Path(str(outcome["path"]))


def start_reaper(home: Path) -> subprocess.Popen[bytes]:
    """``flower.reaper`` for ``home``, in a session of its own (a Ctrl-C or a signal to
    this process group must not stop it first); this process alone holds its pipe."""
    env = {k: v for k, v in os.environ.items() if k != "FLWR_HOME"}
    return subprocess.Popen(
        [sys.executable, "-m", "cfl_bench.flower.reaper", str(home)],
        stdin=subprocess.PIPE,
        env=env,
        start_new_session=True,
    )


#: Seconds between the "still starting" lines while Flower and Ray start (~70 s on 2 cores).
STARTING_NOTE_SECONDS = 15.0


def relay(command: list[str], env: dict[str, str], said: Path, say: Callable[[str], None]) -> str:
    """Run ``flwr run`` and tell the user what it is doing; returns its whole output.

    Why: Flower's simulation spends its first minute starting the SuperLink, Ray and one
    actor per client, and the run itself speaks from inside the ServerApp; with the output
    captured until the end, `cfl-bench run --executor flower` was silent for 70 s and more.
    Until the run's first line, a line every ``STARTING_NOTE_SECONDS`` says what is
    starting; then the run's own lines (round progress, notes), which the ServerApp writes
    to ``said`` (``SAID_FILE``), are passed on as they come, and all of them: Flower's log
    stream may end before the run's last lines arrive.
    """
    process = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    lines: queue.Queue[str | None] = queue.Queue()
    reader = threading.Thread(target=_read_lines, args=(process, lines), daemon=True)
    reader.start()
    kept: list[str] = []
    run_lines = FileTail(said)
    started = time.monotonic()
    last_note, ended = started, False
    while not ended:
        try:
            line = lines.get(timeout=RELAY_POLL_SECONDS)
        except queue.Empty:
            line = ""
        if line is None:
            ended = True  # Flower's output is closed: the ServerApp has written its last
        elif line:
            kept.append(line)
        for text in run_lines.new_lines(final=ended):
            say(text)
        if not run_lines.seen_any and time.monotonic() - last_note >= STARTING_NOTE_SECONDS:
            last_note = time.monotonic()
            say(
                f"Flower: starting the SuperLink, Ray and one actor per client "
                f"({last_note - started:.0f} s so far; ~1 min on 2 cores)"
            )
    process.wait()
    return "".join(kept)


#: Seconds between looks at the ServerApp's lines while Flower's output is quiet.
RELAY_POLL_SECONDS = 0.25


class FileTail:
    """The complete lines appended to a file since the last look (the file may not exist
    yet; a line still being written waits for its newline, or for ``final``)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.partial = ""
        self.seen_any = False

    def new_lines(self, final: bool = False) -> list[str]:
        try:
            with self.path.open("r", encoding="utf-8") as fh:
                fh.seek(self.offset)
                chunk = fh.read()
                self.offset = fh.tell()
        except FileNotFoundError:
            return []
        text = self.partial + chunk
        complete, _, self.partial = text.rpartition("\n")
        if final and self.partial:
            complete, self.partial = f"{complete}\n{self.partial}", ""
        found = [line for line in complete.split("\n") if line] if complete else []
        self.seen_any = self.seen_any or bool(found)
        return found


def _read_lines(process: subprocess.Popen[str], lines: queue.Queue[str | None]) -> None:
    assert process.stdout is not None
    for line in process.stdout:
        lines.put(line)
    lines.put(None)


def wait_for_port(port: int, seconds: float = 60.0) -> None:
    """Return once something listens on 127.0.0.1:``port``; raise after ``seconds``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.5)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port} after {seconds:.0f} s")


def process_tree(pids: list[int]) -> set[int]:
    """``pids`` and all their descendants now."""
    found = set(pids)
    for pid in pids:
        try:
            found |= {c.pid for c in psutil.Process(pid).children(recursive=True)}
        except psutil.Error:
            continue
    return found


@contextmanager
def deployment(
    home: Path, clients: int, seen: set[int], workers: bool = True
) -> Iterator[dict[str, str]]:
    """A SuperLink and ``clients`` nodes (partition-id=K) on free loopback ports, with a
    private ``FLWR_HOME`` under ``home`` whose ``deploy`` connection points at the
    SuperLink; yields the environment for ``flwr``. Each node is ``cfl-bench flower node``
    (a SuperNode and its long-lived worker), or with ``workers=False`` a plain
    ``flower-supernode`` with Flower's defaults (a ClientApp process computes each message
    itself: the baseline bench/flower_overhead.py compares with). Afterwards every process
    started here (with its children, and anything else with that ``FLWR_HOME``) is stopped
    by PID; ``seen`` receives all of them for the caller to check with
    ``flower.reaper.running``. Logs are in ``home/logs``."""
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
            start(f"node{k}", *node_command(home, link, k, workers))
        yield env
    finally:
        pids = process_tree([p.pid for p in started]) | set(flower_pids(home))
        seen |= pids
        stop(sorted(pids))
        for p in started:
            p.wait(timeout=10)


def node_command(home: Path, link: int, k: int, workers: bool) -> list[str]:
    """Node ``k``'s command: ``cfl-bench flower node`` (socket under ``home``), or a plain
    ``flower-supernode``."""
    superlink = f"127.0.0.1:{link}"
    if not workers:
        return ["flower-supernode", "--insecure", "--superlink", superlink,
                "--port", str(free_port()), "--node-config", f"partition-id={k}"]  # fmt: skip
    (home / "sockets").mkdir(exist_ok=True)
    return [sys.executable, "-m", "cfl_bench", "flower", "node", "--superlink", superlink,
            "--partition-id", str(k), "--socket", str(home / "sockets" / f"{k}.sock"),
            "--port", str(free_port())]  # fmt: skip


def run_deployed(app: Path, env: dict[str, str], timeout_s: float = 400.0) -> list[str]:
    """``flwr run APP deploy --stream`` on the :func:`deployment` whose environment is
    ``env``; returns the statuses ``flwr ls`` reports for the runs this call added (one
    ``finished:completed`` when it went well: ``flwr run --stream`` exits 0 even for a
    failed run, so the SuperLink is asked)."""
    before = set(listed_runs(env))
    flwr = ["flwr", "run", str(app), "deploy", "--stream"]
    subprocess.run(flwr, env=env, capture_output=True, timeout=timeout_s, check=False)
    return [status for run, status in listed_runs(env).items() if run not in before]


def listed_runs(env: dict[str, str]) -> dict[str, str]:
    """Run id → status of every run the deployment's SuperLink knows (``flwr ls``)."""
    listed = subprocess.run(
        ["flwr", "ls", "deploy", "--format", "json"], env=env, capture_output=True, text=True
    )
    return {str(r["run-id"]): str(r["status"]) for r in json.loads(listed.stdout)["runs"]}
