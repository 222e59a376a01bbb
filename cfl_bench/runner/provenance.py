"""Where a result came from: package versions, git commit, machine — for config.json.

Why: leaderboard rows whose runs disagree on these must be flagged, so every run records
them at start.
"""

from __future__ import annotations

import importlib.metadata
import platform
import subprocess
from pathlib import Path

import torch

PACKAGES = ("cfl-bench", "torch", "torchvision", "numpy", "pandas", "scikit-learn")


def package_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def git_commit(start: Path | None = None) -> str | None:
    """Commit of the checkout holding the package (None outside a git checkout)."""
    where = start or Path(__file__).resolve().parent
    try:
        result = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=where, capture_output=True, text=True, timeout=5
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if result.returncode != 0:
        return None
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"],
        cwd=where,
        capture_output=True,
        text=True,
        timeout=5,
    )
    suffix = "-dirty" if dirty.returncode == 0 and dirty.stdout.strip() else ""
    return result.stdout.strip() + suffix


def environment(device: torch.device) -> dict[str, object]:
    info: dict[str, object] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "device": str(device),
        "torch_threads": torch.get_num_threads(),
    }
    if device.type == "cuda":
        info["cuda_device"] = torch.cuda.get_device_name(device)
    return info
