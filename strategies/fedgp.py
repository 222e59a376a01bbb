"""FedGP: buffer-based gradient projection for continual federated learning.

Dai et al., "Buffer-based Gradient Projection for Continual Federated Learning" (later
"Fed-A-GEM"). After aggregation each client computes, at the new global model θ_g,

    g_ref_k = ∇ mean CE(f(x; θ_g)) over m samples of its buffer

and the server averages g_ref = (1/K')·Σ g_ref_k over the K' clients with a non-empty buffer
(here: the round's participants). g_ref goes out with the next broadcast, and at every local
step, after the learner's own refinement,

    g ← g − (g·g_ref / ‖g_ref‖²) · g_ref    only where g·g_ref < 0.

Options follow the authors' code where it differs from the paper: ``gref_samples`` (32, or
``all`` = the whole buffer), ``gref_mode`` (``train`` = authors' code, dropout active;
``eval``), ``gref_interval`` (recompute every k rounds, stale in between), ``equal_comm``
(the paper's "equalized communication overhead": half as many rounds per task, each with
twice the local epochs, so FedGP's doubled upload is matched in total bytes).

Communication (declared, moved and counted by the engine): g_ref_k is a client computation
the server requests after aggregation (``client_request``); each contributing client
downloads θ_g (unless it already holds that version) and uploads g_ref_k; participants
download g_ref with the next broadcast.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, ClassVar

import torch

from cfl_bench.core.errors import UserError
from cfl_bench.core.payloads import ClientRequest, Reply
from cfl_bench.strategies import declarations
from cfl_bench.strategies.base import (
    ClientInputs,
    Component,
    Declaration,
    ExtraWork,
    StepView,
    StrategyEnv,
)
from cfl_bench.strategies.declarations import FedGPOptions
from cfl_bench.strategies.projection import projected, row_dot

if TYPE_CHECKING:
    from cfl_bench.core.context import Broadcast, ClientState, ServerState
    from cfl_bench.core.flat import FlatModel
    from cfl_bench.core.objective import Objective


class FedGP(Component):
    declaration: ClassVar[Declaration] = declarations.FEDGP
    opts: FedGPOptions
    needs_buffer: ClassVar[bool] = True
    state_attributes: ClassVar[tuple[str, ...]] = ("gref", "gref_sq")

    def extra_work(self) -> ExtraWork:
        """g_ref: a forward + backward over ``gref_samples`` of every contributing client's
        buffer (``all``: the whole buffer), every ``gref_interval`` rounds."""
        samples = self.opts.gref_samples
        return ExtraWork(
            request_samples=samples if isinstance(samples, int) else math.inf,
            request_interval=self.opts.gref_interval,
        )

    def setup(self, env: StrategyEnv) -> None:
        self.gref: torch.Tensor | None = None
        self.gref_sq: torch.Tensor | None = None
        # Client side: the g_ref of the broadcast the training client received.

    def adjust_schedule(self, rounds_per_task: int, epochs: int) -> tuple[int, int]:
        """equal_comm: half the rounds, twice the epochs — the same local computation with
        half the exchanges. Only an even number of rounds halves exactly; anything else
        would silently change the computation being compared, so it is refused."""
        if not self.opts.equal_comm:
            return rounds_per_task, epochs
        if rounds_per_task % 2:
            raise UserError(
                f"fedgp:equal_comm halves the rounds per task, which needs an even "
                f"--rounds-per-task; got {rounds_per_task}, so use {rounds_per_task + 1} or "
                f"{max(2, rounds_per_task - 1)}."
            )
        return rounds_per_task // 2, epochs * 2

    def broadcast(self, server: ServerState) -> dict[str, torch.Tensor]:
        return {} if self.gref is None else {"fedgp.gref": self.gref}

    def round_inputs(self, broadcast: Broadcast) -> ClientInputs | None:
        """A client projects against the g_ref of its broadcast (not the server's copy:
        under ``--executor flower`` the client holds only what it received); None before
        the first g_ref."""
        gref = broadcast.payloads.get("fedgp.gref")
        return None if gref is None else {"gref": gref, "gref_sq": row_dot(gref, gref)}

    def transform(self, grads: torch.Tensor, inputs: ClientInputs, step: StepView) -> torch.Tensor:
        """g ← g − (g·g_ref / ‖g_ref‖²)·g_ref where g·g_ref < 0."""
        return projected(grads, inputs["gref"], inputs["gref_sq"])

    def client_request(self, server: ServerState) -> ClientRequest | None:
        """After aggregation (last server hook: g_ref must see the final θ_g), ask every
        participant with a filled buffer for its buffer gradient — unless g_ref is still
        fresh under ``gref_interval``."""
        interval = self.opts.gref_interval
        if self.gref is not None and server.round_index % interval != 0:
            return None
        contributors = [c for c in server.participants if c.buffer is not None and c.buffer.filled]
        if not contributors:
            return None
        samples = self.opts.gref_samples
        return ClientRequest(
            "fedgp.gref",
            contributors,
            lambda client, model: self.answer_request("fedgp.gref", client, model),
            self.receive_reply,
            train_mode=self.opts.gref_mode == "train",
            gradient_data=lambda client: buffer_examples(client, samples),
        )

    def answer_request(self, payload: str, client: ClientState, model: FlatModel) -> torch.Tensor:
        """g_ref_k: the gradient of the objective's mean loss on the client's buffer draw
        (``gref_samples`` of it, or all) at the model's θ_g."""
        if payload != "fedgp.gref":
            return super().answer_request(payload, client, model)
        return buffer_gradient(client, model, self.opts.gref_samples, self.objective)

    def receive_reply(self, reply: Reply) -> None:
        """g_ref = (1/K')·Σ g_ref_k over the clients that answered."""
        self.gref = reply.total.div_(reply.count)
        self.gref_sq = torch.dot(self.gref, self.gref)


def buffer_examples(client: ClientState, samples: int | str) -> tuple[torch.Tensor, torch.Tensor]:
    """The examples of g_ref_k: ``samples`` drawn from the client's buffer (its buffer
    generator), or all of it."""
    buffer = client.buffer
    assert buffer is not None  # only clients with a filled buffer contribute
    draw = buffer.sample(samples) if isinstance(samples, int) else buffer.all()
    assert draw is not None
    return draw.x, draw.y


def buffer_gradient(
    client: ClientState, model: FlatModel, samples: int | str, objective: Objective
) -> torch.Tensor:
    """g_ref_k: ∇ of the objective's loss on ``samples`` of the client's buffer (or all of
    it) at the model as loaded (θ_g); the result is the model's gradient vector, valid until
    the next backward."""
    x, y = buffer_examples(client, samples)
    model.zero_grad()
    objective.loss(model.module(x), y).backward()
    return model.grads
