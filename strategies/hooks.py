"""The hooks a component may implement, every one optional: what the engine calls on the
clients' side and on the server's, with the do-nothing default of each.

Why a module of its own: ``strategies.base.Component`` is the contract's bookkeeping
(declaration, options, set-up, state), and these are the round's hooks in the order of
docs/architecture.md, "One round" (see ``strategies.base``'s docstring). ``Component``
inherits both halves, so a component overrides a hook exactly as before. The client half
sees the client's state, the round's ``Broadcast`` and the model being trained, never the
server; the server half sees the ``ServerState``. Torch-free, as ``strategies.base``: the
tensor types are named for the type checker only.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

if TYPE_CHECKING:
    import torch

    from cfl_bench.core.context import (
        Broadcast,
        ClientState,
        LocalRound,
        ServerState,
        Upload,
    )
    from cfl_bench.core.flat import FlatModel
    from cfl_bench.core.payloads import ClientRequest


#: An evaluation classifier (``Component.evaluation_classifier``): class scores of a chunk of
#: model inputs under the model, or None while it cannot classify.
Classifier = Callable[["torch.nn.Module", "torch.Tensor"], "torch.Tensor | None"]

#: What a component's step functions need for one client's round, by name: tensors (one
#: client's, or a chunk's — shared, or stacked with a leading client axis) and numbers.
ClientInputs = dict[str, Any]


@dataclass(frozen=True)
class FrozenForward:
    """One forward without gradient a loss term reads: the model at the parameters (and
    float buffers) under the ``params`` (``buffers``) keys of the component's inputs, on the
    step's batch; ``output`` is "outputs" or "representation"; its result goes to the loss
    term under ``name``."""

    name: str
    params: str
    buffers: str
    output: str = "outputs"


class StepView(Protocol):
    """What a gradient transform may read at a local step besides the gradient: the
    parameters θ ((P,) or (C, P)), the step's buffer batch size, the stepping clients'
    own draws and the gradient of a loss at θ — each executor provides them its way
    (``engine.one_client.OneClientStep``, the vectorized executor's ``LockStep``)."""

    @property
    def params(self) -> torch.Tensor: ...

    @property
    def buffer_batch_size(self) -> int: ...

    def per_client(
        self, draw: Callable[[ClientState], torch.Tensor], idle: torch.Tensor
    ) -> torch.Tensor:
        """``draw(client)`` of the stepping client ((…) tensor), or of every client of a
        chunk stacked ((C, …); ``idle`` for clients that take no step, so they draw
        nothing from their generators)."""
        ...

    def shared(self, value: torch.Tensor) -> torch.Tensor:
        """``value`` as every client's input (a chunk: a leading client axis, expanded)."""
        ...

    def gradient(
        self, loss: Callable[..., torch.Tensor], x: torch.Tensor, *inputs: torch.Tensor
    ) -> torch.Tensor:
        """The flat gradient of ``loss(f(x; θ), *inputs)`` at θ ((P,) or (C, P): each
        client's of its own rows), the model in the step's mode (dropout as the step)."""
        ...

    def buffer_gradient(self) -> torch.Tensor | None:
        """The flat gradient at θ of the objective's loss on one draw of
        ``buffer_batch_size`` examples from each stepping client's buffer (its generator,
        then the replay augmentation, as a replay draw), the model in the step's mode; a
        chunk's client with an empty buffer has a zero row. None: no stepping client's
        buffer holds anything."""
        ...


class ClientHooks:
    """The client side of a component: its inputs to a client's round, its terms and
    transforms of the local steps, and its payloads up (``Component`` inherits them)."""

    name: ClassVar[str]  # the component's (``Component.name``)

    # -- server → client ----------------------------------------------------------------------
    def round_inputs(self, broadcast: Broadcast) -> ClientInputs | None:
        """What every client's local steps need this round, read from the broadcast alone
        (θ_g, g_ref, the ensemble's log-probabilities), so it is the same for all of them:
        an executor computes it once per round (a chunk of clients shares one copy) and
        adds each client's ``client_inputs``. None: the component does nothing on the
        clients' steps this round (its ``penalty`` and ``transform`` are not called)."""
        return {}

    def client_inputs(self, client: ClientState, local: LocalRound) -> ClientInputs:
        """What this client's steps need beyond ``round_inputs``, from its own state:
        tensors of one shape for every client (parameter-shaped (P,) ones so far), which a
        chunk stacks along a leading client axis. Called once before the client's first
        step, ``local.model`` at θ_g (only in rounds whose ``round_inputs`` is not None); it
        may update the client's state (SCAFFOLD's option I takes ∇f_k(θ_g) here)."""
        return {}

    # -- local step ---------------------------------------------------------------------------
    def frozen_forwards(self) -> tuple[FrozenForward, ...]:
        """The forwards without gradient a ``loss_term`` reads, each at parameters its
        inputs hold (FedNTD's teacher at θ_g, MOON's previous model): the executor runs
        them on the step's batch, in eval mode, and passes their results by name."""
        return ()

    def term_inputs(self) -> tuple[str, ...]:
        """The keys of this client's inputs a ``loss_term`` reads besides the frozen
        forwards (MOON's per-client weight)."""
        return ()

    def loss_term(
        self,
        outputs: torch.Tensor,
        representation: torch.Tensor | None,
        y: torch.Tensor,
        mask: torch.Tensor | None,
        values: dict[str, torch.Tensor],
    ) -> torch.Tensor | None:
        """A term of one client's local loss on its batch's ``outputs`` (and its
        ``representation`` when ``wants_representation``), differentiated by autograd:
        ``values`` holds the ``frozen_forwards`` by name and the ``term_inputs``. A pure
        function of tensors: the vectorized executor calls it inside ``vmap`` with one
        client's slice and the padded batch's row ``mask`` (None: every row is real).
        None: no term."""
        return None

    def penalty(
        self, params: torch.Tensor, grads: torch.Tensor, inputs: ClientInputs
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """A closed-form penalty on θ: the gradient with the penalty's gradient added and
        the penalty's value ((), or (C,) for a chunk), a new tensor each (``grads`` is not
        written). Why not autograd: the parameters are views of one flat vector, so ∇ of a
        penalty on θ is one fused vector op, while autograd would first have to concatenate
        every parameter tensor at every step. None: no penalty."""
        return None

    def transform(self, grads: torch.Tensor, inputs: ClientInputs, step: StepView) -> torch.Tensor:
        """The gradient after this component's transform (a new tensor; ``grads`` is not
        written)."""
        return grads

    # -- client → server ----------------------------------------------------------------------
    def after_local(self, client: ClientState, upload: Upload, local: LocalRound) -> None:
        """Add declared payloads to ``upload.extras``; ``local.model`` holds the local model."""

    def answer_request(self, payload: str, client: ClientState, model: FlatModel) -> torch.Tensor:
        """The client half of a request for ``payload`` (one of this component's payloads
        produced by "request"): ``client``'s answer with ``model`` at θ_g, in the mode the
        request asked for. A client in another process (the Flower ClientApp) runs exactly
        this, from the payload's name, without the server's state."""
        raise RuntimeError(f"'{self.name}' answers no request for {payload!r}")


class ServerHooks:
    """The server side of a component: the task's data and the round's start, its payloads
    down, what it does with uploads and after aggregation, and how θ_g is scored
    (``Component`` inherits them)."""

    # -- data ---------------------------------------------------------------------------------
    def on_task_start(self, server: ServerState, task: int, holdout: torch.Tensor | None) -> None:
        """A task's data was assigned; ``holdout`` are the inputs withheld from every client."""

    def on_holdout_labels(
        self, server: ServerState, task: int, x: torch.Tensor, y: torch.Tensor
    ) -> None:
        """Right after ``on_task_start``, when the task withholds a holdout: its inputs and
        labels (FedProj's round-0 warm-up trains on them; every other component ignores
        them — the holdout is unlabelled public data to them)."""

    def on_round_start(self, server: ServerState) -> None:
        """Before the broadcast of round ``server.round_index`` (1-based)."""

    # -- server → client ----------------------------------------------------------------------
    def broadcast(self, server: ServerState) -> dict[str, torch.Tensor]:
        """Extra tensors sent with the global model at round start (counted as bytes down)."""
        return {}

    # -- server -------------------------------------------------------------------------------
    def receive_upload(self, upload: Upload, server: ServerState) -> None:
        """Server side: collect an upload's payloads as it arrives (its tensors are only
        valid during the call: keep sums or copies, not the tensors)."""

    def aggregate(self, server: ServerState) -> None:
        """Aggregator override: refine ``server.global_params``, which holds the FedAvg mean."""

    def after_aggregate(self, server: ServerState) -> None:
        """Server hooks after aggregation (SCAFFOLD's server step, FedCurv's sums)."""

    def client_request(self, server: ServerState) -> ClientRequest | None:
        """A computation to run on some clients at the final θ_g of this round (FedGP's
        reference gradient); the executor runs it and the request's ``on_reply`` gets the
        summed answers. The server half: who is asked, and what is done with the answers;
        the client half is ``answer_request``."""
        return None

    def evaluation_classifier(self) -> Classifier | None:
        """A classifier that replaces the model's outputs when the global model is evaluated
        (iCaRL's nearest mean of exemplars): called with the model (eval mode, θ_g) and a
        chunk of model inputs, it gives class scores whose argmax is the prediction, or None
        while it cannot classify yet (the model's outputs are then scored). None: this
        component leaves evaluation alone."""
        return None

    def own_model(
        self, client: ClientState, task: int, model: FlatModel
    ) -> contextlib.AbstractContextManager[bool]:
        """For a component that declares ``scored_by_clients``: a context inside which
        ``model`` is ``client``'s own classifier for stream task ``task`` (its private
        per-task state swapped in), entered with True; with False when the client has no
        model for that task. The engine scores it on the task's test set at every task end
        (``own_acc`` records, docs/metrics.md) and restores θ_g after. Default: none."""
        return contextlib.nullcontext(False)
