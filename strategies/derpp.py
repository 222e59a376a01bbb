"""DER++ local learner: DER plus a label-replay term on an independent buffer draw.

Buzzega et al., "Dark Experience for General Continual Learning", NeurIPS 2020, eq. (6):

    L = CE(f(x), y) + α · MSE(f(x'_b), z'_b) + β · CE(f(x''_b), y''_b)

where (x'_b, z'_b) and (x''_b, y''_b) are two *independent* draws from the reservoir (as in
Mammoth), each its own forward pass. Defaults α = 0.1, β = 0.5 (specs/algorithms.md).
"""

from __future__ import annotations

from typing import ClassVar

from cfl_bench.strategies import declarations
from cfl_bench.strategies.base import Declaration, Learner, StrategyEnv
from cfl_bench.strategies.declarations import DERPPOptions
from cfl_bench.strategies.replay import ReplayPlan, ReplayTerm


class DERPP(Learner):
    declaration: ClassVar[Declaration] = declarations.DERPP
    opts: DERPPOptions
    needs_buffer: ClassVar[bool] = True

    def setup(self, env: StrategyEnv) -> None:
        self.alpha = self.opts.alpha
        self.beta = self.opts.beta

    def replay_plan(self) -> ReplayPlan:
        """Two independent draws whenever the buffer holds anything (even at α = β = 0, so
        the buffer's generator advances the same); α · MSE to the first's stored logits
        and β · CE on the second's labels, each only when its weight is above 0."""
        terms = (ReplayTerm(0, "mse", self.alpha), ReplayTerm(1, "ce", self.beta))
        return ReplayPlan(2, tuple(t for t in terms if t.weight > 0))
