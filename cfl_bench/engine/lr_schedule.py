"""Learning-rate schedules that restart at every task (``--lr-schedule task-*``).

Why: the data-free FCL codes anneal the clients' learning rate within each task and start
again at the next one, with a fresh optimizer per task: LANDER's ``_fl_train`` steps a
``CosineAnnealingLR(optimizer, com_round, eta_min=1e-3)`` once per round (``methods/
lander.py`` 719–745), MFCL's ``main.py`` (41, 66) trains round i of a task's R with
lr·exp(i/R · ln(lr_end/lr)), lr_end 0.01. The suite's ``--lr-decay`` is one exponential over
the whole run, which neither code runs. Torch-free: the plan builds one, a client update
reads the round's rate from it.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

#: ``--lr-schedule`` values: ``run`` is ``--lr-decay``'s one exponential over the run.
LR_SCHEDULES = ("run", "task-cosine", "task-exponential")


@dataclass(frozen=True)
class TaskLR:
    """A per-task schedule from the run's lr to ``end``: ``starts`` the first 0-based round
    of each task, ``lengths`` its rounds (the first task's include ``--lead-rounds``)."""

    kind: str
    end: float
    starts: tuple[int, ...]
    lengths: tuple[int, ...]

    def __post_init__(self) -> None:
        assert self.kind in LR_SCHEDULES[1:], f"not a per-task schedule: {self.kind}"
        assert len(self.starts) == len(self.lengths) > 0 and self.starts[0] == 0

    def lr(self, base: float, round_index: int) -> float:
        """The rate of 1-based run round ``round_index``: its task's round i of R (0-based)
        gives ``end + (base − end)(1 + cos(π i/R))/2`` (cosine) or
        ``base · exp(i/R · ln(end/base))`` (exponential)."""
        round_ = round_index - 1
        task = max(bisect.bisect_right(self.starts, round_) - 1, 0)
        i, length = round_ - self.starts[task], self.lengths[task]
        if self.kind == "task-cosine":
            return self.end + (base - self.end) * (1 + math.cos(math.pi * i / length)) / 2
        return base * math.exp(i / length * math.log(self.end / base))
