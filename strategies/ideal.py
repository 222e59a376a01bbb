"""The joint-training upper bound with unlimited memory.

In task t each client trains on the union of its own shards of tasks 1..t with the same
rounds and local epochs per round as every other strategy (so an epoch covers more data as
tasks accumulate). Not a continual method — the reference that bounds them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from strategies.base import Learner

if TYPE_CHECKING:
    import torch


class Ideal(Learner):
    name: ClassVar[str] = "ideal"
    summary: ClassVar[str] = "upper bound: each client trains on all its data of tasks 1..t"
    paper: ClassVar[str] = "joint training upper bound (as in the FedGP paper's tables)"
    needs_history: ClassVar[bool] = True

    def training_data(
        self, shards: list[tuple[torch.Tensor, torch.Tensor]]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        import torch

        xs, ys = zip(*shards, strict=True)
        return torch.cat(xs), torch.cat(ys)
