"""Replay buffers keep a stream's exact compact inputs (CARLA's uint8 frames) instead of
float32: draws give back the offered floats bit for bit, classification streams keep float32
buffers (so their golden records cannot change), and a checkpoint holds the compact form."""

from __future__ import annotations

from typing import Any

import torch

from cfl_bench.carla_bridge.stream import FrameStream
from cfl_bench.core.buffer import ReservoirBuffer, StoredInputs
from cfl_bench.engine.loop import buffer_inputs

CPU = torch.device("cpu")


def frames_as_floats(count: int) -> torch.Tensor:
    """Model inputs of uint8 frames covering every pixel value, as the stream makes them."""
    pixels = torch.arange(count * 3 * 4 * 5) % 256
    return pixels.to(torch.uint8).view(count, 3, 4, 5).to(torch.float32) / 255.0


def encode(x: torch.Tensor) -> torch.Tensor:
    return FrameStream.model_input_to_stored(None, x)  # type: ignore[arg-type]


def decode(x: torch.Tensor) -> torch.Tensor:
    return FrameStream.as_model_input(None, x)  # type: ignore[arg-type]


def test_every_pixel_value_survives_the_round_trip_bit_for_bit() -> None:
    x = frames_as_floats(30)
    stored = encode(x)
    assert stored.dtype == torch.uint8
    assert torch.equal(decode(stored), x)


def make(stored_inputs: StoredInputs | None) -> ReservoirBuffer:
    return ReservoirBuffer(
        8, (3, 4, 5), 2, device=CPU, generator=torch.Generator().manual_seed(0),
        stored_inputs=stored_inputs,
    )  # fmt: skip


def test_a_uint8_buffer_draws_exactly_what_a_float_buffer_draws() -> None:
    compact, plain = make(StoredInputs(torch.uint8, encode, decode)), make(None)
    x = frames_as_floats(20)
    for buffer in (compact, plain):
        buffer.add(x[:12], torch.arange(12), torch.zeros(12, 2), task=0)
        buffer.add(x[12:], torch.arange(12, 20), torch.zeros(8, 2), task=1)
    assert compact.x.dtype == torch.uint8 and plain.x.dtype == torch.float32
    first, second = compact.sample(5), plain.sample(5)
    assert first is not None and second is not None
    assert torch.equal(first.x, second.x) and torch.equal(first.y, second.y)
    whole, reference = compact.all(), plain.all()
    assert whole is not None and reference is not None
    assert torch.equal(whole.x, reference.x)
    assert compact.nbytes < plain.nbytes


def test_the_checkpoint_state_holds_uint8_and_loads_back() -> None:
    compact = make(StoredInputs(torch.uint8, encode, decode))
    compact.add(frames_as_floats(6), torch.arange(6), torch.zeros(6, 2), task=0)
    state: dict[str, Any] = compact.state_dict()
    assert state["x"].dtype == torch.uint8
    again = make(StoredInputs(torch.uint8, encode, decode))
    again.load_state_dict(state)
    drawn = again.all()
    assert drawn is not None and torch.equal(drawn.x, frames_as_floats(6))


def test_classification_streams_keep_float32_buffers() -> None:
    from cfl_bench.streams.registry import build_stream

    stream = build_stream(
        "rot-digits", num_tasks=2, seed=0, device=CPU, data_root=None, download=False
    )
    for stacked in (False, True):
        assert buffer_inputs(stream, stacked, CPU) is None
