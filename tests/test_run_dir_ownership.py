"""Issue 39, section 1: ``cfl-bench run --out`` replaces or removes only what a run wrote.

Four classes, each through the real command line in a fresh process (see
tests/test_bad_inputs_classes.py): a non-empty folder that is not a run (whatever the names
in it) is refused; ``--overwrite``/``--restart`` replace the run's own entries
(``cfl_bench.core.run_dir.RUN_OUTPUTS``) and keep every other entry byte-identical; an --out
inside a run directory is refused; a checkpoint.pt that is not a regular file is refused
(``--restart`` starts over). Refusals: exit 2, one line naming the problem, nothing created
or changed. A crash inside the swap, simulated through the ``RunDirectory`` API as in
tests/test_overwrite.py, still rolls forward with the kept entries in place.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from cfl_bench.core.errors import UserError
from cfl_bench.core.run_dir import ASIDE, MOVED, RUN_OUTPUTS, STAGING, RunDirectory
from cfl_bench.sweeps import ledger
from tests.test_bad_inputs_classes import TINY, cli, digest, listing


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One tiny finished run, made once for the module."""
    out = tmp_path_factory.mktemp("finished") / "run"
    result = cli(["run", *TINY, "--out", str(out)], out.parent, timeout=300)
    assert result.returncode == 0, result.stderr.decode(errors="replace")
    return out


def state(root: Path) -> tuple[set[str], dict[str, str], dict[str, str]]:
    """Every name below ``root``, every file's digest, and where every link points."""
    links = {str(p.relative_to(root)): os.readlink(p) for p in root.rglob("*") if p.is_symlink()}
    return listing(root), digest(root), links


def refused(args: list[str], root: Path, *fragments: str) -> str:
    """Run the CLI, assert exit 2, one stderr line holding ``fragments``; the line."""
    result = cli(args, root)
    err = result.stderr.decode(errors="replace")
    assert result.returncode == 2, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def succeeded(args: list[str], root: Path) -> None:
    result = cli(args, root, timeout=300)
    assert result.returncode == 0, result.stderr.decode(errors="replace")


# -- class 1: a folder is a run only when its config.json says so ----------------------------
def user_files(*files: tuple[str, bytes]) -> Callable[[Path], None]:
    def make(folder: Path) -> None:
        for name, content in files:
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            (folder / name).write_bytes(content)

    return make


FOREIGN: dict[str, Callable[[Path], None]] = {
    "records.csv alone": user_files(("records.csv", b"epoch,loss\n1,0.5\n")),
    "checkpoint.pt alone": user_files(("checkpoint.pt", b"PK\x03\x04 a pytorch zip")),
    "an mlruns folder": user_files(("mlruns/0/meta.yaml", b"name: mine\n")),
    "a tensorboard folder": user_files(("tensorboard/events.out.tfevents.1", b"\x00\x01")),
    "costs.csv with summary.json {}": user_files(
        ("costs.csv", b"round,bytes\n1,10\n"), ("summary.json", b"{}")
    ),
    "a config.json that is not a run's": user_files(
        ("config.json", b'{"lr": 0.1, "config_hash": 7}'), ("records.csv", b"mine\n")
    ),
    "a failed summary.json not written by a sweep": user_files(
        ("summary.json", b'{"status": "failed"}'), ("records.csv", b"mine\n")
    ),
}


CASES = [(name, []) for name in FOREIGN] + [
    (name, [flag])
    for name in ("records.csv alone", "an mlruns folder")
    for flag in ("--overwrite", "--restart")
]


@pytest.mark.parametrize(("name", "flags"), CASES, ids=[" ".join([n, *f]) for n, f in CASES])
def test_a_folder_that_is_not_a_run_is_refused(tmp_path: Path, name: str, flags: list) -> None:
    """Whatever the names in it, and with --overwrite or --restart too."""
    out = tmp_path / "mine"
    out.mkdir()
    FOREIGN[name](out)
    before = state(tmp_path)
    first = sorted(p.name for p in out.iterdir())[0]
    refused(["run", *TINY, "--out", str(out), *flags], tmp_path, "is not a cfl-bench run", first)
    assert state(tmp_path) == before


def test_an_empty_folder_and_a_sweeps_failed_point_are_run_into(tmp_path: Path) -> None:
    """The legitimate non-runs: an empty folder (a temp file of a killed write aside), and
    a folder holding only the summary.json a sweep wrote for a point that failed early."""
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / ".records.csv.x1y2.tmp").write_bytes(b"half")
    succeeded(["run", *TINY, "--out", str(empty)], tmp_path)
    assert json.loads((empty / "summary.json").read_text())["status"] == "finished"
    point = tmp_path / "point"
    point.mkdir()
    failed = ledger.failed_summary({"stream": "rot-digits"}, "h", "point", 1, "boom")
    (point / "summary.json").write_text(json.dumps(failed))
    succeeded(["run", *TINY, "--out", str(point)], tmp_path)
    assert json.loads((point / "summary.json").read_text())["status"] == "finished"
    assert sorted(p.name for p in point.iterdir()) == sorted(p.name for p in empty.iterdir())


def test_the_sweep_refuses_a_point_folder_that_is_not_a_run(tmp_path: Path) -> None:
    """check_run_dir agrees with `run`: run-file names without a run's config.json are not
    a run, and a sweep's own record of a failed point is."""
    point = tmp_path / "point"
    point.mkdir()
    (point / "records.csv").write_text("mine\n")
    with pytest.raises(UserError, match="is not a cfl-bench run directory"):
        ledger.check_run_dir(point)
    (point / "records.csv").unlink()
    failed = ledger.failed_summary({}, "h", "point", 1, "boom")
    (point / "summary.json").write_text(json.dumps(failed))
    ledger.check_run_dir(point)


# -- class 2: --overwrite and --restart replace only the run's own entries -------------------
def add_foreign_entries(run: Path, finished: Path) -> None:
    """What a user or other commands put into a run folder, and two old run extras."""
    (run / "NOTES.md").write_text("my notes on this run\n")
    (run / "plots").mkdir()
    (run / "plots" / "acc.png").write_bytes(b"\x89PNG fake")
    (run / "comparison").mkdir()  # a `reproduce --compare` report folder
    for ext in ("html", "csv", "md"):
        (run / "comparison" / f"report.{ext}").write_text(f"report {ext}\n")
    (run / "app").mkdir()  # a Flower app folder
    (run / "app" / "pyproject.toml").write_text("[project]\nname = 'app'\n")
    shutil.copytree(finished, run / "nested-run")  # a whole finished run in a subfolder
    (run / "model.pt").write_bytes(b"the old run's model")  # the run's own: replaced
    (run / "report.html").write_text("<html>the old run's report</html>\n")


@pytest.mark.parametrize("how", ["overwrite", "restart"])
def test_a_replacement_keeps_what_the_run_did_not_write(
    tmp_path: Path, finished: Path, how: str
) -> None:
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    if how == "restart":
        (run / "summary.json").unlink()  # an unfinished run of the same configuration
        flags = ["--restart"]
    else:
        flags = ["--overwrite", "--seed", "1"]
    add_foreign_entries(run, finished)
    kept = {k: v for k, v in digest(run).items() if k.split("/")[0] not in RUN_OUTPUTS}
    kept_names = {n for n in listing(run) if n.split("/")[0] not in RUN_OUTPUTS}
    old_records = (run / "records.csv").read_bytes()
    succeeded(["run", *TINY, "--out", str(run), *flags], tmp_path)
    assert {k: v for k, v in digest(run).items() if k.split("/")[0] not in RUN_OUTPUTS} == kept
    assert {n for n in listing(run) if n.split("/")[0] not in RUN_OUTPUTS} == kept_names
    own = sorted(p.name for p in run.iterdir() if p.name in RUN_OUTPUTS)
    assert own == ["config.json", "costs.csv", "records.csv", "summary.json"]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["seed"] == (1 if how == "overwrite" else 0)
    if how == "overwrite":
        assert (run / "records.csv").read_bytes() != old_records
    assert not (run / STAGING).exists() and not (run / ASIDE).exists()


def test_readme_says_what_overwrite_removes_and_keeps() -> None:
    text = " ".join((Path(__file__).resolve().parents[1] / "README.md").read_text().split())
    for name in RUN_OUTPUTS:
        assert f"`{name}" in text, name
    assert "keeps every other entry" in text


# -- class 3: an --out inside a run directory --------------------------------------------------
@pytest.mark.parametrize("below", ["sub", "a/b", "nested/.hidden"])
def test_an_out_inside_a_run_directory_is_refused(
    tmp_path: Path, finished: Path, below: str
) -> None:
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    before = state(tmp_path)
    refused(
        ["run", *TINY, "--out", str(run / below)],
        tmp_path,
        "is inside the cfl-bench run directory",
        str(run),
    )
    assert state(tmp_path) == before


# -- class 4: a checkpoint.pt that is not a regular file --------------------------------------
def as_folder(path: Path) -> None:
    path.mkdir()
    (path / "data.pkl").write_bytes(b"not ours")


def as_link_to(target: str) -> Callable[[Path], None]:
    return lambda path: path.symlink_to(target)


NOT_A_FILE: dict[str, tuple[Callable[[Path], None], str]] = {
    "a folder": (as_folder, "is a directory"),
    "a link to /dev/null": (as_link_to("/dev/null"), "is a symbolic link"),
    "a link to a file": (as_link_to("../elsewhere.pt"), "is a symbolic link"),
    "a dangling link": (as_link_to("/nonexistent/ckpt.pt"), "is a symbolic link"),
    "a named pipe": (os.mkfifo, "is a named pipe"),
}


@pytest.mark.parametrize("name", list(NOT_A_FILE))
def test_a_checkpoint_that_is_not_a_file_is_refused(
    tmp_path: Path, finished: Path, name: str
) -> None:
    """Refused (also with --overwrite: the same configuration resumes); --restart starts
    over and replaces it (checked for two kinds, each a full run)."""
    flags = ["--overwrite"] if name == "a named pipe" else []
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    (run / "summary.json").unlink()  # unfinished: the run would resume from the checkpoint
    (tmp_path / "elsewhere.pt").write_bytes(b"a file the link points at")
    (run / "NOTES.md").write_text("mine\n")
    make, kind = NOT_A_FILE[name]
    make(run / "checkpoint.pt")
    before = state(tmp_path)
    args = ["run", *TINY, "--out", str(run)]
    refused([*args, *flags], tmp_path, f"'{run / 'checkpoint.pt'}' {kind}", "--restart")
    assert state(tmp_path) == before
    if name not in ("a folder", "a link to /dev/null"):
        return
    succeeded([*args, "--restart"], tmp_path)  # starts over, then replaces it
    assert json.loads((run / "summary.json").read_text())["status"] == "finished"
    assert not os.path.lexists(run / "checkpoint.pt")
    assert (run / "NOTES.md").read_text() == "mine\n"
    assert (tmp_path / "elsewhere.pt").read_bytes() == b"a file the link points at"


# -- a crash inside the swap rolls forward around the kept entries ----------------------------
def fake_run(folder: Path, config_hash: str, content: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"config_hash": config_hash}))
    (folder / "records.csv").write_text(content)
    (folder / "summary.json").write_text(json.dumps({"status": "finished"}))


@pytest.mark.parametrize("moved_before_crash", [0, 1, 2, 4, 5, 6])
def test_a_swap_stopped_half_way_rolls_forward_around_kept_entries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, moved_before_crash: int
) -> None:
    """As tests/test_overwrite.py's swap test, with the user's entries in --out: they are
    never moved (the renames are the run's 4 old entries aside, then 3 new ones up), and
    the next claim completes the swap around them."""
    out = tmp_path / "run"
    fake_run(out, "old", "old records\n")
    (out / "model.pt").write_bytes(b"old model")
    (out / "NOTES.md").write_text("mine\n")
    (out / "plots").mkdir()
    (out / "plots" / "a.png").write_bytes(b"png")
    kept = {k: v for k, v in digest(out).items() if k in ("NOTES.md", "plots/a.png")}
    run_dir = RunDirectory(out)
    assert run_dir.claim("new", overwrite=True, restart=False) is False
    fake_run(run_dir.path, "new", "new records\n")
    (run_dir.path / "NOTES.md").write_text("a staged entry never replaces a kept one\n")
    real_replace, calls = os.replace, [0]

    def crash_after(src: object, dst: object) -> None:
        assert Path(str(src)).parent != out or Path(str(src)).name not in ("NOTES.md", "plots")
        if calls[0] == moved_before_crash:
            raise OSError(5, "Input/output error")
        calls[0] += 1
        real_replace(src, dst)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "replace", crash_after)
    with pytest.raises(OSError), run_dir:
        run_dir.commit()
    monkeypatch.setattr(os, "replace", real_replace)
    assert (out / ASIDE).is_dir()
    assert (out / ASIDE / MOVED).exists() == (moved_before_crash >= 4)
    assert {k: v for k, v in digest(out).items() if k in kept} == kept
    with RunDirectory(out) as again, pytest.raises(UserError, match="holds a finished run"):
        again.claim("new", overwrite=False, restart=False)
    names = sorted(p.name for p in out.iterdir())
    assert names == ["NOTES.md", "config.json", "plots", "records.csv", "summary.json"]
    assert (out / "records.csv").read_text() == "new records\n"
    assert {k: v for k, v in digest(out).items() if k in kept} == kept


def test_a_foreign_folder_is_refused_by_the_api_with_nothing_created(tmp_path: Path) -> None:
    """claim() itself refuses (sweeps and Flower's ServerApp call it, not the CLI)."""
    out = tmp_path / "mine"
    out.mkdir()
    (out / "records.csv").write_text("mine\n")
    before = state(tmp_path)
    with pytest.raises(UserError, match=r"holds records\.csv"):
        RunDirectory(out).claim("h", overwrite=True, restart=True)
    with pytest.raises(UserError, match=r"holds records\.csv"):
        RunDirectory(out).precheck("h", overwrite=True, restart=True)
    assert state(tmp_path) == before


def test_a_flower_run_is_refused_before_flower_starts(tmp_path: Path, finished: Path) -> None:
    """A hosted run claims its folder only inside Flower, a minute later: the same refusals
    come first, in seconds (RunDirectory.precheck)."""
    pytest.importorskip("flwr")
    out = tmp_path / "mine"
    out.mkdir()
    (out / "records.csv").write_text("mine\n")
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    before = state(tmp_path)
    flower = ["run", *TINY, "--executor", "flower"]
    refused([*flower, "--out", str(out)], tmp_path, "is not a cfl-bench run", "records.csv")
    refused([*flower, "--out", str(run / "sub")], tmp_path, "is inside the cfl-bench run")
    assert state(tmp_path) == before
