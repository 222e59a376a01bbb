"""Online EWC: elastic weight consolidation with one running Fisher, as a closed-form
penalty of the local step.

Schwarz et al., "Progress & Compress: A scalable framework for continual learning", ICML
2018 (online EWC; Kirkpatrick et al. 2017 for EWC). After task t the diagonal Fisher F_t
of the task's loss is folded into one running importance and the parameters are anchored:

    F* ← γ · F* + F_t,        θ* ← θ after task t
    L = L_task + (λ/2) · Σ_i F*_i (θ_i − θ*_i)²,      ∇ = λ · F* ⊙ (θ − θ*)

with decay γ ≤ 1 (γ = 1: every task weighs the same; the paper's γ < 1 forgets old
importance). Defaults λ = 100, γ = 1 and 256 Fisher examples (team choices: the paper
tunes λ per benchmark; its Atari λ does not carry over to these streams).

Federated reading (a team decision):
- **F_t is each client's own**, the mean over batches of the squared gradient of the
  objective's loss (``fedcurv.diagonal_fisher``, eval mode) on up to ``samples`` of its
  current examples (whole batches of the run's batch size, drawn from its own generator),
  at its local model after every round it trains (``after_local``): the last one before
  its task changes is the task's F_t. Nothing is communicated.
- **θ*** is the global model the client receives in its first round of a new task (its own
  task, ``ClientState.task``): with full participation, the model that ended the task. At
  that moment the pending F_t is folded in.
- **Before any task ended** F* = 0 and there is no penalty (its inputs are zeros, so a
  chunk of clients at different tasks trains in one vectorized step).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, cast

import torch

from cfl_bench.strategies import declarations
from cfl_bench.strategies.base import ClientInputs, Component, Declaration, ExtraWork, StrategyEnv
from cfl_bench.strategies.declarations import OnlineEWCOptions
from cfl_bench.strategies.fedcurv import client_generator, sampled_fisher
from cfl_bench.strategies.projection import row_dot

if TYPE_CHECKING:
    from cfl_bench.core.context import Broadcast, ClientState, LocalRound, Upload


def elastic_penalty(
    params: torch.Tensor,
    grads: torch.Tensor,
    fisher: torch.Tensor,
    anchor: torch.Tensor,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(∇ + λ·F⊙(θ − θ*), (λ/2)·Σ F(θ − θ*)²), parameter axis last: θ, ∇ one client's (P,)
    or a chunk's (C, P), F and θ* per client alike."""
    weighted = fisher * (params - anchor)
    value = 0.5 * lam * row_dot(weighted, params - anchor)
    return grads.add(weighted, alpha=lam), value


class OnlineEWC(Component):
    declaration: ClassVar[Declaration] = declarations.EWC
    opts: OnlineEWCOptions
    uses_after_local: ClassVar[bool] = True

    def extra_work(self) -> ExtraWork:
        """Each participant's diagonal Fisher after its local steps: a forward + backward
        over ``samples`` of its current examples, in whole batches."""
        return ExtraWork(shard_samples=self.opts.samples)

    def setup(self, env: StrategyEnv) -> None:
        self.lam = self.opts.lam
        self.gamma = self.opts.gamma
        self.samples = self.opts.samples
        self.batch_size = env.batch_size
        self.seed = env.seed

    def round_inputs(self, broadcast: Broadcast) -> ClientInputs | None:
        """Nothing to add at λ = 0."""
        return None if self.lam == 0 else {}

    def client_inputs(self, client: ClientState, local: LocalRound) -> ClientInputs:
        """F* and θ*: on the client's first round of a new task, the pending Fisher of the
        task it finished is folded in and θ* becomes the broadcast θ_g."""
        state = client.state_for(self.name)
        params = local.broadcast.params
        if "fisher" not in state:
            state["fisher"], state["anchor"] = torch.zeros_like(params), params.detach().clone()
        if state.get("task", client.task) != client.task and "pending" in state:
            fisher = cast("torch.Tensor", state["fisher"])
            state["fisher"] = fisher.mul(self.gamma).add_(cast("torch.Tensor", state["pending"]))
            state["anchor"] = params.detach().clone()
            del state["pending"]
        state["task"] = client.task
        return {"fisher": state["fisher"], "anchor": state["anchor"]}

    def penalty(
        self, params: torch.Tensor, grads: torch.Tensor, inputs: ClientInputs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return elastic_penalty(params, grads, inputs["fisher"], inputs["anchor"], self.lam)

    def after_local(self, client: ClientState, upload: Upload, local: LocalRound) -> None:
        """The client's Fisher at its local model on its current examples, pending until
        its task changes."""
        if self.lam == 0 or client.train_y is None or client.num_samples == 0:
            return
        state = client.state_for(self.name)
        rng = client_generator(
            state, self.seed, self.random_stream, client.index, local.broadcast.device
        )
        fisher = sampled_fisher(
            client, local.model, rng, self.samples, self.batch_size, self.objective
        )
        state["pending"] = fisher
