"""The real command line in a fresh process, and a fingerprint of a folder: what the tests of
refusals need to show "one line, exit 2, nothing written, every file byte-identical"."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def cli(
    args: list[str], cwd: Path, timeout: float = 120.0, *, wide: bool = False
) -> subprocess.CompletedProcess[str]:
    """``cfl-bench ARGS`` run from ``cwd`` on one thread, output as text; ``wide``: a
    2,000-column terminal, so that rich wraps no table row (a reason is then found whole)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    if wide:
        env["COLUMNS"] = "2000"
    return subprocess.run(
        [sys.executable, "-m", "cfl_bench.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def tree_digest(root: Path) -> dict[str, str]:
    """Every entry under ``root``: a file's hash, a link's target, a socket or folder."""
    found = {}
    for p in sorted(root.rglob("*")):
        name = os.fsdecode(p.relative_to(root))
        if p.is_symlink():
            found[name] = "link:" + os.readlink(p)
        elif p.is_socket():
            found[name] = "socket"
        elif p.is_file():
            found[name] = hashlib.sha256(p.read_bytes()).hexdigest()
        else:
            found[name] = "folder" if p.is_dir() else "other"
    return found


def assert_runs_refused(tmp_path: Path, extras: list[list[str]], flag: str) -> None:
    """Each ``cfl-bench run --tasks 3 EXTRA`` into ``tmp_path/r`` exits 2 with one line naming
    ``flag`` and no traceback, and leaves ``tmp_path`` as it found it (nothing written)."""
    before = tree_digest(tmp_path)
    for extra in extras:
        result = cli(["run", "--tasks", "3", *extra, "--out", str(tmp_path / "r")], tmp_path)
        assert result.returncode == 2, result.stderr
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
        assert flag in lines[0], lines[0]
    assert tree_digest(tmp_path) == before


def main_here(
    args: list[str],
    cwd: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    *,
    env: dict[str, str] | None = None,
    wide: bool = False,
) -> subprocess.CompletedProcess[str]:
    """``cfl-bench ARGS`` through the console script's own ``main`` in this process, from
    ``cwd`` with ``env`` set (``wide``: a 2,000-column terminal), answered as :func:`cli`
    answers. Why: a fresh process costs seconds of imports, which a command that only reads
    or refuses does not need; the directory and variables are restored afterwards."""
    from cfl_bench.cli import main

    capsys.readouterr()
    with monkeypatch.context() as patch:
        patch.chdir(cwd)
        for name, value in {**(env or {}), **({"COLUMNS": "2000"} if wide else {})}.items():
            patch.setenv(name, value)
        with pytest.raises(SystemExit) as stop:
            main(args)
    captured = capsys.readouterr()
    code = stop.value.code
    assert isinstance(code, int), code
    return subprocess.CompletedProcess(args, code, captured.out, captured.err)
