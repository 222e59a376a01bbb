"""Where a CARLA stream's frames come from: the replayed dataset or a live simulator.

Why a layer between the stream and the frame sources: a stream needs three kinds of frames —
each vehicle's frames of a round, held-out frames that test each task, and the test town's
frames — and the two sources give them differently. A replay holds frames out of each
town's loop and follows every vehicle through its towns on one timeline; a live simulator
drives one town per world, so each task is its own drive (the whole fleet changes town) and
its test frames come from a separate evaluation drive with another seed (other spawn
points, other traffic), never from the frames the clients train on.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol

from cfl_bench.carla_bridge.frames import Frame, FrameSource, TimeWindow
from cfl_bench.carla_bridge.replay import DomainShift, ReplaySource, scan_split
from cfl_bench.core.errors import UserError


@dataclass(frozen=True)
class Phase:
    """One task: the town each vehicle client drives, and the towns that test it."""

    name: str
    towns: tuple[str, ...]
    tested: tuple[str, ...]


class FrameSupply(Protocol):
    """The frames a CARLA stream serves."""

    def round_frames(
        self, window: TimeWindow, entered: dict[int, tuple[float, ...]]
    ) -> dict[int, list[Frame]]:
        """Each client's frames of one round's window; ``entered[k]`` holds the simulated
        time client k entered each task so far (its current task is the last)."""
        ...

    def task_frames(self, t: int) -> list[Frame]:
        """Held-out frames that test task ``t``."""
        ...

    def test_town_frames(self) -> list[Frame]:
        """Frames of the test town, which no task trains on."""
        ...

    def close(self) -> None: ...


@dataclass
class ReplaySupply:
    """Frames of the shared dataset: one timeline per vehicle, towns switched when the
    vehicle's task changes (a :class:`DomainShift` at the first round of the new task)."""

    root: Path
    phases: Sequence[Phase]
    num_clients: int
    frame_period: float
    holdout_every: int
    test_town: str
    box_format: str = "voc"
    _source: ReplaySource | None = None
    # The shifts the current source was built with (rebuilt when a vehicle changes town).
    _shifts: tuple[DomainShift, ...] = ()

    def __post_init__(self) -> None:
        self._source = self._replay(())  # checks the folder, towns and numbers at once

    def _replay(self, shifts: Sequence[DomainShift]) -> ReplaySource:
        return ReplaySource(
            root=self.root,
            split="train",
            num_clients=self.num_clients,
            client_towns=self.phases[0].towns,
            frame_period=self.frame_period,
            box_format=self.box_format,
            holdout_every=self.holdout_every,
            shifts=shifts,
        )

    def shifts(self, entered: dict[int, tuple[float, ...]]) -> tuple[DomainShift, ...]:
        """Every town change so far: client k enters task t at time τ → drive t's town."""
        shifts = []
        for client, times in sorted(entered.items()):
            for t in range(1, len(times)):
                town = self.phases[t].towns[client]
                if town != self.phases[t - 1].towns[client]:
                    shifts.append(DomainShift(client, times[t], town))
        return tuple(shifts)

    def round_frames(
        self, window: TimeWindow, entered: dict[int, tuple[float, ...]]
    ) -> dict[int, list[Frame]]:
        shifts = self.shifts(entered)
        if self._source is None or shifts != self._shifts:
            self._source, self._shifts = self._replay(shifts), shifts
        return self._source.frames(window)

    def task_frames(self, t: int) -> list[Frame]:
        assert self._source is not None
        return [f for town in self.phases[t].tested for f in self._source.heldout(town)]

    def test_town_frames(self) -> list[Frame]:
        """Every frame of the test split's town, in time order (none is ever streamed)."""
        towns = scan_split(self.root, "test", self.box_format)
        if self.test_town not in towns:
            raise UserError(
                f"{self.root} has no {self.test_town} frames in images/test; the CARLA streams "
                "test on it: restore the shared dataset's test split"
            )
        return [entry.frame(-1, 0.0) for entry in towns[self.test_town]]

    def close(self) -> None:
        if self._source is not None:
            self._source.close()


@dataclass
class LiveSupply:
    """Frames from a CARLA server: each task is a drive in its town (the fleet moves to
    the next town at the task's first round); evaluation frames come from separate drives.

    ``drive(town, clients, seed)`` opens a :class:`FrameSource` (a ``LiveSource``); tests
    pass a stand-in, the CLI the real one (``carla_bridge.stream.live_supply``).
    """

    phases: Sequence[Phase]
    num_clients: int
    test_town: str
    eval_seconds: float
    seed: int
    drive: Callable[[str, int, int], FrameSource]
    _current: tuple[int, float, FrameSource] | None = None

    def __post_init__(self) -> None:
        for phase in self.phases:
            if len(set(phase.towns)) != 1:
                raise UserError(
                    f"a live CARLA world is one town, but task {phase.name!r} puts vehicles "
                    f"in {sorted(set(phase.towns))}; use one town per task"
                )

    def _open(self, town: str, clients: int, seed: int) -> FrameSource:
        return self.drive(town, clients, seed)

    def round_frames(
        self, window: TimeWindow, entered: dict[int, tuple[float, ...]]
    ) -> dict[int, list[Frame]]:
        t = max(len(times) - 1 for times in entered.values())
        if self._current is None or self._current[0] != t:
            if self._current is not None:
                self._current[2].close()
            town = self.phases[t].towns[0]
            # Simulated time restarts at the drive's start: windows are shifted by it.
            start = max(times[t] for times in entered.values() if len(times) > t)
            self._current = (t, start, self._open(town, self.num_clients, self.seed + t))
        _, started, source = self._current
        local = TimeWindow(window.start - started, window.end - started)
        frames = source.frames(local)
        return {k: [replace(f, time=f.time + started) for f in v] for k, v in frames.items()}

    def _evaluation_drive(self, town: str) -> list[Frame]:
        source = self._open(town, 1, self.seed + 7919)
        try:
            frames = source.frames(TimeWindow(0.0, self.eval_seconds))
        finally:
            source.close()
        return [replace(f, client=-1) for f in frames.get(0, [])]

    def task_frames(self, t: int) -> list[Frame]:
        return [f for town in self.phases[t].tested for f in self._evaluation_drive(town)]

    def test_town_frames(self) -> list[Frame]:
        return self._evaluation_drive(self.test_town)

    def close(self) -> None:
        if self._current is not None:
            self._current[2].close()
            self._current = None
