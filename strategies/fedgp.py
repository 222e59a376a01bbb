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

from cfl_bench.engine.payloads import ClientRequest, Payload, Reply
from cfl_bench.errors import UserError
from strategies.base import (
    ClientInputs,
    Component,
    ExtraWork,
    Option,
    Role,
    StepView,
    StrategyEnv,
    boolean,
    positive_int,
    text,
)
from strategies.projection import projected, row_dot

if TYPE_CHECKING:
    import torch

    from cfl_bench.engine.context import Broadcast, ClientState, ServerState
    from cfl_bench.flat import FlatModel
    from cfl_bench.objective import Objective


def gref_samples(raw: str) -> int | str:
    """``all`` (any case: the whole buffer, the authors' setting) or a positive sample count;
    the refusal names both forms, not just the integer one."""
    if raw.lower() == "all":
        return "all"
    try:
        return positive_int(raw)
    except ValueError:
        raise ValueError("must be a positive integer or 'all'") from None


class FedGP(Component):
    name: ClassVar[str] = "fedgp"
    roles: ClassVar[frozenset[Role]] = frozenset({Role.GRAD_TRANSFORM})
    payloads: ClassVar[tuple[Payload, ...]] = (
        Payload("fedgp.gref", "broadcast"),
        Payload("fedgp.gref", "request"),
    )
    summary: ClassVar[str] = (
        "project local gradients against the clients' averaged buffer gradient at θ_g"
    )
    paper: ClassVar[str] = "Dai et al., FedGP / Fed-A-GEM (buffer-based gradient projection)"
    needs_buffer: ClassVar[bool] = True
    state_attributes: ClassVar[tuple[str, ...]] = ("gref", "gref_sq")
    options: ClassVar[tuple[Option, ...]] = (
        Option(
            "gref_samples", 32, "buffer samples per client for g_ref (int or 'all')", gref_samples
        ),
        Option(
            "gref_mode",
            "train",
            "model mode while computing g_ref (train = authors' code)",
            text,
            choices=("train", "eval"),
        ),
        Option(
            "gref_interval", 1, "recompute g_ref every k rounds (stale in between)", positive_int
        ),
        Option("equal_comm", False, "halve the rounds per task, double local epochs", boolean),
    )
    # Last in the transform chain, so g_ref constrains the final direction; its request
    # last after aggregation, so g_ref is taken at the round's final θ_g.
    transform_order: ClassVar[int | None] = 30
    server_hook_order: ClassVar[int] = 10

    def extra_work(self) -> ExtraWork:
        """g_ref: a forward + backward over ``gref_samples`` of every contributing client's
        buffer (``all``: the whole buffer), every ``gref_interval`` rounds."""
        samples = self.values["gref_samples"]
        return ExtraWork(
            request_samples=math.inf if samples == "all" else int(str(samples)),
            request_interval=int(str(self.values["gref_interval"])),
        )

    def setup(self, env: StrategyEnv) -> None:
        self.gref: torch.Tensor | None = None
        self.gref_sq: torch.Tensor | None = None
        # Client side: the g_ref of the broadcast the training client received.

    def adjust_schedule(self, rounds_per_task: int, epochs: int) -> tuple[int, int]:
        """equal_comm: half the rounds, twice the epochs — the same local computation with
        half the exchanges. Only an even number of rounds halves exactly; anything else
        would silently change the computation being compared, so it is refused."""
        if not self.values["equal_comm"]:
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
        interval = int(str(self.values["gref_interval"]))
        if self.gref is not None and server.round_index % interval != 0:
            return None
        contributors = [c for c in server.participants if c.buffer is not None and c.buffer.filled]
        if not contributors:
            return None
        samples = self.values["gref_samples"]
        return ClientRequest(
            "fedgp.gref",
            contributors,
            lambda client, model: self.answer_request("fedgp.gref", client, model),
            self.receive_reply,
            train_mode=self.values["gref_mode"] == "train",
            gradient_data=lambda client: buffer_examples(client, samples),
        )

    def answer_request(self, payload: str, client: ClientState, model: FlatModel) -> torch.Tensor:
        """g_ref_k: the gradient of the objective's mean loss on the client's buffer draw
        (``gref_samples`` of it, or all) at the model's θ_g."""
        if payload != "fedgp.gref":
            return super().answer_request(payload, client, model)
        return buffer_gradient(client, model, self.values["gref_samples"], self.objective)

    def receive_reply(self, reply: Reply) -> None:
        """g_ref = (1/K')·Σ g_ref_k over the clients that answered."""
        import torch

        self.gref = reply.total.div_(reply.count)
        self.gref_sq = torch.dot(self.gref, self.gref)


def buffer_examples(client: ClientState, samples: object) -> tuple[torch.Tensor, torch.Tensor]:
    """The examples of g_ref_k: ``samples`` drawn from the client's buffer (its buffer
    generator), or all of it."""
    buffer = client.buffer
    assert buffer is not None  # only clients with a filled buffer contribute
    draw = buffer.all() if samples == "all" else buffer.sample(int(str(samples)))
    assert draw is not None
    return draw.x, draw.y


def buffer_gradient(
    client: ClientState, model: FlatModel, samples: object, objective: Objective
) -> torch.Tensor:
    """g_ref_k: ∇ of the objective's loss on ``samples`` of the client's buffer (or all of
    it) at the model as loaded (θ_g); the result is the model's gradient vector, valid until
    the next backward."""
    x, y = buffer_examples(client, samples)
    model.zero_grad()
    objective.loss(model.module(x), y).backward()
    return model.grads
