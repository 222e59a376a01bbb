"""Issue 39: `cfl-bench reproduce` touches only what it owns and never counts a run twice.

One test per class of defect, each through the real command line in a fresh process where
that is cheap (exit code 2, exactly one output line, no traceback, nothing created, every
pre-existing file byte-identical):

* a run directory, or a folder inside one, as the folder a report or the runs are written to
  (``--compare RUN``, ``--shipped --out RUN``, ``--out RUN/sub``);
* ``--ship`` of part of a table replaced the whole shipped set: it now merges, keeping every
  shipped run it does not replace byte for byte (through the Python API, which takes the
  ``reproductions/`` folder as a parameter, so a copy in a temporary folder is shipped to);
* ``--ship`` from a working tree with uncommitted changes, or of a run made in one: shipped
  runs must name a commit that holds their code (the checkout's commit is injected, so the
  test does not depend on the state of the tree it runs in);
* a cell and seed counted twice (a rerun with another executor into the same folder), and a
  damaged records.csv scored;
* tracebacks for a file as ``--out`` and for a working folder that cannot be written;
* late failures: ``--device cuda`` without a GPU, a ``--data-root`` that does not exist and
  an executor that cannot run a row failed point by point at run time.

The shipped results of FedGP Table 1 (MNIST, cpu scale) serve as finished runs of a table:
they need no dataset and are counted by the same code as a user's runs.
"""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from rich.console import Console

from cfl_bench.core.errors import UserError
from cfl_bench.reproduce.collect import collect
from cfl_bench.reproduce.command import Request, reproduce, reproductions_root
from cfl_bench.reproduce.figures import find_figure
from cfl_bench.reproduce.shipping import ship, shipped_folder
from cfl_bench.reproduce.tables import find_table
from tests.cli_helpers import cli as run_cli

ROOT = reproductions_root()
TABLE = "fedgp-table1-mnist"
SHIPPED = shipped_folder(ROOT, TABLE, "cpu")
ROW, OTHER_ROW = "FedAvg w/o FedGP", "DER w/ FedGP"
COLUMN = "rotated-MNIST domain-IL"
IDEAL = "Ideal (upper bound)"
# The data root the shipped runs were made with: the sweep names a point by it, so a rerun
# with it finds the shipped runs' folders done.
SHIPPED_DATA_ROOT = "../shared/data"
SECONDS = 120
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def clean() -> str:
    """A clean checkout's commit, for ``reproduce(..., commit=clean)``."""
    return COMMIT


def dirty() -> str:
    return COMMIT + "-dirty"


def cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return run_cli(args, cwd, SECONDS)


def digest(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def listing(root: Path) -> set[str]:
    return {os.fsdecode(p.relative_to(root)) for p in root.rglob("*")}


def refused(result: subprocess.CompletedProcess[str], *fragments: str) -> str:
    """Exit code 2 and one line holding every fragment, no traceback."""
    output = (result.stdout + result.stderr).strip()
    assert result.returncode == 2, output
    assert len(output.splitlines()) == 1, output
    assert "Traceback" not in output
    for fragment in fragments:
        assert fragment in output, output
    return output


def shipped_run(row: str, seed: int = 0) -> Path:
    """The shipped run folder of ``row`` × the rotated-MNIST column at ``seed``."""
    table = find_table(TABLE, ROOT)
    values = collect(table, SHIPPED, "cpu").values(row, COLUMN)
    return next(v.path for v in values if v.seed == seed)


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One tiny finished run with an empty sub-folder (a place inside a run directory)."""
    out = tmp_path_factory.mktemp("finished") / "run"
    tiny = ["--stream", "rot-digits", "--tasks", "1", "--rounds-per-task", "1", "--clients", "2"]
    result = cli(["run", *tiny, "--threads", "1", "--out", str(out)], out.parent)
    assert result.returncode == 0, result.stderr
    (out / "sub").mkdir()
    return out


INTO_A_RUN = {
    "compare a run": ["--compare", "{run}"],
    "compare inside a run": ["--compare", "{run}/sub"],
    "compare report into a run": ["--compare", "{root}", "--out", "{run}/report"],
    "shipped report into a run": ["--shipped", "--out", "{run}"],
    "shipped report inside a run": ["--shipped", "--out", "{run}/sub"],
    "runs into a run": ["--scale", "smoke", "--out", "{run}"],
    "runs inside a run": ["--scale", "smoke", "--out", "{run}/sub/new"],
}


@pytest.mark.parametrize("args", list(INTO_A_RUN.values()), ids=list(INTO_A_RUN))
def test_a_run_directory_is_never_written_to(
    args: list[str], finished_run: Path, tmp_path: Path
) -> None:
    before, files = listing(finished_run), digest(finished_run)
    filled = [a.replace("{run}", str(finished_run)).replace("{root}", str(tmp_path)) for a in args]
    result = cli(["reproduce", TABLE, *filled], tmp_path)
    refused(result, "cfl-bench run directory")
    assert listing(finished_run) == before and digest(finished_run) == files
    assert listing(tmp_path) == set()


def quiet() -> Console:
    return Console(file=io.StringIO(), width=100)


@pytest.fixture
def repo_copy(tmp_path: Path) -> Path:
    """A ``reproductions/`` folder with the shipped cpu results of the table, to ship into."""
    root = tmp_path / "reproductions"
    for part in ("tables", "targets"):
        shutil.copytree(ROOT / part, root / part)
    shutil.copytree(SHIPPED, shipped_folder(root, TABLE, "cpu"))
    return root


def test_shipping_part_of_a_table_keeps_every_other_shipped_run(
    repo_copy: Path, tmp_path: Path
) -> None:
    """``--row/--column/--seed … --ship`` replaced the table's whole shipped set with the
    part it ran; it must replace that part only."""
    target = shipped_folder(repo_copy, TABLE, "cpu")
    mine = tmp_path / "mine"
    chosen, other = shipped_run(ROW), shipped_run(OTHER_ROW)
    shutil.copytree(chosen, mine / chosen.name)
    shutil.copytree(other, mine / "another-name")  # a run of a cell the selection leaves out
    before = digest(target)
    request = Request(
        TABLE, scale="cpu", out=str(mine), data_root=SHIPPED_DATA_ROOT, ship=True,
        rows=(ROW,), columns=(COLUMN,), seeds=(0,),
    )  # fmt: skip
    assert reproduce(request, console=quiet(), root=repo_copy, commit=clean) == 0
    after = digest(target)
    assert "another-name/summary.json" not in after
    kept = {k: v for k, v in before.items() if not k.startswith(chosen.name)}
    assert {k: after[k] for k in kept if k != "provenance.json"} == {
        k: v for k, v in kept.items() if k != "provenance.json"
    }
    assert set(after) == set(before)
    facts = json.loads((target / "provenance.json").read_text(encoding="utf-8"))
    assert facts["runs"] == 66 and facts["expected_runs"] == 66
    # One run replaced in a whole set: the table's measured wall time and jobs stay.
    whole = json.loads((SHIPPED / "provenance.json").read_text(encoding="utf-8"))
    assert (facts["elapsed_s"], facts["jobs"]) == (whole["elapsed_s"], whole["jobs"])
    assert collect(find_table(TABLE, repo_copy), target, "cpu").notes == []


def test_shipping_part_of_a_figure_keeps_every_other_shipped_run(tmp_path: Path) -> None:
    """The figure route merges too (its own shipping call)."""
    name = "fedgp-fig4-carla"
    root = tmp_path / "reproductions"
    for part in ("tables", "targets", "figures"):
        shutil.copytree(ROOT / part, root / part)
    target = shipped_folder(root, name, "cpu")
    shutil.copytree(shipped_folder(ROOT, name, "cpu"), target)
    chosen = sorted(p for p in target.iterdir() if p.is_dir())[0]
    made = json.loads((chosen / "config.json").read_text(encoding="utf-8"))["config"]
    figure = find_figure(name, root)
    assert figure is not None
    row = next(r.label for r in figure.rows if figure.strategy_at(r, "cpu") == made["strategy"])
    mine = tmp_path / "mine"
    shutil.copytree(chosen, mine / chosen.name)
    before = digest(target)
    request = Request(
        name, scale="cpu", out=str(mine), data_root=made["data_root"], ship=True,
        rows=(row,), seeds=(made["seed"],),
    )  # fmt: skip
    assert reproduce(request, console=quiet(), root=root, commit=clean) == 0
    after = digest(target)
    assert set(after) == set(before)
    assert [k for k in before if before[k] != after[k]] == ["provenance.json"]


def test_ship_refuses_a_dirty_tree_before_anything_is_written(
    repo_copy: Path, tmp_path: Path
) -> None:
    """``--ship`` from a tree with uncommitted changes: its runs would record
    ``<commit>-dirty``, which no one can rerun. Refused in one sentence naming ``git status``
    and the fix, before a run starts or a folder is made; outside a git checkout too."""
    target = shipped_folder(repo_copy, TABLE, "cpu")
    before = digest(target)
    mine = tmp_path / "mine"
    request = Request(
        TABLE, scale="cpu", out=str(mine), data_root=SHIPPED_DATA_ROOT, ship=True,
        rows=(ROW,), columns=(COLUMN,), seeds=(0,),
    )  # fmt: skip
    with pytest.raises(UserError) as caught:
        reproduce(request, console=quiet(), root=repo_copy, commit=dirty)
    assert str(caught.value) == (
        "--ship refuses a working tree with uncommitted changes (commit 0123456789ab plus "
        "edits, see `git status`): commit or stash them, then rerun the same command."
    )
    with pytest.raises(UserError, match="this cfl-bench is not a git checkout"):
        reproduce(request, console=quiet(), root=repo_copy, commit=lambda: None)
    assert not mine.exists() and digest(target) == before
    # Without --ship the tree's state does not matter: the dirty check is --ship's alone.
    report = Request(TABLE, compare=str(SHIPPED), out=str(tmp_path / "report"))
    assert reproduce(report, console=quiet(), root=repo_copy, commit=dirty) == 0


def test_ship_refuses_a_run_made_in_a_dirty_tree(repo_copy: Path, tmp_path: Path) -> None:
    """A clean tree, but the run to ship was finished earlier in a dirty one (the command
    would only skip it): refused by name before anything is run or shipped."""
    target = shipped_folder(repo_copy, TABLE, "cpu")
    before = digest(target)
    mine = tmp_path / "mine"
    chosen = shipped_run(ROW)
    shutil.copytree(chosen, mine / chosen.name)
    config_path = mine / chosen.name / "config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config["git_commit"] = dirty()
    config_path.write_text(json.dumps(config), encoding="utf-8")
    request = Request(
        TABLE, scale="cpu", out=str(mine), data_root=SHIPPED_DATA_ROOT, ship=True,
        rows=(ROW,), columns=(COLUMN,), seeds=(0,),
    )  # fmt: skip
    with pytest.raises(UserError, match=rf"{chosen.name}' was made at {COMMIT}-dirty, so no"):
        reproduce(request, console=quiet(), root=repo_copy, commit=clean)
    assert digest(target) == before
    assert not (mine / "reproduction").exists()  # refused before the report too
    # The shipped copy of that run names a commit no other shipped run has, as a run from a
    # dirty tree did; once replaced, provenance.json must stop listing that commit.
    replaced = target / chosen.name / "config.json"
    old = json.loads(replaced.read_text(encoding="utf-8"))
    old["git_commit"] = "feedface" * 5 + "-dirty"
    replaced.write_text(json.dumps(old), encoding="utf-8")
    facts = json.loads((target / "provenance.json").read_text(encoding="utf-8"))
    facts["git_commits"] = sorted([*facts["git_commits"], old["git_commit"]])
    (target / "provenance.json").write_text(json.dumps(facts), encoding="utf-8")
    config["git_commit"] = COMMIT  # the same run, made at a commit: it ships
    config_path.write_text(json.dumps(config), encoding="utf-8")
    assert reproduce(request, console=quiet(), root=repo_copy, commit=clean) == 0
    shipped = json.loads((target / chosen.name / "config.json").read_text(encoding="utf-8"))
    assert shipped["git_commit"] == COMMIT
    made = {
        json.loads((run / "config.json").read_text(encoding="utf-8"))["git_commit"]
        for run in target.iterdir()
        if run.is_dir()
    }
    facts = json.loads((target / "provenance.json").read_text(encoding="utf-8"))
    assert facts["git_commits"] == sorted(made) and COMMIT in made
    assert old["git_commit"] not in facts["git_commits"]


def test_the_checkout_commit_is_dirty_exactly_with_uncommitted_changes(tmp_path: Path) -> None:
    """What ``--ship`` asks by default (``runner.provenance.git_commit``, also what every run
    records), in a real repository: a tracked file changed makes ``-dirty``; an untracked
    file does not (it is no part of the code the commit names until added)."""
    from cfl_bench.runner.provenance import git_commit

    def git(*args: str) -> str:
        command = ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args]
        return subprocess.run(
            command, cwd=tmp_path, check=True, capture_output=True
        ).stdout.decode()

    git("init", "-q")
    (tmp_path / "code.py").write_text("x = 1\n", encoding="utf-8")
    git("add", "code.py")
    git("commit", "-q", "-m", "one")
    head = git("rev-parse", "HEAD").strip()
    assert git_commit(tmp_path) == head
    (tmp_path / "notes.txt").write_text("untracked\n", encoding="utf-8")
    assert git_commit(tmp_path) == head
    (tmp_path / "code.py").write_text("x = 2\n", encoding="utf-8")
    assert git_commit(tmp_path) == head + "-dirty"
    with pytest.raises(UserError, match=f"commit {head[:12]} plus edits"):
        reproduce(
            Request(TABLE, scale="cpu", ship=True), root=ROOT, commit=lambda: git_commit(tmp_path)
        )


def test_shipping_a_whole_folder_merges_and_a_stray_entry_is_refused(
    repo_copy: Path, tmp_path: Path
) -> None:
    """Without a selection too: the cells the folder has no run of stay shipped; an entry of
    the shipped folder that is no counted run is refused by name, nothing changed."""
    table = find_table(TABLE, repo_copy)
    target = shipped_folder(repo_copy, TABLE, "cpu")
    mine = tmp_path / "mine"
    chosen = shipped_run(ROW)
    shutil.copytree(chosen, mine / chosen.name)
    before = digest(target)
    ship(table, mine, "cpu", repo_copy)
    after = digest(target)
    assert {k: after[k] for k in before if k != "provenance.json"} == {
        k: v for k, v in before.items() if k != "provenance.json"
    }
    (target / "NOTES.md").write_text("mine\n", encoding="utf-8")
    before = digest(target)
    with pytest.raises(UserError, match=r"holds 'NOTES\.md', which is no counted run"):
        ship(table, mine, "cpu", repo_copy)
    assert digest(target) == before


def test_one_run_per_cell_and_seed(tmp_path: Path) -> None:
    """Two finished runs of one cell and seed: refused naming both in --compare, and a rerun
    with another executor into the same folder is refused before it runs."""
    chosen = shipped_run(ROW)
    twice = tmp_path / "twice"
    shutil.copytree(chosen, twice / chosen.name)
    shutil.copytree(chosen, twice / "again")
    result = cli(
        ["reproduce", TABLE, "--compare", str(twice), "--out", str(tmp_path / "r")], tmp_path
    )
    refused(result, "'again' and", chosen.name, "seed 0")
    assert not (tmp_path / "r").exists()

    mine = tmp_path / "mine"
    shutil.copytree(chosen, mine / chosen.name)
    before, files = listing(mine), digest(mine)
    args = ["--scale", "cpu", "--out", str(mine), "--row", ROW, "--column", COLUMN]
    args += ["--seed", "0", "--executor", "vectorized", "--data-root", SHIPPED_DATA_ROOT]
    result = cli(["reproduce", TABLE, *args], tmp_path)
    refused(result, chosen.name, "would count seed 0 twice", "executor 'sequential' there")
    assert listing(mine) == before and digest(mine) == files


def test_a_run_with_damaged_records_is_not_scored(tmp_path: Path) -> None:
    """A column that reads only the summary still needs the run's records.csv intact."""
    chosen = shipped_run(ROW)
    shutil.copytree(chosen, tmp_path / chosen.name)
    (tmp_path / chosen.name / "records.csv").write_bytes(os.urandom(300))
    found = collect(find_table(TABLE, ROOT), tmp_path, "cpu")
    assert found.cells == {}
    assert any("not counted" in note for note in found.notes)


def test_a_file_as_out_is_refused_in_one_line(tmp_path: Path) -> None:
    file = tmp_path / "report.txt"
    file.write_text("mine\n", encoding="utf-8")
    for args in (
        ["--scale", "smoke", "--out", str(file)],
        ["--shipped", "--out", str(file)],
        ["--compare", str(tmp_path), "--out", str(file)],
    ):
        refused(cli(["reproduce", TABLE, *args], tmp_path), "is a file, not a folder")
        assert listing(tmp_path) == {"report.txt"}
        assert file.read_text(encoding="utf-8") == "mine\n"


def unwritable_folder(tmp_path: Path) -> Path:
    """A folder this process cannot create entries in: a read-only one, or for root (who
    writes through permissions) /sys, when it refuses too."""
    if os.geteuid() != 0:
        folder = tmp_path / "read-only"
        folder.mkdir()
        folder.chmod(0o555)
        return folder
    try:
        os.mkdir("/sys/cfl-bench-probe")
    except OSError as exc:
        if exc.errno in (errno.EPERM, errno.EACCES, errno.EROFS):
            return Path("/sys")
        raise
    os.rmdir("/sys/cfl-bench-probe")
    pytest.skip("no folder here refuses root's writes")


def test_an_unwritable_working_folder_is_refused_in_one_line(tmp_path: Path) -> None:
    folder = unwritable_folder(tmp_path)
    before = listing(folder) if folder != Path("/sys") else None
    result = cli(["reproduce", TABLE, "--shipped"], folder)
    refused(result, "runs")
    if before is not None:
        assert listing(folder) == before


def late_failure_cases(tmp_path: Path, data: Path | None) -> dict[str, list[str]]:
    base = ["--scale", "smoke", "--out", str(tmp_path / "o"), "--column", COLUMN]
    return {
        "cuda": [*base, "--device", "cuda", "--data-root", str(tmp_path)],
        "data root": [*base, "--data-root", str(tmp_path / "absent")],
        # Ideal trains on all the data seen: no vectorized replay plan.
        "executor": [*base, "--data-root", str(data), "--executor", "vectorized", "--row", IDEAL],
    }


@pytest.mark.parametrize(
    ("case", "fragment"),
    [
        ("cuda", "no CUDA GPU is visible"),
        ("data root", "does not exist"),
    ],
)
def test_what_every_point_would_refuse_is_refused_before_any_runs(
    case: str, fragment: str, tmp_path: Path
) -> None:
    if case == "cuda":
        import torch

        if torch.cuda.is_available():
            pytest.skip("a CUDA GPU is visible here")
    args = late_failure_cases(tmp_path, None)[case]
    refused(cli(["reproduce", TABLE, *args], tmp_path), fragment, "cannot run")
    assert listing(tmp_path) == set()


def test_an_executor_that_cannot_run_a_row_is_refused_before_any_runs(
    tmp_path: Path, shared_data: Path
) -> None:
    args = late_failure_cases(tmp_path, shared_data)["executor"]
    refused(cli(["reproduce", TABLE, *args], tmp_path), "vectorized executor", "cannot run")
    assert listing(tmp_path) == set()
