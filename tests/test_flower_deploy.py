"""A Flower *deployment*: a real ``flower-superlink`` and one ``flower-supernode`` per client
on loopback (insecure), the app written by ``cfl-bench flower app`` and started with ``flwr
run APP deploy``. The records must equal the sequential executor's byte for byte, and every
process the test started (with its children) must be gone afterwards.

~45-50 s on 2 busy cores for fedavg: each message phase pays Flower's deployment latency
floor (a new ClientApp process per message, importing torch; a 3 s SuperNode poll), ~35-45 s
for identify + 2 train phases. The der+fedgp run (2 more phases: FedGP's g_ref queries)
takes ~61 s and is marked slow. The launcher (``flower.launch.deployment``,
``run_deployed``) is shared with bench/flower_overhead.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("flwr")

from cfl_bench.cli import main as cli_main
from cfl_bench.flower.launch import deployment, run_deployed, running

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


def deployed_equals_sequential(strategy: str, tmp_path: Path) -> None:
    """Run ``strategy`` on a real loopback deployment; its records must equal the
    sequential executor's and no process it started may be left."""
    run_options = options(strategy=strategy)
    app_dir, run_dir, seq_dir = tmp_path / "app", tmp_path / "run", tmp_path / "seq"
    app_args = ["flower", "app", "--app-dir", str(app_dir), "--out", str(run_dir)]
    assert cli([*app_args, *run_options]) == 0
    assert (app_dir / "pyproject.toml").exists() and not run_dir.exists()
    seen: set[int] = set()
    with deployment(tmp_path / "home", 2, seen) as env:
        statuses = run_deployed(app_dir, env)
    assert statuses == ["finished:completed"], statuses
    assert seen and not [pid for pid in seen if running(pid)]  # every process we started
    assert cli(["run", "--out", str(seq_dir), *run_options]) == 0
    assert (run_dir / "records.csv").read_bytes() == (seq_dir / "records.csv").read_bytes()


def test_deployment_records_equal_the_sequential_executor(tmp_path: Path) -> None:
    deployed_equals_sequential("fedavg", tmp_path)


@pytest.mark.slow
def test_der_fedgp_deployment_records_equal_the_sequential_executor(tmp_path: Path) -> None:
    """FedGP's query.request phase after each round (g_ref from the DER buffers, used by the
    round-2 projection) and DER's buffer carried between messages in the SuperNode's
    context (a new ClientApp process per message): identify + 2 × (train, request).
    ~61 s on 2 busy cores, hence slow (run with -m slow)."""
    deployed_equals_sequential("der+fedgp", tmp_path)


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
