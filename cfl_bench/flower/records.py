"""Engine objects ⇄ Flower records, bit-exactly.

What travels, by record name (``RecordDict`` keys):

``cfl.broadcast``  ArrayRecord: ``params``, ``buffers`` and ``payload.<name>`` for every
                   declared broadcast payload (down; exactly what ``RoundServer`` counts).
``cfl.round``      ConfigRecord: the round's facts (``Broadcast`` minus tensors) and the
                   client's id and task.
``cfl.upload``     ArrayRecord: ``params``, ``buffers``, ``payload.<name>`` for every upload
                   payload (up; its bytes are ``Upload.nbytes``, checked on receipt).
``cfl.answer``     ArrayRecord: ``answer`` (a ``ClientRequest``'s result, up).

The client-state protocol (``flower.node_work``), which is not federated traffic either:
``cfl.state`` (the server's mirror of the client's state, sent only when the server does not
know which state the node holds), ``cfl.held`` (the token of the node's state after the
message, up), ``cfl.stale`` (the node does not hold the state the message names).

Instrumentation, which is no federated traffic and is never counted: ``cfl.result``
(step count, loss sum, seconds, the client-spread probe score, ``--diagnostics``' class
accuracy and weight divergence), ``cfl.probes`` (the server's probe sets for the client
spread at task ends), ``cfl.diagnose`` (``--diagnostics``: the current task's probe, on
which the client scores its local model class by class) and ``cfl.mirror`` (the client's state after
the message, which the engine's measurement — buffer drift —, checkpoints and request
planning read; see docs/executors.md).

Why ``torch.save`` bytes for the client state: a ``ClientState`` holds generators, a
buffer and component extras of any type; a byte image is exact for all of them.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord

from cfl_bench.core.context import Broadcast, ClientState, Upload
from cfl_bench.core.evaluation import EvalSet

PAYLOAD = "payload."

#: Record names of the client-state protocol (``flower.node_work``): the server's copy of a
#: client's state sent down, a node's "I do not hold the state you named" reply, and the
#: key of the token naming a state (in ``cfl.round`` down, in ``cfl.held`` up).
STATE = "cfl.state"
STALE = "cfl.stale"
TOKEN_KEY = "state_token"


def config_int(record: ConfigRecord, key: str) -> int:
    """``int(record[key])``, typed: a ConfigRecord value may also be a list, which no fact
    of these messages is (int() would refuse it too)."""
    value = record[key]
    if isinstance(value, list):
        raise TypeError(f"config record key {key!r} holds a list, not a number")
    return int(value)


def config_float(record: ConfigRecord, key: str) -> float:
    """``float(record[key])``, typed (see :func:`config_int`)."""
    value = record[key]
    if isinstance(value, list):
        raise TypeError(f"config record key {key!r} holds a list, not a number")
    return float(value)


def array_of(tensor: torch.Tensor) -> Array:
    """A Flower array holding ``tensor``'s exact bytes (CPU, contiguous)."""
    return Array(tensor.detach().cpu().contiguous().numpy())


def tensor_of(array: Array, device: torch.device) -> torch.Tensor:
    """The tensor an ``array_of`` array holds, on ``device``."""
    return torch.from_numpy(np.array(array.numpy(), copy=True)).to(device)


def model_record(
    params: torch.Tensor, buffers: torch.Tensor, payloads: dict[str, torch.Tensor]
) -> ArrayRecord:
    """θ (and its buffers) plus named payloads: the arrays a broadcast or upload carries."""
    arrays = {"params": array_of(params), "buffers": array_of(buffers)}
    arrays |= {PAYLOAD + name: array_of(t) for name, t in payloads.items()}
    return ArrayRecord(array_dict=arrays)


def model_of(
    record: ArrayRecord, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """``model_record``'s inverse: params, buffers, payloads by name."""
    params = tensor_of(record["params"], device)
    buffers = tensor_of(record["buffers"], device)
    payloads = {
        key[len(PAYLOAD) :]: tensor_of(array, device)
        for key, array in record.items()
        if key.startswith(PAYLOAD)
    }
    return params, buffers, payloads


def record_bytes(record: ArrayRecord) -> int:
    """The raw tensor bytes of every array in ``record`` (headers excluded)."""
    return sum(
        int(np.prod(a.shape, dtype=np.int64)) * np.dtype(a.dtype).itemsize for a in record.values()
    )


def round_record(broadcast: Broadcast, client: int, client_task: int) -> ConfigRecord:
    """The round's facts a client reads besides the tensors."""
    return ConfigRecord(
        {
            "version": broadcast.version,
            "round_index": broadcast.round_index,
            "task": broadcast.task,
            "is_task_end": broadcast.is_task_end,
            "client": client,
            "client_task": client_task,
        }
    )


def broadcast_of(arrays: ArrayRecord, facts: ConfigRecord, device: torch.device) -> Broadcast:
    """The ``Broadcast`` a ``model_record`` + ``round_record`` pair carries."""
    params, buffers, payloads = model_of(arrays, device)
    return Broadcast(
        params=params,
        buffers=buffers,
        version=config_int(facts, "version"),
        payloads=payloads,
        round_index=config_int(facts, "round_index"),
        task=config_int(facts, "task"),
        is_task_end=bool(facts["is_task_end"]),
        device=device,
    )


def upload_record(upload: Upload) -> ArrayRecord:
    """What a client uploads: its model and its declared upload payloads, nothing else."""
    return model_record(upload.params, upload.buffers, upload.extras)


def upload_of(record: ArrayRecord, client: int, num_samples: int, device: torch.device) -> Upload:
    """``upload_record``'s inverse; refuses a record whose bytes are not the upload's."""
    params, buffers, extras = model_of(record, device)
    upload = Upload(client, params, buffers, num_samples, extras)
    if record_bytes(record) != upload.nbytes:
        raise RuntimeError("the upload record carries bytes the engine does not count")
    return upload


def state_bytes(state: dict[str, Any]) -> ArrayRecord:
    """A ``ClientState.state_dict`` as one uint8 array (``torch.save`` image)."""
    saved = dict(state)
    saved["generator"] = state["generator"].get_state()
    out = io.BytesIO()
    torch.save(saved, out)
    return ArrayRecord(array_dict={"state": Array(np.frombuffer(out.getvalue(), np.uint8))})


def load_state(record: ArrayRecord, client: ClientState, keep_version: bool = False) -> None:
    """Load a ``state_bytes`` record into ``client`` (its generator object is kept; with
    ``keep_version`` the server's model-version bookkeeping is left alone)."""
    raw = record["state"].numpy().tobytes()
    state = torch.load(io.BytesIO(raw), weights_only=False, map_location=client.generator.device)
    generator = torch.Generator(device=client.generator.device)
    generator.set_state(state["generator"])
    state["generator"] = generator
    if keep_version:
        state["model_version"] = client.model_version
    client.load_state_dict(state)


def probes_record(probes: list[EvalSet]) -> ArrayRecord:
    """The client-spread probe sets (instrumentation: the server's test probes)."""
    arrays: dict[str, Array] = {}
    for i, probe in enumerate(probes):
        arrays[f"{i}.x"] = array_of(probe.x)
        arrays[f"{i}.y"] = array_of(probe.y)
        arrays[f"{i}.classes"] = array_of(torch.tensor(probe.classes, dtype=torch.int64))
    return ArrayRecord(array_dict=arrays)


def probes_of(record: ArrayRecord, device: torch.device) -> list[EvalSet]:
    """``probes_record``'s inverse."""
    count = len(record) // 3
    return [
        EvalSet(
            tensor_of(record[f"{i}.x"], device),
            tensor_of(record[f"{i}.y"], device),
            tuple(int(c) for c in tensor_of(record[f"{i}.classes"], device).tolist()),
        )
        for i in range(count)
    ]
