"""MOON: model-contrastive federated learning.

Li, He and Song, "Model-Contrastive Federated Learning", CVPR 2021. With z the
representation of the batch under the local model being trained, z_glob under the frozen
global model the round started from and z_prev under the client's own previous local model
(frozen), sim the cosine similarity and τ a temperature:

    ℓ_con = −log( e^{sim(z, z_glob)/τ} / (e^{sim(z, z_glob)/τ} + e^{sim(z, z_prev)/τ}) )

averaged over the batch; the local loss is the learner's CE + μ·ℓ_con. It pulls the local
representation toward the global model's and pushes it away from the client's last one.

Representation: the features the model's classifier reads (``representation(x)``, the
``features`` model capability), as in FedNTD's code, which contrasts the penultimate
features (MOON's own model adds a projection head; no model here has one). z comes from the
learner's own forward (``StepContext.representation``), so MOON adds no forward pass of the
local model; z_glob and z_prev are two ``FrozenForward``s the executor runs in eval mode
(like FedNTD's teacher: deterministic, on their own BatchNorm statistics), none at μ = 0.

The previous local model: after local training the client stores its parameters and
BatchNorm buffers in its state (one model per client, on the client — memory grows with the
client count). A client without one (its first round) skips the term: in FedNTD's code every
client's previous model starts as the initial global model, which in round 1 is θ_g itself,
so z_prev = z_glob and the term is the constant log 2 with zero gradient — skipping gives
the same update. The skip is a per-client weight of 0 (``client_inputs``), so a chunk of
clients with and without previous models trains in one vmapped step. (A client joining
later would, in FedNTD's code, contrast with the round-0 model instead.) Nothing extra is
communicated.

Defaults: τ = 0.5 (the paper and FedNTD's config/moon.json), μ = 0.1 (FedNTD's config; the
paper used μ = 5 for CIFAR-10 and 1 for CIFAR-100 / Tiny-ImageNet: ``moon:mu=5``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, cast

import torch
from torch.nn import functional as F

from cfl_bench.core.objective import masked_mean
from cfl_bench.strategies import declarations
from cfl_bench.strategies.base import (
    ClientInputs,
    Component,
    Declaration,
    FrozenForward,
    StrategyEnv,
)
from cfl_bench.strategies.declarations import MOONOptions

if TYPE_CHECKING:
    from cfl_bench.core.context import Broadcast, ClientState, LocalRound, Upload


def model_contrastive_loss(
    z: torch.Tensor,
    z_glob: torch.Tensor,
    z_prev: torch.Tensor,
    tau: float,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Mean over rows of −log softmax([sim(z, z_glob), sim(z, z_prev)]/τ)[0] (``mask``: over
    a padded batch's real rows)."""
    z = z.flatten(1)
    positive = F.cosine_similarity(z, z_glob.flatten(1), dim=1) / tau
    negative = F.cosine_similarity(z, z_prev.flatten(1), dim=1) / tau
    logits = torch.stack((positive, negative), dim=1)
    per_row = torch.logsumexp(logits, dim=1) - positive
    return per_row.mean() if mask is None else masked_mean(per_row, mask)


class MOON(Component):
    declaration: ClassVar[Declaration] = declarations.MOON
    opts: MOONOptions
    uses_after_local: ClassVar[bool] = True
    requires: ClassVar[frozenset[str]] = frozenset({"features"})

    def setup(self, env: StrategyEnv) -> None:
        self.mu = self.opts.mu
        self.tau = self.opts.tau

    def wants_representation(self) -> bool:
        return self.mu > 0

    def round_inputs(self, broadcast: Broadcast) -> ClientInputs | None:
        """θ_g and its buffers (z_glob); None: no term at μ = 0."""
        if self.mu == 0:
            return None
        return {"global": broadcast.params, "global_buffers": broadcast.buffers}

    def client_inputs(self, client: ClientState, local: LocalRound) -> ClientInputs:
        """The client's previous local model (z_prev) and the term's weight: 1, or 0 for a
        client without a previous model (its z_prev is then taken at θ_g, unused)."""
        state = client.state_for(self.name)
        active = "params" in state
        broadcast = local.broadcast
        return {
            "previous": state["params"] if active else broadcast.params,
            "previous_buffers": state["buffers"] if active else broadcast.buffers,
            "weight": torch.tensor(float(active), device=broadcast.params.device),
        }

    def frozen_forwards(self) -> tuple[FrozenForward, ...]:
        return (
            FrozenForward("z_glob", "global", "global_buffers", "representation"),
            FrozenForward("z_prev", "previous", "previous_buffers", "representation"),
        )

    def term_inputs(self) -> tuple[str, ...]:
        return ("weight",)

    def loss_term(
        self,
        outputs: torch.Tensor,
        representation: torch.Tensor | None,
        y: torch.Tensor,
        mask: torch.Tensor | None,
        values: dict[str, torch.Tensor],
    ) -> torch.Tensor:
        """μ · weight · ℓ_con(z, z_glob, z_prev)."""
        if representation is None:
            raise RuntimeError("moon needs the learner's forward to keep the representation")
        contrast = model_contrastive_loss(
            representation, values["z_glob"], values["z_prev"], self.tau, mask
        )
        return self.mu * values["weight"] * contrast

    def after_local(self, client: ClientState, upload: Upload, local: LocalRound) -> None:
        """Keep the local model as this client's next previous model (when μ > 0)."""
        if self.mu == 0:
            return
        state = client.state_for(self.name)
        params, buffers = local.model.params, local.model.buffers
        if "params" in state:
            cast("torch.Tensor", state["params"]).copy_(params)
            cast("torch.Tensor", state["buffers"]).copy_(buffers)
        else:
            state["params"] = params.detach().clone()
            state["buffers"] = buffers.detach().clone()
