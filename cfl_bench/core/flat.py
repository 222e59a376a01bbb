"""One flat vector for all parameters, one for all gradients, one for all buffers.

Why: every method in this suite (FedAvg, projections, FedCurv, FedProx, IFA) is an equation
on the flat parameter vector. Making each ``nn.Parameter`` a *view* into one contiguous
tensor means loading a client's model is one ``copy_``, aggregation is one weighted sum,
the optimizer step is one ``add_`` and a projection is two dot products — with no per-step
concatenation or scattering. Gradients accumulate straight into the flat gradient because
each ``param.grad`` is a view into it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class ParamSlice:
    """Where one named parameter lives inside the flat vector."""

    name: str
    start: int
    numel: int
    shape: tuple[int, ...]


class FlatModel:
    """Wraps a module so its trainable parameters and float buffers are flat views.

    ``params``  — flat trainable parameters (θ), in ``parameters()`` order.
    ``grads``   — flat gradient, same layout; backward accumulates into it.
    ``buffers`` — flat float buffers (BatchNorm running stats), averaged like weights.
    """

    def __init__(self, module: nn.Module) -> None:
        self.module = module
        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        if not named:
            raise ValueError("model has no trainable parameters")
        device = named[0][1].device
        dtype = named[0][1].dtype
        total = sum(p.numel() for _, p in named)
        self.params = torch.empty(total, device=device, dtype=dtype)
        self.grads = torch.zeros(total, device=device, dtype=dtype)
        slices: list[ParamSlice] = []
        offset = 0
        with torch.no_grad():
            for name, p in named:
                n = p.numel()
                self.params[offset : offset + n].copy_(p.detach().reshape(-1))
                p.data = self.params[offset : offset + n].view_as(p)
                p.grad = self.grads[offset : offset + n].view_as(p)
                slices.append(ParamSlice(name, offset, n, tuple(p.shape)))
                offset += n
        self.slices: tuple[ParamSlice, ...] = tuple(slices)
        float_buffers = [
            b for _, b in module.named_buffers() if b is not None and b.is_floating_point()
        ]
        nbuf = sum(b.numel() for b in float_buffers)
        self.buffers = torch.empty(nbuf, device=device, dtype=dtype)
        offset = 0
        with torch.no_grad():
            for b in float_buffers:
                n = b.numel()
                self.buffers[offset : offset + n].copy_(b.reshape(-1))
                b.data = self.buffers[offset : offset + n].view_as(b)
                offset += n

    @property
    def num_params(self) -> int:
        return self.params.numel()

    def zero_grad(self) -> None:
        self.grads.zero_()

    def load(self, params: torch.Tensor, buffers: torch.Tensor | None = None) -> None:
        """Load a flat state into the module in place (no new module, no deep copy)."""
        self.params.copy_(params)
        if buffers is not None and buffers.numel():
            self.buffers.copy_(buffers)

    def check_views(self) -> bool:
        """True while every parameter and its gradient still alias the flat tensors."""
        for p, s in zip(
            (p for p in self.module.parameters() if p.requires_grad), self.slices, strict=True
        ):
            if p.data_ptr() != self.params[s.start :].data_ptr():
                return False
            if p.grad is None or p.grad.data_ptr() != self.grads[s.start :].data_ptr():
                return False
        return True
