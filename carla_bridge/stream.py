"""CARLA detection streams: vehicle clients stream camera frames round after round.

Why a per-round stream: a vehicle keeps driving while the federation trains, so a client's
data is what its camera captured during the round (a window of simulated time), not a shard
fixed at a task's start. Tasks are *driving phases*: which town (domain) each vehicle drives
in. Two protocols:

* ``carla-det`` — domains in arrival order: in task t every vehicle drives town t (Town01 →
  Town02 → Town03 → Town04, the highway), each starting at its own point of the town's
  frame loop; task t is tested on the held-out frames of town t (CLAD-D's shape: a matrix
  of mAP per domain after each phase).
* ``carla-highway`` — the FedGP paper's shift: in task 1 ("urban") vehicle k drives Town01,
  Town02 or Town03 (k mod 3); in task 2 vehicle 0 drives onto the highway (Town04) while the
  others keep driving their towns. Task 1 is tested on the urban held-out frames, task 2 on
  the highway's; with ``--lead-rounds`` the urban phase lasts longer than the shift phase
  (``cfl-bench carla demo --rounds R --shift-round S``).

Both are also evaluated after every round on Town05, the dataset's test town, which no task
trains on (``test_map50`` records). Frames come from a :class:`~carla_bridge.frames.FrameSource`
(the replayed shared dataset by default), are resized to the detector's input (uint8, 3×H×W)
and their boxes packed as padded ``(max_boxes, 5)`` targets (:mod:`carla_bridge.detection`).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
import torch

from cfl_bench.carla_bridge.detection import Detection, pack_targets
from cfl_bench.carla_bridge.frames import CLASSES, Frame, TimeWindow
from cfl_bench.carla_bridge.supplies import FrameSupply, LiveSupply, Phase, ReplaySupply
from cfl_bench.core.errors import UserError
from cfl_bench.streams.base import (
    RoundData,
    Stream,
    StreamRequest,
    TaskData,
    TaskTest,
    decoded_task,
)

URBAN_TOWNS: tuple[str, ...] = ("Town01", "Town02", "Town03")
HIGHWAY_TOWN = "Town04"
TEST_TOWN = "Town05"
#: The live protocol's urban town (a large town with traffic lights, signs and junctions).
LIVE_URBAN_TOWN = "Town03"
#: Simulated seconds of each live evaluation drive (its frames test a task).
LIVE_EVAL_SECONDS = 120.0
#: The shared frames are 180 simulator frames apart; at CARLA's usual fixed step of 0.05 s
#: that is 9 simulated seconds (the capture period is not recorded, so it is a parameter).
FRAME_PERIOD_S = 9.0
#: Simulated seconds per round (the paper's rounds are about 200 s of driving).
ROUND_SECONDS = 200.0
#: Every k-th frame of a town (in time order) is held out for evaluation, never streamed.
HOLDOUT_EVERY = 4
#: Detector input (height, width): 640×380 frames at half resolution, multiples of 4.
IMAGE_SIZE = (192, 320)


def arrival_phases(num_tasks: int, num_clients: int) -> list[Phase]:
    """Task t: every vehicle drives town t (Town01 … Town04, the highway last)."""
    towns = (*URBAN_TOWNS, HIGHWAY_TOWN)
    if not 1 <= num_tasks <= len(towns):
        raise UserError(
            f"carla-det has one task per training town ({', '.join(towns)}); use --tasks "
            f"1..{len(towns)}, got {num_tasks}"
        )
    return [Phase(towns[t], (towns[t],) * num_clients, (towns[t],)) for t in range(num_tasks)]


def highway_phases(num_tasks: int, num_clients: int) -> list[Phase]:
    """The paper's shift: urban driving, then vehicle 0 enters the highway."""
    if num_tasks != 2:
        raise UserError(
            f"the highway protocol has 2 tasks (urban, then the highway shift); use --tasks 2, "
            f"got {num_tasks}"
        )
    urban = tuple(URBAN_TOWNS[k % len(URBAN_TOWNS)] for k in range(num_clients))
    return [
        Phase("urban", urban, URBAN_TOWNS),
        Phase("highway shift", (HIGHWAY_TOWN, *urban[1:]), (HIGHWAY_TOWN,)),
    ]


def fleet_phases(num_tasks: int, num_clients: int) -> list[Phase]:
    """A live world is one town: the whole fleet drives urban (Town03), then the highway."""
    if num_tasks != 2:
        raise UserError(
            f"carla-live has 2 tasks (Town03, then the Town04 highway); use --tasks 2, got "
            f"{num_tasks}"
        )
    return [
        Phase("urban", (LIVE_URBAN_TOWN,) * num_clients, (LIVE_URBAN_TOWN,)),
        Phase("highway", (HIGHWAY_TOWN,) * num_clients, (HIGHWAY_TOWN,)),
    ]


@dataclass(frozen=True)
class FrameEncoder:
    """Frames → stored tensors: the image resized to the detector's input as uint8, the
    boxes scaled to it and packed as padded targets."""

    height: int
    width: int
    max_boxes: int

    def image(self, frame: Frame) -> torch.Tensor:
        from PIL import Image

        h, w = frame.image.shape[:2]
        picture = Image.fromarray(frame.image)
        if (h, w) != (self.height, self.width):
            picture = picture.resize((self.width, self.height), Image.Resampling.BILINEAR)
        return torch.from_numpy(np.asarray(picture, dtype=np.uint8).copy()).permute(2, 0, 1)

    def boxes(self, frame: Frame) -> torch.Tensor:
        h, w = frame.image.shape[:2]
        scale = np.array([self.width / w, self.height / h] * 2, dtype=np.float32)
        boxes = torch.from_numpy(frame.boxes.astype(np.float32) * scale)
        labels = torch.from_numpy(frame.labels.astype(np.int64))
        if boxes.shape[0] > self.max_boxes:
            raise UserError(
                f"frame {frame.name} has {boxes.shape[0]} boxes, more than the stream's "
                f"max_boxes {self.max_boxes}"
            )
        return pack_targets([boxes], [labels], self.max_boxes)[0]


class FrameStream(Stream):
    """Vehicle clients receiving frames per round from a frame source per task."""

    scenario = "domain-il"
    per_round = True
    target_dtype = torch.float32

    def __init__(
        self,
        name: str,
        phases: Sequence[Phase],
        supply: FrameSupply,
        encoder: FrameEncoder,
        *,
        round_seconds: float,
        device: torch.device,
        description: dict[str, object],
    ) -> None:
        if not (math.isfinite(round_seconds) and round_seconds > 0):
            raise UserError(
                f"round length must be a positive number of seconds, got {round_seconds}"
            )
        self.name = name
        self.phases = list(phases)
        self.num_tasks = len(self.phases)
        self.num_classes = len(CLASSES)
        self.input_shape = (3, encoder.height, encoder.width)
        self.target_shape = (encoder.max_boxes, 5)
        self.device = device
        self.round_seconds = round_seconds
        self.supply = supply
        self.resumable = not isinstance(supply, LiveSupply)
        self.encoder = encoder
        self._description = description
        self._images: dict[str, torch.Tensor] = {}
        self._objective = Detection()

    # -- what the engine asks -------------------------------------------------------------------
    @property
    def objective(self) -> Detection:
        return self._objective

    @property
    def output_shape(self) -> tuple[int, ...]:
        return self._objective.output_shape(self.input_shape)

    def as_model_input(self, stored: torch.Tensor) -> torch.Tensor:
        """uint8 pixels → floats in [0, 1] (exact per element, batch by batch)."""
        return stored.to(torch.float32) / 255.0

    def model_input_to_stored(self, x: torch.Tensor) -> torch.Tensor:
        """[0, 1] floats of :meth:`as_model_input` → the uint8 pixels they came from: k / 255
        in float32 lies within 1e-7 of k / 255, far inside the ±0.5 / 255 that rounding
        forgives, so the round trip is exact and replay buffers keep frames as uint8."""
        return (x * 255.0).round_().clamp_(0, 255).to(torch.uint8)

    def round_data(
        self, round_index: int, entries: dict[int, tuple[int, ...]]
    ) -> dict[int, RoundData]:
        """Each vehicle's frames of the round's window of simulated time."""
        seconds = self.round_seconds
        window = TimeWindow(round_index * seconds, (round_index + 1) * seconds)
        started = {k: tuple(r * seconds for r in rounds) for k, rounds in entries.items()}
        frames = self.supply.round_frames(window, started)
        return {client: self.encode(frames.get(client, [])) for client in entries}

    def encode(self, frames: list[Frame]) -> RoundData:
        """Frames as stored tensors on the stream's device (images cached by frame name)."""
        if not frames:
            empty = torch.zeros((0, *self.input_shape), dtype=torch.uint8)
            return RoundData(empty.to(self.device), torch.zeros((0, *self.target_shape)), ())
        images = [self._image(f) for f in frames]
        targets = [self.encoder.boxes(f) for f in frames]
        keys = tuple(f"{f.name}@{f.client}" if f.client < 0 else f.name for f in frames)
        return RoundData(
            torch.stack(images).to(self.device), torch.stack(targets).to(self.device), keys
        )

    def _image(self, frame: Frame) -> torch.Tensor:
        key = frame.name
        if key not in self._images:
            self._images[key] = self.encoder.image(frame)
        return self._images[key]

    def task(self, t: int) -> TaskData:
        return decoded_task(self, t)

    def task_train(self, t: int) -> NoReturn:
        raise UserError(
            f"stream {self.name!r} streams frames per round; it has no fixed training split"
        )

    def task_test(self, t: int) -> TaskTest:
        t = self._task_index(t)
        data = self.encode(self.supply.task_frames(t))
        return TaskTest(t, data.x, data.y, tuple(range(self.num_classes)))

    def test_domain(self) -> TaskTest | None:
        data = self.encode(self.supply.test_town_frames())
        return TaskTest(-1, data.x, data.y, tuple(range(self.num_classes)))

    def train_labels(self, t: int) -> torch.Tensor:
        """No fixed training split: vehicles receive frames per round (no label partition)."""
        self._task_index(t)
        return torch.zeros(0, dtype=torch.long)

    def describe(self) -> dict[str, object]:
        return {
            "name": self.name,
            "scenario": self.scenario,
            "phases": [
                {"name": p.name, "towns": list(p.towns), "tested": list(p.tested)}
                for p in self.phases
            ],
            "round_seconds": self.round_seconds,
            "image_size": [self.encoder.height, self.encoder.width],
            "max_boxes": self.encoder.max_boxes,
            **self._description,
        }

    def protocol_fields(self) -> dict[str, object]:
        """Who drives where (in place of a label partition), the frames' data and timing."""
        schedule = "; ".join(f"{p.name}: {' '.join(p.towns)}" for p in self.phases)
        d = self._description
        frames = (
            f"{d['frame_period_s']:g} s apart, {self.round_seconds:g} s rounds, every "
            f"{d['holdout_every']}th held out, {self.encoder.width}x{self.encoder.height}, "
            f"test town {d['test_town']}"
        )
        return {
            "partition": {"name": "vehicles", "schedule": schedule},
            "data": d["data"],
            "frames": frames,
        }

    def close(self) -> None:
        """Close the frame supply (a live one restores the simulator)."""
        self.supply.close()


def folder_identity(root: Path) -> dict[str, object]:
    """{base, sizes, sha256} of the frames and labels a replay reads (sizes: images per
    split): runs on other frames must never share a protocol hash."""
    digest = hashlib.sha256()
    files = sorted(
        p for p in root.rglob("*") if p.is_file() and p.suffix in {".png", ".xml", ".txt"}
    )
    for path in files:
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    sizes = {
        split: sum(1 for p in files if p.suffix == ".png" and p.parent.name == split)
        for split in ("train", "test")
    }
    return {"base": DATASET, "sizes": sizes, "sha256": digest.hexdigest()}


#: At most this many boxes per frame (the shared frames have far fewer); more is refused.
MAX_BOXES = 100
PHASES: dict[str, Callable[[int, int], list[Phase]]] = {
    "carla-det": arrival_phases,
    "carla-highway": highway_phases,
    "carla-live": fleet_phases,
}
DATASET = "carla-object-detection"


def carla_root(data_root: str) -> Path:
    """The shared dataset's folder under ``--data-root`` (or ``--data-root`` itself)."""
    root = Path(data_root)
    for candidate in (root / DATASET, root):
        if (candidate / "images" / "train").is_dir():
            return candidate
    raise UserError(
        f"no CARLA frames under {data_root}: pass --data-root pointing at a folder that holds "
        f"{DATASET}/images/train (the shared dataset's layout)"
    )


def server_address(data_root: str | None) -> tuple[str, int]:
    """``carla://HOST:PORT`` (what ``--data-root`` names for the live stream)."""
    text = data_root or ""
    host, _, port = text.removeprefix("carla://").rpartition(":")
    if not text.startswith("carla://") or not host or not port.isdigit():
        raise UserError(
            f"carla-live reads frames from a CARLA server: pass --data-root carla://HOST:PORT "
            f"(e.g. carla://127.0.0.1:2000), got {data_root!r}"
        )
    if not 1 <= int(port) <= 65535:
        raise UserError(
            f"--data-root {data_root!r} names port {int(port)}; a CARLA server's port lies in "
            f"1–65535 (e.g. carla://127.0.0.1:2000)"
        )
    return host, int(port)


def live_supply(data_root: str | None, phases: list[Phase], clients: int, seed: int) -> LiveSupply:
    """Frames from the CARLA server ``--data-root`` names, checked reachable now."""
    from cfl_bench.carla_bridge.live import MAX_CLIENTS, LiveConfig, LiveSource, connect

    if not 1 <= clients <= MAX_CLIENTS:  # checked here to name the option, not num_clients
        raise UserError(
            f"carla-live drives one vehicle per client and at most {MAX_CLIENTS}; use "
            f"--clients 1 to {MAX_CLIENTS}, got {clients}"
        )
    host, port = server_address(data_root)
    base = LiveConfig(host=host, port=port, capture_period=FRAME_PERIOD_S, seed=seed)
    connect(base)  # no server → the one-line refusal before anything else

    def drive(town: str, vehicles: int, drive_seed: int) -> LiveSource:
        return LiveSource(replace(base, town=town, num_clients=vehicles, seed=drive_seed))

    return LiveSupply(phases, clients, TEST_TOWN, LIVE_EVAL_SECONDS, seed, drive)


def frame_stream(name: str, request: StreamRequest) -> FrameStream:
    """The CARLA stream ``name`` for ``request`` (its tasks, clients, seed and data)."""
    if request.train_size is not None or request.test_size is not None:
        raise UserError(
            f"--train-size / --test-size do not apply to {name}: its vehicles stream frames "
            "per round; drop them"
        )
    phases = PHASES[name](request.num_tasks, request.num_clients)
    if name == "carla-live":
        supply: FrameSupply = live_supply(
            request.data_root, phases, request.num_clients, request.seed
        )
        data: dict[str, object] = {"source": "carla", "towns": sorted({p.towns[0] for p in phases})}
    else:
        root = carla_root(request.require_data_root())
        supply = ReplaySupply(
            root, phases, request.num_clients, FRAME_PERIOD_S, HOLDOUT_EVERY, TEST_TOWN
        )
        data = {"source": "replay", **folder_identity(root)}
    description: dict[str, object] = {
        "frame_period_s": FRAME_PERIOD_S,
        "holdout_every": HOLDOUT_EVERY,
        "test_town": TEST_TOWN,
        "data": data,
    }
    encoder = FrameEncoder(*IMAGE_SIZE, max_boxes=MAX_BOXES)
    return FrameStream(
        name,
        phases,
        supply,
        encoder,
        round_seconds=ROUND_SECONDS,
        device=request.device,
        description=description,
    )


def build_frame_stream(info: Any, request: StreamRequest) -> FrameStream:
    """The catalogue's builder (``streams.catalogue``): the stream its entry names."""
    return frame_stream(str(info.name), request)
