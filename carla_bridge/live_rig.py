"""Setting up and tearing down a live CARLA drive: world, traffic, ego vehicles, cameras.

Why a separate object: everything spawned or changed on the server must be undone however
the drive ends (an exception, Ctrl-C, a forgotten ``close``), because a server left in
synchronous mode blocks until a client ticks it again. The :class:`Rig` records each change
the moment it is made, so :meth:`Rig.teardown` undoes exactly what was done even when the
setup itself failed half way.

The ``api`` argument is the ``carla`` module (or a stand-in for tests); nothing here imports
``carla`` itself.
"""

from __future__ import annotations

import queue
import random
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from cfl_bench.core.errors import UserError

if TYPE_CHECKING:
    from cfl_bench.carla_bridge.live import LiveConfig

#: Front camera position on the ego's roof (metres, vehicle frame: x forward, z up).
CAMERA_LOCATION: tuple[float, float, float] = (1.5, 0.0, 2.4)


@dataclass
class Rig:
    """What a live drive holds on the server, in the order it was acquired."""

    world: Any = None
    traffic_manager: Any = None
    original_settings: Any = None
    egos: list[Any] = field(default_factory=list)
    npc_ids: list[int] = field(default_factory=list)
    sensors: list[Any] = field(default_factory=list)
    #: One queue per client; both cameras put ``(kind, image)`` into it, kind "rgb"/"inst",
    #: so a single blocking ``get`` waits for whichever camera is late.
    feeds: list[queue.Queue[tuple[str, Any]]] = field(default_factory=list)
    base_types: dict[int, str] = field(default_factory=dict)
    light_vertices: list[np.ndarray] = field(default_factory=list)
    sign_vertices: list[np.ndarray] = field(default_factory=list)

    def teardown(self, client: Any, api: Any) -> None:
        """Undo every change: stop and destroy sensors, destroy vehicles, restore the world's
        settings and the traffic manager's asynchronous mode. Each step runs even when an
        earlier one fails; failures are reported as one warning, never raised (this runs
        while another exception may be propagating)."""
        failures: list[str] = []
        _attempt(failures, "stop sensors", lambda: [s.stop() for s in self.sensors])
        _attempt(failures, "destroy sensors", lambda: [s.destroy() for s in self.sensors])
        self.sensors = []
        vehicle_ids = [ego.id for ego in self.egos] + self.npc_ids
        if vehicle_ids:
            commands = [api.command.DestroyActor(actor_id) for actor_id in vehicle_ids]
            _attempt(failures, "destroy vehicles", lambda: client.apply_batch(commands))
        self.egos, self.npc_ids = [], []
        if self.world is not None and self.original_settings is not None:
            settings = self.original_settings
            _attempt(failures, "restore settings", lambda: self.world.apply_settings(settings))
        self.original_settings = None
        if self.traffic_manager is not None:
            tm = self.traffic_manager
            _attempt(failures, "traffic manager async", lambda: tm.set_synchronous_mode(False))
        self.traffic_manager = None
        if failures:
            warnings.warn("CARLA cleanup incomplete: " + "; ".join(failures), stacklevel=2)


def _attempt(failures: list[str], step: str, action: Callable[[], object]) -> None:
    """Run one cleanup step, recording rather than raising its failure."""
    try:
        action()
    except Exception as error:
        failures.append(f"{step}: {error}")


def build_rig(rig: Rig, client: Any, api: Any, config: LiveConfig) -> int:
    """Fill ``rig`` step by step (the caller tears it down if this raises) and return the
    simulator frame of the drive's first tick, the origin of simulated time."""
    world = client.load_world(config.town)
    rig.world = world
    rig.original_settings = world.get_settings()
    settings = world.get_settings()
    settings.synchronous_mode = True
    settings.fixed_delta_seconds = config.fixed_delta
    world.apply_settings(settings)
    world.set_weather(_weather(api, config.weather))
    tm = client.get_trafficmanager(config.tm_port)
    rig.traffic_manager = tm
    tm.set_synchronous_mode(True)
    tm.set_random_device_seed(config.seed)
    world.set_pedestrians_seed(config.seed)
    rng = random.Random(config.seed)
    points = _shuffled_spawn_points(world, rng, config)
    vehicles = sorted(world.get_blueprint_library().filter("vehicle.*"), key=lambda bp: bp.id)
    remaining = _spawn_egos(rig, world, api, config, vehicles, points, rng)
    _spawn_npcs(rig, client, api, config, vehicles, remaining, rng)
    for client_id, ego in enumerate(rig.egos):
        _attach_cameras(rig, world, api, config, ego, client_id)
    _record_ground_truth_sources(rig, world, api)
    return int(world.tick(config.timeout))


def _weather(api: Any, name: str) -> Any:
    """The ``carla.WeatherParameters`` preset called ``name``."""
    preset = getattr(api.WeatherParameters, name, None)
    if preset is None or name.startswith("_"):
        raise UserError(f"unknown CARLA weather {name!r}: use a preset such as ClearNoon")
    return preset


def _shuffled_spawn_points(world: Any, rng: random.Random, config: LiveConfig) -> list[Any]:
    """The map's spawn points in a seeded order (the same seed spawns the same places)."""
    points = list(world.get_map().get_spawn_points())
    needed = config.num_clients + config.num_npcs
    if needed > len(points):
        raise UserError(
            f"{config.town} has {len(points)} spawn points but {needed} vehicles were asked "
            "for: lower num_clients or num_npcs"
        )
    rng.shuffle(points)
    return points


def _base_type(blueprint: Any) -> str:
    """A vehicle blueprint's ``base_type`` (car, truck, van, bus, motorcycle, bicycle)."""
    if blueprint.has_attribute("base_type"):
        return str(blueprint.get_attribute("base_type").as_str()).lower()
    return ""


def _spawn_egos(
    rig: Rig,
    world: Any,
    api: Any,
    config: LiveConfig,
    vehicles: list[Any],
    points: list[Any],
    rng: random.Random,
) -> list[Any]:
    """Spawn one car per client on autopilot; return the spawn points left unused.

    Egos are cars (not bikes or buses) so the roof camera sits at a sensible height."""
    cars = [bp for bp in vehicles if _base_type(bp) == "car"] or vehicles
    left = list(points)
    while len(rig.egos) < config.num_clients and left:
        blueprint = rng.choice(cars)
        if blueprint.has_attribute("role_name"):
            blueprint.set_attribute("role_name", f"client{len(rig.egos)}")
        ego = world.try_spawn_actor(blueprint, left.pop(0))
        if ego is not None:
            rig.egos.append(ego)
            rig.base_types[ego.id] = _base_type(blueprint)
            ego.set_autopilot(True, config.tm_port)
    if len(rig.egos) < config.num_clients:
        raise UserError(
            f"only {len(rig.egos)} of {config.num_clients} ego vehicles fit on {config.town}: "
            "lower num_clients or num_npcs"
        )
    return left


def _spawn_npcs(
    rig: Rig,
    client: Any,
    api: Any,
    config: LiveConfig,
    vehicles: list[Any],
    points: list[Any],
    rng: random.Random,
) -> None:
    """Spawn the background traffic in one synchronous batch, each on autopilot."""
    command = api.command
    batch, kinds = [], []
    for point in points[: config.num_npcs]:
        blueprint = rng.choice(vehicles)
        if blueprint.has_attribute("role_name"):
            blueprint.set_attribute("role_name", "autopilot")
        kinds.append(_base_type(blueprint))
        spawn = command.SpawnActor(blueprint, point)
        batch.append(spawn.then(command.SetAutopilot(command.FutureActor, True, config.tm_port)))
    if not batch:
        return
    for response, kind in zip(client.apply_batch_sync(batch, True), kinds, strict=True):
        if response.error:
            continue  # a blocked spawn point: one NPC fewer, as generate_traffic.py does
        rig.npc_ids.append(response.actor_id)
        rig.base_types[response.actor_id] = kind


def _attach_cameras(
    rig: Rig, world: Any, api: Any, config: LiveConfig, ego: Any, client_id: int
) -> None:
    """An RGB and an instance-segmentation camera at the same place on ``ego``, both feeding
    the client's queue once per capture period."""
    feed: queue.Queue[tuple[str, Any]] = queue.Queue()
    rig.feeds.append(feed)
    library = world.get_blueprint_library()
    x, y, z = CAMERA_LOCATION
    mount = api.Transform(api.Location(x=x, y=y, z=z))
    for kind, name in (
        ("rgb", "sensor.camera.rgb"),
        ("inst", "sensor.camera.instance_segmentation"),
    ):
        blueprint = library.find(name)
        blueprint.set_attribute("image_size_x", str(config.width))
        blueprint.set_attribute("image_size_y", str(config.height))
        blueprint.set_attribute("fov", str(config.fov))
        blueprint.set_attribute("sensor_tick", str(config.capture_period))
        sensor = world.spawn_actor(blueprint, mount, attach_to=ego)
        rig.sensors.append(sensor)
        sensor.listen(_putter(feed, kind))


def _putter(feed: queue.Queue[tuple[str, Any]], kind: str) -> Callable[[Any], None]:
    """The sensor callback: tag the image with its camera and queue it (runs on CARLA's
    streaming thread, so it does nothing but enqueue)."""

    def put(image: Any) -> None:
        feed.put((kind, image))

    return put


def _record_ground_truth_sources(rig: Rig, world: Any, api: Any) -> None:
    """World vertices of every traffic light and sign box of the level (static: read once)."""
    identity = api.Transform()
    for label, target in (
        (api.CityObjectLabel.TrafficLight, rig.light_vertices),
        (api.CityObjectLabel.TrafficSigns, rig.sign_vertices),
    ):
        for box in world.get_level_bbs(label):
            corners = box.get_world_vertices(identity)
            target.append(np.array([[v.x, v.y, v.z] for v in corners], dtype=np.float64))
