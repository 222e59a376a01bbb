"""A federation's checkpointable state: the units' own state dicts, gathered and restored.

Why in one place: a checkpoint (``engine.checkpoint``) must hold exactly what the next
round needs and nothing that can be rebuilt. That is:

- the server's state (θ_g, versions, traffic, participation generator, components);
- every client's state;
- the tasks already started;
- the measurement references;
- the integer module buffers;
- the torch generators.

Client data is not saved: it is a deterministic gather of the stream's task data
(``ClientData.restore``). Every entry is a plain container of tensors, numbers and
generators, so ``torch.load(weights_only=True)`` reads it back.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from cfl_bench.core.flat import FlatModel

if TYPE_CHECKING:
    from cfl_bench.engine.loop import Federation


def federation_state(fed: Federation) -> dict[str, Any]:
    """Everything the next round needs, at a round end."""
    return {
        "server": fed.round_server.state_dict(),
        "clients": [c.state_dict() for c in fed.clients],
        "started_tasks": fed.data.started_tasks,
        "measurement": fed.measure.state_dict(),
        **process_state(fed.model),
    }


def process_state(model: FlatModel) -> dict[str, Any]:
    """What lives in the process rather than in the units: the working model's integer
    buffers (BatchNorm's num_batches_tracked: outside the flat vectors, they run on across
    clients and rounds) and torch's default generators. A checkpoint holds it at a round
    end, a kept client update (``engine.kept_clients``) as that client's update left it."""
    device = model.params.device
    return {
        "module_int_buffers": {
            name: b for name, b in model.module.named_buffers() if not b.is_floating_point()
        },
        "torch_rng": torch.get_rng_state(),
        "cuda_rng": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
    }


def load_process_state(model: FlatModel, state: dict[str, Any]) -> None:
    """Put back what :func:`process_state` took."""
    buffers = dict(model.module.named_buffers())
    with torch.no_grad():
        for name, value in state["module_int_buffers"].items():
            buffers[name].copy_(value)
    torch.set_rng_state(state["torch_rng"].cpu())
    device = model.params.device
    if state["cuda_rng"] is not None and device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda_rng"].cpu(), device)


def load_federation_state(fed: Federation, state: dict[str, Any]) -> None:
    """Put ``fed`` back where :func:`federation_state` found it."""
    fed.round_server.load_state_dict(state["server"])
    for client, saved in zip(fed.clients, state["clients"], strict=True):
        client.load_state_dict(saved)
    fed.data.started_tasks = set(state["started_tasks"])
    fed.measure.load_state_dict(state["measurement"])
    load_process_state(fed.model, state)
