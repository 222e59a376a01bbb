"""Explicit, serialisable state: every unit's state_dict round-trips exactly."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from cfl_bench.engine import checkpoint
from tests.helpers import digits_federation


def same(a: object, b: object) -> bool:
    """Structural equality of state: tensors by value, generators by state."""
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, torch.Generator) and isinstance(b, torch.Generator):
        return torch.equal(a.get_state(), b.get_state())
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


@pytest.mark.parametrize("strategy", ["derpp+fedcurv", "agem+fedgp+ifa", "fedavg+fedprox"])
def test_federation_state_survives_serialisation_and_loading(strategy: str, tmp_path: Path) -> None:
    fed = digits_federation(strategy)
    fed.run()
    checkpoint.save(tmp_path / "state.pt", fed.state_dict())
    # loaded with weights_only: plain containers of tensors, numbers and generator states
    state = checkpoint.load(tmp_path / "state.pt", torch.device("cpu"))
    fresh = digits_federation(strategy)
    assert not same(fresh.state_dict()["server"], state["server"])
    fresh.load_state_dict(state)
    assert same(fresh.state_dict(), fed.state_dict())


def test_client_state_round_trips_and_is_a_copy_of_the_numbers() -> None:
    fed = digits_federation("der")
    fed.run()
    client, other = fed.clients[0], digits_federation("der").clients[0]
    other.load_state_dict(client.state_dict())
    assert same(other.state_dict(), client.state_dict())
    assert other.buffer is not None and other.buffer.filled == client.buffer.filled  # type: ignore[union-attr]
