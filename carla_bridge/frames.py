"""One frame schema for every source of driving frames (replayed files or a live CARLA drive).

Why one schema: the federated loop, the recorder and the detection stream must not know
where a frame came from. A source yields, for a window of simulated time, each vehicle
client's frames; everything downstream (shards, replay buffers, evaluation, the demo's
page) reads only these fields.

Boxes are ``xyxy`` in pixels of the frame's own image (x to the right, y down, the
bottom-right corner exclusive as in VOC's ``xmax``/``ymax`` read as floats); labels index
:data:`CLASSES`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

#: The detection classes, in the shared dataset's ``labels.txt`` order (YOLO class ids).
CLASSES: tuple[str, ...] = ("vehicle", "bike", "motobike", "traffic_light", "traffic_sign")

#: Towns whose roads are highways (the paper's domain shift drives onto one).
HIGHWAY_TOWNS: frozenset[str] = frozenset({"Town04"})


@dataclass(frozen=True)
class Domain:
    """Where a frame was captured: town, road type and weather."""

    town: str
    road: str = "urban"
    weather: str = "ClearNoon"

    @classmethod
    def of_town(cls, town: str, weather: str = "ClearNoon") -> Domain:
        """The domain of a town, with its road type from :data:`HIGHWAY_TOWNS`."""
        return cls(town, "highway" if town in HIGHWAY_TOWNS else "urban", weather)


@dataclass(frozen=True)
class Frame:
    """One camera frame of one vehicle client with its ground-truth boxes."""

    client: int
    time: float  # simulated seconds since the source started
    frame_id: int  # file name number (replayed frames); live: tick × 16 + client (live.py)
    domain: Domain
    image: np.ndarray  # H×W×3 uint8, RGB
    boxes: np.ndarray  # n×4 float32, xyxy pixels
    labels: np.ndarray  # n int64, indices into CLASSES

    def __post_init__(self) -> None:
        if self.image.ndim != 3 or self.image.shape[2] != 3 or self.image.dtype != np.uint8:
            raise ValueError(f"frame image must be H×W×3 uint8, got {self.image.shape}")
        if self.boxes.shape != (self.labels.shape[0], 4):
            raise ValueError(
                f"frame has {self.labels.shape[0]} labels but boxes of shape {self.boxes.shape}"
            )

    @property
    def name(self) -> str:
        """The file stem the shared dataset uses: ``Town01_001020``."""
        return f"{self.domain.town}_{self.frame_id:06d}"


@dataclass(frozen=True)
class TimeWindow:
    """Simulated seconds [start, end) of one round."""

    start: float
    end: float


class FrameSource(Protocol):
    """Yields each vehicle client's frames for a window of simulated time."""

    num_clients: int

    def frames(self, window: TimeWindow) -> dict[int, list[Frame]]:
        """Frames captured in ``window``, per client id (every client present, maybe empty),
        each list in time order."""
        ...

    def close(self) -> None:
        """Release whatever the source holds (a live source restores the simulator)."""
        ...
