"""Run files are written atomically and readable by others, like any result file."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import BinaryIO

import pytest

from cfl_bench.core.atomic import atomic_write, atomic_write_json, atomic_write_text


def test_atomic_files_get_the_umask_mode_not_mkstemps_private_one(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        atomic_write_text(tmp_path / "a.txt", "x")
        atomic_write_json(tmp_path / "s.json", {"status": "finished"})
    finally:
        os.umask(old)
    for name in ("a.txt", "s.json"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o644
    assert (tmp_path / "a.txt").read_text() == "x"


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "summary.json"
    atomic_write_text(target, "old")

    def half_then_fail(fh: BinaryIO) -> None:
        fh.write(b'{"status": "fin')
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        atomic_write(target, half_then_fail)
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]
