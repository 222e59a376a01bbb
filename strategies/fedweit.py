"""FedWeIT: Federated Weighted Inter-client Transfer (Yoon, Jeong, Lee, Yang, Hwang, ICML 2021),
as its official TensorFlow code (wyjeong/FedWeIT: ``modules/layers.py``, ``modules/nets.py``,
``modules/federated.py``, ``modules/train.py``, ``models/fedweit/{client,server}.py``,
``config.py``) runs it, on ``--model fedweit-lenet`` (``cfl_bench.strategies.decomposed``).

Each decomposed layer of client c on its task t composes its weight in the forward::

    θ = B ⊙ σ(m) + A + Σ_k α_k kb_k          (m: one value per output channel)

B is the shared base (the flat global vector θ_g holds the four layers' B and nothing
else); the mask m, the task-adaptive A, the attention α, the bias and the head are the
client's, kept per client (``ClientState.extras``) and trained here with the round's local
optimiser (the engine trains B). At a task start a client draws m and the bias by the
code's VarianceScaling initializer, sets A = B₀/3 (B₀ the initial global bases: the code
builds every task's A from them), α by VarianceScaling over K (zeros in task 0, untrained
there as kb is zero) and takes kb from the broadcast.

Local loss (``Client.loss``), with ½‖·‖² the code's ``l2_loss``::

    CE + wd·(½‖A‖² + ½‖m‖²) + λ1‖A‖₁ + λ_m‖m‖₁ + [t = 0] wd·½‖B‖²
       + Σ_{i<t} λ2·½‖B ⊙ σ(m_i) + A_i − (B' ⊙ σ(m_i) + A_i)‖²        (+ λ1‖A_i‖₁, constant)

B' the client's base when task t began (before the new task's broadcast), m_i and A_i the
past tasks' frozen values: the retroactive term only moves B. The code differentiates the
sum over the batch of CE_n + regularisers (a per-example loss vector), i.e. N·(mean CE +
regularisers); with its Adam this is the mean CE + regularisers used here, up to Adam's ε.

Communication (``ClientModule.get_weights``, ``TrainModule.aggregate``, ``Server``):

- up, every round: B ⊙ keep, keep = |m| > the ⌊n·s⌋-th smallest |m| of the layer (s =
  ``client_sparsity``; per output channel) and keep itself (``fedweit.keep``);
- server: B_g = Σ_c B_c⊙keep_c / (Σ_c keep_c + 1e-15) per channel; a channel no client
  kept is 0, and a client keeps its own base there (``sw·[w = 0] + w``);
- up, in each task's last round: A pruned by |A| > λ1 (``fedweit.adaptive``);
- down, in the next task's first round: the K uploaded A's stacked (``fedweit.kb``), the
  same to every client, its own A included (the code; ``kb_self=drop`` zeroes it: the
  paper's "other clients'").

The suite counts every tensor dense (4 bytes an entry), so B ⊙ keep counts as the whole
base; the code's own count (``calculate_communication_costs``) is its nonzeros
(``code_counted_upload``).

Paper vs code: the code's forward reads σ(m) computed when the task's model is switched in
(once a round), outside the gradient tape, so m moves only by its decay (``mask_grad=round``,
the default); ``mask_grad=step`` trains m through σ(m) as the paper writes.

Evaluation (the code's client ``evaluate`` / ``get_model_by_tid``): the global model
composes θ = B with a zero head (chance), so the declaration's ``scored_by_clients`` has
the run scored by ``own_model`` instead: each client's base with a trained task's m, A,
α, bias, kb and head swapped in (kept per task when the client leaves it, as the code
keeps them), on that task's test set, at every task end.

Not built: the code's validation-driven learning-rate decay and its Adam kept across the
rounds of a task (the suite restarts the local optimiser every round).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

import torch

from cfl_bench.core.errors import UserError
from cfl_bench.strategies import declarations
from cfl_bench.strategies.base import ClientInputs, Component, Declaration, StrategyEnv
from cfl_bench.strategies.declarations import FedWeITOptions
from cfl_bench.strategies.decomposed import FedWeITLeNet, LayerPrivate, prune
from cfl_bench.strategies.fedweit_layout import (  # noqa: F401 - importable from here too
    AGGREGATION_EPS,
    MODEL,
    Layout,
    aggregate_bases,
    keep_mask,
    layout_of,
)
from cfl_bench.strategies.fedweit_server import FedWeITServer
from cfl_bench.strategies.fedweit_tasks import ADAPTIVE_FACTOR, ClientTasks  # noqa: F401

if TYPE_CHECKING:
    from cfl_bench.core.context import ClientState, LocalRound, Upload
    from cfl_bench.core.flat import FlatModel


def code_counted_upload(pruned_bases: torch.Tensor) -> int:
    """The code's per-round upload count: the nonzero entries of B ⊙ keep."""
    return int(torch.count_nonzero(pruned_bases))


def regulariser(
    bases: torch.Tensor,
    mask: torch.Tensor,
    adaptive: torch.Tensor,
    past: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
    layout: Layout,
    opts: FedWeITOptions,
) -> torch.Tensor:
    """Everything of the code's ``Client.loss`` but the cross-entropy: ``past`` holds each
    earlier task's (m_i, A_i, target B'⊙σ(m_i)+A_i)."""
    value = opts.wd * 0.5 * (adaptive.square().sum() + mask.square().sum())
    value = value + opts.lambda_l1 * adaptive.abs().sum() + opts.lambda_mask * mask.abs().sum()
    if not past:
        return value + opts.wd * 0.5 * bases.square().sum()
    for past_mask, past_adaptive, target in past:
        restored = bases * layout.expand(torch.sigmoid(past_mask)) + past_adaptive
        value = value + opts.lambda_l2 * 0.5 * (restored - target).square().sum()
        value = value + opts.lambda_l1 * past_adaptive.abs().sum()
    return value


@dataclass
class Private:
    """One client's trained private vector for its round (a leaf): [m (Σ out), A (P),
    α (L·K), bias (Σ out), head weight, head bias], its optimiser and what the loss reads."""

    vector: torch.Tensor
    layout: Layout
    kb_rows: int
    optimizer: torch.optim.Optimizer | None  # None: evaluated, not trained
    past: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = field(default_factory=list)

    def part(self, name: str) -> torch.Tensor:
        m, p, k = self.layout.channels, self.layout.params, self.kb_rows * len(self.layout.layers)
        classes, features = self.layout.head
        bounds = {"mask": (0, m), "adaptive": (m, m + p), "atten": (m + p, m + p + k)}
        bounds["bias"] = (m + p + k, 2 * m + p + k)
        bounds["head"] = (2 * m + p + k, 2 * m + p + k + classes * features + classes)
        start, stop = bounds[name]
        return self.vector[start:stop]


def detach(module: torch.nn.Module) -> None:
    """Take a client's private tensors and head off the model: it is the global one again."""
    assert isinstance(module, FedWeITLeNet)
    for layer in module.layers():
        layer.private = None
    module.head = None


def private_size(layout: Layout, kb_rows: int) -> int:
    classes, features = layout.head
    return (
        2 * layout.channels
        + layout.params
        + kb_rows * len(layout.layers)
        + classes * (features + 1)
    )


class FedWeIT(ClientTasks, FedWeITServer, Component):
    declaration: ClassVar[Declaration] = declarations.FEDWEIT
    opts: FedWeITOptions
    uses_after_local: ClassVar[bool] = True
    sequential_only: ClassVar[str] = (
        "its clients train private masks and task-adaptive weights outside θ, which only "
        "the sequential executor's one working model carries"
    )
    # The knowledge base built at the last task end (sent in the next task's first round).
    state_attributes: ClassVar[tuple[str, ...]] = ("kb",)

    def setup(self, env: StrategyEnv) -> None:
        """Refuse what has no decomposed layers or no task identity."""
        if env.model.name and env.model.name != MODEL:
            raise UserError(
                f"fedweit composes decomposed layers and model '{env.model.name}' has none; "
                f"use --model {MODEL}."
            )
        if env.scenario != "task-il":
            raise UserError(
                f"fedweit trains one mask, adaptive weights and head per task and needs the "
                f"task at test time, but the stream is {env.scenario}; add --heads per-task."
            )
        self.seed = env.seed
        self.optimizer, self.momentum = env.optimizer, env.momentum
        heads = getattr(env.objective, "heads", ())
        self.head_width = len(heads[0]) if heads else env.num_classes
        self.kb: torch.Tensor | None = None
        self._pruned: torch.Tensor | None = None
        self._kept: torch.Tensor | None = None
        self._uploads = 0
        self._adaptives: dict[int, torch.Tensor] = {}

    # -- client ------------------------------------------------------------------------------
    def client_inputs(self, client: ClientState, local: LocalRound) -> ClientInputs:
        """Start the client's round: its base where the server sent none, its private
        vector for its task (entering a new task first), set on the working model."""
        layout = layout_of(local.model)
        state = client.state_for(self.name)
        theta_g = local.broadcast.params
        if "base" not in state:
            self.first_visit(state, client.index, theta_g, layout)
        own = state["base"]
        assert isinstance(own, torch.Tensor)
        if state["task"] != client.task:
            kb = local.broadcast.payloads.get("fedweit.kb")
            self.enter_task(state, client, kb, layout)
        with torch.no_grad():
            if self.opts.sparse_comm:  # the code's sw·[w = 0] + w
                local.model.params.copy_(torch.where(theta_g != 0, theta_g, own))
            else:
                local.model.params.copy_(theta_g)
        task_vector, head, kb_now = state["task_vector"], state["head"], state["kb"]
        assert isinstance(task_vector, torch.Tensor) and isinstance(head, torch.Tensor)
        assert isinstance(kb_now, torch.Tensor)
        vector = torch.cat((task_vector, head)).clone().requires_grad_(True)
        private = Private(vector, layout, int(kb_now.shape[0]), self.local_optimizer(vector, local))
        private.past = self.past_terms(state)
        self.attach(local.model.module, private, kb_now)
        return {"private": private}

    def local_optimizer(self, vector: torch.Tensor, local: LocalRound) -> torch.optim.Optimizer:
        """The round's optimiser of the private vector: the run's local optimiser and
        learning rate (Adam's ε as the engine's), restarted every round as the engine's."""
        if self.optimizer == "adam":
            return torch.optim.Adam([vector], lr=local.lr, eps=1e-8)
        return torch.optim.SGD([vector], lr=local.lr, momentum=self.momentum)

    @contextmanager
    def own_model(self, client: ClientState, task: int, model: FlatModel) -> Iterator[bool]:
        """The client's composed model for ``task`` (the code's ``get_model_by_tid``): its
        base as it left its last local training (the code evaluates before aggregation)
        with that task's m, A, α, bias, kb and head swapped in."""
        state = client.state_for(self.name)
        kept = self.task_model(state, task)
        if kept is None:
            yield False
            return
        vector, head, kb = kept
        base = state["base"]
        assert isinstance(base, torch.Tensor)
        layout = layout_of(model)
        with torch.no_grad():
            model.params.copy_(base)
        private = Private(torch.cat((vector, head)), layout, int(kb.shape[0]), None)
        self.attach(model.module, private, kb)
        try:
            yield True
        finally:
            detach(model.module)

    def attach(self, module: torch.nn.Module, private: Private, kb: torch.Tensor) -> None:
        """Set the client's private tensors (views of its vector) on the decomposed layers
        and its head on the model."""
        assert isinstance(module, FedWeITLeNet)
        layout, rows = private.layout, private.kb_rows
        mask, adaptive = private.part("mask"), private.part("adaptive")
        atten, bias = private.part("atten"), private.part("bias")
        offset = 0
        for index, (layer, (start, numel, out)) in enumerate(
            zip(module.layers(), layout.layers, strict=True)
        ):
            shape = tuple(layer.shared.shape)
            m = mask[offset : offset + out]
            fixed = torch.sigmoid(m).detach() if self.opts.mask_grad == "round" else None
            layer.private = LayerPrivate(
                mask=m,
                adaptive=adaptive[start : start + numel].view(shape),
                atten=atten[index * rows : (index + 1) * rows],
                bias=bias[offset : offset + out],
                kb=kb[:, start : start + numel].reshape(rows, *shape),
                fixed_mask=fixed,
                l1_thr=self.opts.lambda_l1,
                mask_thr=self.opts.lambda_mask,
            )
            offset += out
        classes, features = layout.head
        head = private.part("head")
        module.head = (
            head[: classes * features].view(classes, features),
            head[classes * features :],
        )

    def penalty(
        self, params: torch.Tensor, grads: torch.Tensor, inputs: ClientInputs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The code's regularisers: their gradient added to B's (returned) and to the
        private vector's (which already holds the cross-entropy's), then the private step."""
        private: Private = inputs["private"]
        bases = params.detach().requires_grad_(True)
        vector = private.vector
        with torch.enable_grad():
            value = regulariser(
                bases,
                private.part("mask"),
                private.part("adaptive"),
                private.past,
                private.layout,
                self.opts,
            )
            grad_b, grad_v = torch.autograd.grad(value, [bases, vector], allow_unused=True)
        if grad_v is not None:
            vector.grad = grad_v if vector.grad is None else vector.grad + grad_v
        if vector.grad is not None:
            assert private.optimizer is not None
            private.optimizer.step()
            vector.grad = None
        return (grads if grad_b is None else grads + grad_b), value.detach()

    def after_local(self, client: ClientState, upload: Upload, local: LocalRound) -> None:
        """Keep the trained private vector and base; upload B ⊙ keep and keep, and at a
        task end the pruned A."""
        private: Private = local.inputs[self.name]["private"]
        state = client.state_for(self.name)
        layout = private.layout
        classes, features = layout.head
        head_size = classes * (features + 1)
        trained = private.vector.detach()
        state["task_vector"] = trained[:-head_size].clone()
        state["head"] = trained[-head_size:].clone()
        params = local.model.params.detach()
        state["base"] = params.clone()
        detach(local.model.module)
        if self.opts.sparse_comm:
            keep = keep_mask(private.part("mask").detach(), layout, self.opts.client_sparsity)
            upload.params = params * layout.expand(keep)
            upload.extras["fedweit.keep"] = keep
        if local.broadcast.is_task_end:
            adaptive = private.part("adaptive").detach()
            upload.extras["fedweit.adaptive"] = prune(adaptive, self.opts.lambda_l1)
