"""Declared communication: what a component sends, in which direction, produced where.

Why declared: the engine moves and counts every tensor that crosses the network, so the
bytes column is measured from what is really exchanged, and no component touches the
traffic counter or the model-version bookkeeping. A component lists its payloads once; the
engine refuses a broadcast or an upload under a name nobody declared, so a new method
cannot send something uncounted by accident.

Producers:

``broadcast``   the server adds it to the round's broadcast (``Component.broadcast``)
``upload``      the client adds it to its upload after local training (``after_local``)
``request``     the server asks some clients for it after aggregation and the executor
                computes it on them at θ_g (``Component.client_request``: FedGP's g_ref)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    import torch

    from cfl_bench.core.context import ClientState
    from cfl_bench.core.flat import FlatModel

Producer = Literal["broadcast", "upload", "request"]


@dataclass(frozen=True)
class Payload:
    """One named tensor a component exchanges besides the model, e.g. ``fedgp.gref``."""

    name: str
    producer: Producer

    @property
    def direction(self) -> str:
        """``down`` for what the server sends, ``up`` for what clients send."""
        return "down" if self.producer == "broadcast" else "up"


@dataclass(frozen=True)
class ClientRequest:
    """A computation the server asks of ``clients`` at the current θ_g after aggregation.

    The executor loads θ_g (counting the model download for clients that do not hold this
    version), sets the model's mode (``train_mode``), runs ``compute(client, model)`` on each
    client in order and sums the results; ``on_reply`` receives the sum and the count on the
    server. Every result is counted as an upload of ``payload``.
    """

    payload: str
    clients: list[ClientState]
    compute: Callable[[ClientState, FlatModel], torch.Tensor]
    on_reply: Callable[[Reply], None]
    train_mode: bool
    # The round whose θ_g is asked about (set by the round server): with the client index
    # it seeds torch's default generator for the computation (dropout in train mode).
    round_index: int = 0
    # Set when ``compute`` is ∇ of the objective's mean loss at θ_g on the examples this
    # returns for a client (inputs as the model sees them, labels; any random draw made
    # here, from the client's own generators): an executor may then draw for every client,
    # in order, and take all the gradients in one batched backward (the vectorized one).
    gradient_data: Callable[[ClientState], tuple[torch.Tensor, torch.Tensor]] | None = None


@dataclass(frozen=True)
class Reply:
    """The summed answers to a ``ClientRequest`` and how many clients gave one."""

    payload: str
    total: torch.Tensor
    count: int


def undeclared(names: list[str], declared: set[str], producer: Producer) -> str | None:
    """The error for payload names no component declared with this producer, or None."""
    unknown = sorted(set(names) - declared)
    if not unknown:
        return None
    return (
        f"payload {', '.join(unknown)} was sent as '{producer}' but no component declares it; "
        f"add Payload(name, '{producer}') to the component's ``payloads``."
    )
