"""Dark Experience Replay (DER) local learner.

Buzzega et al., "Dark Experience for General Continual Learning", NeurIPS 2020:

    L = CE(f(x), y) + α · MSE(f(x_b), z_b)

where (x_b, z_b) is a draw from the reservoir of inputs and the logits the model produced
when they were stored. MSE is the mean over batch × outputs; no replay term while the buffer
is empty. The replay batch is a separate forward pass, as in Mammoth, so BatchNorm
statistics of the current batch are not mixed with the buffer's.
"""

from __future__ import annotations

from dataclasses import replace
from typing import ClassVar

from cfl_bench.strategies import declarations
from cfl_bench.strategies.base import Declaration, Learner, StrategyEnv
from cfl_bench.strategies.declarations import DEROptions
from cfl_bench.strategies.replay import ReplayPlan, ReplayTerm


def is_mnist_like(stream_name: str) -> bool:
    """Rotated/permuted digit streams use the MNIST defaults of the specs."""
    return stream_name.startswith(("rot-", "perm-"))


class DER(Learner):
    declaration: ClassVar[Declaration] = declarations.DER
    opts: DEROptions
    needs_buffer: ClassVar[bool] = True

    def setup(self, env: StrategyEnv) -> None:
        if self.opts.alpha is None:  # auto: the run's config records the resolved value
            self.opts = replace(self.opts, alpha=1.0 if is_mnist_like(env.stream_name) else 0.3)
        assert self.opts.alpha is not None
        self.alpha = self.opts.alpha

    def replay_plan(self) -> ReplayPlan:
        """One draw while α > 0 (none at all at α = 0); α · MSE to its stored logits."""
        if self.alpha <= 0:
            return ReplayPlan()
        return ReplayPlan(1, (ReplayTerm(0, "mse", self.alpha),))
