"""Replay learners for the vectorized executor: draws client by client, compute batched.

The sequential step of a replay learner is (``one_client.plan_loss``, then
``one_client.offer_batch``):

    draws    d_1 … d_D ← buffer.sample(m) each (buffer generator), only when filled > 0
    loss     ℓ(f(x), y) + Σ_t w_t · ℓ_t(f(aug(x_{d(t)})), target_t)
    step     backward, penalties, optimizer
    observe  buffer.add(raw x, y, f(x) before the step, task)   (offered batches only)

with D and the terms the learner's declared ``replay_plan`` (``strategies.replay``: ER,
DER and DER++ write theirs there), each term computed by the same ``replay_term_loss`` as
sequentially, over the real rows of the padded draw.

What stays per client (a Python loop over the chunk's clients, as cheap as the index draws
it makes): the random draws — each sample's ``randperm`` and each insertion's u ~ U[0, 1)
from the client's buffer generator — and the replay augmentation (``replay_augment``: the
stream's train augmentation of each replayed draw, in term order, from the client's
generator). Every generator is the client's own, so drawing client after client within a
lock-step keeps each generator's sequence exactly as the sequential loop draws it: batch
augmentation, then the replay draws, then the replay augmentations, then (after the step)
the reservoir insertion.

What is batched: the buffers live in one ``ReservoirStack`` (x (K, M+1, …), y, logits,
task; each client's ``ReservoirBuffer`` is a view of its row, so checkpoints and the
sequential code paths are unchanged), so a lock-step's replay rows are one gather per field
and its reservoir inserts for all offering clients one slot computation and one
``index_copy_`` per field (``ReservoirStack.add``, equal to per-client algorithm R on the
same draws). The replay forward and backward are part of the vmapped per-client loss:
draws padded to ``m`` rows with a per-row mask (a client with an empty buffer, or whose
steps are done, has an all-zero mask and contributes no replay term: its masked sums are
exactly 0, as the sequential loss has no term); ``_client_loss`` forwards the current batch
and every term's replay rows as one concatenated batch per client. Why one forward: the
vectorizable models hold no BatchNorm, so each example's outputs depend on that example
(and its own dropout mask, drawn per forward as sequentially: ``engine.vectorized_dropout``)
alone and one forward of the union equals separate forwards up to float
rounding, with one kernel launch instead of 1 + T. Insertion stores the current batch's
outputs of that same vmapped forward (taken before the step, as ``step.outputs`` is).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from cfl_bench.core.buffer import ReservoirBuffer
from cfl_bench.core.context import ClientState
from cfl_bench.core.objective import Objective
from cfl_bench.engine.buffer_stack import ReservoirStack
from cfl_bench.engine.host_values import device_tensor
from cfl_bench.strategies.base import Learner
from cfl_bench.strategies.replay import ReplayPlan, ReplayTerm, replay_term_loss

Augment = Callable[[torch.Tensor, torch.Generator], torch.Tensor]


@dataclass(frozen=True)
class ReplayBatch:
    """Every client's replay rows, padded: inputs (C, T, m, …), labels (C, T, m), stored
    logits (C, T, m, K) and the row mask (C, T, m), for the plan's T terms; ``rows`` is each
    client's number of real rows per term, known on the host (no device read)."""

    x: torch.Tensor
    y: torch.Tensor
    logits: torch.Tensor
    mask: torch.Tensor
    rows: tuple[int, ...] = ()


def draw_replay(
    clients: Sequence[ClientState | None],
    plan: ReplayPlan,
    size: int,
    augment: Augment | None,
) -> ReplayBatch | None:
    """Each listed client's replay draws for one step, in the sequential order (None: the
    client takes no step); None when no client replays anything this step.

    The permutations are drawn client by client from each buffer's generator
    (``ReservoirStack.draw_index``), the rows gathered for all clients at once from the
    stacked storage, then each client's replayed inputs augmented from its generator in term
    order. Draws happen even when the plan has no terms (DER++ with α = β = 0 still
    samples), so the buffer generators advance as sequentially.
    """
    buffers = [None if c is None else c.buffer for c in clients]
    stack = stack_of(buffers)
    if stack is None or plan.draws == 0:
        return None
    index, mask = stack.draw_index(buffers, plan.draws, size)
    if not plan.terms or not any(b is not None and b.filled for b in buffers):
        return None
    term_draws = device_tensor([t.draw for t in plan.terms], index.device)
    index, mask = index[:, term_draws], mask[:, term_draws]
    x, y = stack.gather("x", index), stack.gather("y", index)
    logits = stack.gather("logits", index)
    pairs = zip(clients, buffers, strict=True)
    rows = tuple(0 if c is None or b is None else min(size, b.filled) for c, b in pairs)
    if augment is not None:
        for i, client in enumerate(clients):
            if client is None or not rows[i]:  # a padding row, or nothing drawn
                continue
            for t in range(len(plan.terms)):
                x[i, t, : rows[i]] = augment(x[i, t, : rows[i]], client.generator)
    return ReplayBatch(x, y, logits, mask, rows)


def stack_of(buffers: Sequence[ReservoirBuffer | None]) -> ReservoirStack | None:
    """The one ``ReservoirStack`` holding every listed buffer (None: no buffers listed);
    refuses buffers outside a stack or in different stacks."""
    stacks = {id(b.stack): b.stack for b in buffers if b is not None}
    if not stacks:
        return None
    stack = next(iter(stacks.values()))
    if len(stacks) != 1 or not isinstance(stack, ReservoirStack):
        raise RuntimeError("the vectorized executor needs every client's buffer in one stack")
    return stack


def replay_loss(
    outputs: torch.Tensor,
    replay: ReplayBatch,
    terms: tuple[ReplayTerm, ...],
    objective: Objective,
) -> torch.Tensor:
    """One client's weighted replay terms (inside ``vmap``: ``replay``'s tensors are the
    client's (T, m, …) slices, ``outputs`` its (T, m, K) replay outputs): each term's
    ``replay_term_loss`` over the real rows (a term with no real rows is exactly 0)."""
    total = outputs.new_zeros(())
    for t, term in enumerate(terms):
        value = replay_term_loss(
            term, outputs[t], replay.y[t], replay.logits[t], objective, replay.mask[t]
        )
        total = total + term.weight * value
    return total


def observe_all(
    learner: Learner,
    clients: Sequence[ClientState],
    counts: Sequence[int],
    raw: torch.Tensor,
    labels: torch.Tensor,
    outputs: torch.Tensor,
) -> None:
    """The buffer insertion (``one_client.offer_batch``) of every client with ``counts[i]``
    > 0 (it stepped and offers its batch), as one batched reservoir insert: its raw inputs
    ``raw`` (C, batch, …), labels (C, batch) and rows of ``outputs`` (C, batch, K), the
    outputs of the vmapped forward before the step; ``counts[i]`` is the client's real
    batch size."""
    chosen = [i for i, n in enumerate(counts) if n and clients[i].buffer is not None]
    if not chosen:
        return
    buffers = [b for i in chosen if (b := clients[i].buffer) is not None]  # all, by ``chosen``
    stack = stack_of(buffers)
    assert stack is not None
    rows = device_tensor(chosen, raw.device)
    kept = learner.objective.buffer_outputs(outputs)
    stack.add(
        buffers,
        [counts[i] for i in chosen],
        raw[rows],
        labels[rows],
        kept[rows],
        [clients[i].task for i in chosen],
    )
