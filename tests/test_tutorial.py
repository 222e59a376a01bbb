"""docs/tutorial.md, run as written: every titled code block is written to its file and
every ``$`` command is run in order, in a new folder outside the repository, with the
tutorial's method installed as its own package in a new virtual environment.

Why a new environment: installing the tutorial's package into the environment running the
tests would register its entry point for every other test running beside this one. The new
environment sees this one's packages (torch, cfl-bench's dependencies) through a ``.pth``
file, and gets cfl-bench itself and the method's package installed by pip, as a user's does.
"""

from __future__ import annotations

import os
import re
import site
import subprocess
import sys
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[1]
TUTORIAL = REPO / "docs" / "tutorial.md"
BLOCK = re.compile(r"^```(\w*)(?: title=\"([^\"]+)\")?\n(.*?)^```$", re.S | re.M)


def steps(text: str) -> list[tuple[str, str]]:
    """("file", path + NUL + content) and ("command", line) in the page's order."""
    found: list[tuple[str, str]] = []
    for kind, title, body in BLOCK.findall(text):
        if title:
            found.append(("file", f"{title}\0{body}"))
        elif kind == "console":
            found += [("command", line[2:]) for line in body.splitlines() if line.startswith("$ ")]
    return found


def new_environment(folder: Path) -> dict[str, str]:
    """A virtual environment with pip, seeing this interpreter's site-packages, with
    cfl-bench installed (editable, no dependencies); the variables that activate it.

    Its pip is this environment's (the same release ``venv`` would bundle), run by the new
    interpreter, so it installs into the new environment; ``venv``'s own copy of pip and
    setuptools (ensurepip) took ~20 s of CI. cfl-bench is built with this environment's
    setuptools (``--no-build-isolation``), where an isolated build would first install
    setuptools into a scratch environment (~15 s more). The tutorial's own ``pip install``
    of the method still builds isolated, as a user's does."""
    venv = folder / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    own = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    lines = [f"import site; site.addsitedir({p!r})" for p in site.getsitepackages()]
    Path(own, "zz_outer_environment.pth").write_text("\n".join(lines) + "\n", encoding="utf-8")
    pip_script = venv / "bin" / "pip"
    pip_script.write_text(
        f"#!{python}\nimport sys\nfrom pip._internal.cli.main import main\nsys.exit(main())\n",
        encoding="utf-8",
    )
    pip_script.chmod(0o755)
    pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    subprocess.run([*pip, "--no-deps", "--no-build-isolation", "-e", str(REPO)], check=True)
    path = f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}"
    return {**os.environ, "PATH": path, "VIRTUAL_ENV": str(venv), "OMP_NUM_THREADS": "1"}


def test_the_page_has_the_steps_this_test_runs() -> None:
    kinds = [kind for kind, _ in steps(TUTORIAL.read_text(encoding="utf-8"))]
    assert kinds.count("file") == 3 and kinds.count("command") == 5


def test_the_tutorial_runs_as_written(tmp_path: Path) -> None:
    env = new_environment(tmp_path)
    work = tmp_path / "tutorial"
    work.mkdir()
    outputs: dict[str, str] = {}
    for kind, step in steps(TUTORIAL.read_text(encoding="utf-8")):
        if kind == "file":
            name, content = step.split("\0")
            (work / name).parent.mkdir(parents=True, exist_ok=True)
            (work / name).write_text(content, encoding="utf-8")
            continue
        done = subprocess.run(
            ["bash", "-c", step], cwd=work, env=env, capture_output=True, text=True, timeout=600
        )
        assert done.returncode == 0, f"{step}\n{done.stdout}\n{done.stderr}"
        outputs[step.split()[0] + " " + step.split()[1]] = done.stdout
    assert (
        "multidraw_er  learner  — this tutorial · plugin my_method:MultiDrawER"
        in (outputs["cfl-bench list"])
    )
    assert "run folder: runs/first" in outputs["cfl-bench run"]
    assert "multidraw_er:draws=3" in outputs["python compare.py"]
    board = pd.read_csv(work / "runs/compare/leaderboard/leaderboard.csv")
    ours = board[board["strategy"] == "multidraw_er:draws=3"]
    assert sorted(ours["stream"]) == ["perm-digits", "rot-digits"]
    assert set(board["n_seeds"]) == {3} and len(board) == 8
