"""The joint-training upper bound with unlimited memory.

In task t each client trains on the union of its own shards of tasks 1..t with the same
rounds and local epochs per round as every other strategy (so an epoch covers more data as
tasks accumulate). Not a continual method — the reference that bounds them.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from cfl_bench.strategies import declarations
from cfl_bench.strategies.base import Declaration, Learner


class Ideal(Learner):
    declaration: ClassVar[Declaration] = declarations.IDEAL
    needs_history: ClassVar[bool] = True

    def training_data(
        self, shards: list[tuple[torch.Tensor, torch.Tensor]]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        xs, ys = zip(*shards, strict=True)
        return torch.cat(xs), torch.cat(ys)
