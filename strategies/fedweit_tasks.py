"""FedWeIT's per-client, per-task private state: what a client draws on its first visit,
what it sets up when it enters a task (the past tasks' masks and adaptives, the retroactive
targets, the new task's m, A, α, bias and kb), and the models it keeps per task for its
evaluation (``strategies.fedweit``).

Why a module of its own: the life of a client's private tensors across tasks is one
concern, separate from the local step and the server. ``ClientTasks`` holds it as
component methods mixed in before ``Component`` (``class FedWeIT(ClientTasks,
FedWeITServer, Component)``); the state lives in the client's ``ClientState.extras``,
never on the component, which serves every client.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, ClassVar

import torch

from cfl_bench.core.seeding import generator
from cfl_bench.strategies.decomposed import variance_scaling_

if TYPE_CHECKING:
    from cfl_bench.core.context import ClientState
    from cfl_bench.strategies.declarations import FedWeITOptions
    from cfl_bench.strategies.fedweit_layout import Layout

#: The code's ``adaptive_factor``: every task's A starts at B₀ / 3.
ADAPTIVE_FACTOR = 3.0


class ClientTasks:
    """A client's private state across its tasks (the code's per-task ``models``), as
    component methods over its ``state`` dict."""

    opts: FedWeITOptions
    seed: int
    head_width: int
    random_stream: ClassVar[str]  # the component's (``Component.random_stream``)

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

    def past_terms(
        self, state: dict[str, object]
    ) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """Each earlier task's (m_i, A_i, retroactive target), as ``regulariser`` reads them."""
        past, targets = state["past"], state.get("targets", [])
        assert isinstance(past, list) and isinstance(targets, list)
        return [(m, a, t) for (m, a), t in zip(past, targets, strict=True)]
