"""A live CARLA drive as a :class:`~carla_bridge.frames.FrameSource`.

Why synchronous mode with a fixed time step: the federated rounds are windows of simulated
time, and only a world that advances exactly when we tick it gives the same frames for the
same seed and the same number of frames per window whatever the machine's speed.

Contracts the rest of the bridge relies on:

* **Time.** A frame's ``time`` is ``tick × fixed_delta`` seconds, ticks counted from the
  drive's first tick (tick 0). ``frames(window)`` ticks until the simulated time reaches
  ``window.end``; a capture at exactly ``window.end`` belongs to the next window.
* **Frame ids.** ``frame_id = tick × MAX_CLIENTS + client``. The recorder names files
  ``{town}_{frame_id:06d}``; two clients capturing the same tick would collide if the id
  were the tick (or the simulator's frame number) alone. Ticks, unlike the simulator's
  frame counter, restart at 0 every drive, so names are reproducible across runs.
* **Cameras.** Each client has an RGB and an instance-segmentation camera at the same
  transform with ``sensor_tick = capture_period``. Images arrive on CARLA's streaming thread
  after ``world.tick()`` returns, sometimes late, so they are matched by frame number, not
  by arrival; at a window's end the source waits (at most ``image_timeout`` seconds) for a
  capture that is due. A capture that still arrives after its window is dropped.
* **Ground truth.** See :mod:`carla_bridge.segmentation`: vehicles, bikes and motorbikes
  from the instance image (the ego's own pixels excluded), traffic lights and signs from the
  level's 3D boxes kept where the matching semantic tag fills enough of the box.

Version policy (:func:`check_versions`): CARLA numbers releases 0.9.N. A different first
two components (a future 0.10 or 1.x server) is a :class:`UserError`; a different release
(0.9.15 against the 0.9.16 client) is a warning, because the RPC calls used here exist in
both, but before 0.9.16 instance ids are not actor ids, so classes then come from the
semantic tags alone and the ego's own pixels are not recognised.
"""

from __future__ import annotations

import math
import queue
import re
import time
import warnings
from dataclasses import dataclass
from types import ModuleType, TracebackType
from typing import Any

import numpy as np

from cfl_bench.carla_bridge.frames import CLASSES, Domain, Frame, TimeWindow
from cfl_bench.carla_bridge.live_rig import Rig, build_rig
from cfl_bench.carla_bridge.projection import intrinsics
from cfl_bench.carla_bridge.segmentation import (
    TAG_TRAFFIC_LIGHT,
    TAG_TRAFFIC_SIGN,
    VEHICLE_TAGS,
    class_of,
    instance_boxes,
    light_sign_boxes,
)
from cfl_bench.core.errors import UserError

#: Clients per drive at most; frame ids interleave clients in steps of this.
MAX_CLIENTS = 16

_LIGHT = CLASSES.index("traffic_light")
_SIGN = CLASSES.index("traffic_sign")


@dataclass(frozen=True)
class LiveConfig:
    """How to reach the server and what to drive."""

    host: str = "localhost"
    port: int = 2000
    timeout: float = 10.0  # seconds per RPC call and per tick
    town: str = "Town01"
    num_clients: int = 2  # ego vehicles, one per federated client
    num_npcs: int = 30  # background traffic
    seed: int = 0
    fixed_delta: float = 0.05  # simulated seconds per tick
    capture_period: float = 1.0  # simulated seconds between saved frames of a client
    width: int = 640
    height: int = 380
    fov: float = 90.0
    tm_port: int = 8000
    weather: str = "ClearNoon"
    min_pixels: int = 25  # smallest visible vehicle kept, in pixels
    min_light_fraction: float = 0.2  # share of a light/sign box its own tag must fill
    image_timeout: float = 2.0  # seconds to wait for a due capture at a window's end

    def __post_init__(self) -> None:
        if not 1 <= self.num_clients <= MAX_CLIENTS:
            raise UserError(
                f"num_clients={self.num_clients} is out of range: use 1 to {MAX_CLIENTS}"
            )
        if self.num_npcs < 0 or self.timeout <= 0 or self.fixed_delta <= 0:
            raise UserError(
                "num_npcs, timeout and fixed_delta must be non-negative/positive: fix the config"
            )
        ratio = self.capture_period / self.fixed_delta
        if self.capture_period <= 0 or abs(ratio - round(ratio)) > 1e-6:
            raise UserError(
                f"capture_period={self.capture_period} is not a positive multiple of "
                f"fixed_delta={self.fixed_delta}: choose e.g. {20 * self.fixed_delta:g}"
            )

    @property
    def ticks_per_capture(self) -> int:
        """Ticks between two captures of one client."""
        return round(self.capture_period / self.fixed_delta)


def import_carla() -> ModuleType:
    """The ``carla`` client module, imported only when a live drive is asked for."""
    try:
        import carla
    except ImportError as error:
        raise UserError(
            "the carla client is not installed: pip install 'cfl-bench[carla]'"
        ) from error
    return carla


def _release(version: str) -> tuple[int, ...]:
    """The numeric components of a version string ("0.9.16-dirty" → (0, 9, 16))."""
    return tuple(int(part) for part in re.findall(r"\d+", version)[:3])


def check_versions(client_version: str, server_version: str) -> None:
    """Refuse an incompatible server, warn about a different release (module docstring)."""
    client, server = _release(client_version), _release(server_version)
    if client[:2] != server[:2]:
        raise UserError(
            f"CARLA server {server_version} is incompatible with client {client_version}: "
            f"install the matching client, pip install carla=={server_version}"
        )
    if client != server:
        warnings.warn(
            f"CARLA client {client_version} differs from server {server_version}; "
            "before 0.9.16 classes come from semantic tags only",
            stacklevel=2,
        )


def connect(config: LiveConfig) -> Any:
    """A ``carla.Client`` connected to a running server of a compatible version."""
    carla = import_carla()
    client = carla.Client(config.host, config.port)
    client.set_timeout(config.timeout)
    try:
        server_version = client.get_server_version()
    except RuntimeError as error:
        raise UserError(
            f"no CARLA server at {config.host}:{config.port}: start CarlaUE4.sh "
            "-RenderOffScreen, or use the recorded frames instead (`cfl-bench carla demo "
            "--source replay`, `cfl-bench run --stream carla-highway`)"
        ) from error
    check_versions(client.get_client_version(), server_version)
    return client


class LiveSource:
    """Frames of ``num_clients`` ego vehicles driving in a synchronous CARLA world.

    ``client`` and ``api`` are injectable (a stand-in server in the tests); by default the
    real ``carla`` module and :func:`connect`. Use as a context manager, or call
    :meth:`close`: the server is restored on every exit path."""

    def __init__(self, config: LiveConfig, *, client: Any = None, api: Any = None) -> None:
        self.config = config
        self.num_clients = config.num_clients
        self._api = api if api is not None else import_carla()
        self._client = client if client is not None else connect(config)
        self._K = intrinsics(config.width, config.height, config.fov)
        self._domain = Domain.of_town(config.town, config.weather)
        self._rig: Rig | None = Rig()
        self._pending: list[dict[str, dict[int, Any]]] = []
        self._ready: list[list[Frame]] = []
        self._latest: list[int] = []
        try:
            self._frame0 = build_rig(self._rig, self._client, self._api, config)
        except BaseException:
            self.close()
            raise
        self._tick = 0
        self._pending = [{"rgb": {}, "inst": {}} for _ in range(self.num_clients)]
        self._ready = [[] for _ in range(self.num_clients)]
        self._latest = [-config.ticks_per_capture] * self.num_clients
        self._collect()

    def __enter__(self) -> LiveSource:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.close()

    def frames(self, window: TimeWindow) -> dict[int, list[Frame]]:
        """Tick until ``window.end`` and return each client's captures in the window.

        Any exception (Ctrl-C included) closes the source before propagating: a drive
        interrupted mid-tick cannot be resumed, and the server must not stay synchronous."""
        rig = self._require_open()
        try:
            end_tick = math.ceil(window.end / self.config.fixed_delta - 1e-9)
            while self._tick < end_tick:
                frame = rig.world.tick(self.config.timeout)
                self._tick = int(frame) - self._frame0
                self._collect()
            self._settle(rig)
            return self._take(window)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Destroy everything spawned and restore the server's settings (idempotent)."""
        rig, self._rig = self._rig, None
        if rig is not None:
            rig.teardown(self._client, self._api)

    def _require_open(self) -> Rig:
        if self._rig is None:
            raise RuntimeError("LiveSource is closed")
        return self._rig

    def _collect(self) -> None:
        """Move every delivered image into its client's pending set and turn each complete
        RGB + instance pair into a Frame right away (raw buffers are large)."""
        rig = self._require_open()
        for client, feed in enumerate(rig.feeds):
            while not feed.empty():
                kind, image = feed.get_nowait()
                self._pending[client][kind][int(image.frame)] = image
            rgb, inst = self._pending[client]["rgb"], self._pending[client]["inst"]
            for frame in sorted(rgb.keys() & inst.keys()):
                tick = frame - self._frame0
                self._ready[client].append(
                    self._to_frame(client, tick, rgb.pop(frame), inst.pop(frame))
                )
                self._latest[client] = max(self._latest[client], tick)
            # An unpaired image older than a complete pair lost its partner (each camera's
            # stream is ordered): forget it rather than hold its buffer for ever.
            newest = self._frame0 + self._latest[client]
            for images in (rgb, inst):
                for stale in [frame for frame in images if frame < newest]:
                    del images[stale]

    def _settle(self, rig: Rig) -> None:
        """Wait, at most ``image_timeout`` seconds in all, for captures due by now."""
        deadline = time.monotonic() + self.config.image_timeout
        period = self.config.ticks_per_capture
        for client, feed in enumerate(rig.feeds):
            while self._latest[client] + period <= self._tick:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return
                try:
                    kind, image = feed.get(timeout=remaining)
                except queue.Empty:  # the capture slipped to a later tick
                    return
                self._pending[client][kind][int(image.frame)] = image
                self._collect()

    def _take(self, window: TimeWindow) -> dict[int, list[Frame]]:
        """Hand out the ready frames inside ``window``; keep later ones, drop earlier ones."""
        result: dict[int, list[Frame]] = {}
        for client, ready in enumerate(self._ready):
            ready.sort(key=lambda f: f.time)
            result[client] = [f for f in ready if window.start <= f.time < window.end]
            self._ready[client] = [f for f in ready if f.time >= window.end]
        return result

    def _to_frame(self, client: int, tick: int, rgb_image: Any, inst_image: Any) -> Frame:
        """One Frame from a matched RGB and instance-segmentation image pair."""
        rgb = _bgra(rgb_image)[..., 2::-1].copy()
        boxes, labels = self._ground_truth(client, _bgra(inst_image), inst_image.transform)
        return Frame(
            client=client,
            time=tick * self.config.fixed_delta,
            frame_id=tick * MAX_CLIENTS + client,
            domain=self._domain,
            image=rgb,
            boxes=boxes,
            labels=labels,
        )

    def _ground_truth(
        self, client: int, inst: np.ndarray, camera_transform: Any
    ) -> tuple[np.ndarray, np.ndarray]:
        """Boxes and class labels of what the instance image shows."""
        rig = self._require_open()
        ego_id = rig.egos[client].id
        boxes: list[np.ndarray] = []
        labels: list[int] = []
        found = instance_boxes(inst, VEHICLE_TAGS, self.config.min_pixels)
        for actor_id, (box, tag) in sorted(found.items()):
            label = class_of(rig.base_types.get(actor_id), tag)
            if actor_id != ego_id and label is not None:
                boxes.append(box)
                labels.append(label)
        world_to_camera = np.array(camera_transform.get_inverse_matrix(), dtype=np.float64)
        for tag, vertices, label in (
            (TAG_TRAFFIC_LIGHT, rig.light_vertices, _LIGHT),
            (TAG_TRAFFIC_SIGN, rig.sign_vertices, _SIGN),
        ):
            kept = light_sign_boxes(
                vertices,
                inst[..., 2],
                tag,
                world_to_camera,
                self._K,
                self.config.min_light_fraction,
            )
            boxes.extend(kept)
            labels.extend([label] * len(kept))
        box_array = np.array(boxes, dtype=np.float32).reshape(-1, 4)
        return box_array, np.array(labels, dtype=np.int64)


def _bgra(image: Any) -> np.ndarray:
    """A CARLA image's raw bytes as an H×W×4 uint8 BGRA array (a view, no copy)."""
    flat = np.frombuffer(image.raw_data, dtype=np.uint8)
    return flat.reshape(int(image.height), int(image.width), 4)
