"""Issue 39, section 3: options that have no effect are refused, never silently ignored.

An option the command would not read with the other options given (a CARLA server's --host
while frames are replayed from disk; --jobs, --device, --executor, --data-root or --ship of
`reproduce --compare` / `--shipped`, which start no run) used to be accepted and dropped, so
a user believed a setting was in force that was not. Each case runs the real command line in
a fresh process: exit code 2, one line naming the option and the fix, nothing written.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli_helpers import cli

CASES: dict[str, tuple[list[str], str]] = {
    "demo_host_with_replay": (
        ["carla", "demo", "--source", "replay", "--host", "10.0.0.9", "--data-root", "d"],
        "--host has no effect with --source replay",
    ),
    "demo_port_with_replay": (
        ["carla", "demo", "--port", "2001", "--data-root", "d"],
        "--port has no effect with --source replay",
    ),
    "demo_timeout_with_replay": (
        ["carla", "demo", "--timeout", "3", "--data-root", "d"],
        "--timeout has no effect with --source replay",
    ),
    "demo_data_root_with_carla": (
        ["carla", "demo", "--source", "carla", "--data-root", "d"],
        "--data-root has no effect with --source carla",
    ),
    "record_port_with_replay": (
        ["carla", "record", "--out", "rec", "--source", "replay", "--port", "2000"],
        "--port has no effect with --source replay",
    ),
    "record_data_root_with_carla": (
        ["carla", "record", "--out", "rec", "--source", "carla", "--data-root", "d"],
        "--data-root has no effect with --source carla",
    ),
    "keep_checkpoint_without_checkpoints": (
        ["run", "--stream", "rot-digits", "--keep-checkpoint", *("--checkpoint-every", "0")],
        "--keep-checkpoint keeps the last checkpoint, and --checkpoint-every 0 writes none",
    ),
    "compare_jobs": (
        ["reproduce", "fedgp-table1-mnist", "--compare", "d", "--scale", "smoke", "--jobs", "2"],
        "--jobs only acts on the runs reproduce starts, and --compare starts none",
    ),
    "compare_device_executor": (
        [
            "reproduce",
            "fedgp-table1-mnist",
            "--compare",
            "d",
            "--device",
            "cpu",
            "--executor",
            "vectorized",
        ],
        "--device, --executor only act on the runs reproduce starts",
    ),
    "compare_ship": (
        ["reproduce", "fedgp-table1-mnist", "--compare", "d", "--ship"],
        "--ship only acts on the runs reproduce starts",
    ),
    "shipped_data_root": (
        ["reproduce", "fedgp-fig4-carla", "--shipped", "--data-root", "d", "--out", "o"],
        "--data-root only acts on the runs reproduce starts, and --shipped starts none",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_an_option_without_effect_is_refused(tmp_path: Path, case: str) -> None:
    args, words = CASES[case]
    (tmp_path / "d").mkdir()
    before = sorted(p.name for p in tmp_path.rglob("*"))
    result = cli(args, tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    lines = (result.stdout + result.stderr).strip().splitlines()
    assert len(lines) == 1 and words in lines[0] and "Traceback" not in lines[0], lines
    assert sorted(p.name for p in tmp_path.rglob("*")) == before
