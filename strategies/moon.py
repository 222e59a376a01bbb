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
local model; z_glob and z_prev are two forwards of frozen copies in eval mode (like FedNTD's
teacher: deterministic, on their own BatchNorm statistics), skipped entirely when μ = 0.

The previous local model: after local training the client stores its parameters and
BatchNorm buffers in its state (one model per client, on the client — memory grows with the
client count). A client without one (its first round) skips the term: in FedNTD's code every
client's previous model starts as the initial global model, which in round 1 is θ_g itself,
so z_prev = z_glob and the term is the constant log 2 with zero gradient — skipping gives
the same update. (A client joining later would, in FedNTD's code, contrast with the round-0
model instead.) Nothing extra is communicated.

Defaults: τ = 0.5 (the paper and FedNTD's config/moon.json), μ = 0.1 (FedNTD's config; the
paper used μ = 5 for CIFAR-10 and 1 for CIFAR-100 / Tiny-ImageNet: ``moon:mu=5``).
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, ClassVar, cast

from strategies.base import Component, Option, Role, StrategyEnv, non_negative_float, positive_float

if TYPE_CHECKING:
    import torch

    from cfl_bench.engine.context import ClientState, LocalRound, StepContext, Upload
    from cfl_bench.flat import FlatModel


def model_contrastive_loss(
    z: torch.Tensor, z_glob: torch.Tensor, z_prev: torch.Tensor, tau: float
) -> torch.Tensor:
    """Mean over rows of −log softmax([sim(z, z_glob), sim(z, z_prev)]/τ)[0]."""
    import torch
    from torch.nn import functional as F

    z = z.flatten(1)
    positive = F.cosine_similarity(z, z_glob.flatten(1), dim=1) / tau
    negative = F.cosine_similarity(z, z_prev.flatten(1), dim=1) / tau
    logits = torch.stack((positive, negative), dim=1)
    return (torch.logsumexp(logits, dim=1) - positive).mean()


def frozen_copy(model: FlatModel) -> FlatModel:
    """A private copy of the client's architecture, in eval mode and without gradients."""
    from cfl_bench.flat import FlatModel

    frozen = FlatModel(copy.deepcopy(model.module))
    frozen.module.eval()
    frozen.module.requires_grad_(False)
    return frozen


class MOON(Component):
    name: ClassVar[str] = "moon"
    roles: ClassVar[frozenset[Role]] = frozenset({Role.LOSS_TERM})
    summary: ClassVar[str] = (
        "contrast the representation with the global model's (+) and the last local one's (−)"
    )
    paper: ClassVar[str] = "Li, He and Song, CVPR 2021 (MOON)"
    requires: ClassVar[frozenset[str]] = frozenset({"features"})
    options: ClassVar[tuple[Option, ...]] = (
        Option(
            "mu",
            0.1,
            "weight μ of the contrastive term (FedNTD's config; the paper used 5 on CIFAR-10)",
            non_negative_float,
        ),
        Option("tau", 0.5, "temperature τ of the contrastive term", positive_float),
    )

    def setup(self, env: StrategyEnv) -> None:
        self.mu = float(str(self.values["mu"]))
        self.tau = float(str(self.values["tau"]))
        self.global_model: FlatModel | None = None
        self.previous_model: FlatModel | None = None
        self.active = False  # this client has a previous local model

    def wants_representation(self) -> bool:
        return self.mu > 0

    def on_client_start(self, client: ClientState, local: LocalRound) -> None:
        """Load the frozen θ_g and the client's previous local model (when it has one)."""
        state = client.state_for(self.name)
        self.active = self.mu > 0 and "params" in state
        if not self.active:
            return
        if self.global_model is None or self.previous_model is None:
            self.global_model = frozen_copy(local.model)
            self.previous_model = frozen_copy(local.model)
        self.global_model.load(local.broadcast.params, local.broadcast.buffers)
        params = cast("torch.Tensor", state["params"])
        self.previous_model.load(params, cast("torch.Tensor", state["buffers"]))

    def loss_term(self, step: StepContext) -> torch.Tensor | None:
        import torch

        if not self.active or self.global_model is None or self.previous_model is None:
            return None
        z = step.representation
        if z is None:
            raise RuntimeError("moon needs the learner's forward to keep the representation")
        with torch.no_grad():
            # ``.float()``: fp32 under ``--amp`` autocast; the identity otherwise.
            z_glob = self.global_model.module.representation(step.x).float()
            z_prev = self.previous_model.module.representation(step.x).float()
        return self.mu * model_contrastive_loss(z, z_glob, z_prev, self.tau)

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
