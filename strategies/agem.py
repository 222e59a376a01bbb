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

from strategies.base import Learner, Option, StrategyEnv, text
from strategies.projection import conflict_coefficients
from strategies.replay import ReplayPlan, ReplayTerm

if TYPE_CHECKING:
    import torch

    from cfl_bench.engine.context import ClientState, StepContext
    from cfl_bench.flat import FlatModel


class AGEM(Learner):
    name: ClassVar[str] = "agem"
    summary: ClassVar[str] = "project the batch gradient when it conflicts with the buffer gradient"
    paper: ClassVar[str] = "Chaudhry et al., ICLR 2019 (A-GEM)"
    needs_buffer: ClassVar[bool] = True
    options: ClassVar[tuple[Option, ...]] = (
        Option(
            "agem_fill",
            "reservoir",
            "buffer filling: reservoir during training (FedGP code) or M/T per task at task end",
            text,
            choices=("reservoir", "task_end"),
        ),
    )

    def setup(self, env: StrategyEnv) -> None:
        self.fill = str(self.values["agem_fill"])
        self.num_tasks = env.num_tasks
        self._scratch: torch.Tensor | None = None

    def refine_grad(self, step: StepContext) -> None:
        import torch

        buffer = step.client.buffer
        if buffer is None or buffer.filled == 0:
            return
        grads = step.model.grads
        if self._scratch is None or self._scratch.shape != grads.shape:
            self._scratch = torch.empty_like(grads)
        g = self._scratch.copy_(grads)
        step.model.zero_grad()
        draw = buffer.sample(step.buffer_batch_size)
        assert draw is not None  # filled > 0
        replay = step.model.module(step.replay_input(draw.x))
        self.objective.loss(replay, draw.y).backward()
        # grads now holds g_b; overwrite it with g − coef·g_b without a new vector.
        coef = conflict_coefficients(g, grads)
        grads.mul_(-coef).add_(g)

    def reference_plan(self) -> ReplayPlan:
        """One buffer draw per step; g_b is the gradient of the objective's loss on it."""
        return ReplayPlan(1, (ReplayTerm(0, "ce", 1.0),))

    def offers_batches(self) -> bool:
        """reservoir: batches are offered as they are trained; task_end: not at all."""
        return self.fill == "reservoir"

    def on_task_end(self, client: ClientState, task: int, model: FlatModel) -> None:
        """task_end fill: M/T random examples of the finished task join the episodic memory."""
        import torch

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
