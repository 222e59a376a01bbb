"""ReplaySource and FrameRecorder: the real files parse, the timeline is what the docs say.

Tests against the shared CARLA dataset skip when it is absent; the timeline, pacing, error
and recorder tests also run on tiny synthetic folders written by the recorder itself.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cfl_bench.carla_bridge.frames import CLASSES, Domain, Frame, TimeWindow
from cfl_bench.carla_bridge.recorder import FrameRecorder
from cfl_bench.carla_bridge.replay import DomainShift, ReplaySource, load_image, scan_split
from cfl_bench.core.errors import UserError
from tests.test_carla_boxes import carla_root

TRAIN_TOTALS = {
    "vehicle": 184,
    "bike": 21,
    "motobike": 21,
    "traffic_light": 114,
    "traffic_sign": 16,
}
TEST_TOTALS = {"vehicle": 30, "bike": 8, "motobike": 2, "traffic_light": 249, "traffic_sign": 2}
# Read by hand from labels/<split>/<name>.xml (classes of the boxes, in any order).
BY_HAND = {
    ("train", "Town01_001020"): [],
    ("train", "Town01_001920"): ["vehicle"] * 3,
    ("train", "Town02_000360"): ["traffic_sign"],
    ("train", "Town04_004140"): ["vehicle"] * 3 + ["traffic_light"] * 4,
    ("test", "Town05_001920"): ["vehicle"] * 2,
}


def replay(root: Path, **overrides: Any) -> ReplaySource:
    """A source with the arguments the tests usually want, ``overrides`` replacing them."""
    args: dict[str, Any] = {
        "root": root,
        "split": "train",
        "num_clients": 4,
        "client_towns": ("Town01", "Town02", "Town03", "Town01"),
        "frame_period": 2.0,
        "box_format": "voc",
    }
    return ReplaySource(**{**args, **overrides})


def synthetic_frame(town: str, frame_id: int, client: int = 0) -> Frame:
    """A tiny frame whose pixels and boxes depend on its name (so each name is one picture)."""
    rng = np.random.default_rng([frame_id, sum(town.encode())])
    n = frame_id % 3
    corners = rng.uniform(0, 6, size=(n, 2))
    boxes = np.concatenate([corners, corners + rng.uniform(1, 5, size=(n, 2))], axis=1)
    return Frame(
        client=client,
        time=0.0,
        frame_id=frame_id,
        domain=Domain.of_town(town),
        image=rng.integers(0, 256, size=(10, 12, 3), dtype=np.uint8),
        boxes=boxes.astype(np.float32),
        labels=rng.integers(0, len(CLASSES), size=n).astype(np.int64),
    )


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    """A recorded folder: TownA 6 frames, TownB 4 frames, Town04 3 frames (ids step 10)."""
    recorder = FrameRecorder(tmp_path / "tiny")
    for town, count in (("TownA", 6), ("TownB", 4), ("Town04", 3)):
        for j in range(count):
            recorder.write(synthetic_frame(town, 100 + 10 * j))
    return tmp_path / "tiny"


def tiny_source(root: Path, **overrides: Any) -> ReplaySource:
    args: dict[str, Any] = {"client_towns": ("TownA", "TownB", "TownA"), "num_clients": 3}
    return replay(root, **{**args, **overrides})


def ids(frames: list[Frame]) -> list[int]:
    return [f.frame_id for f in frames]


# --- the real files ---------------------------------------------------------------------


@pytest.mark.parametrize("box_format", ["voc", "yolo"])
def test_real_files_parse(box_format: str) -> None:
    root = carla_root()
    for split, totals, towns in (
        ("train", TRAIN_TOTALS, {"Town01": 34, "Town02": 34, "Town03": 34, "Town04": 20}),
        ("test", TEST_TOTALS, {"Town05": 40}),
    ):
        recorded = scan_split(root, split, box_format)
        assert {town: len(entries) for town, entries in recorded.items()} == towns
        counts = Counter(CLASSES[i] for es in recorded.values() for e in es for i in e.labels)
        assert counts == totals
        by_name = {f"{e.town}_{e.frame_id:06d}": e for es in recorded.values() for e in es}
        for (where, name), names in BY_HAND.items():
            if where == split:
                assert Counter(CLASSES[i] for i in by_name[name].labels) == Counter(names)


def test_real_frames_order_domains_and_images() -> None:
    source = replay(carla_root(), num_clients=1, client_towns=("Town04",))
    stream = source.stream_ids("Town04")
    assert list(stream) == sorted(stream) and stream[:3] == (1260, 1440, 1620)
    frames = source.frames(TimeWindow(0.0, 40.0))[0]
    assert ids(frames) == list(stream)
    assert [f.time for f in frames] == [2.0 * j for j in range(20)]
    assert {f.domain for f in frames} == {Domain("Town04", "highway")}
    assert all(f.client == 0 and f.name.startswith("Town04_") for f in frames)
    image = frames[0].image
    assert image.shape == (380, 640, 3) and image.dtype == np.uint8
    by_id = {f.frame_id: f for f in frames}
    assert len(by_id[4140].labels) == 7 and by_id[4140].boxes.shape == (7, 4)
    urban = replay(carla_root()).frames(TimeWindow(0.0, 2.0))
    assert {f.domain.road for fs in urban.values() for f in fs} == {"urban"}


def test_real_phases_differ_in_the_same_town() -> None:
    """Clients 0 and 3 both start in Town01 (34 frames): phases 0 and 17."""
    source = replay(carla_root())
    out = source.frames(TimeWindow(0.0, 20.0))
    stream = source.stream_ids("Town01")
    assert ids(out[0]) == list(stream[:10]) and ids(out[3]) == list(stream[17:27])
    assert not set(ids(out[0])) & set(ids(out[3]))


def test_real_holdout_and_shift() -> None:
    """The paper's highway shift: client 1 drives onto Town04 at t=30; 1 in 4 held out."""
    shift = DomainShift(client=1, at_time=30.0, town="Town04")
    source = replay(carla_root(), holdout_every=4, shifts=[shift])
    held = {t: ids(source.heldout(t)) for t in source.towns}
    assert {t: len(h) for t, h in held.items()} == {
        "Town01": 8,
        "Town02": 8,
        "Town03": 8,
        "Town04": 5,
    }
    everything = scan_split(carla_root(), "train", "voc")["Town04"]
    assert held["Town04"] == [e.frame_id for e in everything][3::4]
    out = source.frames(TimeWindow(0.0, 400.0))
    for client, frames in out.items():
        for frame in frames:
            assert frame.frame_id not in held[frame.domain.town], (client, frame.name)
    before = [f for f in out[1] if f.time < 30.0]
    after = [f for f in out[1] if f.time >= 30.0]
    assert len(before) == 15 and {f.domain.town for f in before} == {"Town02"}
    assert {f.domain for f in after} == {Domain("Town04", "highway")}
    assert all(f.client == -1 and f.time == 0.0 for f in source.heldout("Town04"))


# --- the timeline on a synthetic folder ----------------------------------------------------


def test_window_counts_and_boundaries(tiny: Path) -> None:
    source = tiny_source(tiny, frame_period=0.1)
    for window, times in (
        (TimeWindow(0.0, 0.3), [0.0, 0.1, 0.2]),
        (TimeWindow(0.3, 0.6), [0.30000000000000004, 0.4, 0.5]),
        (TimeWindow(0.25, 0.45), [0.30000000000000004, 0.4]),
        (TimeWindow(-5.0, 0.05), [0.0]),
        (TimeWindow(0.7, 0.7), []),
    ):
        out = source.frames(window)
        assert sorted(out) == [0, 1, 2]
        assert all([f.time for f in frames] == times for frames in out.values()), window


def test_looping_and_phases(tiny: Path) -> None:
    """TownA (6 frames) is driven by clients 0 and 2 (phases 0 and 3); TownB by client 1."""
    out = tiny_source(tiny, frame_period=1.0).frames(TimeWindow(0.0, 9.0))
    assert ids(out[0]) == [100, 110, 120, 130, 140, 150, 100, 110, 120]
    assert ids(out[2]) == [130, 140, 150, 100, 110, 120, 130, 140, 150]
    assert ids(out[1]) == [100, 110, 120, 130, 100, 110, 120, 130, 100]
    assert all(a != b for a, b in zip(ids(out[0]), ids(out[2]), strict=True))


def test_shift_joins_the_new_town_at_its_phase(tiny: Path) -> None:
    shifts = [
        DomainShift(0, 3.0, "Town04"),
        DomainShift(2, 3.0, "Town04"),
        DomainShift(0, 6.0, "TownB"),
    ]
    source = tiny_source(tiny, frame_period=1.0, shifts=shifts)
    out = source.frames(TimeWindow(0.0, 8.0))
    towns = [f.domain.town for f in out[0]]
    assert towns == ["TownA"] * 3 + ["Town04"] * 3 + ["TownB"] * 2
    # Town04 (3 frames) is driven by clients 0 and 2: phases 0 and 1; tick 3 → index 0 / 1.
    assert ids(out[0])[3:6] == [100, 110, 120] and ids(out[2])[3:6] == [110, 120, 100]
    assert {f.domain.road for f in out[2][3:]} == {"highway"}
    assert source.town_at(0, 2.999) == "TownA" and source.town_at(0, 3.0) == "Town04"


def test_holdout_every_k_th_frame(tiny: Path) -> None:
    source = tiny_source(tiny, holdout_every=2, frame_period=1.0)
    assert ids(source.heldout("TownA")) == [110, 130, 150]
    assert source.stream_ids("TownA") == (100, 120, 140)
    streamed = {f.frame_id for fs in source.frames(TimeWindow(0, 50)).values() for f in fs}
    assert streamed.isdisjoint({110, 130, 150})
    assert tiny_source(tiny, frame_period=1.0).heldout("TownA") == []


class FakeClock:
    """A wall clock the test moves by hand; ``sleep`` advances it and remembers the wait."""

    def __init__(self, now: float) -> None:
        self.now = now
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def test_pacing_waits_for_the_window_end(tiny: Path) -> None:
    clock = FakeClock(100.0)
    source = tiny_source(tiny, pacing=2.0, clock=clock, sleep=clock.sleep)
    clock.now = 101.0
    source.frames(TimeWindow(0.0, 10.0))  # due at 100 + 10 / 2
    assert clock.slept == [4.0] and clock.now == 105.0
    clock.now = 112.0  # behind schedule (due at 110): no wait
    source.frames(TimeWindow(10.0, 20.0))
    assert clock.slept == [4.0]
    fast_clock = FakeClock(0.0)
    fast = tiny_source(tiny, clock=fast_clock, sleep=fast_clock.sleep)
    fast.frames(TimeWindow(0.0, 1000.0))
    assert fast_clock.slept == []


def test_deterministic(tiny: Path) -> None:
    window = TimeWindow(3.0, 31.0)
    shifts = [DomainShift(1, 9.0, "Town04")]
    first = tiny_source(tiny, holdout_every=3, shifts=shifts).frames(window)
    second = tiny_source(tiny, holdout_every=3, shifts=shifts).frames(window)
    assert first.keys() == second.keys()
    for client in first:
        for a, b in zip(first[client], second[client], strict=True):
            assert (a.client, a.time, a.name) == (b.client, b.time, b.name)
            np.testing.assert_array_equal(a.image, b.image)
            np.testing.assert_array_equal(a.boxes, b.boxes)


def test_frames_are_read_only(tiny: Path) -> None:
    """Cached arrays are shared between rounds: a consumer must not be able to edit them."""
    source = tiny_source(tiny)
    frame = source.frames(TimeWindow(0.0, 1.0))[0][0]
    with pytest.raises(ValueError, match="read-only"):
        frame.image[0, 0, 0] = 1
    source.close()
    assert source.frames(TimeWindow(0.0, 1.0))[0][0].name == frame.name


# --- errors -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"split": "val"}, "split 'val' is unknown"),
        ({"box_format": "coco"}, "box_format 'coco' is unknown"),
        ({"num_clients": 0}, "num_clients is 0"),
        ({"client_towns": ("TownA",)}, "one town per client"),
        ({"client_towns": "TownA"}, "one town per client"),
        ({"client_towns": ("TownA", "Town09", "TownB")}, "client_towns names town 'Town09'"),
        ({"frame_period": 0}, "frame_period is 0"),
        ({"frame_period": -1.0}, "frame_period is -1.0"),
        ({"frame_period": float("nan")}, "frame_period is nan"),
        ({"frame_period": float("inf")}, "frame_period is inf"),
        ({"frame_period": "2"}, "frame_period is '2', not a number"),
        ({"pacing": 0.0}, "pacing is 0.0"),
        ({"holdout_every": 1}, "holdout_every 1 would hold out every frame"),
        ({"holdout_every": -2}, "holdout_every is -2"),
        ({"shifts": [DomainShift(0, 1.0, "Town09")]}, "names town 'Town09'"),
        ({"shifts": [DomainShift(3, 1.0, "Town04")]}, "names client 3"),
        ({"shifts": [DomainShift(0, -1.0, "Town04")]}, "at_time -1.0"),
        ({"shifts": [DomainShift(0, 1.0, "TownB")] * 2}, "two shifts at time 1.0"),
    ],
)
def test_bad_arguments(tiny: Path, overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(UserError, match=message):
        tiny_source(tiny, **overrides)


def test_bad_folders(tmp_path: Path, tiny: Path) -> None:
    with pytest.raises(UserError, match="does not exist"):
        tiny_source(tmp_path / "nowhere")
    with pytest.raises(UserError, match=r"holds no \.png frames"):
        tiny_source(tmp_path)
    (tiny / "labels_yolo_format" / "train" / "TownA_000100.txt").unlink()
    with pytest.raises(UserError, match=r"TownA_000100\.png has no label file"):
        tiny_source(tiny, box_format="yolo")
    (tiny / "images" / "train" / "junk.png").write_bytes(b"not a png")
    with pytest.raises(UserError, match=r"junk\.png is not named <town>_<frame number>\.png"):
        tiny_source(tiny)
    (tiny / "images" / "train" / "junk.png").rename(tiny / "images" / "train" / "TownC_1.png")
    with pytest.raises(UserError, match="has no label file"):
        tiny_source(tiny)
    (tiny / "labels" / "train" / "TownC_1.xml").write_text("<annotation/>")
    with pytest.raises(UserError, match=r"TownC_1\.png is not a readable PNG"):
        tiny_source(tiny)


def test_bad_windows_and_towns(tiny: Path) -> None:
    source = tiny_source(tiny)
    with pytest.raises(UserError, match="ends before it starts"):
        source.frames(TimeWindow(2.0, 1.0))
    with pytest.raises(UserError, match="not finite"):
        source.frames(TimeWindow(0.0, float("inf")))
    with pytest.raises(UserError, match="heldout names town 'Town09'"):
        source.heldout("Town09")


# --- the recorder --------------------------------------------------------------------------


def leftovers(root: Path) -> list[Path]:
    """Temporary files an atomic write would have left behind."""
    return [p for p in root.rglob("*") if p.name.startswith(".") or p.suffix == ".tmp"]


def walk_frames(root: Path, split: str, box_format: str) -> Iterator[tuple[str, Any]]:
    for town, entries in scan_split(root, split, box_format).items():
        for entry in entries:
            yield f"{town}_{entry.frame_id:06d}", entry


def test_record_real_frames_and_replay_them(tmp_path: Path) -> None:
    source = replay(carla_root(), num_clients=2, client_towns=("Town01", "Town04"))
    recorder = FrameRecorder(tmp_path / "rec")
    windows = [TimeWindow(0.0, 10.0), TimeWindow(10.0, 50.0)]
    assert recorder.record(source, windows) == 2 * 25  # Town04 loops: 20 pictures, 25 frames
    assert (tmp_path / "rec" / "labels.txt").read_text().split() == list(CLASSES)
    assert leftovers(tmp_path / "rec") == []
    originals = dict(walk_frames(carla_root(), "train", "voc"))
    for box_format in ("voc", "yolo"):
        copies = dict(walk_frames(tmp_path / "rec", "train", box_format))
        assert len(copies) == 25 + 20
        for name, copy in copies.items():
            original = originals[name]
            np.testing.assert_array_equal(copy.labels, original.labels)
            np.testing.assert_allclose(copy.boxes, original.boxes, atol=1e-3)
            assert np.array_equal(load_image(copy.image_path), load_image(original.image_path))
    again = replay(tmp_path / "rec", num_clients=2, client_towns=("Town01", "Town04"))
    assert again.stream_ids("Town04") == source.stream_ids("Town04")


def test_record_synthetic_round_trip(tmp_path: Path, tiny: Path) -> None:
    """Fractional boxes: VOC keeps whole pixels, YOLO keeps them to well below a pixel."""
    original = synthetic_frame("TownA", 110)
    assert len(original.labels) == 2
    voc = replay(tiny, client_towns=("TownA",), num_clients=1, box_format="voc")
    yolo = replay(tiny, client_towns=("TownA",), num_clients=1, box_format="yolo")
    for source, atol in ((voc, 0.5), (yolo, 1e-4)):
        frame = source.frames(TimeWindow(0.0, 4.0))[0][1]
        assert frame.name == "TownA_000110"
        np.testing.assert_array_equal(frame.image, original.image)
        np.testing.assert_array_equal(frame.labels, original.labels)
        np.testing.assert_allclose(frame.boxes, original.boxes, atol=atol)


def test_recorder_refuses_clashing_names(tmp_path: Path) -> None:
    recorder = FrameRecorder(tmp_path)
    recorder.write(synthetic_frame("TownA", 100))
    recorder.write(synthetic_frame("TownA", 100, client=1))  # the same picture: fine
    clash = synthetic_frame("TownA", 101)
    clash = Frame(0, 0.0, 100, clash.domain, clash.image, clash.boxes, clash.labels)
    with pytest.raises(ValueError, match="both named TownA_000100"):
        recorder.write(clash)
    assert len(list((tmp_path / "images" / "train").iterdir())) == 1


def test_recorder_checks_labels_txt_and_split(tmp_path: Path) -> None:
    (tmp_path / "labels.txt").write_text("car\nperson\n")
    with pytest.raises(UserError, match="lists other classes"):
        FrameRecorder(tmp_path).write(synthetic_frame("TownA", 100))
    with pytest.raises(UserError, match="split 'val' is unknown"):
        FrameRecorder(tmp_path, split="val")


def test_failed_write_leaves_no_temporary_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken_replace(src: str, dst: str) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk full"):
        FrameRecorder(tmp_path).write(synthetic_frame("TownA", 100))
    assert leftovers(tmp_path) == []
    assert not (tmp_path / "images" / "train" / "TownA_000100.png").exists()


# --- `cfl-bench carla record`: which --out it may write into -------------------------------


def record_cli(*args: str) -> tuple[int, str]:
    """`cfl-bench carla record` through the console entry point (which turns a UserError into
    one line and exit code 2), in this process: exit code and combined output."""
    import contextlib
    import io

    from cfl_bench.cli import main

    out, err = io.StringIO(), io.StringIO()
    with (
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(err),
        pytest.raises(SystemExit) as exited,
    ):
        main(["carla", "record", "--seconds", "4", *args])
    return int(exited.value.code or 0), err.getvalue() + out.getvalue()


def files_of(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


@pytest.mark.parametrize("below", ["", "images/train", "new/folder"])
def test_record_refuses_an_out_inside_its_replay_source(tiny: Path, below: str) -> None:
    before = files_of(tiny)
    out = tiny / below if below else tiny
    code, output = record_cli("--data-root", str(tiny), "--town", "TownA", "--clients", "1",
                              "--out", str(out), "--append")  # fmt: skip
    assert code == 2, output
    assert "Traceback" not in output and len(output.strip().splitlines()) == 1, output
    assert "is inside the replay source" in " ".join(output.split())
    assert files_of(tiny) == before
    assert not (tiny / "new").exists()


def test_record_refuses_a_folder_that_holds_something_else(tiny: Path, tmp_path: Path) -> None:
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("my notes\n")
    code, output = record_cli("--data-root", str(tiny), "--town", "TownA", "--clients", "1",
                              "--out", str(out), "--append")  # fmt: skip
    assert code == 2, output
    assert len(output.strip().splitlines()) == 1, output
    assert "is not empty and holds no earlier recording" in " ".join(output.split())
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]


def test_record_adds_to_an_earlier_recording_only_with_append(tiny: Path, tmp_path: Path) -> None:
    out = tmp_path / "rec"
    args = ("--data-root", str(tiny), "--clients", "1", "--out", str(out))
    code, output = record_cli(*args, "--town", "TownA")
    assert code == 0, output
    first = files_of(out)
    assert first and all(not name.startswith("images/train/TownB") for name in first)
    code, output = record_cli(*args, "--town", "TownB")
    assert code == 2, output
    assert len(output.strip().splitlines()) == 1, output
    assert "holds an earlier recording; pass --append" in " ".join(output.split())
    assert files_of(out) == first
    code, output = record_cli(*args, "--town", "TownB", "--append")
    assert code == 0, output
    merged = files_of(out)
    assert {k: v for k, v in merged.items() if k in first} == first
    assert any(name.startswith("images/train/TownB") for name in merged)


def test_record_help_documents_append() -> None:
    code, output = record_cli("--help")
    assert code == 0
    assert "--append" in output and "earlier recording" in " ".join(output.split())
