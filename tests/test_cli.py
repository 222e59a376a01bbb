"""The command line: every documented error path (exit 2, one line, no traceback), the
listings, an end-to-end run on a slice of the embedded digits, and determinism of records.csv."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from cfl_bench.cli import app
from tests.synthetic_data import write_tiny_mnist

SMALL = [
    "--tasks",
    "2",
    "--rounds-per-task",
    "2",
    "--clients",
    "4",
    "--train-size",
    "800",
    "--test-size",
    "200",
    "--probe-size",
    "100",
    "--threads",
    "1",
]


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cfl_bench.cli", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=600,
    )


def in_process(*args: str) -> tuple[int, str]:
    """Run the CLI in this process (fast); returns exit code and combined output.

    Any exception other than the clean exit would surface as ``result.exception``.
    """
    result = CliRunner().invoke(app, list(args))
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.output


def assert_user_error(result: subprocess.CompletedProcess[str], fragment: str) -> None:
    assert result.returncode == 2, result.stderr + result.stdout
    assert "Traceback" not in result.stderr
    assert fragment in " ".join((result.stderr + result.stdout).split())


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--stream", "nosuch"], "unknown stream 'nosuch'"),
        (["--strategy", "der+agem"], "two local learners"),
        (["--strategy", "fedgp+fedgp"], "appears twice"),
        (["--strategy", "foo"], "unknown strategy component 'foo'"),
        (["--strategy", "der:gamma=1"], "unknown option 'gamma'"),
        (["--model", "resnet9000"], "unknown model 'resnet9000'"),
        (["--clients", "0"], "--clients must be an integer in [1, 100000], got 0."),
        (["--batch-size", "-3"], "--batch-size must be an integer in [1, 100000], got -3."),
        (["--rounds-per-task", "0"], "--rounds-per-task must be an integer in [1, 100000]"),
        (["--buffer-size", "0"], "--buffer-size must be an integer in [1, 1000000]"),
        (["--participation", "0"], "--participation must be a finite number in (0, 1], got 0.0."),
        (["--participation", "1.5"], "--participation must be a finite number in (0, 1], got 1.5."),
        (["--lr", "0"], "--lr must be a finite number in (0, 1000], got 0.0."),
        (["--device", "tpu"], "--device must be one of auto, cpu, cuda"),
        (["--stream", "rot-digits", "--model", "mnist-cnn"], "needs 1×28×28 inputs"),
        (["--strategy", "fedproj:public=fashion-mnist"], "use fedproj:public=holdout"),
        (["--strategy", "fedproj:public=cifar"], "must be one of auto, fashion-mnist, holdout"),
        (["--strategy", "ifa:rho=1.5"], "must be a fraction in (0, 1]"),
        (["--strategy", "ifa:mode=middle"], "must be one of later, random"),
        (["--strategy", "fedprox:mu=-1"], "must be a finite number ≥ 0"),
        (["--strategy", "er+derpp"], "two local learners"),
    ],
)
def test_bad_input_exits_2_with_one_line(args: list[str], fragment: str, tmp_path: Path) -> None:
    code, output = in_process("run", *args, "--out", str(tmp_path / "r"))
    assert code == 2, output
    assert "Traceback" not in output
    assert fragment in " ".join(output.split())
    assert not (tmp_path / "r").exists()  # refused before anything was written


def test_entry_point_turns_user_error_into_exit_2(tmp_path: Path) -> None:
    """The real console entry point: exit code 2, one line on stderr, no traceback."""
    result = cli("run", "--strategy", "der+agem", "--out", str(tmp_path / "r"))
    assert_user_error(result, "two local learners")
    assert len(result.stderr.strip().splitlines()) <= 2  # one sentence (may wrap once)


def test_missing_mnist_directory_says_where_to_put_it(tmp_path: Path) -> None:
    result = cli(
        "run",
        "--stream",
        "rot-mnist",
        "--data-root",
        str(tmp_path / "nowhere"),
        "--out",
        str(tmp_path / "r"),
    )
    assert_user_error(result, "MNIST/raw")
    assert "--download" in result.stderr


def test_mnist_stream_without_data_root(tmp_path: Path) -> None:
    assert_user_error(
        cli("run", "--stream", "perm-mnist", "--out", str(tmp_path / "r")), "--data-root"
    )


def test_corrupt_mnist_file(tmp_path: Path) -> None:
    raw = write_tiny_mnist(tmp_path, gz=True, n_train=60, n_test=10)
    data = (raw / "train-images-idx3-ubyte.gz").read_bytes()
    (raw / "train-images-idx3-ubyte.gz").write_bytes(data[: len(data) // 2])
    result = cli(
        "run", "--stream", "rot-mnist", "--data-root", str(tmp_path), "--out", str(tmp_path / "r")
    )
    assert_user_error(result, "truncated or corrupt")
    assert not (tmp_path / "r").exists()


def test_bad_yaml_config_and_unknown_key(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("clients: [1,\n")
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text("clientz: 3\n")
    cases = [
        (bad, "is not valid YAML"),
        (unknown, "has unknown key 'clientz'"),
        (tmp_path / "none.yaml", "does not exist"),
    ]
    for path, fragment in cases:
        code, output = in_process("run", "--config", str(path))
        assert code == 2 and fragment in " ".join(output.split()), output


def test_list_commands() -> None:
    for what, expect in [
        ("streams", "rot-mnist"),
        ("strategies", "fedgp"),
        ("models", "mnist-cnn"),
    ]:
        result = cli("list", what)
        assert result.returncode == 0 and expect in result.stdout
    assert_user_error(cli("list", "things"), "cannot list 'things'")


def test_end_to_end_digits_slice(tmp_path: Path) -> None:
    out = tmp_path / "run"
    config = tmp_path / "c.yaml"
    config.write_text("strategy: der+fedgp\nseed: 3\nclients: 99\n")
    result = cli(
        "run",
        "--config",
        str(config),
        "--stream",
        "rot-digits",
        *SMALL,
        "--out",
        str(out),
    )
    assert result.returncode == 0, result.stderr
    assert "Acc_T" in result.stdout
    summary = json.loads((out / "summary.json").read_text())
    for key in (
        "Acc_T",
        "Fgt_T",
        "Fgt_T_clipped",
        "BWT",
        "FWT",
        "MD_T",
        "bytes_up_total",
        "bytes_down_total",
        "wall_time_s",
        "peak_rss_bytes",
        "buffer_bytes_per_client",
    ):
        assert summary[key] is not None, key
    assert summary["status"] == "finished"
    assert 0 <= summary["Acc_T"] <= 100
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["config"]["clients"] == 4  # CLI beats YAML
    assert cfg["config"]["seed"] == 3  # YAML beats default
    assert len(cfg["protocol_hash"]) == 12
    records = pd.read_csv(out / "records.csv")
    assert list(records.columns) == [
        "round",
        "trained_task",
        "eval_task",
        "scope",
        "metric",
        "value",
    ]
    acc = records[(records.metric == "acc") & (records.trained_task >= 0)]
    assert set(acc.trained_task) == {0, 1}
    # FedGP doubles the upload: each of the 4 clients sends its model and g_ref every round
    # (the MLP on 8×8 inputs: 64·100 + 100 + 100·100 + 100 + 100·10 + 10 = 17,610 float32
    # parameters = 70,440 bytes each). Down: the model once per round (broadcast or g_ref
    # phase, never both for the same version) plus g_ref.
    model_bytes = (64 * 100 + 100 + 100 * 100 + 100 + 100 * 10 + 10) * 4
    assert summary["num_params"] == 17610 and cfg["config"]["model"] == "mlp"
    up = records[records.metric == "bytes_up"].value.to_numpy()
    down = records[records.metric == "bytes_down"].value.to_numpy()
    assert (up == 8 * model_bytes).all()
    assert down[0] == 8 * model_bytes and (down[1:] == 8 * model_bytes).all()
    assert summary["bytes_up_total"] == 4 * 8 * model_bytes
    # rerunning into a finished run directory is refused unless --overwrite
    again = cli("run", "--stream", "rot-digits", *SMALL, "--out", str(out))
    assert_user_error(again, "already holds a finished run")


def test_same_seed_gives_identical_records(tmp_path: Path) -> None:
    def records_of(seed: str, name: str) -> bytes:
        out = tmp_path / name
        result = cli("run", "--stream", "perm-digits", "--strategy", "agem+fedgp", *SMALL,
                     "--seed", seed, "--out", str(out), "--device", "cpu")  # fmt: skip
        assert result.returncode == 0, result.stderr
        return (out / "records.csv").read_bytes()

    first = records_of("5", "a")
    assert records_of("5", "b") == first
    assert records_of("6", "c") != first


# -- output that fits 80 columns, suggestions, entry points (issue 11) ------------------------
def at_80_columns(*args: str) -> subprocess.CompletedProcess[str]:
    """``python -m cfl_bench ARGS`` as an 80-column terminal would run it."""
    return subprocess.run(
        [sys.executable, "-m", "cfl_bench", *args],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "COLUMNS": "80"},
    )


@pytest.mark.parametrize("task_il", [False, True])
def test_results_table_shows_every_value_in_full_at_80_columns(task_il: bool) -> None:
    from rich.console import Console

    from cfl_bench.cli import results_table

    summary: dict[str, object] = {
        "Acc_T": -10.123456,
        "Fgt_T": 1724.5,
        "BWT": -99.987,
        "FWT": 12345.678,
        "MD_T": 0.0001234,
        "bytes_up_total": 1.7e12,
        "bytes_down_total": 172_400_000_000,
        "wall_time_s": 1_234_567.89,
    }
    shown = ["-10.12", "1724.50", "-99.99", "12345.68", "0.0001", "1700.0 GB", "172.4 GB"]
    shown.append("1234567.9 s")
    if task_il:
        summary.update(
            acc_task_il_T=-20.5, fgt_acc_task_il_T=99.999, bwt_acc_task_il=-0.001,
            fwt_acc_task_il=None,
        )  # fmt: skip
        shown += ["-20.50", "100.00", "-0.00", "task-IL"]
    console = Console(width=80, record=True)
    console.print(results_table(summary, "seq-cifar100", "der:alpha=0.5+fedgp"))
    text = console.export_text()
    assert "…" not in text
    assert all(len(line) <= 80 for line in text.splitlines())
    for value in shown:
        assert value in text, f"{value!r} is not shown in full:\n{text}"


@pytest.mark.parametrize("what", ["streams", "models", "partitions"])
def test_listings_wrap_instead_of_cutting_at_80_columns(what: str) -> None:
    result = at_80_columns("list", what)
    assert result.returncode == 0, result.stderr
    assert "…" not in result.stdout
    assert all(len(line) <= 80 for line in result.stdout.splitlines())
    if what == "streams":  # every stream says which data it needs and where it goes
        from cfl_bench.streams.catalogue import AVALANCHE_FORM, STREAMS

        flat = " ".join(result.stdout.split())
        for info in STREAMS.values():
            assert info.name in flat and " ".join(info.data_line().split()) in flat
        assert "data: none (embedded)" in flat and AVALANCHE_FORM in flat
        assert "text/agnews-subset/train.json and test.json under --data-root" in flat
        assert "cifar-10-batches-py/" in flat and "yahoo_answers_csv/" in flat


def test_top_level_help_cuts_no_command_summary() -> None:
    result = at_80_columns("--help")
    assert result.returncode == 0, result.stderr
    commands = result.stdout.split("Commands:")[1]
    assert "..." not in commands and "…" not in commands, commands
    for name in ("run", "sweep", "clients", "leaderboard", "list"):
        assert f"  {name} " in commands


def test_python_dash_m_cfl_bench_is_the_command(tmp_path: Path) -> None:
    listed = at_80_columns("list", "models")
    assert listed.returncode == 0 and "mnist-cnn" in listed.stdout
    refused = at_80_columns("run", "--stream", "rot-digit", "--out", str(tmp_path / "r"))
    assert_user_error(refused, "unknown stream 'rot-digit' (did you mean 'rot-digits'?)")


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--stream", "rot-digit"], "unknown stream 'rot-digit' (did you mean 'rot-digits'?)"),
        (["--stream", "ROT-MNIST"], "(did you mean 'rot-mnist'?)"),
        (["--model", "resnet180"], "unknown model 'resnet180' (did you mean 'resnet18'?)"),
        (["--model", "cnn"], "unknown model 'cnn'"),
        (["--strategy", "derr"], "unknown strategy component 'derr'; choose from: agem, der,"),
        (["--strategy", "derr"], "(did you mean 'der'?)."),
        (["--strategy", "der+fedgb"], "(did you mean 'fedgp'?)."),
        (["--partition", "dirichlt"], "unknown partition 'dirichlt' (did you mean 'dirichlet'?)"),
        (["--stream", "seq-cifar10"], "holds cifar-10-batches-py/ (the extracted python-pickle"),
        (["--stream", "seq-agnews"], "holds text/agnews-subset/train.json and test.json"),
    ],
)
def test_misspelled_names_get_a_suggestion(args: list[str], fragment: str, tmp_path: Path) -> None:
    code, output = in_process("run", *args, "--out", str(tmp_path / "r"))
    assert code == 2, output
    assert fragment in " ".join(output.split())
    assert not (tmp_path / "r").exists()


def test_leaderboard_without_out_writes_inside_the_first_argument(tmp_path: Path) -> None:
    from tests.leaderboard_fixtures import standard_runs

    root = standard_runs(tmp_path / "runs")
    code, output = in_process("leaderboard", str(root))
    assert code == 0, output
    assert (root / "leaderboard" / "leaderboard.csv").is_file()
    assert (root / "leaderboard" / "leaderboard.html").is_file()
    run_dir = root / "a" / "fedavg_s0"
    code, output = in_process("leaderboard", str(run_dir))
    assert code == 2
    assert "is a cfl-bench run directory (it holds config.json)" in output and "--out" in output
    assert not (run_dir / "leaderboard").exists()


def test_lr_decay_enters_the_protocol_only_when_it_decays(tmp_path: Path) -> None:
    """--lr-decay 1 (the default) leaves the protocol hash of earlier runs unchanged."""
    from cfl_bench.runner.config import make_config

    plain = make_config({"stream": "rot-digits"}).protocol()
    same = make_config({"stream": "rot-digits", "lr_decay": 1.0}).protocol()
    decayed = make_config({"stream": "rot-digits", "lr_decay": "0.99"}).protocol()
    assert "lr_decay" not in plain and plain == same
    assert decayed["lr_decay"] == 0.99
    code, output = in_process("run", "--lr-decay", "0", "--out", str(tmp_path))
    assert code == 2 and "lr-decay" in output


def test_the_closed_stdout_line_names_the_default_run_folder_without_out() -> None:
    """Without --out, ``cfg.out`` is None: the line a closed stdout prints names the folder
    the run plan gives the run (``Path(None)`` raised a TypeError instead)."""
    import dataclasses

    from cfl_bench.cli import run_folder, stopped_run_line
    from cfl_bench.runner.config import make_config

    cfg = make_config({"stream": "rot-digits", "strategy": "fedavg", "seed": 3})
    assert cfg.out is None
    folder = run_folder(cfg)
    assert folder.startswith(os.path.join("runs", "rot-digits_fedavg_s3-")), folder
    assert "before its first checkpoint" in stopped_run_line(folder)
    assert run_folder(dataclasses.replace(cfg, out="elsewhere")) == "elsewhere"
