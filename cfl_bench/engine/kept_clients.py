"""Finished client updates of a round, kept so that an interrupted round resumes without
training them again (docs/protocols.md, "Partial rounds").

Why this works bit for bit: a client update is a function of the round's broadcast and
the client's own state (its generators, buffer and component extras; torch's default
generator is reseeded per client update, ``seeding.seed_torch_default``), so a resumed
round that restarts from the round's start state (the checkpoint of the round before) can
feed a kept client's saved result to the server in that client's place, in the same job
order, while the other clients train. The server then folds the same uploads in the same
order into its running average, and every later client starts from the same state as in
an uninterrupted run.

What one kept update holds (``kept_update``), each part for the reason given:

- ``result``: the ``ClientResult`` fields the server and the records read — the upload
  (parameters, float buffers, sample count, declared payloads), the loss sum, the step
  count, the training seconds, and the client-spread and diagnostic values;
- ``state``: the client's state after its update and before the server received it
  (``ClientState.state_dict``: buffer, generators, component extras), put back on replay;
- ``after``: what a client update leaves in the process and the next one may read —
  torch's default generators and the working model's integer buffers (BatchNorm's step
  counters, which run on across clients) — and the working model holds the upload.

Which clients are kept, where and when is the runner's business (``RoundWork``,
implemented by ``cfl_bench.runner.round_keeper``); the engine only replays and offers.
Only executors whose client updates are independent one by one keep clients
(``ExecutorBuild.keeps_clients``): the vectorized executor trains a chunk of clients in
lock-step, so leaving one out would change its chunk.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import torch

from cfl_bench.core.context import ClientState, Upload
from cfl_bench.core.flat import FlatModel
from cfl_bench.engine.client_update import ClientResult
from cfl_bench.engine.federation_state import load_process_state, process_state

KeptUpdate = dict[str, Any]
KeptLoader = Callable[[], KeptUpdate]
RESULT_KEYS = (
    *("params", "buffers", "num_samples", "extras", "loss_sum", "steps"),
    *("train_seconds", "probe_accuracy", "class_accuracy", "weight_divergence"),
)


class RoundWork(Protocol):
    """Where a round's finished client updates are kept (the run directory's
    ``partial-round/``, ``cfl_bench.runner.round_keeper``)."""

    def opened(self, round_index: int) -> dict[int, KeptLoader]:
        """Round ``round_index`` (1-based) starts; the updates of it that an earlier process
        kept, by client index (each loaded when replayed, instead of training the client)."""
        ...

    def finished(self, client: int, keep: Callable[[], KeptUpdate]) -> None:
        """Client ``client`` of the round in progress was trained here; ``keep()`` is its
        update to save (called only when it is saved: it copies nothing otherwise)."""
        ...


def kept_update(model: FlatModel, result: ClientResult) -> KeptUpdate:
    """``result`` and the state around it, as plain tensors (``engine.checkpoint.pack``
    compacts views), taken while the upload's tensors are still valid."""
    upload = result.upload
    return {
        "result": {
            "params": upload.params.detach(),
            "buffers": upload.buffers.detach(),
            "num_samples": upload.num_samples,
            "extras": dict(upload.extras),
            "loss_sum": result.loss_sum.detach(),
            "steps": result.steps,
            "train_seconds": result.train_seconds,
            "probe_accuracy": result.probe_accuracy,
            "class_accuracy": result.class_accuracy,
            "weight_divergence": result.weight_divergence,
        },
        "state": result.client.state_dict(),
        "after": process_state(model),
    }


def kept_problem(model: FlatModel, kept: KeptUpdate) -> str | None:
    """Why ``kept`` cannot stand in for a client update of this run's model (None: it can):
    a file of another model or a damaged one must never be folded into the average."""
    result, state, after = kept.get("result"), kept.get("state"), kept.get("after")
    if not isinstance(result, dict) or not isinstance(state, dict) or not isinstance(after, dict):
        return "it is not a kept client update"
    missing = [key for key in RESULT_KEYS if key not in result]
    if missing:
        return f"it lacks {', '.join(missing)}"
    for name, want in (("params", model.params), ("buffers", model.buffers)):
        got = result[name]
        if not isinstance(got, torch.Tensor) or got.shape != want.shape or got.dtype != want.dtype:
            return f"its {name} do not fit this run's model"
    return None


def replay(model: FlatModel, client: ClientState, kept: KeptUpdate) -> ClientResult:
    """The kept update of ``client`` as if it had just been trained here: the client's
    state, the process state and the working model as its update left them, and its
    result (handed to the server in the update's place)."""
    client.load_state_dict(kept["state"])
    load_process_state(model, kept["after"])
    saved = kept["result"]
    model.load(saved["params"], saved["buffers"])
    upload = Upload(
        client.index,
        saved["params"],
        saved["buffers"],
        int(saved["num_samples"]),
        dict(saved["extras"]),
    )
    return ClientResult(
        client,
        upload,
        saved["loss_sum"],
        int(saved["steps"]),
        float(saved["train_seconds"]),
        probe_accuracy=saved["probe_accuracy"],
        class_accuracy=saved["class_accuracy"],
        weight_divergence=saved["weight_divergence"],
    )
