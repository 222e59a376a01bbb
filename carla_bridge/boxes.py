"""Box file formats of the CARLA detection dataset: Pascal VOC XML and YOLO text.

Why both: the shared dataset ships each annotation twice and tools downstream expect either,
so the replay source reads whichever the user picks and the recorder writes both. In memory a
box is always ``xyxy`` in pixels (see :mod:`carla_bridge.frames`); the functions here are the
only place that knows the on-disk layouts.

Sizes are ``(width, height)`` in pixels. VOC coordinates are written as whole pixels (the
format's convention, and what the shared files hold), so fractional boxes from a live source
come back rounded; YOLO values are written with enough digits to round-trip to well below a
pixel. Readers turn any bad file into a :class:`~cfl_bench.core.errors.UserError` that names it.
"""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np

from cfl_bench.carla_bridge.frames import CLASSES
from cfl_bench.core.errors import UserError

_VOC_CORNERS = ("xmin", "ymin", "xmax", "ymax")


def _empty() -> tuple[np.ndarray, np.ndarray]:
    return np.zeros((0, 4), dtype=np.float32), np.zeros(0, dtype=np.int64)


def _check_size(width: float, height: float) -> None:
    """Reject sizes that would divide by zero in the normalised formats."""
    if not (width > 0 and height > 0 and math.isfinite(width) and math.isfinite(height)):
        raise ValueError(f"image size must be positive and finite, got {width}×{height}")


def _check_boxes(boxes: np.ndarray, labels: np.ndarray) -> None:
    """Writers take arrays from code, not users: a mismatch is a bug, so ValueError."""
    if boxes.ndim != 2 or boxes.shape[1] != 4 or boxes.shape[0] != labels.shape[0]:
        raise ValueError(f"need n×4 boxes for {labels.shape[0]} labels, got {boxes.shape}")
    if labels.size and (labels.min() < 0 or labels.max() >= len(CLASSES)):
        raise ValueError(f"labels must index CLASSES (0..{len(CLASSES) - 1}), got {labels}")


def xyxy_to_yolo(boxes: np.ndarray, width: float, height: float) -> np.ndarray:
    """Pixel corners → YOLO's normalised ``cx cy w h`` (n×4 float64, precise for writing)."""
    _check_size(width, height)
    b = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    scale = np.array([width, height, width, height])
    centre = (b[:, :2] + b[:, 2:]) / 2
    extent = b[:, 2:] - b[:, :2]
    return np.concatenate([centre, extent], axis=1) / scale


def yolo_to_xyxy(yolo: np.ndarray, width: float, height: float) -> np.ndarray:
    """YOLO's normalised ``cx cy w h`` → pixel corners (n×4 float32)."""
    _check_size(width, height)
    y = np.asarray(yolo, dtype=np.float64).reshape(-1, 4)
    scale = np.array([width, height, width, height])
    centre, half = y[:, :2], y[:, 2:] / 2
    return (np.concatenate([centre - half, centre + half], axis=1) * scale).astype(np.float32)


def scale_boxes(
    boxes: np.ndarray, from_size: tuple[float, float], to_size: tuple[float, float]
) -> np.ndarray:
    """Boxes of an image of ``from_size`` mapped onto the same image resized to ``to_size``.

    Why: an annotation may record a different size than its image (or a model may resize);
    boxes must always be in pixels of the image they travel with.
    """
    _check_size(*from_size)
    _check_size(*to_size)
    factor = np.array([to_size[0] / from_size[0], to_size[1] / from_size[1]] * 2, dtype=np.float64)
    return (np.asarray(boxes, dtype=np.float64).reshape(-1, 4) * factor).astype(np.float32)


def class_index(name: str, path: str | Path) -> int:
    """The index of a class name in :data:`CLASSES`, or a UserError naming the file."""
    try:
        return CLASSES.index(name)
    except ValueError:
        raise UserError(
            f"{path} has unknown class {name!r}; use one of {', '.join(CLASSES)} "
            "(the order of labels.txt)"
        ) from None


def _malformed(path: str | Path, what: str) -> UserError:
    return UserError(f"{path} is not a valid annotation file ({what}); fix or remove it")


def _voc_number(node: ET.Element, tag: str, path: str | Path) -> float:
    text = node.findtext(tag)
    try:
        value = float(text) if text is not None else math.nan
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise _malformed(path, f"<{tag}> is {text!r}, not a number")
    return value


def read_voc(path: str | Path) -> tuple[np.ndarray, np.ndarray, tuple[int, int]]:
    """Boxes (n×4 float32 xyxy), labels (n int64) and ``(width, height)`` of a VOC file.

    A file without ``<object>`` is a frame with no boxes (the shared data has many).
    """
    try:
        root = ET.parse(path).getroot()
    except (ET.ParseError, OSError) as err:
        raise _malformed(path, str(err)) from None
    size = root.find("size")
    if root.tag != "annotation" or size is None:
        raise _malformed(path, "no <annotation> with a <size>")
    width, height = int(_voc_number(size, "width", path)), int(_voc_number(size, "height", path))
    if width <= 0 or height <= 0:
        raise _malformed(path, f"image size {width}×{height} is not positive")
    boxes, labels = [], []
    for obj in root.iter("object"):
        bndbox, name = obj.find("bndbox"), obj.findtext("name")
        if bndbox is None or name is None:
            raise _malformed(path, "an <object> lacks <name> or <bndbox>")
        corners = [_voc_number(bndbox, tag, path) for tag in _VOC_CORNERS]
        if corners[2] < corners[0] or corners[3] < corners[1]:
            raise _malformed(path, f"box {corners} has its max corner before its min corner")
        boxes.append(corners)
        labels.append(class_index(name.strip(), path))
    if not boxes:
        return (*_empty(), (width, height))
    return np.array(boxes, dtype=np.float32), np.array(labels, dtype=np.int64), (width, height)


def voc_text(boxes: np.ndarray, labels: np.ndarray, width: int, height: int, filename: str) -> str:
    """The VOC XML of one image, in the shared files' layout (coordinates in whole pixels)."""
    _check_size(width, height)
    _check_boxes(boxes, labels)
    root = ET.Element("annotation")
    ET.SubElement(root, "filename").text = filename
    ET.SubElement(ET.SubElement(root, "source"), "database").text = "cfl-bench carla_bridge"
    size = ET.SubElement(root, "size")
    for tag, value in (("width", width), ("height", height), ("depth", 3)):
        ET.SubElement(size, tag).text = str(value)
    ET.SubElement(root, "segmented").text = "0"
    for box, label in zip(boxes.tolist(), labels.tolist(), strict=True):
        obj = ET.SubElement(root, "object")
        ET.SubElement(obj, "name").text = CLASSES[label]
        for tag, text in (("pose", "Unspecified"), ("truncated", "0"), ("difficult", "0")):
            ET.SubElement(obj, tag).text = text
        bndbox = ET.SubElement(obj, "bndbox")
        for tag, corner in zip(_VOC_CORNERS, box, strict=True):
            ET.SubElement(bndbox, tag).text = str(round(corner))
    ET.indent(root, space="\t")
    return ET.tostring(root, encoding="unicode") + "\n"


def write_voc(
    path: str | Path,
    boxes: np.ndarray,
    labels: np.ndarray,
    width: int,
    height: int,
    filename: str | None = None,
) -> None:
    """Write a VOC file; ``filename`` (the image's name) defaults to ``<stem>.png``."""
    path = Path(path)
    text = voc_text(boxes, labels, width, height, filename or f"{path.stem}.png")
    path.write_text(text, encoding="utf-8")


def _yolo_row(line: str, path: str | Path, number: int) -> tuple[int, list[float]]:
    fields = line.split()
    try:
        values = [float(v) for v in fields[1:]]
        label = int(fields[0]) if len(fields) == 5 else -1
    except ValueError:
        label = -1
    if len(fields) != 5 or not all(math.isfinite(v) for v in values):
        raise _malformed(path, f"line {number} is {line.strip()!r}, not 'cls cx cy w h'")
    if not 0 <= label < len(CLASSES):
        raise UserError(
            f"{path} line {number} has class id {fields[0]}; use 0..{len(CLASSES) - 1} "
            f"for {', '.join(CLASSES)} (the order of labels.txt)"
        )
    return label, values


def read_yolo(path: str | Path, width: int, height: int) -> tuple[np.ndarray, np.ndarray]:
    """Boxes (n×4 float32 xyxy pixels of a ``width``×``height`` image) and labels of a YOLO
    file; an empty file is a frame with no boxes."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise _malformed(path, str(err)) from None
    rows = [_yolo_row(line, path, i) for i, line in enumerate(lines, 1) if line.strip()]
    if not rows:
        return _empty()
    labels = np.array([label for label, _ in rows], dtype=np.int64)
    return yolo_to_xyxy(np.array([values for _, values in rows]), width, height), labels


def yolo_text(boxes: np.ndarray, labels: np.ndarray, width: int, height: int) -> str:
    """The YOLO lines of one image (empty for no boxes, as in the shared files)."""
    _check_boxes(boxes, labels)
    rows = xyxy_to_yolo(boxes, width, height)
    return "".join(
        f"{label} " + " ".join(f"{v:.10g}" for v in row) + "\n"
        for label, row in zip(labels.tolist(), rows.tolist(), strict=True)
    )


def write_yolo(
    path: str | Path, boxes: np.ndarray, labels: np.ndarray, width: int, height: int
) -> None:
    """Write a YOLO file for boxes of a ``width``×``height`` image."""
    Path(path).write_text(yolo_text(boxes, labels, width, height), encoding="utf-8")
