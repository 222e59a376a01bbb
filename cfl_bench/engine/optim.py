"""Plain SGD (optional momentum, weight decay) on the flat parameter vector.

Why not ``torch.optim.SGD``: with all parameters in one flat tensor the update is one or two
fused ops; a per-parameter optimizer would loop over tensors on every step. Momentum state
is per client and reset at every round, as when research code builds a fresh optimizer per
local training call.
"""

from __future__ import annotations

import torch


class FlatSGD:
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
        g = self.grads
        if self.weight_decay:
            g = g.add(self.params, alpha=self.weight_decay)
        if self.momentum:
            if self.velocity is None:
                self.velocity = g.clone()
            else:
                self.velocity.mul_(self.momentum).add_(g)
            g = self.velocity
        self.params.add_(g, alpha=-self.lr)


class FlatAdam:
    """Adam (Kingma & Ba, 2015) on the flat parameter vector, restarted with every client
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
        self.first: torch.Tensor | None = None
        self.second: torch.Tensor | None = None

    def reset(self) -> None:
        self.steps, self.first, self.second = 0, None, None

    @torch.no_grad()
    def step(self) -> None:
        g = self.grads
        if self.weight_decay:  # L2 added to the gradient, as torch.optim.Adam does
            g = g.add(self.params, alpha=self.weight_decay)
        b1, b2 = self.betas
        if self.first is None or self.second is None:
            self.first, self.second = torch.zeros_like(g), torch.zeros_like(g)
        self.steps += 1
        self.first.mul_(b1).add_(g, alpha=1 - b1)
        self.second.mul_(b2).addcmul_(g, g, value=1 - b2)
        step_size = self.lr / (1 - b1**self.steps)
        denominator = (self.second / (1 - b2**self.steps)).sqrt_().add_(self.eps)
        self.params.addcdiv_(self.first, denominator, value=-step_size)


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
