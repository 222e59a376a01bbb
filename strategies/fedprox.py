"""FedProx proximal term.

Li et al., "Federated Optimization in Heterogeneous Networks", MLSys 2020:

    L_k(θ) + (μ/2) · ‖θ − θ_g‖²,      ∇ = μ · (θ − θ_g)

θ_g is the global model the round started from (frozen), over trainable parameters only
(BatchNorm statistics are not parameters). Default μ = 0.01 (specs); FedNTD's code used
μ = 1.0 for its FedProx baseline — pass ``fedprox:mu=1`` to reproduce it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from cfl_bench.strategies import declarations
from cfl_bench.strategies.base import ClientInputs, Component, Declaration, StrategyEnv
from cfl_bench.strategies.declarations import FedProxOptions
from cfl_bench.strategies.projection import row_dot

if TYPE_CHECKING:
    import torch

    from cfl_bench.core.context import Broadcast


def proximal_penalty(
    params: torch.Tensor, grads: torch.Tensor, anchor: torch.Tensor, mu: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(∇ + μ(θ − θ_g), (μ/2)‖θ − θ_g‖²), parameter axis last: θ and ∇ one client's (P,)
    or a chunk's (C, P), θ_g (P,)."""
    diff = params - anchor
    return grads.add(diff, alpha=mu), 0.5 * mu * row_dot(diff, diff)


class FedProx(Component):
    declaration: ClassVar[Declaration] = declarations.FEDPROX
    opts: FedProxOptions

    def setup(self, env: StrategyEnv) -> None:
        self.mu = self.opts.mu

    def round_inputs(self, broadcast: Broadcast) -> ClientInputs:
        """The broadcast θ_g: the round's starting point."""
        return {"anchor": broadcast.params}

    def penalty(
        self, params: torch.Tensor, grads: torch.Tensor, inputs: ClientInputs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return proximal_penalty(params, grads, inputs["anchor"], self.mu)
