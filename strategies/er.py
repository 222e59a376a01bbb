"""Experience Replay (ER) local learner.

Chaudhry et al., "On Tiny Episodic Memories in Continual Learning", 2019 (reservoir ER):

    L = CE(f(x), y) + CE(f(x_b), y_b)

with (x_b, y_b) m examples drawn from the client's reservoir (no replay term while it is
empty). The replay batch is a separate forward pass and its CE is added, as the spec says;
Mammoth's ER instead concatenates batch and replay into one forward and averages CE over
their union, which weights the two halves by their sizes rather than equally.
"""

from __future__ import annotations

from typing import ClassVar

from cfl_bench.strategies import declarations
from cfl_bench.strategies.base import Declaration, Learner
from cfl_bench.strategies.replay import ReplayPlan, ReplayTerm


class ER(Learner):
    declaration: ClassVar[Declaration] = declarations.ER
    needs_buffer: ClassVar[bool] = True

    def replay_plan(self) -> ReplayPlan:
        """One draw; the objective's loss on its stored labels, weight 1."""
        return ReplayPlan(1, (ReplayTerm(0, "ce", 1.0),))
