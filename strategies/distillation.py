"""Server-side distillation of a logit ensemble into a model on public inputs.

Shared by FedProj (``strategies.fedproj``) and FedDF (``strategies.feddf``): both start from
the FedAvg mean and minimise, with Adam over batches of the public inputs x_pub,

    s·KL(σ(Z/T) ‖ σ(f(x_pub; θ)/T)) + γ·‖θ − anchor‖²

where Z are the teacher's logits (the mean of the clients' logits), T the temperature, s the
loss scale (T² for FedProj, Hinton's gradient-magnitude correction; 1 for FedDF, whose
authors' ``divergence`` has no T²) and γ ≥ 0 a weight-divergence term (FedProj only).

The two methods differ in how long and how they step, so the loop takes either ``epochs``
(passes over x_pub, FedProj) or ``steps`` (batches, cycling through reshuffled passes,
FedDF), an optional cosine-annealed learning rate (FedDF: lr·(1 + cos(π·t/steps))/2 at
step t, torch's ``CosineAnnealingLR`` with η_min = 0) and optional gradient-norm clipping
(FedDF's authors clip to 5).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import torch
from torch.nn import functional as F

if TYPE_CHECKING:
    from cfl_bench.core.flat import FlatModel


def teacher_log_probs(z_ens: torch.Tensor, temperature: float) -> torch.Tensor:
    """log σ(Z_ens/T), computed once per round instead of at every step."""
    return F.log_softmax(z_ens.float() / temperature, dim=1)


def kl_to_teacher(logits: torch.Tensor, teacher: torch.Tensor, temperature: float) -> torch.Tensor:
    """KL(σ(Z_ens/T) ‖ σ(f/T)), batchmean, given the teacher's log-probabilities."""
    student = F.log_softmax(logits / temperature, dim=1)
    return F.kl_div(student, teacher, reduction="batchmean", log_target=True)


def add_proximal_grad_(
    grads: torch.Tensor, params: torch.Tensor, anchor: torch.Tensor, gamma: float
) -> None:
    """Add ∇ γ·‖θ − anchor‖² = 2γ(θ − anchor) to the flat gradient.

    θ − anchor is formed first (one temporary, server side only): adding 2γθ and −2γ·anchor
    separately would cancel catastrophically for large γ and leave rounding noise at
    θ = anchor.
    """
    grads.add_(params - anchor, alpha=2.0 * gamma)


def cosine_lr(lr: float, step: int, total: int) -> float:
    """The learning rate of step ``step`` (0-based) of ``total`` under cosine annealing to 0:
    lr·(1 + cos(π·step/total))/2, the closed form of torch's ``CosineAnnealingLR``."""
    return lr * (1.0 + math.cos(math.pi * step / total)) / 2.0


def clip_grad_norm_(grads: torch.Tensor, max_norm: float) -> None:
    """Scale the flat gradient to norm ≤ ``max_norm`` — torch's ``clip_grad_norm_`` rule
    (coefficient max_norm/(‖g‖ + 1e-6), capped at 1) on the one flat vector."""
    norm = torch.linalg.vector_norm(grads)
    grads.mul_(torch.clamp(max_norm / (norm + 1e-6), max=1.0))


def batch_indices(
    n: int,
    batch_size: int,
    gen: torch.Generator,
    *,
    epochs: int | None = None,
    steps: int | None = None,
) -> Iterator[torch.Tensor]:
    """Index batches of ``n`` examples: ``epochs`` shuffled passes, or ``steps`` batches from
    as many shuffled passes as they need (a pass's last batch may be smaller, as a
    DataLoader without drop_last gives it)."""
    if (epochs is None) == (steps is None):
        raise ValueError("give exactly one of epochs and steps")
    passes = 0
    given = 0
    while (epochs is not None and passes < epochs) or (steps is not None and given < steps):
        order = torch.randperm(n, generator=gen, device=gen.device)
        passes += 1
        for start in range(0, n, batch_size):
            if steps is not None and given == steps:
                return
            given += 1
            yield order[start : start + batch_size]


def distill(
    model: FlatModel,
    x: torch.Tensor,
    teacher: torch.Tensor,
    anchor: torch.Tensor | None = None,
    *,
    temperature: float,
    lr: float,
    batch_size: int,
    gen: torch.Generator,
    gamma: float = 0.0,
    epochs: int | None = None,
    steps: int | None = None,
    scale_by_t_squared: bool = True,
    cosine: bool = False,
    clip_norm: float | None = None,
) -> None:
    """Adam on s·KL(teacher ‖ σ(f(x)/T)) + γ·‖θ − anchor‖², in place on ``model``.

    ``teacher`` holds log σ(Z/T) per row of ``x``. s = T² when ``scale_by_t_squared``, else
    1. ``anchor`` (needed when γ > 0) must not alias ``model.params``: it is a snapshot.
    A fresh optimizer each call (the methods restart it every round). Gradients are zeroed
    through the flat vector: ``Optimizer.zero_grad`` would set each ``param.grad`` to None
    and break the views into ``model.grads``.
    """
    if gamma > 0 and anchor is None:
        raise ValueError("γ > 0 needs an anchor")
    module = model.module
    was_training = module.training
    module.train()
    optimizer = torch.optim.Adam(module.parameters(), lr=lr)
    scale = temperature * temperature if scale_by_t_squared else 1.0
    batches = batch_indices(x.shape[0], batch_size, gen, epochs=epochs, steps=steps)
    try:
        for t, batch in enumerate(batches):
            if cosine and steps is not None:
                for group in optimizer.param_groups:
                    group["lr"] = cosine_lr(lr, t, steps)
            model.zero_grad()
            loss = scale * kl_to_teacher(module(x[batch]), teacher[batch], temperature)
            loss.backward()
            if gamma > 0 and anchor is not None:
                add_proximal_grad_(model.grads, model.params, anchor, gamma)
            if clip_norm is not None:
                clip_grad_norm_(model.grads, clip_norm)
            optimizer.step()
    finally:
        module.train(was_training)


def train_labelled(
    model: FlatModel,
    x: torch.Tensor,
    y: torch.Tensor,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    *,
    epochs: int,
    lr: float,
    batch_size: int,
    gen: torch.Generator,
) -> None:
    """Adam on ``loss_fn(f(x), y)`` for ``epochs`` shuffled passes, in place on ``model``:
    the server's supervised warm-up on labelled public data (FedProj's round 0), with the
    same optimiser and batching as the distillation above."""
    module = model.module
    was_training = module.training
    module.train()
    optimizer = torch.optim.Adam(module.parameters(), lr=lr)
    try:
        for batch in batch_indices(x.shape[0], batch_size, gen, epochs=epochs):
            model.zero_grad()
            loss_fn(module(x[batch]), y[batch]).backward()
            optimizer.step()
    finally:
        module.train(was_training)
