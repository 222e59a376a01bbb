"""``pip install`` puts exactly one top-level package, ``cfl_bench``, into site-packages.

Why: the repository keeps ``streams/``, ``strategies/``, ``leaderboard/`` and
``carla_bridge/`` at its top, and the wheel used to install them under those generic names,
which collide with any other package of the same name in a user's environment (a
``strategies`` of another project would shadow ours, or ours theirs). ``pyproject.toml``
maps them under ``cfl_bench`` (``package-dir``); this test builds and installs the real
package into a folder and reads what landed there, so a new folder left out of the package
list, or a mapping undone, fails here.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.test_layers import FOLDERS, ROOT


def installed(target: Path) -> Path:
    """Install this checkout (no dependencies) into ``target`` as pip installs it for a user:
    a wheel built in an isolated environment from ``pyproject.toml``."""
    command = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps"]
    command += ["--disable-pip-version-check", "--target", str(target)]
    done = subprocess.run([*command, str(ROOT)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return target


def test_the_wheel_installs_one_top_level_package(tmp_path: Path) -> None:
    target = installed(tmp_path / "site")
    # ``bin`` holds the console script (``cfl-bench``), which pip puts in the scripts folder
    # of a real environment, not in site-packages.
    top = sorted(p.name for p in target.iterdir() if not p.name.endswith(".dist-info"))
    assert top == ["bin", "cfl_bench"], top
    assert [p.name for p in (target / "bin").iterdir()] == ["cfl-bench"]
    assert [p.name for p in target.glob("*.dist-info")] == ["cfl_bench-0.1.0.dist-info"]
    # Every source module is in the wheel, under its package's folder.
    for folder, package in FOLDERS.items():
        inside = target / package.replace(".", "/")
        for source in (ROOT / folder).rglob("*.py"):
            relative = source.relative_to(ROOT / folder)
            assert (inside / relative).is_file(), f"{folder}/{relative} is not installed"
    assert not (target / "cfl_bench" / "tests").exists()
