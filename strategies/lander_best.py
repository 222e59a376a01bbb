"""LANDER's end-of-task restore of the lowest-loss round-start model (``best_model``).

Code: tmtuan1307/LANDER, ``methods/lander.py``. Every round of ``_fl_train`` (715–771) the
clients return ``total_loss``, the sum of their first local epoch's step losses
(``_local_update`` 797–800, ``_local_finetune`` 864–869, ``if iter == 0``); when the round's
sum over its clients is below the task's lowest, the server keeps a copy of the model the
round *started* from (``self._network`` before this round's average is loaded, 748–751);
after the task's last round it loads that copy (771), so the task-end model that is
evaluated, distilled by the next task's clients and inverted by the synthesis is the
round-start model whose round trained with the lowest first-epoch loss. The last round's
average is never a candidate.

Here: each client uploads its first epoch's summed loss (``lander.loss``, one float: the
engine's ``LocalRound.first_epoch_loss``); the server sums a round's uploads, keeps the
round-start θ_g and its buffers when the sum is the task's lowest, and replaces θ_g with
them after the task's last aggregation, before the synthesis.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from cfl_bench.core.context import ServerState

#: The upload that carries a client's first-epoch summed loss.
LOSS = "lander.loss"


@dataclass
class LowestLossStart:
    """A task's lowest round loss so far and the round-start model it came from (the
    checkpointed part: ``state``), and the current round's running sum (rebuilt from the
    round's uploads, so not state)."""

    lowest: float = math.inf
    params: torch.Tensor | None = None
    buffers: torch.Tensor | None = None
    round_index: int = -1
    round_loss: torch.Tensor | None = None
    round_start: tuple[torch.Tensor, torch.Tensor] | None = field(default=None, repr=False)

    def add(self, loss: torch.Tensor, server: ServerState) -> None:
        """Fold one client's loss into its round's sum; the round's first upload also
        copies the round-start θ_g (aggregation has not replaced it yet)."""
        if self.round_index != server.round_index:
            self.round_index = server.round_index
            self.round_loss = torch.zeros((), device=loss.device)
            self.round_start = (server.global_params.clone(), server.global_buffers.clone())
        assert self.round_loss is not None
        self.round_loss += loss.sum()

    def close_round(self, server: ServerState) -> None:
        """Keep the round's start when its summed loss is the task's lowest (strictly, as
        the code's ``<``); at the task's end, load the kept model into θ_g and start over."""
        if self.round_index == server.round_index and self.round_loss is not None:
            total = float(self.round_loss)  # once a round, on the server
            if total < self.lowest:
                assert self.round_start is not None
                self.lowest = total
                self.params, self.buffers = self.round_start
        self.round_loss, self.round_start = None, None
        if server.is_task_end:
            if self.params is not None and self.buffers is not None:
                server.global_params, server.global_buffers = self.params, self.buffers
            self.lowest, self.params, self.buffers = math.inf, None, None

    def state(self) -> dict[str, object]:
        return {"lowest": self.lowest, "params": self.params, "buffers": self.buffers}

    def load(self, state: dict[str, object]) -> None:
        self.lowest = float(state["lowest"])  # type: ignore[arg-type]
        self.params = state["params"]  # type: ignore[assignment]
        self.buffers = state["buffers"]  # type: ignore[assignment]
