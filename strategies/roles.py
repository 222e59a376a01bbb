"""What each role implements: one small protocol per list of ``Strategy`` the engine iterates.

``Component`` gives every hook a do-nothing default, so any component fits any protocol
structurally; the protocols say which hooks a role is about, and type the lists the
engine iterates (``Strategy.loss_terms``, ``.transforms``, ``.aggregator``,
``.server_hooks``), so an executor sees only those hooks. Which components join a list is
declared (``Declaration.roles``), never found by comparing methods; the registry test
checks that each declared role's component implements the hooks its role is about.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch

    from cfl_bench.core.context import Broadcast, ClientState, LocalRound, ServerState, Upload
    from cfl_bench.core.flat import FlatModel
    from cfl_bench.core.payloads import ClientRequest
    from cfl_bench.strategies.base import ClientInputs, FrozenForward, StepView


@runtime_checkable
class Named(Protocol):
    """Its inputs and state are keyed by the component's name."""

    @property
    def name(self) -> str: ...


@runtime_checkable
class ClientSide(Named, Protocol):
    """What a client's local steps need from the component this round: computed once per
    round from the broadcast, then per client from its own state (None: nothing)."""

    def round_inputs(self, broadcast: Broadcast) -> ClientInputs | None: ...

    def client_inputs(self, client: ClientState, local: LocalRound) -> ClientInputs: ...


@runtime_checkable
class LossTerm(ClientSide, Protocol):
    """``Role.LOSS_TERM``: adds to a client's local loss, as an autograd term on the batch's
    outputs (``loss_term``, reading its ``frozen_forwards`` and ``term_inputs``) or as a
    closed-form penalty on θ (``penalty``). Implements at least one of the two."""

    def frozen_forwards(self) -> tuple[FrozenForward, ...]: ...

    def term_inputs(self) -> tuple[str, ...]: ...

    def loss_term(
        self,
        outputs: torch.Tensor,
        representation: torch.Tensor | None,
        y: torch.Tensor,
        mask: torch.Tensor | None,
        values: dict[str, torch.Tensor],
    ) -> torch.Tensor | None: ...

    def penalty(
        self, params: torch.Tensor, grads: torch.Tensor, inputs: ClientInputs
    ) -> tuple[torch.Tensor, torch.Tensor] | None: ...


@runtime_checkable
class GradientTransform(ClientSide, Protocol):
    """``Role.GRAD_TRANSFORM``: rewrites the step's flat gradient, in its declared place of
    the chain (``Declaration.transform_order``)."""

    def transform(
        self, grads: torch.Tensor, inputs: ClientInputs, step: StepView
    ) -> torch.Tensor: ...


@runtime_checkable
class Aggregator(Named, Protocol):
    """``Role.AGGREGATOR``: refines the FedAvg mean in ``server.global_params``."""

    def aggregate(self, server: ServerState) -> None: ...


@runtime_checkable
class ServerHook(Named, Protocol):
    """Every component, in ``Declaration.server_hook_order``: its work after aggregation
    and its request to the clients at the round's final θ_g (a declared server schedule)."""

    def on_round_start(self, server: ServerState) -> None: ...

    def after_aggregate(self, server: ServerState) -> None: ...

    def client_request(self, server: ServerState) -> ClientRequest | None: ...


@runtime_checkable
class PayloadProducer(Named, Protocol):
    """A component with declared payloads (``Declaration.payloads``): it produces them on
    the broadcast, the upload or a request, and the server collects the uploads."""

    def broadcast(self, server: ServerState) -> dict[str, torch.Tensor]: ...

    def after_local(self, client: ClientState, upload: Upload, local: LocalRound) -> None: ...

    def receive_upload(self, upload: Upload, server: ServerState) -> None: ...

    def answer_request(
        self, payload: str, client: ClientState, model: FlatModel
    ) -> torch.Tensor: ...
