"""FedDyn: federated learning with dynamic regularisation.

Acar et al., "Federated Learning Based on Dynamic Regularization", ICLR 2021 (Algorithm 1).
Client k keeps h_k, its estimate of ∇L_k at its last local model (zeros before its first
round). In round t, from the broadcast θ_g, it minimises

    L_k(θ) − ⟨h_k, θ⟩ + (α/2)·‖θ − θ_g‖²,      extra gradient  −h_k + α·(θ − θ_g)

and after its local steps updates h_k ← h_k − α·(θ_k − θ_g). Why this sign: at a stationary
point of the local objective ∇L_k(θ_k) = h_k − α·(θ_k − θ_g), which is exactly the new h_k
— the paper's ∇L_k(θ_k^t) = ∇L_k(θ_k^{t−1}) − α(θ_k^t − θ^{t−1}) (and FedNTD's
``upload_local``).

The server keeps h (zeros at first) and, with S the round's participants and N all clients,

    h   ← h − (α/N)·Σ_{k∈S} (θ_k − θ_g^old)
    θ_g ← (1/|S|)·Σ_{k∈S} θ_k − h/α

The mean is the paper's unweighted one (option ``mean=uniform``); ``mean=weighted`` takes the
engine's FedAvg mean instead (``--weighting``, samples by default — the FedNTD code's
choice). BatchNorm statistics are not parameters: they take the engine's mean. h_k never
leaves the client and h never leaves the server, so FedDyn communicates nothing besides
the model. Default α = 0.1 (FedNTD's config/feddyn.json ``dyn_alpha``; the authors' CIFAR-10
example used 0.01, scaled per client by its share of the data).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, cast

import torch

from cfl_bench.strategies import declarations
from cfl_bench.strategies.base import ClientInputs, Component, Declaration, StrategyEnv
from cfl_bench.strategies.declarations import FedDynOptions
from cfl_bench.strategies.projection import row_dot

if TYPE_CHECKING:
    from cfl_bench.core.context import Broadcast, ClientState, LocalRound, ServerState, Upload


def dynamic_penalty(
    params: torch.Tensor,
    grads: torch.Tensor,
    anchor: torch.Tensor,
    h: torch.Tensor,
    alpha: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(∇ − h + α(θ − θ_g), −⟨h, θ⟩ + (α/2)‖θ − θ_g‖²), parameter axis last: θ, ∇ and h
    one client's (P,) or a chunk's (C, P), θ_g (P,)."""
    diff = params - anchor
    grads = grads.add(diff, alpha=alpha).sub_(h)
    return grads, 0.5 * alpha * row_dot(diff, diff) - row_dot(h, params)


class FedDyn(Component):
    declaration: ClassVar[Declaration] = declarations.FEDDYN
    opts: FedDynOptions
    uses_after_local: ClassVar[bool] = True
    # h: the server's linear-term state. The per-round sums are empty at every round end,
    # where checkpoints are written, so they need no saving.
    state_attributes: ClassVar[tuple[str, ...]] = ("h",)

    def setup(self, env: StrategyEnv) -> None:
        self.alpha = self.opts.alpha
        self.mean = self.opts.mean
        self.h: torch.Tensor | None = None
        self._sum: torch.Tensor | None = None
        self._count = 0
        self._old: torch.Tensor | None = None

    # -- client -------------------------------------------------------------------------------
    def round_inputs(self, broadcast: Broadcast) -> ClientInputs:
        """θ_g: the proximal part's anchor."""
        return {"anchor": broadcast.params}

    def client_inputs(self, client: ClientState, local: LocalRound) -> ClientInputs:
        """The client's h_k (zeros before its first round)."""
        state = client.state_for(self.name)
        if "h" not in state:
            state["h"] = torch.zeros_like(local.broadcast.params)
        return {"h": state["h"]}

    def penalty(
        self, params: torch.Tensor, grads: torch.Tensor, inputs: ClientInputs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return dynamic_penalty(params, grads, inputs["anchor"], inputs["h"], self.alpha)

    def after_local(self, client: ClientState, upload: Upload, local: LocalRound) -> None:
        """h_k ← h_k − α(θ_k − θ_g): the local gradient at θ_k when training converged."""
        h = cast("torch.Tensor", client.state_for(self.name)["h"])
        h.sub_(local.model.params - local.broadcast.params, alpha=self.alpha)

    # -- server -------------------------------------------------------------------------------
    def receive_upload(self, upload: Upload, server: ServerState) -> None:
        """Sum θ_k as it arrives (the upload is only valid during the call); θ_g^old is the
        server's model until aggregation replaces it."""
        if self._sum is None:
            self._sum = torch.zeros_like(upload.params)
            self._old = server.global_params
        self._sum.add_(upload.params)
        self._count += 1

    def aggregate(self, server: ServerState) -> None:
        """h ← h − (α/N)Σ(θ_k − θ_g^old); θ_g ← mean − h/α."""
        total, count, old = self._sum, self._count, self._old
        self._sum, self._count, self._old = None, 0, None
        if total is None or old is None or count == 0:
            return
        if self.h is None:
            self.h = torch.zeros_like(total)
        n = len(server.clients)
        self.h.sub_(total - count * old, alpha=self.alpha / n)
        mean = total.div_(count) if self.mean == "uniform" else server.global_params
        server.global_params = mean - self.h / self.alpha
