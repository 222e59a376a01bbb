"""The protocol hash covers the data a stream read: a subset and the full set, or two
different subsets of the same size, never share a leaderboard row; seeds of one protocol do."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from cfl_bench.runner.config import make_config
from cfl_bench.runner.run import execute
from cfl_bench.streams.base import data_identity
from cfl_bench.streams.registry import build_stream

CPU = torch.device("cpu")


def digits(seed: int, train_size: int | None = None) -> dict[str, object]:
    stream = build_stream(
        "rot-digits", num_tasks=2, seed=seed, device=CPU, data_root=None, download=False,
        train_size=train_size, test_size=None,
    )  # fmt: skip
    return stream.protocol_fields()


def test_same_data_any_seed_same_identity_other_data_other_identity() -> None:
    full = digits(0)
    assert full == digits(7)  # rotation angles differ, the base data does not
    assert full["data"]["sizes"] == {"train": 1437, "test": 360}  # type: ignore[index]
    assert digits(0, train_size=300) != full


def test_the_digest_sees_content_not_only_sizes() -> None:
    x = torch.zeros(4, 1, 2, 2, dtype=torch.uint8)
    y = torch.tensor([0, 1, 0, 1])
    one = data_identity("d", train=(x, y), test=(x, y))
    flipped = data_identity("d", train=(x, y.flip(0)), test=(x, y))
    assert one["sizes"] == flipped["sizes"] and one["sha256"] != flipped["sha256"]
    texts = data_identity("t", train=(["a b", "c"], y[:2]), test=(["d"], y[:1]))
    regrouped = data_identity("t", train=(["a", "b c"], y[:2]), test=(["d"], y[:1]))
    assert texts["sha256"] != regrouped["sha256"]


def test_runs_on_different_data_get_different_protocol_hashes(tmp_path: Path) -> None:
    def protocol_hash(out: str, **extra: object) -> str:
        options = {"tasks": 2, "rounds_per_task": 1, "threads": 1, "out": str(tmp_path / out)}
        execute(make_config({**options, **extra}))
        return json.loads((tmp_path / out / "config.json").read_text())["protocol_hash"]

    full = protocol_hash("a")
    assert full == protocol_hash("b", seed=3)
    assert full != protocol_hash("c", train_size=1000)
