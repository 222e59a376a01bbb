"""Ground-truth 2D boxes from CARLA's instance-segmentation camera (pure numpy).

Why boxes from pixels rather than from projected 3D boxes: a pixel box is tight and
occlusion-aware (a car half hidden behind a bus gets the box of its visible half, a car
wholly hidden gets none), which is what a detector can be asked to find. Traffic lights and
signs are not actors, so their boxes come from the level's 3D boxes, projected, and kept
only where the image really shows that kind of object.

The camera delivers raw BGRA bytes (H×W×4 uint8): the semantic tag is the R channel
(``arr[..., 2]``) and the instance id is ``G + 256·B``; since CARLA 0.9.16 that id is the
id of the actor the pixel belongs to.

Tag numbers: the ``carla.CityObjectLabel`` values of the 0.9.14+ table (docs "Sensors
reference → Semantic segmentation camera"), checked against the installed 0.9.16 client's
enum: TrafficLight 7, TrafficSigns 8, Rider 13, Car 14, Truck 15, Bus 16, Motorcycle 18,
Bicycle 19.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from cfl_bench.carla_bridge.frames import CLASSES
from cfl_bench.carla_bridge.projection import box_2d_from_vertices

TAG_TRAFFIC_LIGHT = 7
TAG_TRAFFIC_SIGN = 8
TAG_RIDER = 13
TAG_CAR = 14
TAG_TRUCK = 15
TAG_BUS = 16
TAG_MOTORCYCLE = 18
TAG_BICYCLE = 19

#: Tags whose pixels belong to road vehicles (a rider's pixels carry its bike's instance id,
#: so the rider is inside the bike's box, as in the shared dataset's labels).
VEHICLE_TAGS: frozenset[int] = frozenset(
    {TAG_RIDER, TAG_CAR, TAG_TRUCK, TAG_BUS, TAG_MOTORCYCLE, TAG_BICYCLE}
)

_CLASS = {name: index for index, name in enumerate(CLASSES)}
_CLASS_OF_TAG = {
    TAG_CAR: _CLASS["vehicle"],
    TAG_TRUCK: _CLASS["vehicle"],
    TAG_BUS: _CLASS["vehicle"],
    TAG_MOTORCYCLE: _CLASS["motobike"],
    TAG_BICYCLE: _CLASS["bike"],
    TAG_TRAFFIC_LIGHT: _CLASS["traffic_light"],
    TAG_TRAFFIC_SIGN: _CLASS["traffic_sign"],
}
_CLASS_OF_BASE_TYPE = {"bicycle": _CLASS["bike"], "motorcycle": _CLASS["motobike"]}


def decode(arr: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Semantic tags (H×W uint8) and instance ids (H×W int64) of a raw BGRA image."""
    if arr.ndim != 3 or arr.shape[2] != 4 or arr.dtype != np.uint8:
        raise ValueError(f"instance image must be H×W×4 uint8 BGRA, got {arr.shape} {arr.dtype}")
    ids = arr[..., 1].astype(np.int64) + 256 * arr[..., 0].astype(np.int64)
    return arr[..., 2], ids


def class_of(base_type: str | None, tag: int) -> int | None:
    """The index into CLASSES of an object, or None when it is none of them.

    Why the actor's ``base_type`` first: it tells a bicycle from a motorcycle even where the
    visible pixels are mostly the rider; the tag is the fallback for objects that are not
    actors (parked cars placed in the level) or servers older than 0.9.16."""
    if base_type:
        return _CLASS_OF_BASE_TYPE.get(base_type.lower(), _CLASS["vehicle"])
    return _CLASS_OF_TAG.get(tag)


def instance_boxes(
    arr: np.ndarray, tags: Iterable[int], min_pixels: int = 1
) -> dict[int, tuple[np.ndarray, int]]:
    """Tight boxes of the instances whose pixels carry one of ``tags``.

    Returns ``{instance id: (xyxy float32 with exclusive max, dominant tag)}`` for instances
    with at least ``min_pixels`` such pixels. Instance id 0 (no actor) is skipped: it lumps
    unrelated objects together. Vectorised: one pass of ``np.unique`` and ``ufunc.at``."""
    semantic, ids = decode(arr)
    mask = np.isin(semantic, np.fromiter(tags, dtype=np.int64)) & (ids != 0)
    ys, xs = np.nonzero(mask)
    if ys.size == 0:
        return {}
    unique, inverse, counts = np.unique(ids[ys, xs], return_inverse=True, return_counts=True)
    inverse = inverse.reshape(-1)
    n = unique.size
    x0 = np.full(n, np.iinfo(np.int64).max)
    y0 = np.full(n, np.iinfo(np.int64).max)
    x1 = np.full(n, -1)
    y1 = np.full(n, -1)
    np.minimum.at(x0, inverse, xs)
    np.minimum.at(y0, inverse, ys)
    np.maximum.at(x1, inverse, xs)
    np.maximum.at(y1, inverse, ys)
    dominant = _dominant_tags(inverse, semantic[ys, xs], n)
    boxes = np.stack([x0, y0, x1 + 1, y1 + 1], axis=1).astype(np.float32)
    return {
        int(unique[i]): (boxes[i], int(dominant[i])) for i in range(n) if counts[i] >= min_pixels
    }


def _dominant_tags(instance: np.ndarray, tag: np.ndarray, n: int) -> np.ndarray:
    """The most frequent tag of each of ``n`` instances, ignoring the rider tag wherever the
    instance shows any other tag (a cyclist is a bike, however much of it is rider)."""
    table = np.zeros((n, 256), dtype=np.int64)
    np.add.at(table, (instance, tag.astype(np.int64)), 1)
    others = table.copy()
    others[:, TAG_RIDER] = 0
    return np.where(others.max(axis=1) > 0, others.argmax(axis=1), TAG_RIDER)


def light_sign_boxes(
    vertex_sets: Iterable[np.ndarray],
    semantic: np.ndarray,
    tag: int,
    world_to_camera: np.ndarray,
    K: np.ndarray,
    min_fraction: float = 0.2,
    min_pixels: int = 4,
) -> list[np.ndarray]:
    """Projected level boxes (xyxy float32) of traffic lights or signs that the image shows.

    A box is kept when at least ``min_fraction`` of the pixels inside it (and at least
    ``min_pixels``) carry ``tag``: a light hidden behind a building projects onto building
    pixels and is dropped. Counting uses one summed-area table per image, so each box costs
    O(1) however large it is."""
    height, width = semantic.shape
    integral = np.zeros((height + 1, width + 1), dtype=np.int64)
    integral[1:, 1:] = np.cumsum(np.cumsum(semantic == tag, axis=0), axis=1)
    kept: list[np.ndarray] = []
    for vertices in vertex_sets:
        box = box_2d_from_vertices(vertices, world_to_camera, K, width, height)
        if box is None:
            continue
        c0, r0 = int(np.floor(box[0])), int(np.floor(box[1]))
        c1, r1 = int(np.ceil(box[2])), int(np.ceil(box[3]))
        area = (c1 - c0) * (r1 - r0)
        hits = integral[r1, c1] - integral[r0, c1] - integral[r1, c0] + integral[r0, c0]
        if area > 0 and hits >= min_pixels and hits >= min_fraction * area:
            kept.append(box)
    return kept
