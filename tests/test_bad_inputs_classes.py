"""Issue 25, item 5: every bad input of five classes gets one line and exit code 2.

Each class is one table run through the real command line in a fresh process (so a hang
shows as a timeout, and a broken stdout is a real pipe): exit code 2, exactly one non-empty
output line, no traceback, nothing created under the test folder, and a finished run that
a case points at byte-identical afterwards. The classes: YAML 1.1 forms, inputs that used
to hang, inputs that used to end in a traceback, inputs that were silently accepted, and
messages that named internal fields or options the command does not have.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def tiny(tasks: str = "1", rounds: str = "1", clients: str = "2") -> list[str]:
    """The tiny run's options, with one of its sizes replaced."""
    sizes = ["--tasks", tasks, "--rounds-per-task", rounds, "--clients", clients]
    return ["--stream", "rot-digits", *sizes, "--threads", "1"]


TINY = tiny()
HANG_SECONDS = 60  # every case must answer in seconds; a hang fails here instead of waiting

Setup = Callable[[Path, Path], list[str]]


def cli(args: list[str], cwd: Path, timeout: float = HANG_SECONDS) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "cfl_bench.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        timeout=timeout,
    )


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One tiny finished run, made once for the module."""
    out = tmp_path_factory.mktemp("finished") / "run"
    result = cli(["run", *TINY, "--out", str(out)], out.parent, timeout=300)
    assert result.returncode == 0, result.stderr.decode(errors="replace")
    return out


def digest(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def listing(root: Path) -> set[str]:
    return {os.fsdecode(p.relative_to(root)) for p in root.rglob("*")}


def argv(*args: str) -> Setup:
    """Arguments with {root} (the test folder) and {run} (the finished run) filled in."""
    return lambda root, run: [
        a.replace("{root}", str(root)).replace("{run}", str(run)) for a in args
    ]


def yaml_run(text: str, *extra: str) -> Setup:
    def setup(root: Path, run: Path) -> list[str]:
        (root / "c.yaml").write_text(text, encoding="utf-8")
        return ["run", "--config", str(root / "c.yaml"), *TINY, "--out", str(root / "o"), *extra]

    return setup


def yaml_sweep(text: str) -> Setup:
    def setup(root: Path, run: Path) -> list[str]:
        (root / "s.yaml").write_text(f"out: {root / 'sw'}\n{text}", encoding="utf-8")
        return ["sweep", "--config", str(root / "s.yaml")]

    return setup


def made(kind: str, name: str, *args: str) -> Setup:
    """A FIFO or a regular file at {root}/name, made before the command."""

    def setup(root: Path, run: Path) -> list[str]:
        if kind == "fifo":
            os.mkfifo(root / name)
        else:
            (root / name).write_text("x")
        return argv(*args)(root, run)

    return setup


BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{n}: &{n} [{', '.join(['*' + p] * 9)}]\n" for p, n in zip("abcdefgh", "bcdefghi", strict=True)
)

YAML_FORMS: dict[str, tuple[Setup, str]] = {
    "octal seed": (yaml_run("seed: 017\n"), "seed: 017 (line 1) reads as 15 in YAML 1.1"),
    "sexagesimal seed": (yaml_run("seed: 1:30\n"), "reads as 90 in YAML 1.1"),
    "hex lr": (yaml_run("lr: 0x10\n"), "lr: 0x10 (line 1) is a hexadecimal integer (16)"),
    "binary seed": (yaml_run("seed: 0b11\n"), "reads as 3 in YAML 1.1"),
    "0o seed": (yaml_run("seed: 0o17\n"), "but as 15 in YAML 1.2"),
    "underscores": (yaml_run("lr: 1_000\n"), "reads as 1000 in YAML 1.1"),
    "yes boolean": (yaml_run("overwrite: yes\n"), "write true or false"),
    "on boolean": (yaml_run("eval_every_round: on\n"), "write true or false"),
    "leading zero 08": (yaml_run("seed: 08\n"), "reads as the text '08' in YAML 1.1"),
    "inf lr": (yaml_run("lr: .inf\n"), "--lr must be a finite number"),
    "thousands of digits": (yaml_run("seed: " + "1" * 5000 + "\n"), "a number of 5000"),
    "alias bomb": (yaml_run(BOMB), "uses the alias *a"),
    "merge key": (yaml_run("a: &b {seed: 1}\n<<: *b\n"), "uses the alias *b"),
    "sweep grid octal": (yaml_sweep("grid: {seed: [07, 010]}\n"), "seed: 010 (line 2)"),
    "sweep alias": (yaml_sweep("base: &b {seed: 1}\ngrid: *b\n"), "uses the alias *b"),
    "cli seed of 5000 digits": (argv("run", "--seed", "1" * 5000), "--seed must be an integer"),
}

HANGS: dict[str, tuple[Setup, str]] = {
    "tasks 1e9": (
        argv("run", *tiny(tasks="1000000000"), "--out", "{root}/o"),
        "--tasks must be an integer in [1, 1000]",
    ),
    "rounds 1e9": (
        argv("run", *tiny(rounds="1000000000"), "--out", "{root}/o"),
        "--rounds-per-task must be an integer in [1, 100000]",
    ),
    "total rounds": (
        argv("run", *tiny(tasks="1000", rounds="1000"), "--out", "{root}/o"),
        "a run has at most 100,000",
    ),
    "client-rounds": (
        argv("run", *tiny(rounds="50000", clients="1000"), "--out", "{root}/o"),
        "a run has at most 10,000,000",
    ),
    "epochs 1e9": (
        argv("run", *TINY, "--epochs", "1000000000", "--out", "{root}/o"),
        "--epochs must be an integer in [1, 1000]",
    ),
    "buffer 1e21": (
        argv("run", *TINY, "--buffer-size", "1" + "0" * 21, "--out", "{root}/o"),
        "--buffer-size must be an integer in [1, 1000000]",
    ),
    "sweep of a million points": (
        argv(
            "sweep",
            "--out",
            "{root}/sw",
            "--set",
            "seed=" + ",".join(map(str, range(1000))),
            "--set",
            "buffer_size=" + ",".join(map(str, range(1, 1001))),
        ),
        "the sweep grid has 1,000,000 points",
    ),
    "carla record seconds inf": (
        argv("carla", "record", "--out", "{root}/o", "--seconds", "inf"),
        "--seconds must be a number of simulated seconds in (0, 86400], got inf",
    ),
}

TRACEBACKS: dict[str, tuple[Setup, str]] = {
    "batch size 1e8": (
        argv("run", *TINY, "--batch-size", "100000000", "--out", "{root}/o"),
        "--batch-size must be an integer in [1, 100000]",
    ),
    "out with a newline": (
        argv("run", *TINY, "--out", "{root}/a\nb"),
        "--out must be a folder path of UTF-8 text without control characters",
    ),
    "out not utf-8": (
        lambda root, run: ["run", *TINY, "--out", str(root) + "/\udcff"],
        "--out must be a folder path of UTF-8 text",
    ),
    "sweep folder with a newline": (
        argv("sweep", "--out", "{root}/a\nb", "--seed", "1"),
        "must not hold control characters",
    ),
    "flower app-dir is a file": (
        made("file", "f", "flower", "app", "--app-dir", "{root}/f", *TINY),
        "--app-dir '{root}/f' is a file, not a folder",
    ),
    "pilot out is a file": (
        made("file", "f", "pilot", "boundary", "--out", "{root}/f"),
        "--out '{root}/f' is a file",
    ),
    "carla record port 0": (
        argv("carla", "record", "--out", "{root}/o", "--port", "0"),
        "--port must be an integer in [1, 65535], got 0",
    ),
    "carla record port 70000": (
        argv("carla", "record", "--out", "{root}/o", "--port", "70000"),
        "--port must be an integer in [1, 65535], got 70000",
    ),
    "carla demo port 70000": (
        argv("carla", "demo", "--out", "{root}/o", "--port", "70000"),
        "--port must be an integer in [1, 65535]",
    ),
}

SILENT: dict[str, tuple[Setup, str]] = {
    "download on embedded": (
        argv("run", *TINY, "--download", "--out", "{root}/o"),
        "is embedded and reads no data files, so --download has no effect",
    ),
    "data root on embedded": (
        argv("run", *TINY, "--data-root", "{root}", "--out", "{root}/o"),
        "so --data-root has no effect",
    ),
    "momentum with adam": (
        argv("run", *TINY, "--momentum", "0.9", "--optimizer", "adam", "--out", "{root}/o"),
        "--momentum applies to --optimizer sgd only",
    ),
    "sweep points that are one run": (
        argv("sweep", "--out", "{root}/sw", *TINY[:2], "--set", "tasks=none,5"),
        "are the same run once defaults are filled in",
    ),
    "sweep duplicate lr": (
        yaml_sweep("grid: {lr: [0.1, 0.10]}\n"),
        "lists 0.1 twice for 'lr'",
    ),
    "empty app-dir": (argv("flower", "app", "--app-dir", "", *TINY), "--app-dir is empty"),
    "finished run with adam momentum": (
        argv("run", *TINY, "--momentum", "0.5", "--optimizer", "adam", "--out", "{run}"),
        "--momentum applies to --optimizer sgd only",
    ),
}

MESSAGES: dict[str, tuple[Setup, str]] = {
    "carla-live clients names the option": (
        argv(
            "run",
            "--stream",
            "carla-live",
            "--data-root",
            "carla://127.0.0.1:2000",
            "--clients",
            "20",
            "--threads",
            "1",
            "--out",
            "{root}/o",
        ),
        "use --clients 1 to 16, got 20",
    ),
    "carla-live port": (
        argv(
            "run",
            "--stream",
            "carla-live",
            "--data-root",
            "carla://127.0.0.1:70000",
            "--threads",
            "1",
            "--out",
            "{root}/o",
        ),
        "names port 70000; a CARLA server's port lies in 1–65535",
    ),
    "train size names the option": (
        argv("run", *TINY, "--train-size", "100000", "--out", "{root}/o"),
        "--train-size 100000 does not fit",
    ),
    "carla clients names the option": (
        argv("carla", "record", "--out", "{root}/o", "--clients", "0"),
        "--clients must be an integer in [1, 16], got 0",
    ),
    "config is a device": (
        argv("run", "--config", "/dev/zero", *TINY, "--out", "{root}/o"),
        "config file '/dev/zero' is a device, not a file",
    ),
    "config is a fifo": (
        made("fifo", "p", "run", "--config", "{root}/p", *TINY, "--out", "{root}/o"),
        "config file '{root}/p' is a named pipe, not a file",
    ),
    "out is a device": (argv("run", *TINY, "--out", "/dev/zero"), "'/dev/zero' is a device"),
    "out is a fifo": (
        made("fifo", "p", "run", *TINY, "--out", "{root}/p"),
        "--out '{root}/p' is a named pipe",
    ),
    "feddf holdout names feddf": (
        argv(
            "run",
            *TINY,
            "--strategy",
            "feddf:public=holdout,public_size=5000",
            "--out",
            "{root}/o",
        ),
        "lower feddf:public_size",
    ),
}

CLASSES = {
    "yaml": YAML_FORMS,
    "hang": HANGS,
    "traceback": TRACEBACKS,
    "silent": SILENT,
    "message": MESSAGES,
}


def check_case(table: dict[str, tuple[Setup, str]], name: str, root: Path, run: Path) -> None:
    setup, fragment = table[name]
    args = setup(root, run)
    before, run_before = listing(root), digest(run)
    result = cli(args, root)
    err = result.stderr.decode("utf-8", "replace")
    out = result.stdout.decode("utf-8", "replace")
    lines = [line for line in (err + out).splitlines() if line.strip()]
    assert result.returncode == 2, err + out
    assert "Traceback" not in err
    assert len(lines) == 1, err + out
    assert fragment.replace("{root}", str(root)) in lines[0], lines[0]
    assert listing(root) == before
    assert digest(run) == run_before


@pytest.mark.parametrize("name", sorted(YAML_FORMS))
def test_yaml_1_1_forms_are_refused(name: str, tmp_path: Path, finished_run: Path) -> None:
    check_case(YAML_FORMS, name, tmp_path, finished_run)


@pytest.mark.parametrize("name", sorted(HANGS))
def test_inputs_that_hung_are_refused_at_once(
    name: str, tmp_path: Path, finished_run: Path
) -> None:
    check_case(HANGS, name, tmp_path, finished_run)


@pytest.mark.parametrize("name", sorted(TRACEBACKS))
def test_inputs_that_ended_in_a_traceback(name: str, tmp_path: Path, finished_run: Path) -> None:
    check_case(TRACEBACKS, name, tmp_path, finished_run)


@pytest.mark.parametrize("name", sorted(SILENT))
def test_inputs_that_were_silently_accepted(name: str, tmp_path: Path, finished_run: Path) -> None:
    check_case(SILENT, name, tmp_path, finished_run)


@pytest.mark.parametrize("name", sorted(MESSAGES))
def test_messages_name_what_the_user_typed(name: str, tmp_path: Path, finished_run: Path) -> None:
    check_case(MESSAGES, name, tmp_path, finished_run)


@pytest.mark.parametrize("name", ["a\nb", "\udcff"])
def test_report_and_leaderboard_read_oddly_named_run_folders(
    name: str, tmp_path: Path, finished_run: Path
) -> None:
    """A run folder named with a newline or a non-UTF-8 byte (made by hand, or by an older
    version) is reported and ranked, not a traceback."""
    import shutil

    folder = tmp_path / "runs" / name
    shutil.copytree(finished_run, folder)
    report = cli(["report", str(folder), "--out", str(tmp_path / "r.html")], tmp_path)
    assert report.returncode == 0 and b"Traceback" not in report.stderr, report.stderr
    board = cli(["leaderboard", str(tmp_path / "runs"), "--out", str(tmp_path / "lb")], tmp_path)
    assert board.returncode == 0 and b"Traceback" not in board.stderr, board.stderr
    assert (tmp_path / "lb" / "leaderboard.csv").is_file()


def test_a_closed_stdout_does_not_blame_the_run_directory(tmp_path: Path) -> None:
    """`cfl-bench run … | head -0`: the run stops quietly (or says the output closed), and
    never reports its run directory as failed."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "cfl_bench.cli", "run", *TINY, "--out", str(tmp_path / "o")]
    proc = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)  # fmt: skip
    assert proc.stdout is not None
    proc.stdout.close()  # the reader is gone before the first line
    _, err = proc.communicate(timeout=300)
    text = err.decode("utf-8", "replace")
    assert "Traceback" not in text
    assert "failed" not in text and "run directory" not in text
    assert len([line for line in text.splitlines() if line.strip()]) <= 1, text
    assert proc.returncode != 0


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("lr: 1e-3\n", {"lr": 0.001}),
        ("weight_decay: 5E-4\nlr: 2.5e-2\n", {"weight_decay": 0.0005, "lr": 0.025}),
        ("seed: 7\nlr: 0.5\n", {"seed": 7, "lr": 0.5}),
        ("stream: '017'\n", {"stream": "017"}),
    ],
)
def test_yaml_forms_both_versions_read_alike_are_read(text: str, expected: dict) -> None:
    # 1e-3 is text to YAML 1.1 and 0.001 to 1.2: the number is the only meaning, so the
    # 1.2 reading is taken; quoted text stays text.
    from cfl_bench.runner.config import load_plain_yaml

    assert load_plain_yaml(text) == expected


@pytest.mark.shared_data
def test_a_replayed_town_is_named_by_its_option(tmp_path: Path, finished_run: Path) -> None:
    # The replayed towns are those of the shared frames, so this needs the real dataset
    # (and the recording folder check, which comes first, needs a real replay source).
    from tests.conftest import SHARED_DATA

    data = str(SHARED_DATA)
    table = {
        "town": (
            argv("carla", "record", "--out", "{root}/o", "--data-root", data, "--town", "Bogus"),
            "--town 'Bogus' is not a town of the recorded frames in",
        )
    }
    check_case(table, "town", tmp_path, finished_run)
