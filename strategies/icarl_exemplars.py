"""iCaRL's exemplar memory: the examples a client keeps from its earlier tasks and joins to
the data of each new one (``strategies.icarl``, and GLFC on top of it).

Why a module of its own: choosing and keeping exemplars (a uniform draw, or herding on the
model's features) is one concern, separate from iCaRL's distillation and its nearest-mean
classifier; ``ExemplarMemory`` holds it as component methods, mixed in before ``Learner``
(``class ICaRL(ExemplarMemory, Learner)``), so these override the learner's defaults. The
memory lives in the client's state (``client.state_for(name)``: ``x``, ``y``, ``rows``,
``seen``), never on the component, which serves every client.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, ClassVar, cast

import torch

if TYPE_CHECKING:
    from cfl_bench.core.context import ClientState
    from cfl_bench.core.flat import FlatModel
    from cfl_bench.strategies.declarations import ICaRLOptions

# PyCIL's EPSILON in the feature normalisation x / (‖x‖ + ε).
EPSILON = 1e-8


def normalised(features: torch.Tensor) -> torch.Tensor:
    """Rows divided by their norm + ε, as PyCIL normalises features."""
    return features / (features.norm(dim=1, keepdim=True) + EPSILON)


def features_of(module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The features the model's classifier reads (the ``features`` capability), float."""
    represent = cast("Callable[[torch.Tensor], torch.Tensor]", module.representation)
    return represent(x).float()


def herding(features: torch.Tensor, m: int) -> torch.Tensor:
    """The indices of the ``m`` rows herding chooses from normalised ``features`` (n, d), in
    the order chosen: step k takes the remaining row whose addition brings the mean of the
    k chosen rows closest (Euclidean) to the mean of all rows; ties go to the first row."""
    target = features.mean(dim=0)
    taken = torch.zeros(features.shape[0], dtype=torch.bool, device=features.device)
    total = torch.zeros_like(target)
    order: list[int] = []
    for k in range(1, min(m, features.shape[0]) + 1):
        gaps = (target - (features + total) / k).norm(dim=1)
        i = int(gaps.masked_fill(taken, float("inf")).argmin())
        order.append(i)
        taken[i] = True
        total = total + features[i]
    return torch.tensor(order, dtype=torch.long, device=features.device)


def random_memory_split(seen: int, new: int, memory: int, gen: torch.Generator) -> int:
    """How many rows of a uniform ``memory``-subset of ``seen`` + ``new`` examples fall
    among the ``seen`` (all of them when there are no more than ``memory``)."""
    if seen + new <= memory:
        return seen
    draw = torch.randperm(seen + new, generator=gen, device=gen.device)[:memory]
    return int((draw < seen).sum())


class ExemplarMemory:
    """The exemplars a client keeps (``selection``: a uniform draw or herding), joined to
    its task data and chosen again at every task end, as component methods."""

    name: ClassVar[str]  # the component's (``Component.name``)
    opts: ICaRLOptions
    classes_per_task: int

    def local_data(
        self, client: ClientState, x: torch.Tensor, y: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The task's shard with the client's exemplars after it (the shard's length is
        kept: a task end chooses among the shard's rows only)."""
        state = client.state_for(self.name)
        state["rows"] = int(y.shape[0])
        kept_y = state.get("y")
        if not isinstance(kept_y, torch.Tensor) or kept_y.numel() == 0:
            return x, y
        kept_x = state["x"]
        assert isinstance(kept_x, torch.Tensor)
        return torch.cat([x, kept_x.to(x.device)]), torch.cat([y, kept_y.to(y.device)])

    def on_task_end(self, client: ClientState, task: int, model: FlatModel) -> None:
        """Choose the exemplars the client keeps for the next tasks (``model`` at θ_g)."""
        if client.train_x is None or client.train_y is None:
            return
        state = client.state_for(self.name)
        if self.opts.selection == "herding":
            state["x"], state["y"] = self._herded_memory(client, model, task)
            return
        rows, (new_x, new_y), (old_x, old_y) = self._shard_and_exemplars(client)
        seen = int(state.get("seen", 0))  # type: ignore[call-overload]
        gen = client.generator
        k = random_memory_split(seen, rows, self.opts.memory, gen)
        keep_old = torch.randperm(old_y.shape[0], generator=gen, device=gen.device)[:k]
        take = min(self.opts.memory - k, rows)
        keep_new = torch.randperm(rows, generator=gen, device=gen.device)[:take]
        state["x"] = torch.cat([old_x[keep_old.to(old_x.device)], new_x[keep_new.to(new_x.device)]])
        state["y"] = torch.cat([old_y[keep_old.to(old_y.device)], new_y[keep_new.to(new_y.device)]])
        state["seen"] = seen + rows

    def _herded_memory(
        self, client: ClientState, model: FlatModel, task: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The exemplars (stored inputs, labels) the client keeps if ``task`` ends at the
        model's θ_g: herding's choice among its kept exemplars and the task's shard."""
        rows, (new_x, new_y), (old_x, old_y) = self._shard_and_exemplars(client)
        keep_old, keep_new = self._herded(client, model, task, rows, old_y)
        return (
            torch.cat([old_x[keep_old], new_x[keep_new]]),
            torch.cat([old_y[keep_old], new_y[keep_new]]),
        )

    def _shard_and_exemplars(
        self, client: ClientState
    ) -> tuple[int, tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
        """The client's training rows split as ``local_data`` joined them: the number of
        the task's own rows, those rows (x, y), and the exemplars kept so far (x, y; empty
        before the first task end)."""
        assert client.train_x is not None and client.train_y is not None
        state = client.state_for(self.name)
        rows = int(state.get("rows", client.num_samples))  # type: ignore[call-overload]
        new_x, new_y = client.train_x[:rows], client.train_y[:rows]
        old_x, old_y = state.get("x"), state.get("y")
        if not isinstance(old_x, torch.Tensor) or not isinstance(old_y, torch.Tensor):
            old_x, old_y = new_x[:0], new_y[:0]
        return rows, (new_x, new_y), (old_x, old_y)

    def _herded(
        self, client: ClientState, model: FlatModel, task: int, rows: int, old_y: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows of the old exemplars and of the finished task's shard that herding keeps:
        the first m of each old class, m herded of each new class, m = memory // (classes
        of tasks 0..task)."""
        m = self.opts.memory // ((task + 1) * self.classes_per_task)
        assert client.train_y is not None
        device = client.train_y.device
        keep_old = [torch.nonzero(old_y == c).flatten()[:m] for c in torch.unique(old_y).tolist()]
        new_y = client.train_y[:rows]
        keep_new: list[torch.Tensor] = []
        with torch.inference_mode():
            for c in torch.unique(new_y).tolist():
                idx = torch.nonzero(new_y == c).flatten()
                features = normalised(features_of(model.module, client.inputs(idx)))
                keep_new.append(idx[herding(features, m).to(device)])
        empty = torch.zeros(0, dtype=torch.long, device=device)
        return torch.cat([empty, *keep_old]), torch.cat([empty, *keep_new])
