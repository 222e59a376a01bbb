"""The live CARLA bridge: projection, instance-segmentation boxes, the live source's tick and
cleanup logic, and the no-server error path of the real client.

No CARLA server can run on these machines (it needs a GPU and the simulator build), so the
live source's tests drive it against a small stand-in for the server objects written below
(``_FakeClient``, ``_FakeWorld``, ...). The stand-in checks *our* logic — ticking, matching
images by frame number, cleanup on every exit path — not CARLA's; the real code path is
``carla_bridge/live.py`` (with ``carla_bridge/live_rig.py``), whose ``connect`` is exercised
against the real client below.
"""

from __future__ import annotations

import queue
import socket
import sys
import threading
import time
from fnmatch import fnmatch
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from cfl_bench.carla_bridge.frames import CLASSES, TimeWindow
from cfl_bench.carla_bridge.live import (
    MAX_CLIENTS,
    LiveConfig,
    LiveSource,
    check_versions,
    connect,
    import_carla,
)
from cfl_bench.carla_bridge.projection import box_2d_from_vertices, intrinsics, project_points
from cfl_bench.carla_bridge.segmentation import (
    TAG_BICYCLE,
    TAG_CAR,
    TAG_RIDER,
    TAG_TRAFFIC_LIGHT,
    VEHICLE_TAGS,
    class_of,
    instance_boxes,
    light_sign_boxes,
)
from cfl_bench.core.errors import UserError

W, H = 640, 380


def _carla() -> Any:
    return pytest.importorskip("carla", reason="the carla client wheel is not installed")


def _vertices(box: Any, transform: Any) -> np.ndarray:
    return np.array([[v.x, v.y, v.z] for v in box.get_world_vertices(transform)])


# --- projection with the real carla classes ---------------------------------------------


def test_intrinsics_focal_and_centre() -> None:
    K = intrinsics(W, H, 90.0)
    assert K[0, 0] == pytest.approx(320.0) and K[1, 1] == pytest.approx(320.0)
    assert (K[0, 2], K[1, 2]) == (320.0, 190.0)


def test_box_ahead_of_camera_matches_hand_computation() -> None:
    """A 2×2×2 box 10 m ahead of a camera at the origin looking along +x: the near face
    (x = 9) spans ±1 m, so u = 320 ± 320/9 and v = 190 ± 320/9."""
    carla = _carla()
    camera = carla.Transform(carla.Location(0.0, 0.0, 0.0), carla.Rotation())
    box = carla.BoundingBox(carla.Location(10.0, 0.0, 0.0), carla.Vector3D(1.0, 1.0, 1.0))
    world_to_camera = np.array(camera.get_inverse_matrix())
    result = box_2d_from_vertices(
        _vertices(box, carla.Transform()), world_to_camera, intrinsics(W, H, 90), W, H
    )
    d = 320.0 / 9.0
    assert result == pytest.approx([320 - d, 190 - d, 320 + d, 190 + d], abs=1e-3)


def test_moved_and_turned_camera_uses_inverse_matrix() -> None:
    """The same geometry seen by a camera 2 m up, turned to look along +y, with the box
    placed by an actor transform that also turns it (extent 2×1×1 turned by 90°)."""
    carla = _carla()
    camera = carla.Transform(carla.Location(5.0, 0.0, 2.0), carla.Rotation(yaw=90.0))
    actor = carla.Transform(carla.Location(5.0, 10.0, 2.0), carla.Rotation(yaw=90.0))
    box = carla.BoundingBox(carla.Location(0.0, 0.0, 0.0), carla.Vector3D(2.0, 1.0, 1.0))
    world_to_camera = np.array(camera.get_inverse_matrix())
    result = box_2d_from_vertices(
        _vertices(box, actor), world_to_camera, intrinsics(W, H, 90), W, H
    )
    d = 320.0 / 8.0  # the turned box's length runs along the view axis: near face at 8 m
    assert result == pytest.approx([320 - d, 190 - d, 320 + d, 190 + d], abs=1e-3)
    uv, depth = project_points(np.array([[5.0, 10.0, 2.0]]), world_to_camera, intrinsics(W, H, 90))
    assert depth[0] == pytest.approx(10.0) and uv[0] == pytest.approx([320.0, 190.0])


def test_box_behind_camera_is_none_and_straddling_box_is_clipped() -> None:
    carla = _carla()
    world_to_camera = np.array(carla.Transform().get_inverse_matrix())
    K = intrinsics(W, H, 90)
    behind = carla.BoundingBox(carla.Location(-10.0, 0.0, 0.0), carla.Vector3D(1, 1, 1))
    assert (
        box_2d_from_vertices(_vertices(behind, carla.Transform()), world_to_camera, K, W, H) is None
    )
    # x from −1 to 2 m: the part in front of the camera spans u = 320 + 320·0.5/2 = 400 to
    # beyond the right edge, and vertically beyond both edges.
    straddling = carla.BoundingBox(carla.Location(0.5, 1.0, 0.0), carla.Vector3D(1.5, 0.5, 0.5))
    vertices = _vertices(straddling, carla.Transform())
    clipped = box_2d_from_vertices(vertices, world_to_camera, K, W, H)
    assert clipped is not None and clipped.tolist() == pytest.approx([400, 0, W, H])


# --- instance segmentation ---------------------------------------------------------------


def _paint(arr: np.ndarray, rows: slice, cols: slice, tag: int, actor_id: int) -> None:
    """Write BGRA pixels as CARLA's instance camera does: R = tag, G + 256·B = id."""
    arr[rows, cols, 2] = tag
    arr[rows, cols, 1] = actor_id % 256
    arr[rows, cols, 0] = actor_id // 256


def test_instance_boxes_are_tight_and_occlusion_aware() -> None:
    """A car (id 300) partly hidden by a bicycle with its rider (id 7): the car's box is
    its visible part only; the rider's pixels belong to the bike's box."""
    arr = np.zeros((40, 60, 4), dtype=np.uint8)
    _paint(arr, slice(10, 20), slice(10, 30), TAG_CAR, 300)
    _paint(arr, slice(5, 25), slice(20, 40), TAG_BICYCLE, 7)  # drawn over the car
    _paint(arr, slice(2, 5), slice(25, 35), TAG_RIDER, 7)
    _paint(arr, slice(30, 32), slice(0, 2), TAG_CAR, 900)  # 4 pixels
    _paint(arr, slice(30, 40), slice(50, 60), 12, 901)  # a pedestrian
    _paint(arr, slice(35, 40), slice(0, 10), TAG_CAR, 0)  # a non-actor: id 0
    boxes = instance_boxes(arr, VEHICLE_TAGS, min_pixels=5)
    assert set(boxes) == {300, 7}
    assert boxes[300][0].tolist() == [10, 10, 20, 20] and boxes[300][1] == TAG_CAR
    assert boxes[7][0].tolist() == [20, 2, 40, 25] and boxes[7][1] == TAG_BICYCLE
    assert set(instance_boxes(arr, VEHICLE_TAGS, min_pixels=1)) == {300, 7, 900}
    assert set(instance_boxes(arr, {12}, min_pixels=1)) == {901}
    assert instance_boxes(np.zeros((4, 4, 4), np.uint8), VEHICLE_TAGS) == {}


def test_class_of_prefers_base_type_then_tag() -> None:
    assert class_of("bicycle", TAG_RIDER) == CLASSES.index("bike")
    assert class_of("motorcycle", 18) == CLASSES.index("motobike")
    assert class_of("truck", 15) == CLASSES.index("vehicle")
    assert class_of(None, 19) == CLASSES.index("bike")
    assert class_of("", 16) == CLASSES.index("vehicle")
    assert class_of(None, TAG_RIDER) is None


def test_light_boxes_kept_only_where_their_tag_shows() -> None:
    """Two lights 10 m ahead (identity camera); only the one whose box the semantic image
    fills with the traffic-light tag is kept (the other is 'behind a wall')."""
    K = intrinsics(W, H, 90)
    semantic = np.zeros((H, W), dtype=np.uint8)
    semantic[160:220, 305:335] = TAG_TRAFFIC_LIGHT
    visible = _box_vertices(center=(10.0, 0.0, 0.0), extent=(0.5, 0.5, 1.0))
    hidden = _box_vertices(center=(10.0, 3.0, 0.0), extent=(0.5, 0.5, 1.0))
    kept = light_sign_boxes([visible, hidden], semantic, TAG_TRAFFIC_LIGHT, np.eye(4), K)
    assert len(kept) == 1 and kept[0][0] == pytest.approx(320 - 320 * 0.5 / 9.5, abs=1e-3)


def _box_vertices(center: tuple[float, float, float], extent: tuple[float, ...]) -> np.ndarray:
    signs = np.array([[sx, sy, sz] for sx in (-1, 1) for sy in (-1, 1) for sz in (-1, 1)])
    return np.asarray(center) + signs * np.asarray(extent)


# --- the live source against a stand-in server ------------------------------------------
# A stand-in, because no CARLA server can run here: just enough of the client API for
# LiveSource's own logic. Camera images mark their frame (RGB pixel value, the NPC's box
# position) so the tests can tell a matched pair from a mismatched one.

FRAME0 = 1000  # the stand-in's simulator frame counter starts away from 0, like a server's
NPC_BASE_ID = 500


class _Attr:
    def __init__(self, value: str) -> None:
        self.value = value

    def as_str(self) -> str:
        return self.value


class _Blueprint:
    def __init__(self, bp_id: str, **attributes: str) -> None:
        self.id = bp_id
        self.attributes = dict(attributes)

    def has_attribute(self, name: str) -> bool:
        return name in self.attributes or name == "role_name"

    def get_attribute(self, name: str) -> _Attr:
        return _Attr(self.attributes[name])

    def set_attribute(self, name: str, value: str) -> None:
        self.attributes[name] = value


class _Library:
    def __init__(self) -> None:
        self.blueprints = [
            _Blueprint("vehicle.tesla.model3", base_type="car"),
            _Blueprint("vehicle.bh.crossbike", base_type="bicycle"),
            _Blueprint("sensor.camera.rgb"),
            _Blueprint("sensor.camera.instance_segmentation"),
        ]

    def filter(self, pattern: str) -> list[_Blueprint]:
        return [bp for bp in self.blueprints if fnmatch(bp.id, pattern)]

    def find(self, bp_id: str) -> _Blueprint:
        return _Blueprint(bp_id, **next(b for b in self.blueprints if b.id == bp_id).attributes)


class _Actor:
    def __init__(self, actor_id: int, blueprint: _Blueprint) -> None:
        self.id = actor_id
        self.attributes = dict(blueprint.attributes)
        self.destroyed = False
        self.autopilot = False

    def set_autopilot(self, enabled: bool, port: int) -> None:
        self.autopilot = enabled

    def destroy(self) -> bool:
        self.destroyed = True
        return True


class _Identity:
    def get_inverse_matrix(self) -> list[list[float]]:
        return np.eye(4).tolist()


class _Sensor(_Actor):
    def __init__(
        self, actor_id: int, blueprint: _Blueprint, world: _FakeWorld, parent: _Actor
    ) -> None:
        super().__init__(actor_id, blueprint)
        self.parent = parent
        self.kind = "inst" if "instance" in blueprint.id else "rgb"
        self.world = world
        self.callback: Any = None
        self.stopped = False
        self.listen_frame = 0

    def listen(self, callback: Any) -> None:
        self.callback, self.listen_frame = callback, self.world.frame

    def stop(self) -> None:
        self.stopped, self.callback = True, None

    def fire(self, frame: int) -> None:
        """Capture on the tick after listen and every sensor_tick after (like CARLA)."""
        every = round(
            float(self.attributes["sensor_tick"]) / self.world.settings.fixed_delta_seconds
        )
        if self.callback is None or (frame - self.listen_frame - 1) % every:
            return
        image = self.world.image(self, frame)
        if self.kind == self.world.late_kind:  # arrives on another thread, a bit later
            self.world.courier.send(self.callback, image)
        else:
            self.callback(image)


class _Courier:
    """Delivers images 10 ms late on its own thread, in the order sent: like one CARLA sensor
    stream, late but never reordered."""

    def __init__(self) -> None:
        self.parcels: queue.Queue[tuple[float, Any, Any]] = queue.Queue()
        threading.Thread(target=self._run, daemon=True).start()

    def send(self, callback: Any, image: Any) -> None:
        self.parcels.put((time.monotonic() + 0.01, callback, image))

    def _run(self) -> None:
        while True:
            due, callback, image = self.parcels.get()
            time.sleep(max(0.0, due - time.monotonic()))
            callback(image)


class _FakeWorld:
    def __init__(self) -> None:
        self.frame = FRAME0
        self.settings = SimpleNamespace(synchronous_mode=False, fixed_delta_seconds=None)
        self.actors: dict[int, _Actor] = {}
        self.sensors: list[_Sensor] = []
        self.next_id = 1
        self.library = _Library()
        self.late_kind = "inst"
        self.courier = _Courier()
        self.fail_at_tick: BaseException | None = None
        self.fail_camera = False

    def get_settings(self) -> SimpleNamespace:
        return SimpleNamespace(**vars(self.settings))

    def apply_settings(self, settings: SimpleNamespace) -> int:
        self.settings = SimpleNamespace(**vars(settings))
        return self.frame

    def set_weather(self, weather: Any) -> None:
        self.weather = weather

    def set_pedestrians_seed(self, seed: int) -> None:
        self.pedestrians_seed = seed

    def get_map(self) -> SimpleNamespace:
        points = [SimpleNamespace(index=i) for i in range(10)]
        return SimpleNamespace(get_spawn_points=lambda: points)

    def get_blueprint_library(self) -> _Library:
        return self.library

    def add(self, blueprint: _Blueprint, attach_to: Any = None) -> _Actor:
        actor_id, self.next_id = self.next_id, self.next_id + 1
        if blueprint.id.startswith("sensor."):
            if self.fail_camera:
                raise RuntimeError("spawn failed")
            actor: _Actor = _Sensor(actor_id, blueprint, self, attach_to)
            self.sensors.append(actor)  # type: ignore[arg-type]
        else:
            actor = _Actor(actor_id, blueprint)
        self.actors[actor_id] = actor
        return actor

    def try_spawn_actor(self, blueprint: _Blueprint, point: Any) -> _Actor:
        return self.add(blueprint)

    def spawn_actor(self, blueprint: _Blueprint, point: Any, attach_to: Any = None) -> _Actor:
        return self.add(blueprint, attach_to)

    def get_level_bbs(self, label: int) -> list[Any]:
        if label != TAG_TRAFFIC_LIGHT:
            return []
        corners = _box_vertices(center=(10.0, 0.0, 0.0), extent=(0.5, 0.5, 1.0))
        points = [SimpleNamespace(x=x, y=y, z=z) for x, y, z in corners]
        return [SimpleNamespace(get_world_vertices=lambda transform: points)]

    def tick(self, timeout: float = 0.0) -> int:
        assert self.settings.synchronous_mode, "ticked an asynchronous world"
        if self.fail_at_tick is not None and self.frame >= FRAME0 + 30:
            raise self.fail_at_tick
        self.frame += 1
        for sensor in list(self.sensors):
            sensor.fire(self.frame)
        return self.frame

    def image(self, sensor: _Sensor, frame: int) -> SimpleNamespace:
        """RGB: every pixel (frame % 256, 1, 2) as BGRA. Instance: an NPC car whose box
        starts at column frame % 50, the camera's own ego's hood, and a traffic light."""
        arr = np.zeros((H, W, 4), dtype=np.uint8)
        if sensor.kind == "rgb":
            arr[..., 2], arr[..., 1], arr[..., 0] = frame % 256, 1, 2
        else:
            left = frame % 50
            _paint(arr, slice(100, 150), slice(left, left + 80), TAG_CAR, NPC_BASE_ID)
            _paint(arr, slice(340, 380), slice(0, W), TAG_CAR, sensor.parent.id)
            arr[160:220, 305:335, 2] = TAG_TRAFFIC_LIGHT
        return SimpleNamespace(
            frame=frame, width=W, height=H, raw_data=arr.tobytes(), transform=_Identity()
        )


class _FakeClient:
    def __init__(self) -> None:
        self.world = _FakeWorld()
        self.tm = SimpleNamespace(synchronous=False, seed=None)
        self.tm.set_synchronous_mode = lambda on: setattr(self.tm, "synchronous", on)
        self.tm.set_random_device_seed = lambda seed: setattr(self.tm, "seed", seed)
        self.destroy_batches = 0

    def load_world(self, town: str) -> _FakeWorld:
        return self.world

    def get_trafficmanager(self, port: int) -> SimpleNamespace:
        return self.tm

    def apply_batch_sync(self, batch: list[Any], do_tick: bool = False) -> list[Any]:
        responses = []
        for command in batch:
            actor = self.world.add(command.blueprint)
            actor.autopilot = command.then_command.enabled
            responses.append(SimpleNamespace(error="", actor_id=actor.id))
        return responses

    def apply_batch(self, batch: list[Any]) -> None:
        self.destroy_batches += 1
        for command in batch:
            self.world.actors[command.actor_id].destroy()


class _Spawn:
    def __init__(self, blueprint: _Blueprint, point: Any) -> None:
        self.blueprint, self.then_command = blueprint, None

    def then(self, command: Any) -> _Spawn:
        self.then_command = command
        return self


_FAKE_API = SimpleNamespace(
    Transform=lambda *args, **kwargs: SimpleNamespace(args=args),
    Location=lambda **kwargs: SimpleNamespace(**kwargs),
    WeatherParameters=SimpleNamespace(ClearNoon="clear noon"),
    CityObjectLabel=SimpleNamespace(TrafficLight=TAG_TRAFFIC_LIGHT, TrafficSigns=8),
    command=SimpleNamespace(
        SpawnActor=_Spawn,
        SetAutopilot=lambda actor, enabled, port: SimpleNamespace(enabled=enabled),
        FutureActor=0,
        DestroyActor=lambda actor_id: SimpleNamespace(actor_id=actor_id),
    ),
)


def _source(client: _FakeClient, **overrides: Any) -> LiveSource:
    settings = {"num_clients": 2, "num_npcs": 3, "capture_period": 1.0, "image_timeout": 2.0}
    settings.update(overrides)
    return LiveSource(LiveConfig(**settings), client=client, api=_FAKE_API)


def _assert_restored(client: _FakeClient) -> None:
    world = client.world
    assert all(actor.destroyed for actor in world.actors.values())
    assert all(sensor.stopped for sensor in world.sensors) and len(world.sensors) == 4
    assert world.settings.synchronous_mode is False
    assert world.settings.fixed_delta_seconds is None
    assert client.tm.synchronous is False


def test_frames_per_window_follow_the_capture_period() -> None:
    """1 s captures, 0.05 s ticks: a 5 s window holds 5 frames per client, at 0..4 s, the
    next window 5..9 s; ids interleave clients; images and boxes come from matching frames
    although the instance images arrive late on another thread."""
    client = _FakeClient()
    with _source(client) as source:
        first = source.frames(TimeWindow(0.0, 5.0))
        second = source.frames(TimeWindow(5.0, 10.0))
    assert set(first) == {0, 1}
    for c in (0, 1):
        assert [f.time for f in first[c]] == pytest.approx([0, 1, 2, 3, 4])
        assert [f.time for f in second[c]] == pytest.approx([5, 6, 7, 8, 9])
    names = {f.name for window in (first, second) for frames in window.values() for f in frames}
    assert len(names) == 20
    frame = second[1][2]  # tick 140
    assert frame.frame_id == 140 * MAX_CLIENTS + 1
    simulator_frame = FRAME0 + 1 + 140  # tick 0 is the first tick after setup
    assert frame.image[0, 0].tolist() == [simulator_frame % 256, 1, 2]  # BGRA → RGB
    labels = frame.labels.tolist()
    assert sorted(labels) == [CLASSES.index("vehicle"), CLASSES.index("traffic_light")]
    car = frame.boxes[labels.index(CLASSES.index("vehicle"))]
    assert car.tolist() == [simulator_frame % 50, 100, simulator_frame % 50 + 80, 150]
    assert client.world.settings.fixed_delta_seconds is None  # closed by the with block
    assert client.tm.seed == 0 and client.world.pedestrians_seed == 0


def test_images_are_matched_by_frame_number_whichever_camera_is_late() -> None:
    client = _FakeClient()
    client.world.late_kind = "rgb"
    with _source(client, num_clients=1, capture_period=0.5) as source:
        frames = source.frames(TimeWindow(0.0, 3.0))[0]
    assert [f.time for f in frames] == pytest.approx([0, 0.5, 1, 1.5, 2, 2.5])
    for f in frames:
        simulator_frame = FRAME0 + 1 + round(f.time / 0.05)
        assert f.image[0, 0, 0] == simulator_frame % 256
        assert f.boxes[0, 0] == simulator_frame % 50


@pytest.mark.parametrize("failure", [RuntimeError("lost the server"), KeyboardInterrupt()])
def test_close_restores_the_server_when_frames_raises(failure: BaseException) -> None:
    client = _FakeClient()
    source = _source(client)
    client.world.fail_at_tick = failure
    with pytest.raises(type(failure)):
        source.frames(TimeWindow(0.0, 5.0))
    _assert_restored(client)
    source.close()  # idempotent: nothing is destroyed twice
    assert client.destroy_batches == 1
    with pytest.raises(RuntimeError, match="closed"):
        source.frames(TimeWindow(5.0, 6.0))


def test_failed_setup_undoes_what_was_spawned() -> None:
    client = _FakeClient()
    client.world.fail_camera = True
    with pytest.raises(RuntimeError, match="spawn failed"):
        _source(client)
    world = client.world
    assert world.actors and all(actor.destroyed for actor in world.actors.values())
    assert world.settings.synchronous_mode is False and client.tm.synchronous is False


def test_config_errors_are_user_errors() -> None:
    with pytest.raises(UserError, match="multiple of fixed_delta"):
        LiveConfig(capture_period=0.07)
    with pytest.raises(UserError, match="num_clients"):
        LiveConfig(num_clients=MAX_CLIENTS + 1)
    with pytest.raises(UserError, match="spawn points"):
        _source(_FakeClient(), num_npcs=20)
    with pytest.raises(UserError, match="unknown CARLA weather"):
        _source(_FakeClient(), weather="Sandstorm")


# --- versions, missing client, no server ------------------------------------------------


def test_version_policy() -> None:
    check_versions("0.9.16", "0.9.16")
    with pytest.warns(UserWarning, match="differs"):
        check_versions("0.9.16", "0.9.15")
    with pytest.raises(UserError, match="incompatible"):
        check_versions("0.9.16", "0.10.0")


def test_missing_carla_client_is_a_user_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "carla", None)
    with pytest.raises(UserError) as raised:
        import_carla()
    assert str(raised.value) == "the carla client is not installed: pip install 'cfl-bench[carla]'"


def test_no_server_is_one_user_error_with_the_fix() -> None:
    """The real client against a port nobody listens on: CARLA's RuntimeError after the
    1 s timeout becomes the one-sentence UserError."""
    _carla()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    started = time.monotonic()
    with pytest.raises(UserError) as raised:
        connect(LiveConfig(host="127.0.0.1", port=port, timeout=1.0))
    assert time.monotonic() - started < 5.0
    assert str(raised.value) == (
        f"no CARLA server at 127.0.0.1:{port}: start CarlaUE4.sh -RenderOffScreen, or use the "
        "recorded frames instead (`cfl-bench carla demo --source replay`, `cfl-bench run "
        "--stream carla-highway`)"
    )


def test_an_image_whose_partner_never_comes_is_forgotten() -> None:
    """One lost instance image: its RGB partner must not be held for ever nor mismatched."""
    client = _FakeClient()
    source = _source(client, num_clients=1)
    world = client.world
    inst = next(s for s in world.sensors if s.kind == "inst")
    original = inst.fire
    lost = FRAME0 + 1 + 40
    inst.fire = lambda frame: None if frame == lost else original(frame)  # type: ignore[method-assign]
    with source:
        times = [f.time for f in source.frames(TimeWindow(0.0, 4.0))[0]]
        assert times == pytest.approx([0, 1, 3])
        assert all(not images for images in source._pending[0].values())
