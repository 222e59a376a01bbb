"""DER++ local learner: DER plus a label-replay term on an independent buffer draw.

Buzzega et al., "Dark Experience for General Continual Learning", NeurIPS 2020, eq. (6):

    L = CE(f(x), y) + α · MSE(f(x'_b), z'_b) + β · CE(f(x''_b), y''_b)

where (x'_b, z'_b) and (x''_b, y''_b) are two *independent* draws from the reservoir (as in
Mammoth), each its own forward pass. Defaults α = 0.1, β = 0.5 (specs/algorithms.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from strategies.base import Learner, Option, StrategyEnv, non_negative_float
from strategies.der import der_logit_loss

if TYPE_CHECKING:
    import torch

    from cfl_bench.engine.context import StepContext


class DERPP(Learner):
    name: ClassVar[str] = "derpp"
    summary: ClassVar[str] = "DER + β·CE on the labels of a second, independent buffer draw"
    paper: ClassVar[str] = "Buzzega et al., NeurIPS 2020 (DER++)"
    needs_buffer: ClassVar[bool] = True
    options: ClassVar[tuple[Option, ...]] = (
        Option("alpha", 0.1, "weight of the logit-matching (MSE) term", non_negative_float),
        Option("beta", 0.5, "weight of the label-replay (CE) term", non_negative_float),
    )

    def setup(self, env: StrategyEnv) -> None:
        self.alpha = float(str(self.values["alpha"]))
        self.beta = float(str(self.values["beta"]))

    def loss(self, step: StepContext) -> torch.Tensor:

        loss = super().loss(step)
        buffer = step.client.buffer
        if buffer is None or buffer.filled == 0:
            return loss
        module = step.model.module
        logit_draw = buffer.sample(step.buffer_batch_size)
        label_draw = buffer.sample(step.buffer_batch_size)
        assert logit_draw is not None and label_draw is not None  # filled > 0
        if self.alpha > 0:
            replay = module(step.replay_input(logit_draw.x))
            loss = loss + self.alpha * der_logit_loss(replay, logit_draw.logits)
        if self.beta > 0:
            replay = module(step.replay_input(label_draw.x))
            loss = loss + self.beta * self.objective.loss(replay, label_draw.y)
        return loss
