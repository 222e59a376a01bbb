"""FedProj: server-side distillation on public data plus client-side memory projection.

Chunduru, Morafah et al. 2025, "Avoid Forgetting by Preserving Global Knowledge Gradients in
Federated Learning with Non-IID Data". With a public (unlabeled) set x_pub shared by the
server and the clients, temperature T and softmax σ:

Upload — after local training client k sends its logits z_k = f(x_pub; θ_k) on the whole
current public set (counted as bytes up).

Server — θ_avg is the FedAvg mean (a *snapshot*: the authors' code compared the live
parameters with themselves, so their γ term was always zero). The teacher is the ensemble
Z_ens = (1/K)·Σ_k z_k. Starting from θ_avg, ``distill_epochs`` epochs of Adam (lr
``distill_lr``, a fresh optimizer each round) over public batches minimise

    T²·KL(σ(Z_ens/T) ‖ σ(f(x_pub; θ)/T)) + γ·‖θ − θ_avg‖²

and the result is the new global model. Z_ens is broadcast (counted as bytes down per
participant) and is the memory the clients project against in the next round.

Client — at every local step, after the learner's own refinement, on a batch of the public
examples Z_ens covers,

    g_glob = ∇ KL(σ(Z_ens/T) ‖ σ(f(x_pub; θ)/T))           (batchmean, no T² here)
    g ← g − (g·g_glob / ‖g_glob‖²)·g_glob   only where g·g_glob < 0 and ‖g_glob‖² > ε

so the local step never increases the distance to the global knowledge to first order.
Before the first ensemble exists (the first round of the run) there is no projection.

Public data (option ``public``, ``strategies.public_set``): ``fashion-mnist`` (the
Fashion-MNIST test split, a seeded subset of ``public_size`` images, default 1000; for the
1×28×28 MNIST streams), ``cifar100`` (the CIFAR-100 train split, for 3×32×32 streams such as
CIFAR-10) or ``holdout`` (every task withholds ``public_size`` of its training inputs from all
clients, default 10 % of them up to 1000; the memory is the union of the slices of the tasks
seen so far). A holdout changes what the clients hold, so it is part of the protocol hash
(``protocol_changes``). ``auto`` picks fashion-mnist for 1×28×28 streams and holdout
otherwise. The public inputs are assumed to be available to every client beforehand, like a
public dataset, so they are not counted as communication.

The papers' variants (options added later, ``quiet_default``: their defaults keep the
behaviour above, the one earlier runs recorded):

- ``memory_temperature``: ``T`` (default) uses T in the client's memory loss as above;
  ``1`` is the papers' memory loss, KL(σ(Z_ens) ‖ σ(f(x_pub; θ))) — T only on the server.
- ``memory``: ``batch`` (default) takes g_glob on a fresh random batch of the memory of the
  step's buffer batch size; ``all`` is the papers' L_mem over the whole memory M: g_glob
  depends on θ, so each local step then runs a forward and backward pass over all |M|
  memory examples (up to 1000 per task seen) instead of one batch — |M|/batch times the
  memory cost per step.
- ``warmup_epochs`` (default 0): the first paper's algorithm starts with round 0 on the
  server: cross-entropy on *labelled* public data before round 1. Labels exist only for a
  holdout (``on_holdout_labels``), so it needs ``public=holdout``: when task 0's holdout
  arrives, θ_g trains on it with its labels for that many epochs (Adam at ``distill_lr``,
  batches of the run's batch size: the server's optimiser, our choice — the paper names
  none for round 0).
- ``anchor``: what γ·‖θ − anchor‖² pulls towards: ``snapshot`` (default) the FedAvg mean
  θ_avg (``--weighting``), ``mean`` the unweighted mean of the round's client models (the
  paper's weight-divergence term), ``global`` the previous round's θ_g. Only meaningful with
  γ > 0, so another anchor with γ = 0 is refused.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import torch

from cfl_bench.core.errors import UserError
from cfl_bench.core.evaluation import predict_logits
from cfl_bench.core.seeding import generator
from cfl_bench.strategies import declarations
from cfl_bench.strategies.base import (
    ClientInputs,
    Component,
    Declaration,
    ExtraWork,
    StepView,
    StrategyEnv,
)
from cfl_bench.strategies.declarations import FedProjOptions
from cfl_bench.strategies.distillation import (
    distill,
    kl_to_teacher,
    teacher_log_probs,
    train_labelled,
)
from cfl_bench.strategies.fedproj_anchor import AnchorMaterial
from cfl_bench.strategies.projection import conflict_coefficients
from cfl_bench.strategies.public_set import PublicSetUser

if TYPE_CHECKING:
    from cfl_bench.core.context import Broadcast, ClientState, LocalRound, ServerState, Upload

STATE_KEY = "fedproj"


def memory_batch(
    client: ClientState, n: int, size: int, seed: int, device: torch.device
) -> torch.Tensor:
    """``size`` distinct indices among the ``n`` public examples Z_ens covers, drawn from the
    client's own generator so the draws do not depend on other clients or components."""
    state = client.state_for(STATE_KEY)
    gen = state.get("generator")
    if not isinstance(gen, torch.Generator):
        gen = generator(seed, STATE_KEY, client.index, device=device)
        state["generator"] = gen
    return torch.randperm(n, generator=gen, device=device)[: min(size, n)]


class FedProj(AnchorMaterial, PublicSetUser, Component):
    declaration: ClassVar[Declaration] = declarations.FEDPROJ
    opts: FedProjOptions
    uses_after_local: ClassVar[bool] = True
    requires: ClassVar[frozenset[str]] = frozenset({"class_logits"})
    # The public memory grows with every task's holdout; the ensemble is next round's memory.
    state_attributes: ClassVar[tuple[str, ...]] = (
        "public_x",
        "z_ens",
        "teacher",
        "_logit_sum",
        "_logit_count",
        "_distill_gen",
    )

    def extra_work(self) -> ExtraWork:
        """Every participant's logits on the public set, and ``distill_epochs`` server
        passes over it."""
        return ExtraWork(
            public_examples=self.fixed_public_size(),
            distill_epochs=self.opts.distill_epochs,
        )

    def setup(self, env: StrategyEnv) -> None:
        public = self.setup_public(env)
        self.temperature = self.opts.temperature
        self.gamma = self.opts.gamma
        self.distill_epochs = self.opts.distill_epochs
        self.distill_lr = self.opts.distill_lr
        self.eps = self.opts.eps
        # log σ(Z_ens/τ) and the memory KL on the client use τ = T, or 1 (the papers' form).
        self.client_temperature = self.temperature if self.opts.memory_temperature == "T" else 1.0
        self.memory = self.opts.memory
        self.warmup_epochs = self.opts.warmup_epochs
        self.anchor = self.opts.anchor
        self.refuse_variants(public)
        self.seed = env.seed
        self.batch_size = env.batch_size
        self.load_named_public(env, self.name)
        self.z_ens: torch.Tensor | None = None
        self.teacher: torch.Tensor | None = None  # log σ(Z_ens/T)
        self._logit_sum: torch.Tensor | None = None
        self._logit_count = 0
        self._distill_gen = generator(env.seed, STATE_KEY, "distill", device=env.device)
        # This round's anchor material (anchor=mean: Σθ_k and the count; anchor=global: θ_g
        # as the round began), empty at every round end where checkpoints are written.
        self._param_sum: torch.Tensor | None = None
        self._param_count = 0
        self._previous: torch.Tensor | None = None

    def refuse_variants(self, public: str) -> None:
        """Refuse variants that would silently do nothing or cannot run."""
        if self.warmup_epochs > 0 and public != "holdout":
            raise UserError(
                f"fedproj:warmup_epochs trains on labelled public data, which only "
                f"fedproj:public=holdout has (public is {public}); use public=holdout or "
                "warmup_epochs=0."
            )
        if self.anchor != "snapshot" and self.gamma == 0:
            raise UserError(
                f"fedproj:anchor={self.anchor} sets the anchor of γ·‖θ − anchor‖², which does "
                "nothing at gamma=0; set fedproj:gamma above 0 or drop the anchor."
            )

    # -- data ---------------------------------------------------------------------------------
    def on_holdout_labels(
        self, server: ServerState, task: int, x: torch.Tensor, y: torch.Tensor
    ) -> None:
        """``warmup_epochs`` > 0: the first paper's round 0 — before round 1, θ_g learns task
        0's labelled holdout with the stream's loss (Adam at ``distill_lr``)."""
        if self.warmup_epochs == 0 or task != 0 or x.shape[0] == 0:
            return
        model = server.model
        model.load(server.global_params, server.global_buffers)
        train_labelled(
            model,
            x.to(device=self.device, dtype=torch.float32),
            y.to(self.device),
            self.objective.loss,
            epochs=self.warmup_epochs,
            lr=self.distill_lr,
            batch_size=self.batch_size,
            gen=generator(self.seed, STATE_KEY, "warmup", device=self.device),
        )
        server.global_params = model.params.detach().clone()
        server.global_buffers = model.buffers.detach().clone()

    # -- server → client ----------------------------------------------------------------------
    def broadcast(self, server: ServerState) -> dict[str, torch.Tensor]:
        return {} if self.z_ens is None else {"fedproj.z_ens": self.z_ens}

    def round_inputs(self, broadcast: Broadcast) -> ClientInputs | None:
        """The clients' memory target: log σ(Z_ens/τ) of the ensemble in the broadcast (the
        same tensor the server distilled with; recomputing it keeps the client side free of
        server state); None before the first ensemble."""
        z_ens = broadcast.payloads.get("fedproj.z_ens")
        if z_ens is None or self.public_x is None:
            return None
        return {"received": teacher_log_probs(z_ens, self.client_temperature)}

    # -- local step ---------------------------------------------------------------------------
    def transform(self, grads: torch.Tensor, inputs: ClientInputs, step: StepView) -> torch.Tensor:
        """g ← g − coef·g_glob, g_glob = ∇ KL(σ(Z_ens/τ) ‖ σ(f(x_m; θ)/τ)) on the memory
        batch (``memory_rows``), coef as FedGP's with FedProj's ε."""
        g_glob = self.memory_gradient(inputs["received"], step)
        coef = conflict_coefficients(grads, g_glob, min_norm_sq=self.eps)
        return g_glob.mul(-coef[..., None]).add_(grads)

    def memory_gradient(self, received: torch.Tensor, step: StepView) -> torch.Tensor:
        """g_glob: ∇ KL(σ(Z_ens/τ) ‖ σ(f(x_m; θ)/τ)) at θ on the memory rows; τ = T or 1
        (``memory_temperature``)."""
        x, teacher = self.memory_rows(received, step)
        tau = self.client_temperature

        def loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
            return kl_to_teacher(logits, target, tau)

        return step.gradient(loss, x, teacher)

    def memory_rows(
        self, received: torch.Tensor, step: StepView
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The memory inputs and their teacher log-probabilities: a random memory batch of
        the client's own draws (memory=batch) or the whole memory (memory=all)."""
        assert self.public_x is not None  # client_inputs
        n = received.shape[0]
        if self.memory == "all":  # the whole memory M at every step
            return step.shared(self.public_x[:n]), step.shared(received)
        size = min(step.buffer_batch_size, n)

        def draw(client: ClientState) -> torch.Tensor:
            return memory_batch(client, n, size, self.seed, self.device)

        idx = step.per_client(draw, torch.arange(size, device=received.device))
        return self.public_x[idx], received[idx]

    # -- client → server ----------------------------------------------------------------------
    def after_local(self, client: ClientState, upload: Upload, local: LocalRound) -> None:
        """The local model labels the whole public set; the logits are uploaded."""
        if self.public_x is None or self.public_x.shape[0] == 0:
            return
        upload.extras["fedproj.logits"] = predict_logits(local.model.module, self.public_x)

    def receive_upload(self, upload: Upload, server: ServerState) -> None:
        """The server sums the clients' public logits into this round's ensemble (and, for
        the ``mean`` and ``global`` anchors, the client models or the round's θ_g)."""
        self.collect_anchor(upload, server)
        logits = upload.extras.get("fedproj.logits")
        if logits is None:
            return
        if self._logit_sum is None:
            self._logit_sum = logits.clone()  # a normal tensor: inference tensors are read-only
        else:
            self._logit_sum.add_(logits)
        self._logit_count += 1

    # -- server -------------------------------------------------------------------------------
    def aggregate(self, server: ServerState) -> None:
        """Distil Z_ens into the FedAvg mean; keep Z_ens as next round's client memory."""
        if self._logit_sum is None or self._logit_count == 0 or self.public_x is None:
            self.anchor_params(server.global_params)  # drop this round's anchor material
            return
        z_ens = self._logit_sum.div_(self._logit_count)
        self._logit_sum, self._logit_count = None, 0  # each round's ensemble starts afresh
        teacher = self.remember(z_ens)
        theta_avg = server.global_params.detach().clone()  # snapshot, never the live θ
        anchor = self.anchor_params(theta_avg)
        model = server.model
        model.load(theta_avg, server.global_buffers)
        distill(
            model,
            self.public_x[: z_ens.shape[0]],
            teacher,
            anchor,
            temperature=self.temperature,
            gamma=self.gamma,
            epochs=self.distill_epochs,
            lr=self.distill_lr,
            batch_size=self.batch_size,
            gen=self._distill_gen,
        )
        server.global_params = model.params.detach().clone()
        server.global_buffers = model.buffers.detach().clone()

    def remember(self, z_ens: torch.Tensor) -> torch.Tensor:
        """Make ``z_ens`` the ensemble — the distillation teacher now, the clients' memory in
        the next round (broadcast) — and return its log σ(Z_ens/T), computed once."""
        self.z_ens = z_ens
        self.teacher = teacher_log_probs(z_ens, self.temperature)
        return self.teacher
