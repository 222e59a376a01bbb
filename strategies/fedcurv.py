"""FedCurv: elastic consolidation across clients with diagonal Fisher information.

Shoham et al., "Overcoming Forgetting in Federated Learning on Non-IID Data", 2019. After
local training client k computes its diagonal Fisher u_k at its local θ_k and uploads

    u_k,   v_k = u_k ⊙ θ_k.

The server sums them over the round's participants, U = Σ u_j, V = Σ v_j, and sends (U, V)
with the next broadcast. Client k then adds to its loss

    λ · Σ [ θ² ⊙ (U − u_k) − 2 θ ⊙ (V − v_k) ]        ∇ = 2λ [ θ ⊙ (U − u_k) − (V − v_k) ]

i.e. Σ_{j≠k} λ u_j (θ − θ_j)² up to a constant: every *other* client's important weights are
anchored. Own terms are removed only when the client was among the participants whose sums
the server sent — it uploaded in the round before the broadcast (otherwise its stored u_k
is not in U); U − u_k is a new tensor, never an in-place edit of the shared U. No penalty
before the first sums exist. The client side reads U, V from the broadcast only, the
server side sums the uploads as they arrive (``receive_upload``).

Fisher (specs): mean over batches of the squared batch-mean CE gradient, model in eval
mode, on about ``samples`` of the client's current-task examples (⌈samples / batch⌉ batches
of a seeded random permutation). u, v up and U, V down are counted as communication.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, ClassVar

import torch

from cfl_bench.core.objective import Classification
from cfl_bench.core.seeding import generator
from cfl_bench.strategies import declarations
from cfl_bench.strategies.base import ClientInputs, Component, Declaration, ExtraWork, StrategyEnv
from cfl_bench.strategies.declarations import FedCurvOptions
from cfl_bench.strategies.projection import row_dot

if TYPE_CHECKING:
    from cfl_bench.core.context import Broadcast, ClientState, LocalRound, ServerState, Upload
    from cfl_bench.core.flat import FlatModel
    from cfl_bench.core.objective import Objective


def diagonal_fisher(
    model: FlatModel,
    x: torch.Tensor,
    y: torch.Tensor,
    batch_size: int,
    objective: Objective | None = None,
) -> torch.Tensor:
    """Mean over batches of (∇ batch-mean loss)², at the model's current parameters; the
    loss is the objective's (cross-entropy for classification, the default)."""
    loss = (objective or Classification()).loss

    fisher = torch.zeros_like(model.grads)
    batches = 0
    for start in range(0, y.shape[0], batch_size):
        model.zero_grad()
        sl = slice(start, start + batch_size)
        loss(model.module(x[sl]), y[sl]).backward()
        fisher.addcmul_(model.grads, model.grads)
        batches += 1
    model.zero_grad()
    return fisher.div_(max(batches, 1))


def client_generator(
    state: dict[str, object], seed: int, name: str, index: int, device: torch.device
) -> torch.Generator:
    """The client's own generator for ``name``'s draws, kept in its ``state`` (made from
    (seed, name, client) on first use), so the draws depend on no other client."""
    if "rng" not in state:
        state["rng"] = generator(seed, name, index, device=device)
    rng = state["rng"]
    assert isinstance(rng, torch.Generator)
    return rng


def sampled_fisher(
    client: ClientState,
    model: FlatModel,
    rng: torch.Generator,
    samples: int,
    batch_size: int,
    objective: Objective | None = None,
) -> torch.Tensor:
    """``diagonal_fisher`` of ``model`` in eval mode on up to ``samples`` of the client's
    current examples, in whole batches of ``batch_size``, drawn with ``rng``; the model's
    mode is restored after (FedCurv's u_k, online EWC's F_t)."""
    assert client.train_y is not None
    n = client.num_samples
    batches = math.ceil(min(samples, n) / batch_size)
    take = torch.randperm(n, generator=rng, device=rng.device)[: batches * batch_size]
    training = model.module.training
    model.module.eval()
    x, y = client.inputs(take), client.train_y[take]
    fisher = diagonal_fisher(model, x, y, batch_size, objective)
    model.module.train(training)
    return fisher


def curvature_penalty(
    params: torch.Tensor,
    grads: torch.Tensor,
    others_u: torch.Tensor,
    others_v: torch.Tensor,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(∇ + 2λ[θ⊙U' − V'], λ·Σ[θ²⊙U' − 2θ⊙V']) with U' = U − u_k, V' = V − v_k, parameter
    axis last: θ, ∇ one client's (P,) or a chunk's (C, P), U' and V' shared (P,) or per
    client (C, P)."""
    inner = params * others_u - others_v
    grads = grads.add(inner, alpha=2.0 * lam)
    return grads, lam * (row_dot(params, inner) - row_dot(params, others_v))


class FedCurv(Component):
    declaration: ClassVar[Declaration] = declarations.FEDCURV
    opts: FedCurvOptions
    uses_after_local: ClassVar[bool] = True
    # The sums sent with the next broadcast, and those being collected this round (own u_k,
    # v_k and the round of the upload are per-client state in ClientState.extras).
    state_attributes: ClassVar[tuple[str, ...]] = ("sums", "_next")

    def extra_work(self) -> ExtraWork:
        """Each participant's diagonal Fisher: a forward + backward over ``samples`` of its
        current examples, in whole batches."""
        return ExtraWork(shard_samples=self.opts.samples)

    def setup(self, env: StrategyEnv) -> None:
        self.lam = self.opts.lam
        self.samples = self.opts.samples
        self.batch_size = env.batch_size
        self.seed = env.seed
        # Sums the server sends this round.
        self.sums: tuple[torch.Tensor, torch.Tensor] | None = None
        # Sums being collected from this round's uploads.
        self._next: tuple[torch.Tensor, torch.Tensor] | None = None

    def broadcast(self, server: ServerState) -> dict[str, torch.Tensor]:
        if self.sums is None:
            return {}
        return {"fedcurv.U": self.sums[0], "fedcurv.V": self.sums[1]}

    def round_inputs(self, broadcast: Broadcast) -> ClientInputs | None:
        """None (no penalty) before any sums exist, or when λ = 0."""
        return None if "fedcurv.U" not in broadcast.payloads or self.lam == 0 else {}

    def client_inputs(self, client: ClientState, local: LocalRound) -> ClientInputs:
        """U' and V': the broadcast sums less the client's own u_k, v_k when they are in
        them (it uploaded last round)."""
        payloads = local.broadcast.payloads
        total_u, total_v = payloads["fedcurv.U"], payloads["fedcurv.V"]
        state = client.state_for(self.name)
        if state.get("round") == local.broadcast.round_index - 1:  # its u_k is in U
            own_u, own_v = state["u"], state["v"]
            assert isinstance(own_u, torch.Tensor) and isinstance(own_v, torch.Tensor)
            return {"u": total_u - own_u, "v": total_v - own_v}  # new tensors: U is shared
        return {"u": total_u, "v": total_v}

    def penalty(
        self, params: torch.Tensor, grads: torch.Tensor, inputs: ClientInputs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return curvature_penalty(params, grads, inputs["u"], inputs["v"], self.lam)

    def after_local(self, client: ClientState, upload: Upload, local: LocalRound) -> None:
        """Client k's Fisher u_k at its local θ_k; it keeps and uploads u_k and v_k."""
        if client.train_x is None or client.train_y is None or client.num_samples == 0:
            return
        state = client.state_for(self.name)
        rng = client_generator(
            state, self.seed, self.random_stream, client.index, local.broadcast.device
        )
        model = local.model
        u = sampled_fisher(client, model, rng, self.samples, self.batch_size, self.objective)
        v = u * model.params
        state["u"], state["v"], state["round"] = u, v, local.broadcast.round_index
        upload.extras["fedcurv.u"] = u
        upload.extras["fedcurv.v"] = v

    def receive_upload(self, upload: Upload, server: ServerState) -> None:
        """The server sums u_k and v_k over this round's uploads."""
        if "fedcurv.u" not in upload.extras:
            return
        u, v = upload.extras["fedcurv.u"], upload.extras["fedcurv.v"]
        if self._next is None:
            self._next = (u.clone(), v.clone())
        else:
            self._next[0].add_(u)
            self._next[1].add_(v)

    def after_aggregate(self, server: ServerState) -> None:
        # Only this round's participants count: a round without uploads leaves no sums.
        self.sums = self._next
        self._next = None
