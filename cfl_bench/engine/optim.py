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
