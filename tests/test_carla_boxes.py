"""Box formats: VOC ↔ YOLO ↔ xyxy round trips, the real files agreeing, bad files erroring."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

from cfl_bench.carla_bridge.boxes import (
    read_voc,
    read_yolo,
    scale_boxes,
    write_voc,
    write_yolo,
    xyxy_to_yolo,
    yolo_to_xyxy,
)
from cfl_bench.carla_bridge.frames import CLASSES
from cfl_bench.core.errors import UserError
from tests.conftest import requires_shared_data

BOXES = np.array([[308, 193, 339, 219], [0, 0, 640, 380], [10.25, 20.5, 11.75, 200.0]], "f4")
LABELS = np.array([0, 3, 4], dtype=np.int64)


def carla_root() -> Path:
    """The shared CARLA detection dataset, or skip naming the missing folder."""
    root = requires_shared_data() / "carla-object-detection"
    if not root.is_dir():
        pytest.skip(f"needs the CARLA detection dataset {root}, which is absent")
    return root


def test_xyxy_yolo_round_trip() -> None:
    yolo = xyxy_to_yolo(BOXES, 640, 380)
    np.testing.assert_allclose(yolo[0], [323.5 / 640, 206 / 380, 31 / 640, 26 / 380])
    np.testing.assert_allclose(yolo[1], [0.5, 0.5, 1.0, 1.0])
    np.testing.assert_allclose(yolo_to_xyxy(yolo, 640, 380), BOXES, atol=1e-4)
    assert yolo_to_xyxy(np.zeros((0, 4)), 640, 380).shape == (0, 4)


def test_scale_boxes_round_trip() -> None:
    half = scale_boxes(BOXES, (640, 380), (320, 190))
    np.testing.assert_allclose(half[0], [154, 96.5, 169.5, 109.5])
    np.testing.assert_allclose(scale_boxes(half, (320, 190), (640, 380)), BOXES, atol=1e-4)
    assert half.dtype == np.float32


def test_voc_file_round_trip(tmp_path: Path) -> None:
    """Whole-pixel boxes survive exactly; fractional ones come back rounded (VOC's rule)."""
    path = tmp_path / "Town01_000001.xml"
    write_voc(path, BOXES, LABELS, 640, 380)
    boxes, labels, size = read_voc(path)
    assert size == (640, 380) and labels.tolist() == LABELS.tolist()
    assert boxes.dtype == np.float32 and labels.dtype == np.int64
    np.testing.assert_array_equal(boxes, np.round(BOXES))
    root = ET.parse(path).getroot()
    assert root.findtext("filename") == "Town01_000001.png"
    assert root.findtext("size/depth") == "3"
    assert [o.findtext("name") for o in root.iter("object")] == [
        "vehicle",
        "traffic_light",
        "traffic_sign",
    ]
    assert root.findtext("object/bndbox/xmin") == "308"


def test_yolo_file_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "a.txt"
    write_yolo(path, BOXES, LABELS, 640, 380)
    boxes, labels = read_yolo(path, 640, 380)
    assert labels.tolist() == LABELS.tolist()
    np.testing.assert_allclose(boxes, BOXES, atol=1e-4)
    assert path.read_text().splitlines()[0].split()[0] == "0"


def test_empty_files_mean_no_boxes(tmp_path: Path) -> None:
    write_voc(tmp_path / "e.xml", np.zeros((0, 4), "f4"), np.zeros(0, "i8"), 64, 32)
    write_yolo(tmp_path / "e.txt", np.zeros((0, 4), "f4"), np.zeros(0, "i8"), 64, 32)
    boxes, labels, size = read_voc(tmp_path / "e.xml")
    assert boxes.shape == (0, 4) and labels.shape == (0,) and size == (64, 32)
    assert (tmp_path / "e.txt").read_text() == ""
    boxes, labels = read_yolo(tmp_path / "e.txt", 64, 32)
    assert boxes.shape == (0, 4) and boxes.dtype == np.float32 and labels.dtype == np.int64


@pytest.mark.shared_data
def test_real_voc_and_yolo_files_agree() -> None:
    """Every shared annotation: the two formats give the same boxes within one pixel."""
    root = carla_root()
    checked = 0
    for split in ("train", "test"):
        for xml in sorted((root / "labels" / split).glob("*.xml")):
            boxes, labels, (width, height) = read_voc(xml)
            yolo = root / "labels_yolo_format" / split / f"{xml.stem}.txt"
            yolo_boxes, yolo_labels = read_yolo(yolo, width, height)
            assert yolo_labels.tolist() == labels.tolist(), xml
            assert np.abs(yolo_boxes - boxes).max(initial=0) <= 1.0 + 1e-3, xml
            checked += len(labels)
    assert checked == 356 + 291


@pytest.mark.shared_data
def test_real_voc_file_by_hand() -> None:
    boxes, labels, size = read_voc(carla_root() / "labels/train/Town01_001920.xml")
    assert size == (640, 380) and labels.tolist() == [0, 0, 0]
    assert boxes[1].tolist() == [227, 190, 269, 221]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("<annotation><size>", "not a valid annotation file"),
        ("<notvoc/>", "not a valid annotation file"),
        ("<annotation><size><width>x</width><height>1</height></size></annotation>", "<width>"),
        ("<annotation><size><width>0</width><height>1</height></size></annotation>", "size"),
    ],
)
def test_malformed_voc(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.xml"
    path.write_text(text)
    with pytest.raises(UserError, match=message) as info:
        read_voc(path)
    assert str(path) in str(info.value)


def _voc_object(name: str, corners: str = "1 2 3 4") -> str:
    tags = "".join(
        f"<{t}>{v}</{t}>"
        for t, v in zip(("xmin", "ymin", "xmax", "ymax"), corners.split(), strict=True)
    )
    size = "<size><width>8</width><height>8</height></size>"
    return f"<annotation>{size}<object><name>{name}</name><bndbox>{tags}</bndbox></object>"


def test_voc_unknown_class_and_bad_box(tmp_path: Path) -> None:
    path = tmp_path / "cls.xml"
    path.write_text(_voc_object("pedestrian") + "</annotation>")
    with pytest.raises(UserError, match="unknown class 'pedestrian'") as info:
        read_voc(path)
    assert str(path) in str(info.value) and all(c in str(info.value) for c in CLASSES)
    path.write_text(_voc_object("vehicle", "5 2 3 4") + "</annotation>")
    with pytest.raises(UserError, match="max corner before its min corner"):
        read_voc(path)
    path.write_text(
        "<annotation><size><width>8</width><height>8</height></size>"
        "<object><name>vehicle</name></object></annotation>"
    )
    with pytest.raises(UserError, match="lacks <name> or <bndbox>"):
        read_voc(path)
    with pytest.raises(UserError, match=r"missing\.xml"):
        read_voc(tmp_path / "missing.xml")


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("0 0.5 0.5 0.1", "not 'cls cx cy w h'"),
        ("car 0.5 0.5 0.1 0.1", "class id car"),
        ("0 0.5 nan 0.1 0.1", "not 'cls cx cy w h'"),
        ("7 0.5 0.5 0.1 0.1", "class id 7"),
        ("-1 0.5 0.5 0.1 0.1", "class id -1"),
    ],
)
def test_malformed_yolo(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "bad.txt"
    path.write_text(f"1 0.5 0.5 0.2 0.2\n{line}\n")
    with pytest.raises(UserError, match=message) as info:
        read_yolo(path, 640, 380)
    assert str(path) in str(info.value) and "line 2" in str(info.value)


def test_writers_reject_inconsistent_arrays(tmp_path: Path) -> None:
    """Arrays come from code, not users: mismatches are bugs (ValueError), not UserErrors."""
    with pytest.raises(ValueError, match="labels"):
        write_yolo(tmp_path / "x.txt", BOXES, LABELS[:2], 640, 380)
    with pytest.raises(ValueError, match="CLASSES"):
        write_voc(tmp_path / "x.xml", BOXES, np.array([0, 1, 5]), 640, 380)
    with pytest.raises(ValueError, match="size"):
        xyxy_to_yolo(BOXES, 0, 380)
