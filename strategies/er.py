"""Experience Replay (ER) local learner.

Chaudhry et al., "On Tiny Episodic Memories in Continual Learning", 2019 (reservoir ER):

    L = CE(f(x), y) + CE(f(x_b), y_b)

with (x_b, y_b) m examples drawn from the client's reservoir (no replay term while it is
empty). The replay batch is a separate forward pass and its CE is added, as the spec says;
Mammoth's ER instead concatenates batch and replay into one forward and averages CE over
their union, which weights the two halves by their sizes rather than equally.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from strategies.base import Learner

if TYPE_CHECKING:
    import torch

    from cfl_bench.engine.context import StepContext


class ER(Learner):
    name: ClassVar[str] = "er"
    summary: ClassVar[str] = "CE on the batch + CE on a reservoir buffer draw"
    paper: ClassVar[str] = "Chaudhry et al., 2019 (tiny episodic memories, reservoir ER)"
    needs_buffer: ClassVar[bool] = True

    def loss(self, step: StepContext) -> torch.Tensor:

        loss = super().loss(step)
        buffer = step.client.buffer
        if buffer is not None and buffer.filled > 0:
            draw = buffer.sample(step.buffer_batch_size)
            assert draw is not None  # filled > 0
            replay = step.model.module(step.replay_input(draw.x))
            loss = loss + self.objective.loss(replay, draw.y)
        return loss
