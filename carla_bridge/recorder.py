"""Record frames from any source into a folder in the shared dataset's layout.

Why: a live CARLA drive is slow and needs a simulator; recording it once lets every later
run replay it with :class:`~carla_bridge.replay.ReplaySource` (the recorded folder is
re-readable by it, which the tests check). Each frame becomes

* ``images/<split>/<name>.png`` (RGB),
* ``labels/<split>/<name>.xml`` (VOC, coordinates in whole pixels),
* ``labels_yolo_format/<split>/<name>.txt`` (YOLO),

plus ``labels.txt`` (the class order) once. ``<name>`` is :attr:`Frame.name`,
``<town>_<frame_id:06d>``, exactly the shared files' naming, so the client is *not* in the
name. The contract for sources is therefore: within one town, a frame id names one picture.
A replay source honours it (clients sharing a town show the same files); a live source
with several vehicles must give each camera's frames distinct ids (e.g. the simulator frame
times the number of clients plus the client). A recorder refuses a second, different frame
under a name it already wrote (that would silently lose data).

Which folder a recording may go into (:func:`check_recording_folder`, checked by
``cfl-bench carla record`` before any frame is pulled): a new or empty folder; never one
inside the replay source it reads from (it would re-encode its own source frames over
themselves); and a folder holding an earlier recording only when asked to add to it
(``--append``: frames under a name already there replace those files). Any other non-empty
folder is refused, so a recording never mixes into someone else's files.

Every file is written atomically (a temporary file in the same folder, then
:func:`os.replace`), so a reader or a crash never sees half a file; no temporary file is
left behind, even when writing fails.
"""

from __future__ import annotations

import hashlib
import io
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

from PIL import Image

from cfl_bench.carla_bridge.boxes import voc_text, yolo_text
from cfl_bench.carla_bridge.frames import CLASSES, Frame, FrameSource, TimeWindow
from cfl_bench.core.errors import UserError


def write_atomically(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` in one step: readers see the old file or the new one."""
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


def _png_bytes(frame: Frame) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(frame.image, mode="RGB").save(buffer, format="PNG")
    return buffer.getvalue()


def _digest(frame: Frame) -> str:
    """What makes two frames under one name the same picture: pixels, boxes, labels."""
    hasher = hashlib.sha256()
    for array in (frame.image, frame.boxes, frame.labels):
        hasher.update(str(array.shape).encode())
        hasher.update(array.tobytes())
    return hasher.hexdigest()


class FrameRecorder:
    """Writes frames into ``root`` in the shared layout, under split ``split``."""

    def __init__(self, root: str | Path, split: str = "train") -> None:
        if split not in ("train", "test"):
            raise UserError(f"recorder split {split!r} is unknown; use train or test")
        self.root = Path(root)
        self.split = split
        self._written: dict[str, str] = {}  # name → digest, this recorder's frames only

    def _folders(self) -> tuple[Path, Path, Path]:
        """The three split folders, created (with ``labels.txt``) before the first frame."""
        images, voc, yolo = (
            self.root / kind / self.split for kind in ("images", "labels", "labels_yolo_format")
        )
        if not self._written:
            for folder in (images, voc, yolo):
                folder.mkdir(parents=True, exist_ok=True)
            self._write_class_list()
        return images, voc, yolo

    def _write_class_list(self) -> None:
        """``labels.txt`` once; a folder listing other classes belongs to another dataset."""
        path = self.root / "labels.txt"
        if path.is_file():
            if path.read_text(encoding="utf-8").split() != list(CLASSES):
                raise UserError(
                    f"{path} lists other classes than {', '.join(CLASSES)}; "
                    "record into an empty folder"
                )
            return
        write_atomically(path, ("\n".join(CLASSES) + "\n").encode())

    def write(self, frame: Frame) -> str:
        """Write one frame's image and both label files; returns its name.

        A frame this recorder already wrote (a replayed loop shows pictures again) is not
        written twice.
        """
        name = frame.name
        digest = _digest(frame)
        previous = self._written.get(name)
        if previous == digest:
            return name
        if previous is not None:
            raise ValueError(
                f"two different frames are both named {name} (client {frame.client}); the "
                "source must give distinct frame ids within a town (see carla_bridge.recorder)"
            )
        images, voc, yolo = self._folders()
        height, width = frame.image.shape[:2]
        write_atomically(images / f"{name}.png", _png_bytes(frame))
        xml = voc_text(frame.boxes, frame.labels, width, height, f"{name}.png")
        write_atomically(voc / f"{name}.xml", xml.encode())
        lines = yolo_text(frame.boxes, frame.labels, width, height)
        write_atomically(yolo / f"{name}.txt", lines.encode())
        self._written[name] = digest
        return name

    def record(self, source: FrameSource, windows: Sequence[TimeWindow]) -> int:
        """Pull every client's frames for each window and write them; returns how many
        frames were recorded (a picture streamed twice counts twice, its files are written
        once)."""
        count = 0
        for window in windows:
            for client_frames in source.frames(window).values():
                for frame in client_frames:
                    self.write(frame)
                    count += 1
        return count


#: What a recording folder holds (besides temporary files of a killed write).
RECORDING_ENTRIES = frozenset({"images", "labels", "labels_yolo_format", "labels.txt"})


def is_recording(folder: Path) -> bool:
    """Whether ``folder`` holds an earlier recording: this module's layout and nothing else,
    with ``labels.txt`` listing :data:`CLASSES`."""
    try:
        names = {p.name for p in folder.iterdir() if not p.name.startswith(".")}
        classes = (folder / "labels.txt").read_text(encoding="utf-8").split()
    except (OSError, UnicodeDecodeError):
        return False
    return names <= RECORDING_ENTRIES and classes == list(CLASSES)


def check_recording_folder(out: Path, source_root: Path | None, append: bool) -> None:
    """Refuse an ``--out`` a recording must not write into (see the module docstring);
    ``source_root``: the folder a replay source reads its frames from."""
    if source_root is not None:
        target, source = out.resolve(), source_root.resolve()
        if target == source or source in target.parents:
            raise UserError(
                f"--out '{out}' is inside the replay source '{source_root}' the frames are read "
                "from; choose a folder outside it"
            )
    if not os.path.lexists(out):
        return
    if not out.is_dir():
        raise UserError(f"--out '{out}' is a file; choose a new or empty folder")
    try:
        empty = not any(out.iterdir())
    except OSError as exc:
        raise UserError(
            f"--out '{out}' cannot be listed ({exc.strerror}); choose another folder"
        ) from None
    if empty:
        return
    if not is_recording(out):
        raise UserError(
            f"--out '{out}' is not empty and holds no earlier recording; choose a new or "
            "empty folder"
        )
    if not append:
        raise UserError(
            f"--out '{out}' holds an earlier recording; pass --append to add these frames to "
            "it, or choose a new or empty folder"
        )
