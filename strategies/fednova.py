"""FedNova: normalised averaging, so clients that take more local steps do not pull θ_g
toward their own objective.

Wang, Liu, Liang, Joshi and Poor, "Tackling the Objective Inconsistency Problem in
Heterogeneous Federated Optimization", NeurIPS 2020. Client k takes τ_k local steps from θ_g
and uploads θ_k with τ_k (payload ``fednova.tau``, a one-element tensor, counted as bytes up).
With p_k = n_k / Σ_{j∈S} n_j the data-size weights of the round's participants S and a_k the
ℓ1 norm of client k's normalising vector, the server sets

    d_k   = (θ_g^old − θ_k) / a_k                 (the client's step-averaged update)
    τ_eff = Σ_k p_k · a_k
    θ_g   ← θ_g^old − τ_eff · Σ_k p_k · d_k

For plain local SGD a_k = τ_k. With SGD momentum ρ (heavy ball, v ← ρv + g, θ ← θ − ηv,
velocity restarted every round: ``engine.optim.FlatSGD``) the s-th gradient of a round moves
θ by η(1 − ρ^{τ−s+1})/(1 − ρ), and the sum of these coefficients is the paper's

    a_k = [τ_k − ρ(1 − ρ^{τ_k})/(1 − ρ)] / (1 − ρ).

With equal τ_k this is FedAvg exactly (τ_eff = a_k for every k); with τ = 2 and 6 and equal
data, plain SGD weighs the two updates 1 and 1/3 (p·τ_eff/a_k with τ_eff = 4), where FedAvg
weighs both 1/2 and lets the 6-step client dominate.

Choices (why):

- ρ is the run's ``--momentum`` (``StrategyEnv.momentum``), so a_k describes the optimizer
  the clients actually ran. Weight decay only adds λθ to the gradient before momentum, so it
  is part of the "gradient" the vector normalises and needs no term of its own.
- Local Adam is refused: its step is not a fixed linear combination of the gradients, so no
  normalising vector exists.
- p_k are always data-size weights (the paper's), whatever ``--weighting`` says; BatchNorm
  running statistics are not parameters and keep the engine's ``--weighting`` mean.
- A client with no data (τ_k = 0, n_k = 0) has weight zero and is skipped.
- The server keeps nothing between rounds (its sums are emptied at every aggregation), so
  FedNova has no checkpointed state.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import torch

from cfl_bench.core.errors import UserError
from cfl_bench.strategies import declarations
from cfl_bench.strategies.base import Component, Declaration, StrategyEnv

if TYPE_CHECKING:
    from cfl_bench.core.context import ClientState, LocalRound, ServerState, Upload

TAU = "fednova.tau"


def momentum_steps(steps: int, momentum: float) -> float:
    """‖a‖₁ of ``steps`` heavy-ball SGD steps with momentum ρ: the total weight the round's
    gradients get in θ_g − θ_k, in units of η (``steps`` itself when ρ = 0)."""
    if momentum == 0.0:
        return float(steps)
    rho = momentum
    return (steps - rho * (1.0 - rho**steps) / (1.0 - rho)) / (1.0 - rho)


def refuse_adam(env: StrategyEnv, name: str, why: str) -> None:
    """Refuse a component whose update assumes local SGD when the clients run Adam."""
    if env.optimizer != "sgd":
        raise UserError(
            f"'{name}' {why}, but this run's clients use --optimizer {env.optimizer}; "
            f"use --optimizer sgd or drop '{name}'."
        )


class FedNova(Component):
    declaration: ClassVar[Declaration] = declarations.FEDNOVA
    uses_after_local: ClassVar[bool] = True

    def setup(self, env: StrategyEnv) -> None:
        refuse_adam(env, self.name, "normalises local SGD steps")
        self.momentum = float(env.momentum)
        self._reset()

    def _reset(self) -> None:
        # Σ n_k (θ_old − θ_k)/a_k, Σ n_k a_k, Σ n_k over the round's uploads; θ_old.
        self._direction: torch.Tensor | None = None
        self._steps_sum = 0.0
        self._samples = 0.0
        self._old: torch.Tensor | None = None
        self._round = -1

    # -- client -------------------------------------------------------------------------------
    def after_local(self, client: ClientState, upload: Upload, local: LocalRound) -> None:
        """Upload τ_k, the local steps this client took."""
        upload.extras[TAU] = torch.tensor([float(local.steps)], device=local.broadcast.device)

    # -- server -------------------------------------------------------------------------------
    def receive_upload(self, upload: Upload, server: ServerState) -> None:
        """Fold n_k·(θ_old − θ_k)/a_k and n_k·a_k into the round's sums."""
        if self._round != server.round_index:  # a new round: nothing of an earlier one
            self._reset()
            self._round = server.round_index
        self._old = server.global_params  # θ_g^old until aggregation replaces it
        tau = round(float(upload.extras[TAU].item()))
        n = float(upload.num_samples)
        if tau <= 0 or n <= 0:
            return
        a = momentum_steps(tau, self.momentum)
        if self._direction is None:
            self._direction = torch.zeros_like(upload.params)
        self._direction.add_(self._old - upload.params, alpha=n / a)
        self._steps_sum += n * a
        self._samples += n

    def aggregate(self, server: ServerState) -> None:
        """θ_g ← θ_old − τ_eff·Σ p_k d_k (replacing the engine's mean of the parameters)."""
        direction, old, samples = self._direction, self._old, self._samples
        tau_eff = self._steps_sum / samples if samples > 0 else 0.0
        self._reset()
        if direction is None or old is None:
            return
        server.global_params = old - direction.mul_(tau_eff / samples)
