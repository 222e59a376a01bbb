"""Replay learners (ER, DER, DER++) for the vectorized executor: draws client by client,
compute batched.

The sequential step of a replay learner is (``strategies.er`` / ``der`` / ``derpp``, then
``Learner.observe``):

    draws    d_1 … d_D ← buffer.sample(m) each (buffer generator), only when filled > 0
    loss     CE(f(x), y) + Σ_t w_t · ℓ_t(f(aug(x_{d(t)})), target_t)
    step     backward, penalties, optimizer
    observe  buffer.add(raw x, y, f(x) before the step, task)   (offered batches only)

with, per learner (``ReplayPlan``):

- ER: D = 1, one term ℓ = CE on the draw's labels, w = 1;
- DER: D = 1 when α > 0 (no draw at all when α = 0), ℓ = MSE to the draw's stored logits
  (mean over rows × outputs), w = α;
- DER++: D = 2 independent draws whenever the buffer holds anything; the MSE term on the
  first (w = α, only when α > 0), the CE term on the second (w = β, only when β > 0).

What stays per client (a Python loop over the chunk's clients, as cheap as the index draws
it makes): ``buffer.sample`` and ``buffer.add`` on the client's own ``ClientState.buffer``
(the reservoir's ``randperm`` and ``rand`` come from the buffer's generator), and the replay
augmentation (``replay_augment``: the stream's train augmentation of each replayed draw, in
term order, from the client's generator). Every generator is the client's own, so drawing
client after client within a lock-step keeps each generator's sequence exactly as the
sequential loop draws it: batch augmentation, then the replay draws, then the replay
augmentations, then (after the step) the reservoir insertion.

What is batched: the replay forward and backward. The draws are padded to ``m`` rows with
a per-row mask (a client with an empty buffer, or whose steps are done, has an all-zero
mask and contributes no replay term: its masked sums are exactly 0, as the sequential loss
has no term), and ``_client_loss`` forwards the current batch and every term's replay rows
as one concatenated batch per client. Why one forward: the vectorizable models hold no
BatchNorm and no dropout, so each example's outputs depend on that example alone and one
forward of the union equals separate forwards up to float rounding, with one kernel
launch instead of 1 + T. Insertion stores the current batch's outputs of that same
vmapped forward (taken before the step, as ``step.outputs`` is).

The buffers stay the per-client ``ReservoirBuffer`` objects, which checkpoints and the
sequential executor read unchanged; stacked (C, M, …) buffers with a batched reservoir
insert over clients are later work.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from cfl_bench.engine.context import ClientState
from strategies.agem import AGEM
from strategies.base import Learner
from strategies.der import DER
from strategies.derpp import DERPP
from strategies.er import ER
from strategies.fedavg import FedAvg

# The learners whose local step the vectorized executor reproduces (exact classes: a
# subclass may override ``loss`` or ``observe``).
SUPPORTED_LEARNERS: tuple[type[Learner], ...] = (FedAvg, ER, DER, DERPP, AGEM)

Augment = Callable[[torch.Tensor, torch.Generator], torch.Tensor]


@dataclass(frozen=True)
class ReplayTerm:
    """One replay term of the loss: ``weight`` · ``kind`` on the rows of draw ``draw``;
    ``kind`` is "ce" (cross-entropy to the stored labels) or "mse" (mean squared error to
    the stored logits)."""

    draw: int
    kind: str
    weight: float


@dataclass(frozen=True)
class ReplayPlan:
    """How many buffer draws a step makes while the buffer holds anything, and the terms
    built from them (in the order the learner forwards them)."""

    draws: int = 0
    terms: tuple[ReplayTerm, ...] = ()


def reference_plan(learner: Learner) -> ReplayPlan | None:
    """A-GEM's reference draw: one buffer sample per step, whose mean CE gradient g_b the
    step's gradient is projected against (after the penalties, before the transforms);
    None for the other learners."""
    return ReplayPlan(1, (ReplayTerm(0, "ce", 1.0),)) if type(learner) is AGEM else None


def observes(learner: Learner) -> bool:
    """Whether the learner's ``observe`` offers batches to the buffer (A-GEM's ``task_end``
    fill does not: its buffer is filled at task ends)."""
    return not (type(learner) is AGEM and learner.fill != "reservoir")


def replay_plan(learner: Learner) -> ReplayPlan:
    """The replay plan of one of ``SUPPORTED_LEARNERS`` (fedavg and agem: none)."""
    if type(learner) is ER:
        return ReplayPlan(1, (ReplayTerm(0, "ce", 1.0),))
    if type(learner) is DER:
        alpha = float(learner.alpha)
        return ReplayPlan(1, (ReplayTerm(0, "mse", alpha),)) if alpha > 0 else ReplayPlan()
    if type(learner) is DERPP:
        terms = (ReplayTerm(0, "mse", float(learner.alpha)), ReplayTerm(1, "ce", learner.beta))
        return ReplayPlan(2, tuple(t for t in terms if t.weight > 0))
    return ReplayPlan()


@dataclass(frozen=True)
class ReplayBatch:
    """Every client's replay rows, padded: inputs (C, T, m, …), labels (C, T, m), stored
    logits (C, T, m, K) and the row mask (C, T, m), for the plan's T terms."""

    x: torch.Tensor
    y: torch.Tensor
    logits: torch.Tensor
    mask: torch.Tensor


def draw_replay(
    clients: Sequence[ClientState | None],
    plan: ReplayPlan,
    size: int,
    augment: Augment | None,
) -> ReplayBatch | None:
    """Each listed client's replay draws for one step, in the sequential order (None: the
    client takes no step); None when no client replays anything this step.

    Draws happen even when the plan has no terms (DER++ with α = β = 0 still samples), so
    the buffer generators advance as sequentially.
    """
    per_client: list[list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] | None] = []
    for client in clients:
        buffer = None if client is None else client.buffer
        if client is None or buffer is None or buffer.filled == 0 or plan.draws == 0:
            per_client.append(None)
            continue
        draws = [buffer.sample(size) for _ in range(plan.draws)]
        rows = []
        for term in plan.terms:
            draw = draws[term.draw]
            assert draw is not None  # filled > 0
            x = draw.x if augment is None else augment(draw.x, client.generator)
            rows.append((x, draw.y, draw.logits))
        per_client.append(rows)
    if not plan.terms or all(rows is None for rows in per_client):
        return None
    return pad_replay(per_client, len(plan.terms), size)


def pad_replay(
    per_client: list[list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] | None],
    terms: int,
    size: int,
) -> ReplayBatch:
    """Stack the clients' replay rows into (C, T, size, …) tensors with a row mask."""
    x0, y0, z0 = next(rows for rows in per_client if rows is not None)[0]
    count = len(per_client)
    x = x0.new_zeros((count, terms, size, *x0.shape[1:]))
    y = y0.new_zeros((count, terms, size, *y0.shape[1:]))
    logits = z0.new_zeros((count, terms, size, *z0.shape[1:]))
    mask = x0.new_zeros((count, terms, size))
    for i, rows in enumerate(per_client):
        for t, (rx, ry, rz) in enumerate(rows or ()):
            m = ry.shape[0]
            x[i, t, :m], y[i, t, :m], logits[i, t, :m], mask[i, t, :m] = rx, ry, rz, 1
    return ReplayBatch(x, y, logits, mask)


def replay_loss(
    outputs: torch.Tensor, replay: ReplayBatch, terms: tuple[ReplayTerm, ...]
) -> torch.Tensor:
    """One client's weighted replay terms (inside ``vmap``: ``replay``'s tensors are the
    client's (T, m, …) slices, ``outputs`` its (T, m, K) replay outputs).

    Masked means over the real rows: CE as ``F.cross_entropy``'s mean, MSE as
    ``F.mse_loss``'s mean over rows × outputs; a term with no real rows is exactly 0.
    """
    from torch.nn import functional as F

    total = outputs.new_zeros(())
    for t, term in enumerate(terms):
        mask = replay.mask[t]
        rows = mask.sum().clamp(min=1)
        if term.kind == "ce":
            per_row = F.cross_entropy(outputs[t], replay.y[t], reduction="none")
        else:
            diff = outputs[t] - replay.logits[t]
            per_row = (diff * diff).flatten(1).mean(dim=1)
        total = total + term.weight * ((per_row * mask).sum() / rows)
    return total


def observe_all(
    learner: Learner,
    clients: Sequence[ClientState],
    offers: Sequence[bool],
    stored: Sequence[tuple[torch.Tensor, torch.Tensor] | None],
    outputs: torch.Tensor,
) -> None:
    """``Learner.observe`` of every client that stepped and offers its batch: its raw
    inputs and labels (``stored[i]``), and its rows of ``outputs`` (C, batch, K), the
    outputs of the vmapped forward before the step."""
    for i, client in enumerate(clients):
        buffer, batch = client.buffer, stored[i]
        if buffer is None or batch is None or not offers[i]:
            continue
        x, y = batch
        kept = learner.objective.buffer_outputs(outputs[i, : y.shape[0]])
        buffer.add(x, y, kept, client.task)
