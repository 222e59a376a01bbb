"""Server optimizers on the FedAvg pseudo-gradient: FedAvgM and FedOpt (FedAdam/Yogi/Adagrad).

Both treat the round's averaged update as a gradient for an optimizer that lives on the
server. With θ_old the broadcast model and θ_avg the engine's mean of the uploads
(``--weighting``), the pseudo-gradient is Δ = θ_avg − θ_old.

``fedavgm`` — Hsu, Qi and Brown, "Measuring the Effects of Non-Identical Data Distribution for
Federated Visual Classification", 2019 (server momentum):

    v   ← β·v + (θ_old − θ_avg)          (v = 0 before the first round)
    θ_g ← θ_old − η_s·v

Options ``momentum`` (β) and ``server_lr`` (η_s); defaults β = 0.7, η_s = 1: FedNTD's
config/fedavgm.json (``avgm_beta`` 0.7) and its ``algorithms/fedavgm/utils.py``, which steps
θ_g ← θ_old − v, i.e. η_s = 1. (Hsu et al. sweep β together with η_s and read the results
by the effective rate η_s/(1 − β).) β = 0 with η_s = 1 is FedAvg.

``fedopt`` — Reddi, Charles, Zaheer, Garrett, Rush, Konečný, Kumar and McMahan, "Adaptive
Federated Optimization", ICLR 2021 (Algorithm 2), per coordinate:

    m ← β1·m + (1 − β1)·Δ
    v ← v + Δ²                                  (adagrad)
    v ← β2·v + (1 − β2)·Δ²                      (adam)
    v ← v − (1 − β2)·Δ²·sign(v − Δ²)            (yogi)
    θ_g ← θ_old + η·m / (√v + τ)

with m = 0 and v = τ² before the first round (the paper requires v_{−1} ≥ τ²; τ² is the
smallest such value). Defaults β1 = 0.9, β2 = 0.99, τ = 1e-3 (the paper's experiments), and
the server rate η = the best of the paper's CIFAR-10 grid (its appendix table of best
learning rates: log10 η = −2 for FedAdam and FedYogi, −1 for FedAdagrad), resolved from
``server_opt`` when ``server_lr`` is left at ``auto``.

Choices (why):

- Algorithm 2 exactly: no bias correction (the authors' experiments ran library optimizers,
  whose Adam corrects bias and whose Adagrad has no momentum; the paper's equations do
  neither, and this component follows the equations).
- BatchNorm running statistics are not parameters: they keep the engine's mean.
- The server state (v for fedavgm; m, v for fedopt) is created at the first aggregation and
  checkpointed (``state_attributes``); θ_old is the server's model while uploads arrive,
  caught in ``receive_upload`` as FedDyn does.
"""

from __future__ import annotations

import abc
from dataclasses import replace
from typing import TYPE_CHECKING, ClassVar

import torch

from cfl_bench.strategies import declarations
from cfl_bench.strategies.base import Component, Declaration, Role, StrategyEnv
from cfl_bench.strategies.declarations import FedAvgMOptions, FedOptOptions

if TYPE_CHECKING:
    from cfl_bench.core.context import ServerState, Upload


#: The best server learning rate of Reddi et al.'s CIFAR-10 grid, per server optimizer.
CIFAR10_SERVER_LR: dict[str, float] = {"adam": 1e-2, "yogi": 1e-2, "adagrad": 1e-1}


def momentum_step(
    old: torch.Tensor, mean: torch.Tensor, v: torch.Tensor | None, beta: float, lr: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """FedAvgM: v ← βv + (θ_old − θ_avg); returns (θ_old − η_s·v, v)."""
    update = old - mean
    v = update if v is None else v.mul(beta).add_(update)
    return old - lr * v, v


def adaptive_step(
    old: torch.Tensor,
    mean: torch.Tensor,
    moments: tuple[torch.Tensor, torch.Tensor] | None,
    rule: str,
    hyper: tuple[float, float, float, float],
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """One step of Reddi et al.'s Algorithm 2; ``hyper`` = (η, β1, β2, τ). Returns θ_g and
    the new (m, v)."""
    lr, beta1, beta2, tau = hyper
    delta = mean - old
    if moments is None:
        moments = (torch.zeros_like(delta), torch.full_like(delta, tau * tau))
    m = moments[0].mul(beta1).add_(delta, alpha=1.0 - beta1)
    square = delta * delta
    if rule == "adagrad":
        v = moments[1] + square
    elif rule == "adam":
        v = moments[1].mul(beta2).add_(square, alpha=1.0 - beta2)
    else:  # yogi
        v = moments[1] - (1.0 - beta2) * square * torch.sign(moments[1] - square)
    return old + lr * m / (v.sqrt() + tau), (m, v)


class _ServerOptimizer(Component, abc.ABC):
    """An aggregator that steps from θ_old along the engine's mean."""

    roles: ClassVar[frozenset[Role]] = frozenset({Role.AGGREGATOR})

    def setup(self, env: StrategyEnv) -> None:
        self._old: torch.Tensor | None = None

    def receive_upload(self, upload: Upload, server: ServerState) -> None:
        self._old = server.global_params  # θ_old until aggregation replaces it

    def aggregate(self, server: ServerState) -> None:
        old, self._old = self._old, None
        if old is not None:
            server.global_params = self.step(old, server.global_params)

    @abc.abstractmethod
    def step(self, old: torch.Tensor, mean: torch.Tensor) -> torch.Tensor:
        """θ_g from θ_old and the engine's mean θ_avg, updating the server state."""


class FedAvgM(_ServerOptimizer):
    declaration: ClassVar[Declaration] = declarations.FEDAVGM
    opts: FedAvgMOptions
    state_attributes: ClassVar[tuple[str, ...]] = ("velocity",)

    def setup(self, env: StrategyEnv) -> None:
        super().setup(env)
        self.beta = self.opts.momentum
        self.server_lr = self.opts.server_lr
        self.velocity: torch.Tensor | None = None

    def step(self, old: torch.Tensor, mean: torch.Tensor) -> torch.Tensor:
        theta, self.velocity = momentum_step(old, mean, self.velocity, self.beta, self.server_lr)
        return theta


class FedOpt(_ServerOptimizer):
    declaration: ClassVar[Declaration] = declarations.FEDOPT
    opts: FedOptOptions
    state_attributes: ClassVar[tuple[str, ...]] = ("moments",)

    def setup(self, env: StrategyEnv) -> None:
        super().setup(env)
        self.rule = self.opts.server_opt
        if self.opts.server_lr is None:  # auto: the run's config records the resolved value
            self.opts = replace(self.opts, server_lr=CIFAR10_SERVER_LR[self.rule])
        assert self.opts.server_lr is not None
        self.hyper = (self.opts.server_lr, self.opts.beta1, self.opts.beta2, self.opts.tau)
        self.moments: tuple[torch.Tensor, torch.Tensor] | None = None

    def step(self, old: torch.Tensor, mean: torch.Tensor) -> torch.Tensor:
        theta, self.moments = adaptive_step(old, mean, self.moments, self.rule, self.hyper)
        return theta
