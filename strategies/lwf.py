"""LwF: learning without forgetting, as a loss term of the local step.

Li and Hoiem, "Learning without Forgetting", ECCV 2016 / TPAMI 2017. While a task is
trained, the model's outputs on the current batch are distilled towards those of the model
that finished the previous task (the teacher), with temperature T:

    L = L_task + λ · CE(softmax(z_old/T), softmax(z/T))      (mean over the batch)

where z are the outputs of the model being trained and z_old the teacher's on the same
inputs (eval mode, no gradient). The paper's λ_o = 1 and T = 2 are the defaults. The
paper writes the term as this cross-entropy between softened distributions, not as T²·KL
(Hinton's scaling): the gradient is that of KL(softmax(z_old/T) ‖ softmax(z/T)); the value
differs from the KL by the teacher's entropy.

Federated reading (a team decision; the paper trains one model):
- **The teacher** is the global model the client receives in its first round of a new task
  (its own task, ``ClientState.task``): with full participation, the model every client
  holds at the end of the previous task. The client keeps it in its state (one model per
  client, on the client; nothing extra is communicated). A client joining its new task
  late (partial participation) takes the θ_g it first receives then.
- **The first task** has no teacher: the term's weight is 0 (the inputs still exist, so a
  chunk of clients at different tasks trains in one vectorized step).
- **All outputs** are distilled (the paper distils the old tasks' heads; on the suite's
  single-head streams every output is an old class or a shared one).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import torch
from torch.nn import functional as F

from cfl_bench.core.objective import masked_mean
from cfl_bench.strategies import declarations
from cfl_bench.strategies.base import (
    ClientInputs,
    Component,
    Declaration,
    FrozenForward,
    StrategyEnv,
)
from cfl_bench.strategies.declarations import LwFOptions

if TYPE_CHECKING:
    from cfl_bench.core.context import Broadcast, ClientState, LocalRound


def softened_cross_entropy(
    outputs: torch.Tensor,
    teacher_outputs: torch.Tensor,
    temperature: float,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """CE(softmax(z_old/T), softmax(z/T)) per row, the mean over rows (``mask``: over a
    padded batch's real rows)."""
    target = F.softmax(teacher_outputs.flatten(1) / temperature, dim=1)
    log_student = F.log_softmax(outputs.flatten(1) / temperature, dim=1)
    per_row = -(target * log_student).sum(dim=1)
    return per_row.mean() if mask is None else masked_mean(per_row, mask)


class LwF(Component):
    declaration: ClassVar[Declaration] = declarations.LWF
    opts: LwFOptions
    requires: ClassVar[frozenset[str]] = frozenset({"class_logits"})

    def setup(self, env: StrategyEnv) -> None:
        self.weight = self.opts.weight
        self.temperature = self.opts.temperature

    def round_inputs(self, broadcast: Broadcast) -> ClientInputs | None:
        """Nothing to add at λ = 0."""
        return None if self.weight == 0 else {}

    def client_inputs(self, client: ClientState, local: LocalRound) -> ClientInputs:
        """The client's teacher (taken from the broadcast when its task changed) and the
        term's weight: 1, or 0 before any task ended (the teacher is then θ_g, unused)."""
        state = client.state_for(self.name)
        broadcast = local.broadcast
        if state.get("task", client.task) != client.task:  # a new task: θ_g ended the last
            state["teacher"] = broadcast.params.detach().clone()
            state["teacher_buffers"] = broadcast.buffers.detach().clone()
        state["task"] = client.task
        has_teacher = "teacher" in state
        return {
            "teacher": state["teacher"] if has_teacher else broadcast.params,
            "teacher_buffers": state["teacher_buffers"] if has_teacher else broadcast.buffers,
            "weight": torch.tensor(float(has_teacher), device=broadcast.params.device),
        }

    def frozen_forwards(self) -> tuple[FrozenForward, ...]:
        return (FrozenForward("teacher_outputs", "teacher", "teacher_buffers"),)

    def term_inputs(self) -> tuple[str, ...]:
        return ("weight",)

    def loss_term(
        self,
        outputs: torch.Tensor,
        representation: torch.Tensor | None,
        y: torch.Tensor,
        mask: torch.Tensor | None,
        values: dict[str, torch.Tensor],
    ) -> torch.Tensor:
        """λ · weight · CE(softmax(z_old/T), softmax(z/T))."""
        distilled = softened_cross_entropy(
            outputs, values["teacher_outputs"], self.temperature, mask
        )
        return self.weight * values["weight"] * distilled
