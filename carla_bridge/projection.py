"""Pinhole projection of world points into a CARLA camera image (pure numpy).

Why our own few lines instead of a vision library: CARLA's camera frame is x forward,
y right, z up, while the pinhole model wants x right, y down, z forward; getting that axis
swap wrong silently mirrors every box, so it lives in one small, tested place. The
world→camera matrix is what ``carla.Transform.get_inverse_matrix()`` returns for the
camera's transform (``image.transform`` of a sensor image).
"""

from __future__ import annotations

import math

import numpy as np

#: Points closer to the image plane than this (metres along the camera's forward axis) are
#: treated as behind the camera; boxes crossing it are clipped against it.
NEAR_PLANE: float = 0.05


def intrinsics(width: int, height: int, fov: float) -> np.ndarray:
    """The 3×3 camera matrix K of a CARLA camera of ``width``×``height`` pixels and a
    horizontal field of view ``fov`` in degrees (square pixels, centred principal point)."""
    if width <= 0 or height <= 0 or not 0.0 < fov < 180.0:
        raise ValueError(
            f"bad camera {width}×{height}, fov {fov}: need positive size, 0 < fov < 180"
        )
    focal = width / (2.0 * math.tan(math.radians(fov) / 2.0))
    return np.array(
        [[focal, 0.0, width / 2.0], [0.0, focal, height / 2.0], [0.0, 0.0, 1.0]],
        dtype=np.float64,
    )


def to_camera(world_points: np.ndarray, world_to_camera: np.ndarray) -> np.ndarray:
    """World points (n×3) in the pinhole frame (n×3: right, down, forward).

    CARLA's camera axes (x forward, y right, z up) map to (y, −z, x)."""
    points = np.asarray(world_points, dtype=np.float64).reshape(-1, 3)
    homogeneous = np.hstack([points, np.ones((points.shape[0], 1))])
    local = homogeneous @ np.asarray(world_to_camera, dtype=np.float64).T
    return np.stack([local[:, 1], -local[:, 2], local[:, 0]], axis=1)


def project_points(
    world_points: np.ndarray, world_to_camera: np.ndarray, K: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Pixel coordinates (n×2) and depth along the view axis (n) of world points.

    Points with depth ≤ 0 are behind the camera; their pixel coordinates are meaningless
    (callers check the depth)."""
    camera = to_camera(world_points, world_to_camera)
    depth = camera[:, 2]
    safe = np.where(np.abs(depth) < 1e-12, 1e-12, depth)
    pixels = camera @ np.asarray(K, dtype=np.float64).T
    return pixels[:, :2] / safe[:, None], depth


def _clip_to_near_plane(camera: np.ndarray) -> np.ndarray:
    """The points of the convex hull of ``camera`` points that lie in front of the near plane
    and bound its clipped part: the points in front plus, for every pair straddling the
    plane, the crossing point.

    Why every pair rather than the box's 12 edges: CARLA's vertex order is not documented as
    an edge list; the crossings of all pairs lie inside the hull and include those of the
    edges, so the min/max of the projection is the same."""
    front = camera[:, 2] > NEAR_PLANE
    ahead, behind = camera[front], camera[~front]
    if behind.shape[0] == 0:
        return ahead
    a = ahead[:, None, :]
    b = behind[None, :, :]
    t = (NEAR_PLANE - a[..., 2]) / (b[..., 2] - a[..., 2])
    crossings = (a + t[..., None] * (b - a)).reshape(-1, 3)
    return np.vstack([ahead, crossings])


def box_2d_from_vertices(
    vertices: np.ndarray,
    world_to_camera: np.ndarray,
    K: np.ndarray,
    width: int,
    height: int,
) -> np.ndarray | None:
    """The image box (xyxy float32, clipped to the image) enclosing projected 3D vertices.

    None when every vertex is behind the camera or the box lies wholly outside the image —
    such an object is not in the frame, so no ground truth should name it."""
    camera = to_camera(vertices, world_to_camera)
    if not np.any(camera[:, 2] > NEAR_PLANE):
        return None
    visible = _clip_to_near_plane(camera)
    pixels = visible @ np.asarray(K, dtype=np.float64).T
    uv = pixels[:, :2] / pixels[:, 2:3]
    x0, y0 = np.clip(uv.min(axis=0), 0.0, [width, height])
    x1, y1 = np.clip(uv.max(axis=0), 0.0, [width, height])
    if x1 <= x0 or y1 <= y0:
        return None
    return np.array([x0, y0, x1, y1], dtype=np.float32)
