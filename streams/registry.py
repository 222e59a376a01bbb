"""The one function that builds a stream by name, from the catalogue of streams.

Why the catalogue lives apart (``streams.catalogue``, re-exported here): the CLI lists
streams, fills in per-stream defaults and knows which ones need a data folder without
importing torch or any loader. Each catalogue entry names its builder
(``streams.builders``), so this module only resolves that name: adding a stream is one
catalogue entry, and no table or branch here. Besides the native names,
``avalanche:package.module:factory`` names any Avalanche benchmark (see
``streams.avalanche``); :func:`stream_info` answers for both.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

import torch

from cfl_bench.streams.base import Stream, StreamRequest
from cfl_bench.streams.catalogue import (
    AVALANCHE_STREAM_HELP,
    STREAMS,
    StreamInfo,
    check_class_order,
    check_classes_per_task,
    check_cutout,
    require_data_root,
    stream_info,
)

__all__ = [
    "AVALANCHE_STREAM_HELP",
    "STREAMS",
    "StreamInfo",
    "build_stream",
    "builder_of",
    "stream_info",
]


def build_stream(
    name: str,
    *,
    num_tasks: int,
    seed: int,
    device: torch.device,
    data_root: str | None,
    download: bool,
    train_size: int | None = None,
    test_size: int | None = None,
    num_clients: int = 1,
    cutout: int = 0,
    classes_per_task: int | None = None,
    class_order: str = "natural",
) -> Stream:
    """Load the base data of stream ``name`` and wrap it as a stream on ``device``.

    For ``avalanche:...`` names, ``num_tasks`` 0 takes all the benchmark's experiences and
    ``download`` has no say (Avalanche's own benchmarks fetch missing files themselves).
    """
    info = stream_info(name)  # unknown names and malformed avalanche specs fail here
    # Cheap checks first: a missing --data-root is refused before any file is read,
    # downloaded or encoded (the builders check the folder and --tasks next).
    require_data_root(name, data_root, download)
    check_cutout(info, cutout)
    check_classes_per_task(info, classes_per_task)
    check_class_order(info, class_order)
    request = StreamRequest(
        num_tasks=num_tasks,
        seed=seed,
        device=torch.device(device),
        data_root=data_root,
        download=download,
        train_size=train_size,
        test_size=test_size,
        num_clients=num_clients,
        cutout=cutout,
        classes_per_task=classes_per_task,
        class_order=class_order,
    )
    return builder_of(info)(info, request)


def builder_of(info: StreamInfo) -> Callable[[StreamInfo, StreamRequest], Stream]:
    """The function a catalogue entry names as ``"module:function"``."""
    module, _, function = info.builder.partition(":")
    return getattr(importlib.import_module(module), function)
