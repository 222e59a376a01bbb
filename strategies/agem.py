"""Averaged GEM (A-GEM) local learner.

Chaudhry et al., "Efficient Lifelong Learning with A-GEM", ICLR 2019. With g the gradient
of the batch loss and g_b the gradient of CE on m buffer samples (same parameters):

    g ← g − (g·g_b / g_b·g_b) · g_b    only where g·g_b < 0

Option ``agem_fill``: ``reservoir`` (FedGP code, default) fills the buffer by reservoir
during training, so projection starts from the second step of task 1; ``task_end`` (the
original A-GEM) fills it at the end of each task with M/T samples of that task and trains
with plain SGD during task 1.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import torch

from cfl_bench.strategies import declarations
from cfl_bench.strategies.base import Declaration, Learner, StepView, StrategyEnv
from cfl_bench.strategies.declarations import AGEMOptions
from cfl_bench.strategies.projection import projected

if TYPE_CHECKING:
    from cfl_bench.core.context import ClientState
    from cfl_bench.core.flat import FlatModel


class AGEM(Learner):
    declaration: ClassVar[Declaration] = declarations.AGEM
    opts: AGEMOptions
    needs_buffer: ClassVar[bool] = True

    def setup(self, env: StrategyEnv) -> None:
        self.fill = self.opts.agem_fill
        self.num_tasks = env.num_tasks

    def refine(self, g: torch.Tensor, view: StepView) -> torch.Tensor:
        """g − coef·g_b with g_b the objective's gradient on one buffer draw (``view``),
        coef = g·g_b / g_b·g_b where g·g_b < 0 and 0 elsewhere; g as it is while the buffer
        is empty. One client (P,) or a chunk (C, P), where an empty buffer's zero row of g_b
        gives coef = 0."""
        g_b = view.buffer_gradient()
        return g if g_b is None else projected(g, g_b)

    def offers_batches(self) -> bool:
        """reservoir: batches are offered as they are trained; task_end: not at all."""
        return self.fill == "reservoir"

    def on_task_end(self, client: ClientState, task: int, model: FlatModel) -> None:
        """task_end fill: M/T random examples of the finished task join the episodic memory."""
        buffer = client.buffer
        if (
            self.fill != "task_end"
            or buffer is None
            or client.train_x is None
            or client.train_y is None
        ):
            return
        per_task = max(1, buffer.capacity // self.num_tasks)
        count = min(per_task, client.num_samples, buffer.capacity - buffer.filled)
        if count <= 0:
            return
        device = client.train_y.device
        idx = torch.randperm(client.num_samples, generator=client.generator, device=device)[:count]
        x = client.inputs(idx)
        with torch.inference_mode():
            logits = model.module(x)
        buffer.append(x, client.train_y[idx], logits, task)
