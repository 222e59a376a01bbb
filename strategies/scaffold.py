"""SCAFFOLD: control variates that correct the client drift of local steps.

Karimireddy, Kale, Mohri, Reddi, Stich and Suresh, "SCAFFOLD: Stochastic Controlled Averaging
for Federated Learning", ICML 2020 (Algorithm 1). The server keeps c and every client k keeps
c_k (zeros before its first round, in ``ClientState.extras["scaffold"]``). c is broadcast
(payload ``scaffold.c``) and at every local step the flat gradient is corrected,

    g ← g − c_k + c,

first in ``compose.TRANSFORM_CHAIN`` (A-GEM's ``refine`` runs before the chain; FedProj's
and FedGP's projections then act on the corrected direction). After its K local steps with
local learning rate η the client updates its control variate,

    option II (``variate=II``, default, the paper's cheaper choice):
        c_k⁺ = c_k − c + (θ_g − θ_k) / (K·η)
    option I  (``variate=I``):
        c_k⁺ = ∇f_k(θ_g), the gradient of its local loss at the broadcast model, averaged
        over all its current training data (a full extra pass, done before the local steps)

and uploads Δc_k = c_k⁺ − c_k (payload ``scaffold.dc``, counted as bytes up). With S the
round's participants and N all clients, the server sets

    c   ← c + (|S|/N) · mean_{k∈S} Δc_k        (= c + (1/N)·Σ_{k∈S} Δc_k)
    θ_g ← θ_g^old + η_g · (θ_avg − θ_g^old)     (η_g: ``server_lr``, default 1 = FedAvg)

with θ_avg the engine's mean (or an aggregator's result: SCAFFOLD is not an aggregator and
composes with one). This runs first in ``compose.SERVER_HOOK_ORDER``, so θ_g is final before
FedGP takes its reference gradient.

Choices (why):

- K = ``LocalRound.steps`` (the steps actually taken) and η = ``LocalRound.lr`` (the round's
  local rate after ``--lr-decay``): the paper's (θ_g − θ_k)/(Kη) is the mean corrected
  gradient of plain SGD, and both are what this client really ran.
- Momentum: with heavy-ball momentum ρ a gradient moves θ by up to η/(1 − ρ), so
  (θ_g − θ_k)/(Kη) overestimates the mean gradient by up to 1/(1 − ρ) (×10 at ρ = 0.9). The
  default ``divisor=momentum`` divides by a_K·η instead, with a_K = FedNova's
  [K − ρ(1 − ρ^K)/(1 − ρ)]/(1 − ρ) (``fednova.momentum_steps``) — FedNTD's
  ``adaptive_divison`` (its config/scaffold.json enables it with ρ = 0.9). Without momentum
  a_K = K, so the default *is* the paper's K·η wherever the paper's plain SGD is used;
  ``divisor=steps`` keeps K·η under momentum too (SCAFFOLD code written for plain SGD). Why
  this default: on the reduced CIFAR-10 protocol (momentum 0.9) ``divisor=steps`` diverged
  within 9 rounds (accuracy back to 10 %).
  Weight decay is added to the gradient by the optimizer after the correction, so option
  II's c_k includes λθ; option I's does not.
- Option I's gradient is the stream objective's loss (cross-entropy) on the client's current
  training data, without augmentation and without the learner's replay terms or other
  components' loss terms (the paper's f_k is the client's data loss), with the model in eval
  mode (as FedCurv's Fisher): a full pass must not move the BatchNorm statistics that the
  client later trains from and uploads, and it must draw no random numbers, so a run with
  ``variate=I`` stays reproducible. Batches of ``--batch-size``; the mean over batches is
  weighted by batch size, so it is the mean over examples.
- Option II with local Adam is refused: (θ_g − θ_k)/(Kη) is no gradient estimate for Adam's
  steps. Option I is allowed (it computes the gradient directly).
- A client with no data or no steps keeps c_k and uploads Δc_k = 0 (it still participated,
  so the counted traffic matches the protocol).
- c is created as zeros at the first broadcast; it and each c_k are model-sized float32
  vectors (c is checkpointed as server state, c_k with each client).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, cast

import torch

from cfl_bench.core.errors import UserError
from cfl_bench.strategies import declarations
from cfl_bench.strategies.base import ClientInputs, Component, Declaration, StepView, StrategyEnv
from cfl_bench.strategies.declarations import ScaffoldOptions
from cfl_bench.strategies.fednova import momentum_steps

if TYPE_CHECKING:
    from cfl_bench.core.context import ClientState, LocalRound, ServerState, Upload
    from cfl_bench.core.flat import FlatModel
    from cfl_bench.core.objective import Objective

C = "scaffold.c"
DC = "scaffold.dc"


def local_gradient(
    model: FlatModel,
    client: ClientState,
    batch_size: int,
    objective: Objective,
) -> torch.Tensor:
    """The gradient of the mean objective loss over all of ``client``'s training data at the
    model's current parameters (eval mode; the model's gradient is left zeroed)."""
    assert client.train_y is not None
    n = client.num_samples
    total = torch.zeros_like(model.params)
    was_training = model.module.training
    model.module.eval()
    for start in range(0, n, batch_size):
        rows = torch.arange(start, min(start + batch_size, n), device=client.train_y.device)
        model.zero_grad()
        loss = objective.loss(model.module(client.inputs(rows)), client.train_y[rows])
        loss.backward()
        total.add_(model.grads, alpha=len(rows) / n)
    model.zero_grad()
    model.module.train(was_training)
    return total


class Scaffold(Component):
    declaration: ClassVar[Declaration] = declarations.SCAFFOLD
    opts: ScaffoldOptions
    uses_after_local: ClassVar[bool] = True
    # c: the server's control variate. The round's Δc sum and θ_old are emptied at every
    # round end, where checkpoints are written.
    state_attributes: ClassVar[tuple[str, ...]] = ("c",)

    def setup(self, env: StrategyEnv) -> None:
        self.variate = self.opts.variate
        self.server_lr = self.opts.server_lr
        self.divisor = self.opts.divisor
        if self.variate == "II" and env.optimizer != "sgd":
            raise UserError(
                f"'scaffold:variate=II' estimates gradients from local SGD steps, but this "
                f"run's clients use --optimizer {env.optimizer}; use scaffold:variate=I or "
                f"--optimizer sgd."
            )
        self.momentum = float(env.momentum) if self.divisor == "momentum" else 0.0
        self.batch_size = env.batch_size
        self.c: torch.Tensor | None = None
        self._dc_sum: torch.Tensor | None = None
        self._old: torch.Tensor | None = None
        self._round = -1

    # -- server → client ----------------------------------------------------------------------
    def broadcast(self, server: ServerState) -> dict[str, torch.Tensor]:
        if self.c is None:
            self.c = torch.zeros_like(server.global_params)
        return {C: self.c}

    # -- client -------------------------------------------------------------------------------
    def client_inputs(self, client: ClientState, local: LocalRound) -> ClientInputs:
        """The correction c − c_k (c_k starts at zero); option I takes ∇f_k(θ_g) now, while
        the model holds θ_g, and keeps it in the client's state for ``after_local``."""
        state = client.state_for(self.name)
        if "c" not in state:
            state["c"] = torch.zeros_like(local.broadcast.params)
        c_k = cast("torch.Tensor", state["c"])
        state.pop("next", None)
        if self.variate == "I" and client.num_samples > 0:
            state["next"] = local_gradient(local.model, client, self.batch_size, self.objective)
        return {"correction": local.broadcast.payloads[C] - c_k}

    def transform(self, grads: torch.Tensor, inputs: ClientInputs, step: StepView) -> torch.Tensor:
        """g ← g − c_k + c."""
        return grads.add(inputs["correction"])

    def after_local(self, client: ClientState, upload: Upload, local: LocalRound) -> None:
        """c_k ← c_k⁺ and upload Δc_k = c_k⁺ − c_k."""
        state = client.state_for(self.name)
        c_k = cast("torch.Tensor", state["c"])
        new = cast("torch.Tensor | None", state.pop("next", None))
        if new is None and self.variate == "II" and local.steps > 0:
            c = local.broadcast.payloads[C]
            scale = momentum_steps(local.steps, self.momentum) * local.lr
            moved = local.broadcast.params - local.model.params.detach()
            new = c_k - c + moved / scale
        delta = torch.zeros_like(c_k) if new is None else new - c_k
        if new is not None:
            state["c"] = new
        upload.extras[DC] = delta

    # -- server -------------------------------------------------------------------------------
    def receive_upload(self, upload: Upload, server: ServerState) -> None:
        """Sum Δc_k (the upload is valid only during the call); θ_old is θ_g until
        aggregation replaces it."""
        if self._round != server.round_index:
            self._dc_sum, self._round = None, server.round_index
        self._old = server.global_params
        if self._dc_sum is None:
            self._dc_sum = torch.zeros_like(upload.extras[DC])
        self._dc_sum.add_(upload.extras[DC])

    def after_aggregate(self, server: ServerState) -> None:
        """c ← c + (1/N)·Σ Δc_k; θ_g ← θ_old + η_g(θ_avg − θ_old)."""
        dc_sum, old = self._dc_sum, self._old
        self._dc_sum, self._old, self._round = None, None, -1
        if dc_sum is None or old is None:
            return
        if self.c is None:  # a broadcast always comes first; keep mypy honest
            self.c = dc_sum.mul(0.0)
        self.c = self.c + dc_sum / len(server.clients)
        if self.server_lr != 1.0:  # skipped at 1 so θ_g is the mean bit for bit
            server.global_params = old + self.server_lr * (server.global_params - old)
