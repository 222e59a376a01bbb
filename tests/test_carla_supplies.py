"""The live CARLA supply's bookkeeping against a stand-in drive, the demo's round plan, the
recorder command and the no-server path of the demo.

The stand-in below replaces ``LiveSource`` (no CARLA server can run on these machines); the
real drive is ``carla_bridge.stream.live_supply`` → ``carla_bridge.live.LiveSource``, whose
own logic ``tests/test_carla_live.py`` checks against a stand-in server.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path

import numpy as np
import pytest

from cfl_bench.carla_bridge.frames import Domain, Frame, TimeWindow
from cfl_bench.carla_bridge.replay import ReplaySource
from cfl_bench.carla_bridge.supplies import LiveSupply, Phase
from cfl_bench.carla_demo import phase_rounds
from cfl_bench.core.errors import UserError
from tests.conftest import requires_shared_data
from tests.test_cli import assert_user_error, cli


class StandInDrive:
    """Stand-in for a live drive: one frame per client every 10 simulated seconds."""

    def __init__(self, town: str, clients: int, seed: int, log: list[str]) -> None:
        self.town, self.num_clients, self.seed, self.log = town, clients, seed, log
        log.append(f"open {town} seed {seed}")

    def frames(self, window: TimeWindow) -> dict[int, list[Frame]]:
        self.log.append(f"frames {self.town} {window.start:g}-{window.end:g}")
        ticks = [t for t in range(0, int(window.end) + 10, 10) if window.start <= t < window.end]
        image = np.zeros((4, 4, 3), np.uint8)
        empty = np.zeros((0, 4), np.float32)
        return {
            k: [Frame(k, float(t), t * 16 + k, Domain.of_town(self.town), image, empty,
                      np.zeros(0, np.int64)) for t in ticks]
            for k in range(self.num_clients)
        }  # fmt: skip

    def close(self) -> None:
        self.log.append(f"close {self.town}")


def supply(log: list[str]) -> LiveSupply:
    phases = [
        Phase("urban", ("Town03",) * 2, ("Town03",)),
        Phase("highway", ("Town04",) * 2, ("Town04",)),
    ]

    def drive(town: str, clients: int, seed: int) -> StandInDrive:
        return StandInDrive(town, clients, seed, log)

    return LiveSupply(phases, 2, "Town05", 30.0, 7, drive)


def test_live_supply_drives_each_task_from_its_start_and_closes_the_last() -> None:
    log: list[str] = []
    live = supply(log)
    first = live.round_frames(TimeWindow(0, 20), {0: (0.0,), 1: (0.0,)})
    assert [f.time for f in first[1]] == [0.0, 10.0]
    live.round_frames(TimeWindow(20, 40), {0: (0.0,), 1: (0.0,)})
    moved = live.round_frames(TimeWindow(40, 60), {0: (0.0, 40.0), 1: (0.0, 40.0)})
    # The highway drive starts at its own time 0, reported on the run's clock.
    assert [f.time for f in moved[0]] == [40.0, 50.0]
    assert {f.domain.town for f in moved[0]} == {"Town04"}
    live.close()
    assert log == [
        "open Town03 seed 7", "frames Town03 0-20", "frames Town03 20-40", "close Town03",
        "open Town04 seed 8", "frames Town04 0-20", "close Town04",
    ]  # fmt: skip


def test_live_evaluation_frames_come_from_their_own_drive() -> None:
    log: list[str] = []
    frames = supply(log).task_frames(1)
    assert len(frames) == 3 and {f.client for f in frames} == {-1}
    assert log == ["open Town04 seed 7926", "frames Town04 0-30", "close Town04"]


def test_a_live_task_must_keep_the_fleet_in_one_town() -> None:
    with pytest.raises(UserError, match="a live CARLA world is one town"):
        LiveSupply([Phase("mixed", ("Town01", "Town02"), ("Town01",))], 2, "Town05", 30, 0, None)


@pytest.mark.parametrize(
    ("rounds", "shift", "expected"), [(70, 60, (10, 50)), (12, 8, (4, 4)), (4, 2, (2, 0))]
)
def test_demo_rounds_become_equal_phases_plus_a_lead(
    rounds: int, shift: int, expected: tuple[int, int]
) -> None:
    assert phase_rounds(rounds, shift) == expected


@pytest.mark.parametrize(
    ("rounds", "shift", "message"),
    [(10, 10, "between 1 and --rounds - 1"), (10, 0, "between 1"), (10, 3, "--shift-round >= 5")],
)
def test_impossible_demo_rounds_are_refused(rounds: int, shift: int, message: str) -> None:
    with pytest.raises(UserError, match=message):
        phase_rounds(rounds, shift)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_demo_without_a_carla_server_says_so_in_one_line(tmp_path: Path) -> None:
    pytest.importorskip("carla")
    port = free_port()
    started = time.monotonic()
    result = cli(
        "carla", "demo", "--source", "carla", "--port", str(port), "--timeout", "2",
        "--out", str(tmp_path / "demo"),
    )  # fmt: skip
    assert time.monotonic() - started < 60
    assert_user_error(
        result,
        f"no CARLA server at 127.0.0.1:{port}: start CarlaUE4.sh -RenderOffScreen, or use the "
        "recorded frames instead (`cfl-bench carla demo --source replay`",
    )
    assert not (tmp_path / "demo").exists()


@pytest.mark.shared_data
def test_record_writes_a_folder_replay_reads_back(tmp_path: Path) -> None:
    root = requires_shared_data()
    out = tmp_path / "recorded"
    result = cli(
        "carla", "record", "--source", "replay", "--data-root", str(root), "--out", str(out),
        "--clients", "2", "--seconds", "90", "--town", "Town02",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr + result.stdout
    assert "recorded 20 frames" in result.stdout  # 2 vehicles × ticks 0, 9, …, 81
    again = ReplaySource(
        root=out, split="train", num_clients=1, client_towns=("Town02",), frame_period=9.0
    )
    assert len(again.stream_ids("Town02")) == 10 and set(again.towns) == {"Town02", "Town01"}
