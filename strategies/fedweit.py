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

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

import torch

from cfl_bench.core.errors import UserError
from cfl_bench.core.seeding import generator
from cfl_bench.strategies import declarations
from cfl_bench.strategies.base import ClientInputs, Component, Declaration, StrategyEnv
from cfl_bench.strategies.declarations import FedWeITOptions
from cfl_bench.strategies.decomposed import (
    FedWeITLeNet,
    LayerPrivate,
    prune,
    variance_scaling_,
)

if TYPE_CHECKING:
    from cfl_bench.core.context import ClientState, LocalRound, ServerState, Upload
    from cfl_bench.core.flat import FlatModel

#: The code's ``adaptive_factor``: every task's A starts at B₀ / 3.
ADAPTIVE_FACTOR = 3.0
#: The code's ε in the per-channel division of the aggregated bases.
AGGREGATION_EPS = 1e-15
MODEL = "fedweit-lenet"


@dataclass(frozen=True)
class Layout:
    """Where each decomposed layer's base lies in θ: (start, numel, output channels)."""

    layers: tuple[tuple[int, int, int], ...]
    head: tuple[int, int]  # the head's (classes, features)

    @property
    def params(self) -> int:
        return sum(n for _, n, _ in self.layers)

    @property
    def channels(self) -> int:
        return sum(out for _, _, out in self.layers)

    def expand(self, per_channel: torch.Tensor) -> torch.Tensor:
        """A per-output-channel vector (Σ out) spread over θ's layout (out is the first
        axis of every torch weight, so a channel's entries are contiguous)."""
        parts, offset = [], 0
        for _, numel, out in self.layers:
            parts.append(per_channel[offset : offset + out].repeat_interleave(numel // out))
            offset += out
        return torch.cat(parts)


def layout_of(model: FlatModel) -> Layout:
    module = model.module
    if not isinstance(module, FedWeITLeNet):
        raise UserError(f"fedweit composes decomposed layers only; use --model {MODEL}.")
    where = {s.name: s for s in model.slices}
    names = [n for n, m in module.named_modules() if m in module.layers()]
    rows = []
    for name, layer in zip(names, module.layers(), strict=True):
        s = where[f"{name}.shared"]
        rows.append((s.start, s.numel, int(layer.shared.shape[0])))
    return Layout(tuple(rows), (module.num_classes, int(module.fc2.shared.shape[0])))


def keep_mask(mask: torch.Tensor, layout: Layout, sparsity: float) -> torch.Tensor:
    """Per layer, 1 for the channels whose |m| exceeds the ⌊n·s⌋-th smallest |m| (0-based),
    the code's ``hard_threshold`` of ``get_weights``."""
    parts, offset = [], 0
    for _, _, out in layout.layers:
        m = mask[offset : offset + out].abs()
        threshold = torch.sort(m).values[math.floor(out * sparsity)]
        parts.append((m > threshold).to(mask.dtype))
        offset += out
    return torch.cat(parts)


def code_counted_upload(pruned_bases: torch.Tensor) -> int:
    """The code's per-round upload count: the nonzero entries of B ⊙ keep."""
    return int(torch.count_nonzero(pruned_bases))


def aggregate_bases(
    pruned_sum: torch.Tensor, keep_sum: torch.Tensor, layout: Layout
) -> torch.Tensor:
    """B_g = Σ B_c⊙keep_c / (Σ keep_c + ε), channel by channel."""
    return pruned_sum / (layout.expand(keep_sum) + AGGREGATION_EPS)


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


class FedWeIT(Component):
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

    def first_visit(
        self, state: dict[str, object], index: int, theta_g: torch.Tensor, layout: Layout
    ) -> None:
        """The first θ_g is the client's base and B₀; its head is drawn (Keras' Dense
        default: Glorot-uniform weights over one task's head, zero bias)."""
        state["base"], state["initial"] = theta_g.clone(), theta_g.clone()
        state["task"], state["past"] = -1, []
        classes, features = layout.head
        limit = math.sqrt(6.0 / (features + self.head_width))
        gen = generator(self.seed, self.random_stream, "head", index)
        weight = torch.rand(classes * features, generator=gen).mul_(2 * limit).sub_(limit)
        state["head"] = torch.cat((weight, torch.zeros(classes))).to(theta_g.device)

    def enter_task(
        self,
        state: dict[str, object],
        client: ClientState,
        kb: torch.Tensor | None,
        layout: Layout,
    ) -> None:
        """A new task: the last task's (m, A) joins the past, the retroactive targets are
        taken with the client's base as it stands, and the new task's m, bias, A, α and kb
        are set (kb: the broadcast's, zero without one)."""
        past = state["past"]
        assert isinstance(past, list)
        first = int(state["task"]) < 0  # type: ignore[call-overload]
        if not first:
            previous = state["task_vector"]
            assert isinstance(previous, torch.Tensor)
            m, p = layout.channels, layout.params
            past.append((previous[:m].clone(), previous[m : m + p].clone()))
            self.keep_task_model(state)
        own, initial = state["base"], state["initial"]
        assert isinstance(own, torch.Tensor) and isinstance(initial, torch.Tensor)
        state["targets"] = [own * layout.expand(torch.sigmoid(m)) + a for m, a in past]
        # The client's own first task has no α (the code's tid = 0, which is each client's
        # own first task: under per-client orders not stream task 0).
        rows = 0 if kb is None or first else int(kb.shape[0])
        kb_now = own.new_zeros(rows, own.numel()) if kb is None or rows == 0 else kb.clone()
        if rows and self.opts.kb_self == "drop":
            kb_now[client.index].zero_()
        gen = generator(self.seed, self.random_stream, client.index, client.task)
        mask, bias = own.new_empty(layout.channels), own.new_empty(layout.channels)
        atten = own.new_zeros(rows * len(layout.layers))
        offset = 0
        for index, (_, _, out) in enumerate(layout.layers):
            variance_scaling_(mask[offset : offset + out], out, gen)
            variance_scaling_(bias[offset : offset + out], out, gen)
            if rows:
                variance_scaling_(atten[index * rows : (index + 1) * rows], rows, gen)
            offset += out
        state["task_vector"] = torch.cat((mask, initial / ADAPTIVE_FACTOR, atten, bias))
        state["kb"], state["task"] = kb_now, client.task

    def keep_task_model(self, state: dict[str, object]) -> None:
        """The task just left, as the code keeps it per task for its evaluation: its m, A,
        α, bias, its head and its knowledge base (``models``, by stream task)."""
        models = state.setdefault("models", {})
        assert isinstance(models, dict)
        vector, head, kb = state["task_vector"], state["head"], state["kb"]
        assert isinstance(vector, torch.Tensor) and isinstance(head, torch.Tensor)
        assert isinstance(kb, torch.Tensor)
        models[int(state["task"])] = (vector.clone(), head.clone(), kb)  # type: ignore[call-overload]

    def task_model(
        self, state: dict[str, object], task: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """The client's (task vector, head, kb) for stream task ``task``: the current task's
        as trained so far, a past one's as kept when the client left it; None if untrained."""
        if "base" not in state:
            return None
        if state["task"] == task:
            vector, head, kb = state["task_vector"], state["head"], state["kb"]
            assert isinstance(vector, torch.Tensor) and isinstance(head, torch.Tensor)
            assert isinstance(kb, torch.Tensor)
            return vector, head, kb
        models = state.get("models", {})
        assert isinstance(models, dict)
        return models.get(task)

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

    def past_terms(
        self, state: dict[str, object]
    ) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """Each earlier task's (m_i, A_i, retroactive target), as ``regulariser`` reads them."""
        past, targets = state["past"], state.get("targets", [])
        assert isinstance(past, list) and isinstance(targets, list)
        return [(m, a, t) for (m, a), t in zip(past, targets, strict=True)]

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

    # -- server ------------------------------------------------------------------------------
    def receive_upload(self, upload: Upload, server: ServerState) -> None:
        """Sum the pruned bases and the keep masks; keep each uploaded A by client."""
        params = upload.params.detach()
        if self._pruned is None:
            self._pruned, self._uploads = params.clone(), 0
        else:
            self._pruned.add_(params)
        self._uploads += 1
        keep = upload.extras.get("fedweit.keep")
        if keep is not None:
            self._kept = keep.clone() if self._kept is None else self._kept.add_(keep)
        if "fedweit.adaptive" in upload.extras:
            self._adaptives[upload.client] = upload.extras["fedweit.adaptive"].clone()

    def aggregate(self, server: ServerState) -> None:
        """B_g per channel over the clients that kept it (sparse), else the plain mean (the
        code's unweighted ``1/len(clients)``)."""
        if self._pruned is None:
            return
        if self._kept is not None:
            layout = layout_of(server.model)
            server.global_params = aggregate_bases(self._pruned, self._kept, layout)
        else:
            server.global_params = self._pruned / self._uploads
        self._pruned, self._kept, self._uploads = None, None, 0

    def after_aggregate(self, server: ServerState) -> None:
        """At a task end: the knowledge base, one row per client (zero for a client that
        sent no A), in client order."""
        if not self._adaptives:
            return
        kb = server.global_params.new_zeros(len(server.clients), server.global_params.numel())
        for index, adaptive in self._adaptives.items():
            kb[index] = adaptive
        self.kb, self._adaptives = kb, {}

    def broadcast(self, server: ServerState) -> dict[str, torch.Tensor]:
        """The knowledge base goes out once, in the first round of the next task."""
        if self.kb is None or server.round_in_task != 0 or server.task == 0:
            return {}
        return {"fedweit.kb": self.kb}
