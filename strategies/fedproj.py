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

Public data (option ``public``): ``fashion-mnist`` (the Fashion-MNIST test split, a seeded
subset of ``public_size`` images, default 1000; for the 1×28×28 MNIST streams) or ``holdout``
(every task withholds ``public_size`` of its training inputs from all clients, default 10 % of
them up to 1000; the memory is the union of the slices of the tasks seen so far). A holdout
changes what the clients hold, so it is part of the protocol hash (``protocol_changes``).
``auto`` picks fashion-mnist for 1×28×28 streams and holdout otherwise. The public inputs are
assumed to be available to every client beforehand, like a public dataset, so they are not
counted as communication.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from cfl_bench.engine.payloads import Payload
from strategies.base import (
    Component,
    Option,
    Role,
    StrategyEnv,
    non_negative_float,
    positive_float,
    positive_int,
    text,
)
from strategies.distillation import distill, kl_to_teacher, teacher_log_probs
from strategies.projection import conflict_coefficient
from strategies.public_set import (
    AUTO_PUBLIC_SIZE,
    PUBLIC_CHOICES,
    PUBLIC_SHAPES,
    holdout_protocol,
    holdout_size,
    load_public,
    resolve_public,
    with_holdout,
)

if TYPE_CHECKING:
    import torch

    from cfl_bench.engine.context import ClientState, LocalRound, ServerState, StepContext, Upload

STATE_KEY = "fedproj"


def memory_batch(
    client: ClientState, n: int, size: int, seed: int, device: torch.device
) -> torch.Tensor:
    """``size`` distinct indices among the ``n`` public examples Z_ens covers, drawn from the
    client's own generator so the draws do not depend on other clients or components."""
    import torch

    from cfl_bench.seeding import generator

    state = client.state_for(STATE_KEY)
    gen = state.get("generator")
    if not isinstance(gen, torch.Generator):
        gen = generator(seed, STATE_KEY, client.index, device=device)
        state["generator"] = gen
    return torch.randperm(n, generator=gen, device=device)[: min(size, n)]


class FedProj(Component):
    name: ClassVar[str] = "fedproj"
    roles: ClassVar[frozenset[Role]] = frozenset({Role.GRAD_TRANSFORM, Role.AGGREGATOR})
    payloads: ClassVar[tuple[Payload, ...]] = (
        Payload("fedproj.z_ens", "broadcast"),
        Payload("fedproj.logits", "upload"),
    )
    summary: ClassVar[str] = (
        "distil the clients' public-data logit ensemble into θ_g; project local gradients "
        "against the ensemble's memory gradient"
    )
    paper: ClassVar[str] = "Chunduru, Morafah et al. 2025 (FedProj)"
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
    options: ClassVar[tuple[Option, ...]] = (
        Option(
            "public",
            "auto",
            "public data: fashion-mnist, holdout (training inputs no client holds), or auto "
            "(fashion-mnist for 1×28×28 streams, else holdout)",
            text,
            choices=PUBLIC_CHOICES,
        ),
        Option(
            "public_size",
            None,
            "public examples: subset of the named dataset (auto: 1000), or withheld per task "
            "(auto: 10% of the task's training examples, at most 1000)",
            positive_int,
        ),
        Option("temperature", 3.0, "distillation temperature T", positive_float),
        Option("gamma", 0.0, "weight γ of ‖θ − θ_avg‖² during distillation", non_negative_float),
        Option("distill_epochs", 1, "server distillation epochs per round", positive_int),
        Option("distill_lr", 1e-4, "server Adam learning rate", positive_float),
        Option("eps", 1e-8, "no client projection when ‖g_glob‖² ≤ eps", non_negative_float),
    )

    def setup(self, env: StrategyEnv) -> None:
        from cfl_bench.seeding import generator

        public = resolve_public(str(self.values["public"]), env.input_shape)
        self.values["public"] = public  # the run's config records the resolved choice
        self.public = public
        size = self.values["public_size"]
        self.public_size = int(str(size)) if size is not None else None
        self.temperature = float(str(self.values["temperature"]))
        self.gamma = float(str(self.values["gamma"]))
        self.distill_epochs = int(str(self.values["distill_epochs"]))
        self.distill_lr = float(str(self.values["distill_lr"]))
        self.eps = float(str(self.values["eps"]))
        self.device = env.device
        self.seed = env.seed
        self.batch_size = env.batch_size
        self.public_x: torch.Tensor | None = None
        if public in PUBLIC_SHAPES:
            size = self.public_size or AUTO_PUBLIC_SIZE
            self.public_x = load_public(env, self.name, public, size, env.seed)
        self.z_ens: torch.Tensor | None = None
        self.teacher: torch.Tensor | None = None  # log σ(Z_ens/T)
        self._logit_sum: torch.Tensor | None = None
        self._logit_count = 0
        self._distill_gen = generator(env.seed, STATE_KEY, "distill", device=env.device)
        self._scratch: torch.Tensor | None = None
        # Client side: log σ(Z_ens/T) of the ensemble the training client received.
        self._received: torch.Tensor | None = None

    def holdout_per_task(self, train_size: int) -> int:
        """Holdout mode: ``public_size`` per task, or 10 % of the task (at most 1000)."""
        size = self.values["public_size"]
        public_size = int(str(size)) if size is not None else None
        return holdout_size(str(self.values["public"]), public_size, train_size)

    def protocol_changes(self) -> dict[str, object]:
        """A holdout takes training data away from every client: a different protocol."""
        size = self.values["public_size"]
        public_size = int(str(size)) if size is not None else None
        return holdout_protocol(str(self.values["public"]), public_size)

    # -- data ---------------------------------------------------------------------------------
    def on_task_start(self, server: ServerState, task: int, holdout: torch.Tensor | None) -> None:
        """Holdout mode: the task's withheld inputs join the public memory (tasks seen so far).

        Z_ens keeps covering only the examples it was computed on; the new slice gets
        ensemble logits at the end of this task's first round.
        """
        if self.public == "holdout":
            self.public_x = with_holdout(self.public_x, holdout, self.device)

    # -- server → client ----------------------------------------------------------------------
    def broadcast(self, server: ServerState) -> dict[str, torch.Tensor]:
        return {} if self.z_ens is None else {"fedproj.z_ens": self.z_ens}

    def on_client_start(self, client: ClientState, local: LocalRound) -> None:
        """The client's memory target: log σ(Z_ens/T) of the ensemble in the broadcast (the
        same tensor the server distilled with; recomputing it keeps the client side free of
        server state)."""
        z_ens = local.broadcast.payloads.get("fedproj.z_ens")
        self._received = None if z_ens is None else teacher_log_probs(z_ens, self.temperature)

    # -- local step ---------------------------------------------------------------------------
    def transform_grad(self, step: StepContext) -> None:
        import torch

        if self._received is None or self.public_x is None:
            return
        grads = step.model.grads
        if self._scratch is None or self._scratch.shape != grads.shape:
            self._scratch = torch.empty_like(grads)
        g = self._scratch.copy_(grads)
        n = self._received.shape[0]
        idx = memory_batch(step.client, n, step.buffer_batch_size, self.seed, self.device)
        step.model.zero_grad()
        logits = step.model.module(self.public_x[idx])
        kl_to_teacher(logits, self._received[idx], self.temperature).backward()
        # grads now holds g_glob; overwrite it with g − coef·g_glob without a new vector.
        coef = conflict_coefficient(g, grads, min_norm_sq=self.eps)
        grads.mul_(-coef).add_(g)

    # -- client → server ----------------------------------------------------------------------
    def after_local(self, client: ClientState, upload: Upload, local: LocalRound) -> None:
        """The local model labels the whole public set; the logits are uploaded."""
        from cfl_bench.engine.evaluation import predict_logits

        if self.public_x is None or self.public_x.shape[0] == 0:
            return
        upload.extras["fedproj.logits"] = predict_logits(local.model.module, self.public_x)

    def receive_upload(self, upload: Upload, server: ServerState) -> None:
        """The server sums the clients' public logits into this round's ensemble."""
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
            return
        z_ens = self._logit_sum.div_(self._logit_count)
        self._logit_sum, self._logit_count = None, 0  # each round's ensemble starts afresh
        teacher = self.remember(z_ens)
        theta_avg = server.global_params.detach().clone()  # snapshot, never the live θ
        model = server.model
        model.load(theta_avg, server.global_buffers)
        distill(
            model,
            self.public_x[: z_ens.shape[0]],
            teacher,
            theta_avg,
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
