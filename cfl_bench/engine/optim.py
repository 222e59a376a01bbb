"""The clients' local optimizers on flat parameter vectors: one functional update, written
once, that the sequential executor runs on one client's (P,) vector and the vectorized one
on a chunk's (C, P) rows.

Why not ``torch.optim``: with all parameters in one flat tensor the update is one or two
fused ops; a per-parameter optimizer would loop over tensors on every step. State (SGD's
momentum, Adam's moments and step count) is per client and reset at every round, as when
research code builds a fresh optimizer per local training call.

The update functions (``sgd_update``, ``adam_update``) take ``keep``: None (every row
steps) or a (C, 1) bool mask whose False rows keep their parameters and state bit for bit
(``masked``), so a chunk's finished clients take no step. Parameter axis last, as the
components' step functions (``strategies.base``).
"""

from __future__ import annotations

import torch


def masked(keep: torch.Tensor | None, updated: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
    """``updated`` on the kept rows, ``old`` (bit for bit) on the others."""
    return updated if keep is None else torch.where(keep, updated, old)


def with_weight_decay(
    grads: torch.Tensor, params: torch.Tensor, weight_decay: float
) -> torch.Tensor:
    """g + λθ (L2 added to the gradient, as ``torch.optim`` does); g itself when λ = 0."""
    return grads.add(params, alpha=weight_decay) if weight_decay else grads


def sgd_update(
    params: torch.Tensor,
    g: torch.Tensor,
    velocity: torch.Tensor | None,
    lr: float,
    momentum: float,
    keep: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(θ − η·v, v) with v ← μv + g (v₁ = g: None is the state before the first step;
    unkept rows of a first step keep v = 0), or θ − η·g without momentum."""
    if momentum:
        if velocity is None:
            fresh = g.clone()
            velocity = fresh if keep is None else torch.where(keep, fresh, 0.0)
        else:
            velocity = masked(keep, velocity.mul(momentum).add(g), velocity)
        g = velocity
    return masked(keep, params.add(g, alpha=-lr), params), velocity


def adam_update(
    params: torch.Tensor,
    g: torch.Tensor,
    moments: tuple[torch.Tensor, torch.Tensor],
    t: int,
    hyper: tuple[float, float, float, float],
    keep: torch.Tensor | None = None,
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """Adam's step ``t`` (1-based; the same Python-float bias corrections for every row):
    m ← β₁m + (1−β₁)g; s ← β₂s + (1−β₂)g²; θ ← θ − η/(1−β₁^t) · m / (√(s/(1−β₂^t)) + ε).
    ``hyper`` is (η, β₁, β₂, ε)."""
    lr, b1, b2, eps = hyper
    first, second = moments
    first = masked(keep, first.mul(b1).add(g, alpha=1 - b1), first)
    second = masked(keep, second.mul(b2).addcmul(g, g, value=1 - b2), second)
    step_size = lr / (1 - b1**t)
    denominator = (second / (1 - b2**t)).sqrt_().add_(eps)
    updated = params.addcdiv(first, denominator, value=-step_size)
    return masked(keep, updated, params), (first, second)


class FlatSGD:
    """SGD (optional momentum, weight decay) of one client's working model: the functional
    update on its flat parameters, written back in place (they are the module's views)."""

    def __init__(
        self,
        params: torch.Tensor,
        grads: torch.Tensor,
        lr: float,
        momentum: float,
        weight_decay: float,
    ) -> None:
        self.params = params
        self.grads = grads
        self.lr = lr
        self.momentum = momentum
        self.weight_decay = weight_decay
        self.velocity: torch.Tensor | None = None

    def reset(self) -> None:
        self.velocity = None

    @torch.no_grad()
    def step(self) -> None:
        g = with_weight_decay(self.grads, self.params, self.weight_decay)
        updated, self.velocity = sgd_update(self.params, g, self.velocity, self.lr, self.momentum)
        self.params.copy_(updated)


class FlatAdam:
    """Adam (Kingma & Ba, 2015) of one client's working model, restarted with every client
    update (``reset``): a client's moments describe its own local steps, as in FedProj's
    and most FL codebases' local Adam, and nothing of another client's leaks into them.
    Why it exists: a detector trained from scratch (the CARLA streams) learns several times
    faster per step with Adam than with SGD, and a round gives each client only a few steps.
    """

    def __init__(
        self,
        params: torch.Tensor,
        grads: torch.Tensor,
        lr: float,
        weight_decay: float,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
    ) -> None:
        self.params = params
        self.grads = grads
        self.lr = lr
        self.weight_decay = weight_decay
        self.betas = betas
        self.eps = eps
        self.steps = 0
        self.moments: tuple[torch.Tensor, torch.Tensor] | None = None

    def reset(self) -> None:
        self.steps, self.moments = 0, None

    @property
    def hyper(self) -> tuple[float, float, float, float]:
        """(η, β₁, β₂, ε) as ``adam_update`` takes them."""
        return (self.lr, *self.betas, self.eps)

    @torch.no_grad()
    def step(self) -> None:
        g = with_weight_decay(self.grads, self.params, self.weight_decay)
        if self.moments is None:
            self.moments = (torch.zeros_like(g), torch.zeros_like(g))
        self.steps += 1
        updated, self.moments = adam_update(self.params, g, self.moments, self.steps, self.hyper)
        self.params.copy_(updated)


LocalOptimizer = FlatSGD | FlatAdam


def local_optimizer(
    name: str,
    params: torch.Tensor,
    grads: torch.Tensor,
    lr: float,
    momentum: float,
    weight_decay: float,
) -> LocalOptimizer:
    """The clients' optimizer: ``sgd`` (with ``momentum``) or ``adam``."""
    if name == "adam":
        return FlatAdam(params, grads, lr, weight_decay)
    return FlatSGD(params, grads, lr, momentum, weight_decay)  # fmt: skip
