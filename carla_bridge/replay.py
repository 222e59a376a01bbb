"""Replay recorded CARLA frames as if vehicle clients were driving now.

Why a replay source: the federated loop should run the driving scenario without a simulator
(CI, laptops, reproducible papers). :class:`ReplaySource` turns a folder in the shared
dataset's layout (``images/<split>/TownXX_NNNNNN.png`` with VOC or YOLO labels) into the
same per-client, per-window stream a live CARLA source yields.

The timeline, fully deterministic (same arguments → same frames):

* Each town's frames are sorted by frame number; the recording's capture period is not
  stored, so ``frame_period`` (simulated seconds between consecutive frames) is explicit.
* Every client captures at the ticks ``n × frame_period`` (n = 0, 1, ...). At tick ``n`` a
  client driving town ``T`` shows frame ``(phase + n) mod len(T)`` of ``T``'s streamed
  sequence. Streams **loop**: the shared train split has only 122 frames, so any run longer
  than a town's loop reuses frames.
* ``phase`` spreads the clients that ever drive a town over its loop: the ``r``-th of ``m``
  such clients (in client-id order) starts ``r × len(T) // m`` frames in, so two clients in
  the same town never show the same frame at the same time (while the town has at least
  ``m`` frames).
* A :class:`DomainShift` switches a client to another town from ``at_time`` on (the paper's
  highway shift: an urban client drives onto Town04); the client joins that town's loop at
  its own phase there, at the current tick.
* ``holdout_every = k`` holds out the k-th, 2k-th, ... frame of each town (in time order)
  for evaluation: :meth:`ReplaySource.heldout` returns them and no stream ever shows them.
"""

from __future__ import annotations

import math
import numbers
import re
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

from cfl_bench.carla_bridge.boxes import read_voc, read_yolo, scale_boxes
from cfl_bench.carla_bridge.frames import Domain, Frame, TimeWindow
from cfl_bench.core.errors import UserError

SPLITS: tuple[str, ...] = ("train", "test")
BOX_FORMATS: tuple[str, ...] = ("voc", "yolo")
_STEM = re.compile(r"^(?P<town>.+)_(?P<frame>\d+)$")


@dataclass(frozen=True)
class DomainShift:
    """From simulated time ``at_time`` on, ``client`` drives ``town`` instead."""

    client: int
    at_time: float
    town: str


@dataclass(frozen=True)
class RecordedFrame:
    """One frame on disk: its town, number, image file and (read-only) boxes and labels."""

    town: str
    frame_id: int
    image_path: Path
    boxes: np.ndarray
    labels: np.ndarray

    def frame(self, client: int, t: float, image: np.ndarray | None = None) -> Frame:
        """This recording as ``client``'s frame at simulated time ``t`` (the image read from
        disk unless given, e.g. from a cache)."""
        pixels = load_image(self.image_path) if image is None else image
        return Frame(
            client, t, self.frame_id, Domain.of_town(self.town), pixels, self.boxes, self.labels
        )


def _read_only(array: np.ndarray) -> np.ndarray:
    """Frames share cached arrays; freezing them stops one consumer corrupting the next."""
    array.flags.writeable = False
    return array


def _image_size(path: Path) -> tuple[int, int]:
    try:
        with Image.open(path) as image:
            return image.size
    except (OSError, UnidentifiedImageError) as err:
        raise UserError(f"{path} is not a readable PNG ({err}); replace or remove it") from None


def load_image(path: Path) -> np.ndarray:
    """An image file as H×W×3 uint8 RGB (the shared PNGs are RGBA; alpha is dropped)."""
    try:
        with Image.open(path) as image:
            return _read_only(np.array(image.convert("RGB"), dtype=np.uint8))
    except (OSError, UnidentifiedImageError) as err:
        raise UserError(f"{path} is not a readable PNG ({err}); replace or remove it") from None


def _read_entry(root: Path, split: str, image_path: Path, box_format: str) -> RecordedFrame:
    match = _STEM.match(image_path.stem)
    if match is None:
        raise UserError(f"{image_path} is not named <town>_<frame number>.png; rename or remove it")
    folder, suffix = ("labels", "xml") if box_format == "voc" else ("labels_yolo_format", "txt")
    label_path = root / folder / split / f"{image_path.stem}.{suffix}"
    if not label_path.is_file():
        raise UserError(
            f"{image_path} has no label file {label_path}; add it or pick the other box_format"
        )
    size = _image_size(image_path)
    if box_format == "voc":
        boxes, labels, annotated = read_voc(label_path)
        if annotated != size:
            boxes = scale_boxes(boxes, annotated, size)
    else:
        boxes, labels = read_yolo(label_path, *size)
    town, frame_id = match["town"], int(match["frame"])
    return RecordedFrame(town, frame_id, image_path, _read_only(boxes), _read_only(labels))


def scan_split(root: str | Path, split: str, box_format: str) -> dict[str, list[RecordedFrame]]:
    """Each town's recorded frames of one split, sorted by frame number.

    Labels are parsed now (they are small) so a bad file fails at construction, not in the
    middle of a run; images are read lazily.
    """
    root = Path(root)
    if split not in SPLITS:
        raise UserError(f"split {split!r} is unknown; use one of {', '.join(SPLITS)}")
    if box_format not in BOX_FORMATS:
        raise UserError(f"box_format {box_format!r} is unknown; use {' or '.join(BOX_FORMATS)}")
    if not root.is_dir():
        raise UserError(
            f"replay folder {root} does not exist; pass the folder holding images/ and labels/"
        )
    images = sorted((root / "images" / split).glob("*.png"))
    if not images:
        raise UserError(
            f"{root / 'images' / split} holds no .png frames; point root at a folder in the "
            "shared layout (images/<split>/TownXX_NNNNNN.png)"
        )
    towns: dict[str, list[RecordedFrame]] = {}
    for path in images:
        entry = _read_entry(root, split, path, box_format)
        towns.setdefault(entry.town, []).append(entry)
    return {town: sorted(entries, key=lambda e: e.frame_id) for town, entries in towns.items()}


def _check_town(town: str, towns: Sequence[str], what: str) -> None:
    if town not in towns:
        raise UserError(
            f"{what} names town {town!r}, which this split lacks; use one of {', '.join(towns)}"
        )


def _check_number(value: object, what: str, fix: str) -> float:
    """A positive finite real (not a bool), else a UserError naming ``what``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise UserError(f"{what} is {value!r}, not a number; {fix}")
    number = float(value)
    if not (math.isfinite(number) and number > 0):
        raise UserError(f"{what} is {value!r}; {fix}")
    return number


def _check_count(value: object, what: str, fix: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise UserError(f"{what} is {value!r}; {fix}")
    return int(value)


def _check_pacing(pacing: float | None) -> float | None:
    if pacing is None:
        return None
    return _check_number(pacing, "pacing", "use None (as fast as possible) or a speed factor > 0")


def _check_holdout(holdout_every: int) -> int:
    """0 (nothing held out) or k ≥ 2; k = 1 would leave nothing to stream."""
    if holdout_every == 1:
        raise UserError("holdout_every 1 would hold out every frame; use 0 (none) or k ≥ 2")
    return _check_count(holdout_every, "holdout_every", "use 0 (none) or k ≥ 2", 0)


def _check_shifts(
    shifts: Sequence[DomainShift], num_clients: int, towns: Sequence[str]
) -> tuple[DomainShift, ...]:
    seen: set[tuple[int, float]] = set()
    for shift in shifts:
        if not 0 <= shift.client < num_clients:
            raise UserError(
                f"shift {shift} names client {shift.client}; use a client 0..{num_clients - 1}"
            )
        if not (math.isfinite(shift.at_time) and shift.at_time >= 0):
            raise UserError(f"shift {shift} has at_time {shift.at_time}; use a time ≥ 0")
        _check_town(shift.town, towns, f"shift {shift}")
        if (shift.client, shift.at_time) in seen:
            raise UserError(
                f"client {shift.client} has two shifts at time {shift.at_time}; keep one"
            )
        seen.add((shift.client, shift.at_time))
    return tuple(sorted(shifts, key=lambda s: (s.client, s.at_time)))


def _holdout(
    entries: list[RecordedFrame], every: int
) -> tuple[list[RecordedFrame], list[RecordedFrame]]:
    """(streamed, held out): the k-th, 2k-th, ... entries are held out when ``every = k``."""
    if every == 0:
        return list(entries), []
    held = [e for j, e in enumerate(entries) if (j + 1) % every == 0]
    return [e for j, e in enumerate(entries) if (j + 1) % every != 0], held


def _phases(
    routes: dict[int, list[tuple[float, str]]], lengths: dict[str, int]
) -> dict[tuple[int, str], int]:
    """Each (client, town) pair's offset into the town's loop (see the module docstring)."""
    drivers: dict[str, list[int]] = {}
    for client in sorted(routes):
        for _, town in routes[client]:
            if client not in drivers.setdefault(town, []):
                drivers[town].append(client)
    return {
        (client, town): rank * lengths[town] // len(clients)
        for town, clients in drivers.items()
        for rank, client in enumerate(clients)
    }


def first_tick(t: float, period: float) -> int:
    """The first capture tick ``n ≥ 0`` with ``n × period ≥ t`` (exact in floating point)."""
    if t <= 0:
        return 0
    n = math.ceil(t / period)
    while n > 0 and (n - 1) * period >= t:
        n -= 1
    while n * period < t:
        n += 1
    return n


class _ImageCache:
    """A small LRU of decoded images: a round re-reads the frames the last one showed."""

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._images: OrderedDict[Path, np.ndarray] = OrderedDict()

    def get(self, path: Path) -> np.ndarray:
        if path in self._images:
            self._images.move_to_end(path)
            return self._images[path]
        image = load_image(path)
        self._images[path] = image
        if len(self._images) > self._capacity:
            self._images.popitem(last=False)
        return image

    def clear(self) -> None:
        self._images.clear()


class ReplaySource:
    """A :class:`~carla_bridge.frames.FrameSource` over a folder in the shared layout.

    See the module docstring for the timeline. ``pacing`` ``None`` delivers as fast as
    possible; a factor ``f`` makes :meth:`frames` wait until ``window.end / f`` wall seconds
    have passed since construction (``f = 1`` is real time), so a demo runs at driving speed.
    ``clock`` and ``sleep`` are injectable so tests need not wait.
    """

    def __init__(
        self,
        *,
        root: str | Path,
        split: str,
        num_clients: int,
        client_towns: Sequence[str],
        frame_period: float,
        box_format: str = "voc",
        holdout_every: int = 0,
        shifts: Sequence[DomainShift] = (),
        pacing: float | None = None,
        cache_frames: int = 32,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        recorded = scan_split(root, split, box_format)
        self.num_clients = _check_count(num_clients, "num_clients", "use 1 or more", 1)
        self._period = _check_number(
            frame_period, "frame_period", "use the positive simulated seconds between frames"
        )
        self._pacing = _check_pacing(pacing)
        every = _check_holdout(holdout_every)
        self._streamed: dict[str, list[RecordedFrame]] = {}
        self._heldout: dict[str, list[RecordedFrame]] = {}
        for town, entries in recorded.items():
            self._streamed[town], self._heldout[town] = _holdout(entries, every)
        self._routes = self._plan_routes(client_towns, shifts)
        lengths = {town: len(entries) for town, entries in self._streamed.items()}
        self._phase = _phases(self._routes, lengths)
        self._cache = _ImageCache(_check_count(cache_frames, "cache_frames", "use ≥ 1", 1))
        self._clock, self._sleep = clock, sleep
        self._started = clock()

    def _plan_routes(
        self, client_towns: Sequence[str], shifts: Sequence[DomainShift]
    ) -> dict[int, list[tuple[float, str]]]:
        """Each client's (from time, town) legs, in time order."""
        if isinstance(client_towns, str) or len(client_towns) != self.num_clients:
            raise UserError(
                f"client_towns {client_towns!r} must list one town per client "
                f"({self.num_clients}), e.g. ('Town01', 'Town02')"
            )
        for town in client_towns:
            _check_town(town, self.towns, "client_towns")
        routes = {client: [(0.0, town)] for client, town in enumerate(client_towns)}
        for shift in _check_shifts(shifts, self.num_clients, self.towns):
            legs = routes[shift.client]
            if shift.at_time == 0:
                legs[0] = (0.0, shift.town)
            else:
                legs.append((float(shift.at_time), shift.town))
        return routes

    @property
    def towns(self) -> tuple[str, ...]:
        """The towns this split holds, sorted."""
        return tuple(sorted(self._streamed))

    def stream_ids(self, town: str) -> tuple[int, ...]:
        """The frame numbers a client driving ``town`` loops over, in time order."""
        _check_town(town, self.towns, "stream_ids")
        return tuple(entry.frame_id for entry in self._streamed[town])

    def town_at(self, client: int, t: float) -> str:
        """The town ``client`` drives at simulated time ``t``."""
        return [town for start, town in self._routes[client] if start <= t][-1]

    def frames(self, window: TimeWindow) -> dict[int, list[Frame]]:
        """Each client's frames with capture times in ``[window.start, window.end)``."""
        if not (math.isfinite(window.start) and math.isfinite(window.end)):
            raise UserError(f"window {window} is not finite; use finite simulated seconds")
        if window.end < window.start:
            raise UserError(f"window {window} ends before it starts; swap start and end")
        ticks = range(first_tick(window.start, self._period), first_tick(window.end, self._period))
        out = {c: [self._frame(c, n) for n in ticks] for c in range(self.num_clients)}
        self._pace(window)
        return out

    def _frame(self, client: int, tick: int) -> Frame:
        t = tick * self._period
        town = self.town_at(client, t)
        loop = self._streamed[town]
        entry = loop[(self._phase[client, town] + tick) % len(loop)]
        return self._to_frame(entry, client, t)

    def _to_frame(self, entry: RecordedFrame, client: int, t: float) -> Frame:
        return entry.frame(client, t, self._cache.get(entry.image_path))

    def _pace(self, window: TimeWindow) -> None:
        """Hold the window back until its end is due in wall time (no-op without pacing)."""
        if self._pacing is None:
            return
        wait = self._started + window.end / self._pacing - self._clock()
        if wait > 0:
            self._sleep(wait)

    def heldout(self, town: str) -> list[Frame]:
        """The frames of ``town`` held out for evaluation (client -1, time 0), in time order."""
        _check_town(town, self.towns, "heldout")
        return [self._to_frame(entry, -1, 0.0) for entry in self._heldout[town]]

    def close(self) -> None:
        """Drop the cached images (nothing else is held open)."""
        self._cache.clear()
