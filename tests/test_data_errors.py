"""Bad data inputs under --data-root: every one is a one-line UserError naming problem and fix.

Why a table: each row builds one bad layout in ``tmp_path`` (a folder where a file should
be, a --data-root that is a file, a corrupt or empty file of each format, too many --tasks,
...), calls ``streams.registry.build_stream`` exactly as ``cfl_bench/runner/plan.py`` does, and
checks three things: the message carries the key words, it is a single line, and nothing
was left behind under ``tmp_path``. No row touches the network, torchvision's downloader or
the MiniLM encoder: an autouse fixture makes each of them fail loudly, which also proves
that refusals such as ``seq-dbpedia --tasks 8`` come before any text is encoded.
Downloads have their own tests below (offline for real when this machine is offline, and
with the exact offline exception injected at urllib's level everywhere else), and three
end-to-end cases run the real CLI in subprocesses.
"""

from __future__ import annotations

import json
import os
import pickle
import socket
import stat
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from cfl_bench.core.errors import UserError
from cfl_bench.streams import cifar, mnist, text
from cfl_bench.streams.registry import build_stream, stream_info
from tests.test_cifar_loader import dump, tiny_batch, write_tiny_cifar10, write_tiny_cifar100
from tests.test_mnist_loader import STEMS, images_bytes, labels_bytes, write_tiny_mnist
from tests.test_text import write_json, write_yahoo_csv

CPU = torch.device("cpu")
REPO = Path(__file__).resolve().parents[1]
# What an offline machine's urllib raises for every download URL (measured here: torchvision
# 0.29 gives up after ~0.05 s, trying each mirror over https and http).
OFFLINE = urllib.error.URLError(socket.gaierror(-2, "Name or service not known"))


# ------------------------------------------------------------------------- helpers


def tree(root: Path) -> list[tuple[str, int, int]]:
    """Every entry under ``root`` as (relative path, file type, size): an ``ls -laR``."""
    entries = []
    for folder, dirs, files in os.walk(root):
        for name in (*dirs, *files):
            path = Path(folder) / name
            info = path.lstat()
            size = info.st_size if stat.S_ISREG(info.st_mode) else 0
            entries.append((str(path.relative_to(root)), stat.S_IFMT(info.st_mode), size))
    return sorted(entries)


def build(
    stream: str,
    data_root: Path | str | None,
    *,
    tasks: int | None = None,
    download: bool = False,
    train_size: int | None = None,
) -> object:
    """build_stream with the arguments cfl_bench/runner/plan.py passes (the stream's default number
    of tasks when ``tasks`` is None, as run.py fills it in)."""
    return build_stream(
        stream,
        num_tasks=stream_info(stream).default_tasks if tasks is None else tasks,
        seed=0,
        device=CPU,
        data_root=None if data_root is None else str(data_root),
        download=download,
        train_size=train_size,
        test_size=None,
    )


def assert_one_line(message: str, *fragments: str) -> None:
    assert "\n" not in message and "\r" not in message, message
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"


def mnist_root(root: Path, *, gz: bool = True) -> Path:
    """A tiny good MNIST (6 train, 4 test images) in the torchvision layout."""
    write_tiny_mnist(root, gz=gz)
    return root


def raw(root: Path, stem: str, gz: bool = True) -> Path:
    return root / "MNIST" / "raw" / (STEMS[stem] + (".gz" if gz else ""))


def replace_with_dir(path: Path) -> None:
    path.unlink()
    path.mkdir()
    (path / "inside").write_bytes(b"x")


def cifar10_root(root: Path) -> Path:
    write_tiny_cifar10(root)
    return root


def cifar_file(root: Path, name: str) -> Path:
    return root / "cifar-10-batches-py" / name


AGNEWS = [{"label": i % 4, "sentence": f"text {i}"} for i in range(8)]


def agnews_root(root: Path, train: Any = None, test: Any = None) -> Path:
    """A tiny AG News layout; ``train``/``test`` replace the good content when given."""
    folder = root / "text" / "agnews-subset"
    write_json(folder / "train.json", AGNEWS if train is None else train)
    write_json(folder / "test.json", AGNEWS if test is None else test)
    return root


def dbpedia_root(root: Path, rows: Any = None) -> Path:
    """Every class five times in a row: index % 5 == 0 (test) holds each class once."""
    good = [{"label": c, "sentence": f"text {c} {k}"} for c in range(14) for k in range(5)]
    write_json(root / "text" / "dbpedia-test" / "test.json", good if rows is None else rows)
    return root


def yahoo_root(root: Path, train: bytes | None = None) -> Path:
    rows = [[str(c), "t", "c", "a"] for c in range(1, 11)]
    folder = root / "yahoo_answers_csv"
    write_yahoo_csv(folder / "test.csv", rows)
    if train is None:
        write_yahoo_csv(folder / "train.csv", rows)
    else:
        (folder / "train.csv").write_bytes(train)
    return root


def a_file(root: Path) -> Path:
    root.mkdir(parents=True)
    (root / "data.bin").write_bytes(b"not a folder")
    return root / "data.bin"


def empty_folder(root: Path) -> Path:
    root.mkdir(parents=True)
    return root


def truncate(path: Path, keep: float = 0.5) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def _link_to_proc_mem(root: Path) -> Path:
    mnist_root(root)
    target = raw(root, "test_images")
    target.unlink()
    target.symlink_to("/proc/self/mem")  # open() works, read() fails with EIO
    return root


def _mnist_dangling(root: Path) -> Path:
    mnist_root(root)
    raw(root, "train_labels").unlink()
    raw(root, "train_labels").symlink_to(root / "elsewhere.gz")
    return root


def _mnist_fifo(root: Path) -> Path:
    mnist_root(root, gz=False)
    raw(root, "test_labels", gz=False).unlink()
    os.mkfifo(raw(root, "test_labels", gz=False))
    return root


def _mnist_raw_is_file(root: Path) -> Path:
    (root / "MNIST").mkdir(parents=True)
    (root / "MNIST" / "raw").write_bytes(b"")
    return root


def _mnist_empty_labels(root: Path) -> Path:
    mnist_root(root, gz=False)
    raw(root, "test_labels", gz=False).write_bytes(b"")
    return root


def _mnist_truncated_gz(root: Path) -> Path:
    mnist_root(root)
    truncate(raw(root, "train_images"))
    return root


def _mnist_label_range(root: Path) -> Path:
    mnist_root(root, gz=False)
    raw(root, "test_labels", gz=False).write_bytes(labels_bytes(np.array([0, 1, 12, 3])))
    return root


def _mnist_no_train_images(root: Path) -> Path:
    mnist_root(root, gz=False)
    raw(root, "train_images", gz=False).write_bytes(images_bytes(np.zeros((0, 28, 28))))
    raw(root, "train_labels", gz=False).write_bytes(labels_bytes(np.zeros(0)))
    return root


def _cifar_batch_dir(root: Path) -> Path:
    cifar10_root(root)
    replace_with_dir(cifar_file(root, "data_batch_3"))
    return root


def _cifar_folder_is_file(root: Path) -> Path:
    root.mkdir(parents=True)
    (root / "cifar-10-batches-py").write_bytes(b"a tarball, maybe")
    return root


def _cifar_empty(root: Path) -> Path:
    cifar10_root(root)
    cifar_file(root, "test_batch").write_bytes(b"")
    return root


def _cifar_truncated(root: Path) -> Path:
    cifar10_root(root)
    truncate(cifar_file(root, "data_batch_1"), 0.9)
    return root


def _cifar_list_pickle(root: Path) -> Path:
    cifar10_root(root)
    cifar_file(root, "data_batch_2").write_bytes(pickle.dumps([1, 2, 3]))
    return root


def _cifar_label_range(root: Path) -> Path:
    cifar10_root(root)
    batch = tiny_batch(4, 10, b"labels", seed=1)
    batch[b"labels"] = [0, 1, 10, 3]
    dump(cifar_file(root, "test_batch"), batch)
    return root


def _cifar_meta_not_utf8(root: Path) -> Path:
    cifar10_root(root)
    names = [b"\xff\xfe"] + [f"c{i}".encode() for i in range(9)]
    dump(cifar_file(root, "batches.meta"), {b"label_names": names})
    return root


def _cifar_missing_classes(root: Path) -> Path:
    """A subset holding only classes 0 and 1: task 1 (classes 2, 3) would be empty."""
    cifar10_root(root)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        batch = tiny_batch(4, 10, b"labels", seed=1)
        batch[b"labels"] = [0, 1, 0, 1]
        dump(cifar_file(root, name), batch)
    return root


def _cifar100_folder_is_dir_of_dirs(root: Path) -> Path:
    write_tiny_cifar100(root)
    replace_with_dir(root / "cifar-100-python" / "meta")
    return root


def _agnews_test_dir(root: Path) -> Path:
    agnews_root(root)
    replace_with_dir(root / "text" / "agnews-subset" / "test.json")
    return root


def _agnews_bytes(content: bytes) -> Callable[[Path], Path]:
    def layout(root: Path) -> Path:
        agnews_root(root)
        (root / "text" / "agnews-subset" / "train.json").write_bytes(content)
        return root

    return layout


def _yahoo_folder_is_file(root: Path) -> Path:
    root.mkdir(parents=True)
    (root / "yahoo_answers_csv").write_bytes(b"class,title,content,answer\n")
    return root


def _yahoo_train_dir(root: Path) -> Path:
    yahoo_root(root)
    replace_with_dir(root / "yahoo_answers_csv" / "train.csv")
    return root


def _under_a_file(root: Path) -> Path:
    return a_file(root) / "data"


@dataclass(frozen=True)
class Case:
    """One bad input: the layout to build, the stream call, the words the message needs."""

    id: str
    stream: str
    layout: Callable[[Path], Path]
    expect: tuple[str, ...]
    tasks: int | None = None
    download: bool = False
    train_size: int | None = None
    linux_only: bool = False


CASES = [
    # --data-root itself (checked before anything is read, fetched or encoded)
    Case("root-file-mnist", "rot-mnist", a_file, ("is a file, not a folder", "MNIST/raw/")),
    Case(
        "root-file-download",
        "perm-mnist",
        a_file,
        ("is a file, not a folder", "MNIST/raw/"),
        download=True,
    ),
    Case("root-file-cifar", "seq-cifar100", a_file, ("is a file, not a folder", "cifar-100")),
    Case("root-file-text", "seq-agnews", a_file, ("is a file, not a folder", "agnews-subset")),
    Case("root-file-yahoo", "seq-yahooqa", a_file, ("is a file, not a folder", "yahoo_answers")),
    Case(
        "root-missing",
        "rot-mnist",
        lambda root: root / "nowhere",
        ("does not exist", "MNIST/raw/", "--download"),
    ),
    Case("root-missing-text", "seq-dbpedia", lambda r: r / "nowhere", ("does not exist",)),
    Case(
        "root-under-file",
        "seq-cifar10",
        _under_a_file,
        ("cannot exist because", "is a file, not a folder"),
        download=True,
    ),
    Case(
        "root-file-avalanche",
        "avalanche:tests.test_data_errors:never_called",
        a_file,
        ("is a file, not a folder", "dataset_root"),
    ),
    # a folder (or something else) where a data file should be
    Case(
        "mnist-file-is-dir",
        "rot-mnist",
        lambda r: (mnist_root(r), replace_with_dir(raw(r, "train_images")))[0],
        ("train-images-idx3-ubyte.gz is a directory, not a file", "replace it with the file"),
    ),
    Case(
        "mnist-file-is-dir-download",
        "rot-mnist",
        lambda r: (mnist_root(r), replace_with_dir(raw(r, "test_labels")))[0],
        ("t10k-labels-idx1-ubyte.gz is a directory, not a file",),
        download=True,
    ),
    Case(
        "mnist-raw-is-file",
        "rot-mnist",
        _mnist_raw_is_file,
        ("MNIST/raw is a file, not a folder", "replace it with the folder"),
    ),
    Case("mnist-dangling-link", "rot-mnist", _mnist_dangling, ("which does not exist",)),
    Case("mnist-fifo", "rot-mnist", _mnist_fifo, ("is a named pipe, not a file",)),
    Case(
        "mnist-io-error",
        "rot-mnist",
        _link_to_proc_mem,
        ("exists but cannot be read", "Input/output error"),
        linux_only=True,
    ),
    Case(
        "cifar-file-is-dir",
        "seq-cifar10",
        _cifar_batch_dir,
        ("data_batch_3 is a directory, not a file",),
    ),
    Case(
        "cifar-file-is-dir-download",
        "seq-cifar100",
        _cifar100_folder_is_dir_of_dirs,
        ("cifar-100-python/meta is a directory, not a file",),
        download=True,
    ),
    Case(
        "cifar-folder-is-file",
        "seq-cifar10",
        _cifar_folder_is_file,
        ("cifar-10-batches-py is a file, not a folder",),
    ),
    Case(
        "agnews-file-is-dir",
        "seq-agnews",
        _agnews_test_dir,
        ("test.json is a directory, not a file",),
    ),
    Case(
        "yahoo-folder-is-file",
        "seq-yahooqa",
        _yahoo_folder_is_file,
        ("yahoo_answers_csv is a file, not a folder",),
    ),
    Case("yahoo-file-is-dir", "seq-yahooqa", _yahoo_train_dir, ("train.csv is a directory",)),
    # truncated, empty or malformed files of each format
    Case("mnist-truncated-gz", "rot-mnist", _mnist_truncated_gz, ("truncated or corrupt",)),
    Case("mnist-empty", "rot-mnist", _mnist_empty_labels, ("truncated or corrupt", "0 bytes")),
    Case("mnist-label-range", "perm-mnist", _mnist_label_range, ("label 12 is outside 0..9",)),
    Case("mnist-no-train", "rot-mnist", _mnist_no_train_images, ("has no train images",)),
    Case("cifar-empty", "seq-cifar10", _cifar_empty, ("test_batch is truncated or not a",)),
    Case("cifar-truncated", "seq-cifar10", _cifar_truncated, ("truncated or not a CIFAR-10",)),
    Case("cifar-list", "seq-cifar10", _cifar_list_pickle, ("holds a list, not a dict",)),
    Case("cifar-label-range", "seq-cifar10", _cifar_label_range, ("label 10 outside 0..9",)),
    Case("cifar-meta-not-utf8", "seq-cifar10", _cifar_meta_not_utf8, ("not UTF-8 text",)),
    Case(
        "cifar-task-without-data",
        "seq-cifar10",
        _cifar_missing_classes,
        ("no train examples of task 1's classes 2..3", "--tasks 1"),
    ),
    Case("json-empty", "seq-agnews", _agnews_bytes(b""), ("train.json is empty",)),
    Case("json-truncated", "seq-agnews", _agnews_bytes(b'[{"label": 0'), ("not valid JSON",)),
    Case("json-not-utf8", "seq-agnews", _agnews_bytes(b"\xff\xfe[]"), ("is not UTF-8 text",)),
    Case("json-deep", "seq-agnews", _agnews_bytes(b"[" * 100_000), ("nested too deeply",)),
    Case(
        "json-mapping",
        "seq-agnews",
        lambda r: agnews_root(r, train={"label": 0, "sentence": "a"}),
        ("holds a JSON object, not a non-empty list",),
    ),
    Case(
        "json-entry-list",
        "seq-agnews",
        lambda r: agnews_root(r, test=[["World", "a"]]),
        ("entry 0", "not an object with 'label' and 'sentence'"),
    ),
    Case(
        "json-label-range",
        "seq-dbpedia",
        lambda r: dbpedia_root(r, [{"label": 14, "sentence": "a"}]),
        ("label 14, outside 0..13",),
    ),
    Case(
        "json-too-few",
        "seq-dbpedia",
        lambda r: dbpedia_root(r, [{"label": 0, "sentence": "a"}]),
        ("no train examples of task 0's classes 0..1",),
    ),
    Case(
        "csv-missing-column",
        "seq-yahooqa",
        lambda r: yahoo_root(r, b"1,title,content\n"),
        ("row 1 has 3 columns, not 4",),
    ),
    Case(
        "csv-header",
        "seq-yahooqa",
        lambda r: yahoo_root(r, b"class,title,content,answer\n"),
        ("row 1 has class 'class', not an integer",),
    ),
    Case(
        "csv-not-utf8",
        "seq-yahooqa",
        lambda r: yahoo_root(r, b'"3","caf\xe9","c","a"\n'),
        ("is not UTF-8 text",),
    ),
    Case(
        "csv-label-range",
        "seq-yahooqa",
        lambda r: yahoo_root(r, b"11,t,c,a\n"),
        ("class 11, outside 1..10",),
    ),
    Case("csv-empty", "seq-yahooqa", lambda r: yahoo_root(r, b""), ("train.csv is empty",)),
    Case(
        "csv-huge-class",
        "seq-yahooqa",
        lambda r: yahoo_root(r, b"9" * 5000 + b",t,c,a\n"),
        ("row 1 has class 999", "..., outside 1..10"),
    ),
    Case(
        "json-huge-number",
        "seq-agnews",
        _agnews_bytes(b'[{"label": ' + b"9" * 5000 + b', "sentence": "a"}]'),
        ("holds a number too long to read",),
    ),
    # --tasks the data cannot give, refused before loading (an empty folder proves it)
    Case(
        "agnews-tasks-3",
        "seq-agnews",
        agnews_root,
        ("has 2 tasks of 2 classes, so --tasks 3 is too many", "use --tasks 2 or fewer"),
        tasks=3,
    ),
    Case("dbpedia-tasks-8", "seq-dbpedia", dbpedia_root, ("--tasks 7 or fewer",), tasks=8),
    Case("yahoo-tasks-6", "seq-yahooqa", empty_folder, ("--tasks 5 or fewer",), tasks=6),
    Case("cifar10-tasks-6", "seq-cifar10", empty_folder, ("--tasks 5 or fewer",), tasks=6),
    Case("cifar100-tasks-11", "seq-cifar100", empty_folder, ("--tasks 10 or fewer",), tasks=11),
    Case("mnist-tasks-0", "rot-mnist", empty_folder, ("use --tasks 1 or more",), tasks=0),
    Case(
        "text-train-size",
        "seq-agnews",
        agnews_root,
        ("--train-size 99 does not fit the agnews train split of 8 examples",),
        train_size=99,
    ),
]


def never_called() -> object:
    """An Avalanche 'factory' the data-root check must refuse before importing anything."""
    raise AssertionError("the factory ran although --data-root is a file")


@pytest.fixture(autouse=True)
def no_network_no_encoder(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Make every expensive or external step fail loudly: none may run for a bad input."""

    def forbidden(*args: object, **kwargs: object) -> Any:
        raise AssertionError("this step must not run for a refused input")

    for module in (mnist, cifar):
        monkeypatch.setattr(module, "_torchvision_dataset_class", forbidden)
    monkeypatch.setattr(text, "_load_encoder", forbidden)
    monkeypatch.setattr(text, "encode_texts", forbidden)
    monkeypatch.setattr(text, "encoder_fingerprint", forbidden)
    monkeypatch.setattr(text, "_hf_load_dataset", forbidden)
    monkeypatch.setattr("cfl_bench.streams.avalanche._require_avalanche", forbidden)
    monkeypatch.setenv("CFL_BENCH_CACHE", str(tmp_path / "cache"))


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_data_input(case: Case, tmp_path: Path) -> None:
    if case.linux_only and not Path("/proc/self/mem").exists():
        pytest.skip("needs /proc/self/mem to produce a real I/O error")
    data_root = case.layout(tmp_path / "data")
    before = tree(tmp_path)
    with pytest.raises(UserError) as info:
        build(
            case.stream,
            data_root,
            tasks=case.tasks,
            download=case.download,
            train_size=case.train_size,
        )
    assert_one_line(str(info.value), *case.expect)
    assert tree(tmp_path) == before, "the refused input left something behind"


# ------------------------------------------------------------- unreadable files


@pytest.mark.parametrize("stream", ["rot-mnist", "seq-cifar10", "seq-agnews"])
def test_permission_denied_says_so(
    stream: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file that is there but not readable (root reads everything, so the refusal the OS
    would give is injected at the open/read call every loader goes through)."""
    layouts = {"rot-mnist": mnist_root, "seq-cifar10": cifar10_root, "seq-agnews": agnews_root}
    data_root = layouts[stream](tmp_path / "data")
    victim = {
        "rot-mnist": raw(data_root, "test_images"),
        "seq-cifar10": cifar_file(data_root, "data_batch_1"),
        "seq-agnews": data_root / "text" / "agnews-subset" / "train.json",
    }[stream]
    real_open = Path.open

    def guarded_open(self: Path, *args: Any, **kwargs: Any) -> Any:
        if self == victim:
            raise PermissionError(13, "Permission denied", str(self))
        return real_open(self, *args, **kwargs)

    def guarded_read_bytes(self: Path) -> bytes:
        with guarded_open(self, "rb") as handle:
            return handle.read()

    monkeypatch.setattr(Path, "open", guarded_open)
    monkeypatch.setattr(Path, "read_bytes", guarded_read_bytes)
    with pytest.raises(UserError) as info:
        build(stream, data_root)
    assert_one_line(str(info.value), str(victim), "cannot be read (permission denied)")


@pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root may read any file"
)
def test_permission_denied_for_real(tmp_path: Path) -> None:
    data_root = mnist_root(tmp_path / "data")
    raw(data_root, "train_labels").chmod(0)
    with pytest.raises(UserError) as info:
        build("rot-mnist", data_root)
    assert_one_line(str(info.value), "cannot be read (permission denied)")


# ------------------------------------------------------------------- downloads


def offline_for_real() -> bool:
    """Whether this machine cannot resolve the download host (then a real attempt is
    harmless and fast; on a connected machine it would fetch 170 MB, so it is skipped)."""
    try:
        socket.getaddrinfo("ossci-datasets.s3.amazonaws.com", 443)
    except OSError:
        return True
    return False


DOWNLOADS = [
    ("rot-mnist", "downloading MNIST into", "MNIST/raw by hand"),
    ("seq-cifar10", "downloading CIFAR-10 into", "cifar-10-batches-py by hand"),
]


def _check_offline_download(
    stream: str, expect: tuple[str, str], tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "data" / "MNIST" / "raw").mkdir(parents=True)
    (tmp_path / "data" / "MNIST" / "raw" / "README").write_text("kept")
    before = tree(tmp_path)
    for root in (tmp_path / "data", tmp_path / "new" / "deeper"):
        with pytest.raises(UserError) as info:
            build(stream, root, download=True)
        assert_one_line(
            str(info.value),
            expect[0],
            "failed: no network connection (Name or service not known)",
            expect[1],
            "or run with network",
        )
    assert tree(tmp_path) == before, "the failed download left files or folders behind"
    out, err = capfd.readouterr()
    assert out == "" and err == "", "torchvision's own output must not reach the terminal"


@pytest.mark.parametrize(("stream", "start", "by_hand"), DOWNLOADS)
def test_offline_download_is_one_line(
    stream: str,
    start: str,
    by_hand: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    """torchvision's real download code with urllib's fetch raising what an offline
    machine raises, so the test is identical (and never downloads) on any machine."""
    monkeypatch.undo()  # the real torchvision downloader, not the autouse stand-in
    monkeypatch.setenv("CFL_BENCH_CACHE", str(tmp_path / "cache"))

    def offline(*args: object, **kwargs: object) -> Any:
        raise OFFLINE

    monkeypatch.setattr(urllib.request, "urlopen", offline)
    _check_offline_download(stream, (start, by_hand), tmp_path, capfd)


@pytest.mark.parametrize(("stream", "start", "by_hand"), DOWNLOADS)
def test_offline_download_for_real(
    stream: str,
    start: str,
    by_hand: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    if not offline_for_real():
        pytest.skip("this machine is online; the injected-offline test covers the same path")
    monkeypatch.undo()
    monkeypatch.setenv("CFL_BENCH_CACHE", str(tmp_path / "cache"))
    _check_offline_download(stream, (start, by_hand), tmp_path, capfd)


class BreaksMidway:
    """A urllib response that delivers some bytes, then loses the connection; records
    which partial files existed at that moment (proof that cleanup had work to do)."""

    seen: list[list[str]] = []  # noqa: RUF012 - shared on purpose, reset per test

    def __init__(self, request: urllib.request.Request, root: Path) -> None:
        self.url = request.full_url
        self.length = 10_000
        self.calls = 0
        self.root = root

    def __enter__(self) -> BreaksMidway:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def read(self, size: int = -1) -> bytes:
        self.calls += 1
        if self.calls == 1:
            return b"\x1f\x8b" + b"x" * 998
        BreaksMidway.seen.append([str(p.relative_to(self.root)) for p in self.root.rglob("*")])
        raise ConnectionResetError(104, "Connection reset by peer")


@pytest.mark.parametrize("stream", ["rot-mnist", "seq-cifar100"])
def test_broken_download_leaves_no_partial_files_or_progress(
    stream: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.undo()
    monkeypatch.setenv("CFL_BENCH_CACHE", str(tmp_path / "cache"))
    data_root = empty_folder(tmp_path / "data")
    before = tree(tmp_path)
    BreaksMidway.seen = []
    monkeypatch.setattr(
        urllib.request, "urlopen", lambda request, *a, **k: BreaksMidway(request, data_root)
    )
    with pytest.raises(UserError) as info:
        build(stream, data_root, download=True)
    assert_one_line(
        str(info.value), "failed: the network connection failed (Connection reset by peer)"
    )
    assert any(any(p.endswith(".gz") for p in seen) for seen in BreaksMidway.seen)
    assert tree(tmp_path) == before
    out, err = capfd.readouterr()
    assert out == "" and err == "", "the progress bar must not reach the terminal"


def test_avalanche_factory_offline_cleans_its_leftovers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data_root = empty_folder(tmp_path / "data")
    (data_root / "kept").write_text("x")
    before = tree(tmp_path)
    monkeypatch.setattr("cfl_bench.streams.avalanche._require_avalanche", lambda: None)
    with pytest.raises(UserError) as info:
        build("avalanche:tests.test_data_errors:offline_factory", data_root, tasks=2)
    assert_one_line(
        str(info.value),
        "failed to download its data: no network connection (Name or service not known)",
        f"into {data_root} by hand",
    )
    assert tree(tmp_path) == before


def offline_factory(dataset_root: str) -> object:
    """Behaves like an Avalanche classic benchmark on an offline machine: makes its dataset
    folder, starts a file, then fails the way torchvision does."""
    raw_dir = Path(dataset_root) / "MNIST" / "raw"
    raw_dir.mkdir(parents=True)
    (raw_dir / "train-images-idx3-ubyte.gz").write_bytes(b"partial")
    raise RuntimeError(
        "Error downloading train-images-idx3-ubyte.gz:\nTried https://example/, got:\n"
        "<urlopen error [Errno -2] Name or service not known>\n"
    )


# ------------------------------------------------------------- end to end (CLI)


def test_cli_prints_one_line_and_exits_2(tmp_path: Path) -> None:
    """Bad inputs through the real ``cfl-bench run`` in their own processes (side by side:
    each start imports torch, ~2 s of CPU): exit code 2, exactly one stderr line, no
    traceback, nothing on stdout and nothing written (no runs/ folder, no cache)."""
    cifar10_root(tmp_path / "c")
    replace_with_dir(cifar_file(tmp_path / "c", "test_batch"))
    empty_folder(tmp_path / "e")
    cases = {
        "dir-for-file": (
            ["--stream", "seq-cifar10", "--data-root", str(tmp_path / "c")],
            "test_batch is a directory, not a file",
        ),
        "too-many-tasks": (
            ["--stream", "seq-agnews", "--tasks", "3", "--data-root", str(tmp_path / "e")],
            "so --tasks 3 is too many",
        ),
    }
    before = tree(tmp_path)
    env = {**os.environ, "CFL_BENCH_CACHE": str(tmp_path / "cache"), "COLUMNS": "60"}
    procs = {
        name: subprocess.Popen(
            [sys.executable, "-m", "cfl_bench.cli", "run", *args],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name, (args, _) in cases.items()
    }
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 2, (name, out, err)
        assert "Traceback" not in err and out == "", (name, out, err)
        lines = err.splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), (name, err)
        assert cases[name][1] in lines[0], (name, err)
    assert tree(tmp_path) == before, "a refused run left files behind (runs/ or a cache)"


def test_cli_in_process_data_root_is_a_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The third CLI case in this process (torch is already imported here)."""
    from tests.test_cli import in_process

    data_root = a_file(tmp_path / "f")
    monkeypatch.chdir(tmp_path)
    before = tree(tmp_path)
    code, output = in_process("run", "--stream", "rot-mnist", "--data-root", str(data_root))
    assert code == 2 and "Traceback" not in output, output
    lines = output.splitlines()
    assert len(lines) == 1, output
    assert f"--data-root '{data_root}' is a file, not a folder" in lines[0], output
    assert tree(tmp_path) == before


def test_encoder_is_untouched_when_tasks_are_refused(tmp_path: Path) -> None:
    """The text stream itself refuses too many tasks before it embeds (direct callers skip
    the registry); the autouse fixture makes any encoder call fail."""
    from cfl_bench.streams.text import load_agnews
    from cfl_bench.streams.text_stream import EmbeddedTextStream

    splits = load_agnews(agnews_root(tmp_path / "data"))
    with pytest.raises(UserError, match="so --tasks 3 is too many"):
        EmbeddedTextStream(splits, name="seq-agnews", num_tasks=3, device=CPU)
    assert not (tmp_path / "cache").exists()
    assert json.loads((tmp_path / "data/text/agnews-subset/train.json").read_text()) == AGNEWS


# --------------------------------------------------------- Avalanche experiences


class _Experience:
    """The part of an Avalanche experience the adapter reads: a dataset of (x, y)."""

    def __init__(self, dataset: object) -> None:
        self.dataset = dataset


class _Benchmark:
    def __init__(self, train: object, test: object) -> None:
        self.train_stream = [_Experience(train)]
        self.test_stream = [_Experience(test)]


class _Unsized(torch.utils.data.IterableDataset):  # type: ignore[type-arg]
    def __iter__(self) -> Any:
        return iter([(torch.zeros(2), 0)])


class _ShapeChanges(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Same shape within each 1024-sample read batch, another shape in the next one."""

    def __len__(self) -> int:
        return 1025

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return torch.zeros(2 if i < 1024 else 3), 0


GOOD = [(torch.zeros(2), 0), (torch.ones(2), 1)]


@pytest.mark.parametrize(
    ("train", "expect"),
    [
        (_Unsized(), "has a dataset of unknown size"),
        (_ShapeChanges(), "yields inputs of different shapes"),
    ],
    ids=["unsized", "shape-changes"],
)
def test_avalanche_experience_data_errors(train: object, expect: str) -> None:
    from cfl_bench.streams.avalanche import AvalancheStream

    with pytest.raises(UserError) as info:
        AvalancheStream(_Benchmark(train, GOOD), device=CPU)
    assert_one_line(str(info.value), "train experience 0", expect)
