"""Replay learners and server-only components under the vectorized executor
(``engine.vectorized_replay``): equal to the sequential executor, buffers included.

Runs: embedded rot-digits, MLP, 2 tasks × 2 rounds, 4 clients with unequal Dirichlet shards,
a 20-example buffer (each client offers hundreds of examples per task, so it fills in the
first steps and the reservoir then replaces), replay batches of 8.
"""

from __future__ import annotations

import math

import pytest
import torch

from cfl_bench.core.buffer import ReservoirBuffer
from cfl_bench.core.errors import UserError
from cfl_bench.core.objective import Classification
from cfl_bench.engine.buffer_stack import ReservoirStack
from cfl_bench.engine.loop import Federation
from cfl_bench.engine.vectorized import VectorizedExecutor, check_strategy
from cfl_bench.engine.vectorized_replay import ReplayBatch, draw_replay, replay_loss
from cfl_bench.strategies.compose import build_strategy
from cfl_bench.strategies.replay import ReplayPlan, ReplayTerm
from cfl_bench.streams.partition import DirichletPartitioner
from tests.helpers import client, digits_federation, env
from tests.test_vectorized import assert_same, one_thread  # noqa: F401 - the fixture

REPLAY = dict(
    partitioner=DirichletPartitioner(alpha=0.5, min_size=2), buffer_size=20, buffer_batch_size=8
)


def run_both(strategy: str, augment: bool = False, **kw: object) -> tuple[Federation, Federation]:
    """Both executors on the same run (``augment``: a train augmentation drawing from the
    client's generator, re-applied to replayed inputs); returns the finished federations."""
    feds = []
    for executor in ("sequential", "vectorized"):
        fed = digits_federation(strategy, executor=executor, **{**REPLAY, **kw})  # type: ignore[arg-type]
        if augment:
            fed.executor.trainer.augment = noisy  # type: ignore[attr-defined]
        feds.append((fed, fed.run()))
    (seq, a), (vec, b) = feds
    assert isinstance(vec.executor, VectorizedExecutor)
    assert_same(seq, a, vec, b)
    return seq, vec


def noisy(x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """A stand-in train augmentation: Gaussian noise from the client's generator."""
    return x + 0.1 * torch.randn(x.shape, generator=gen)


def assert_same_buffers(seq: Federation, vec: Federation) -> None:
    """Every client's buffer holds the same examples, labels, task ids, counter and
    generator state; the stored logits agree to float rounding. (The trash row past the
    capacity is not compared: it holds whatever was rejected last, padding included.)"""
    for c, d in zip(seq.clients, vec.clients, strict=True):
        one, two = c.buffer, d.buffer
        assert one is not None and two is not None
        assert two.stack is not None and two.stack is vec.clients[0].buffer.stack  # type: ignore[union-attr]
        assert one.num_seen == two.num_seen > one.capacity  # filled, then replaced
        m = one.capacity
        assert torch.equal(one.x[:m], two.x[:m]) and torch.equal(one.y[:m], two.y[:m])
        assert torch.equal(one.task[:m], two.task[:m])
        assert set(one.task[: one.filled].tolist()) == {0, 1}
        assert torch.allclose(one.logits[:m], two.logits[:m], rtol=0, atol=1e-5)
        assert torch.equal(one.generator.get_state(), two.generator.get_state())
        assert torch.equal(c.generator.get_state(), d.generator.get_state())


@pytest.mark.parametrize("strategy", ["er", "der", "derpp", "der+fedprox:mu=0.3"])
def test_replay_learners_equal_the_sequential_executor(strategy: str) -> None:
    seq, vec = run_both(strategy)
    assert len({c.num_samples for c in vec.clients}) == 4  # unequal shards
    assert_same_buffers(seq, vec)


def test_augmented_replay_and_every_step_offers_equal() -> None:
    # DER++'s two draws, both terms' replay augmentations and the batch's, in order, from
    # the client's generator; offers every step of both epochs; momentum.
    kw = dict(replay_augment=True, buffer_offer="every_step", epochs=2, momentum=0.9)
    seq, vec = run_both("derpp", augment=True, **kw)
    assert_same_buffers(seq, vec)


def test_zero_weights_still_draw_as_sequentially() -> None:
    # DER++ with α = 0 still samples twice per step (one term); DER with α = 0 never samples.
    assert_same_buffers(*run_both("derpp:alpha=0"))
    assert_same_buffers(*run_both("der:alpha=0"))


@pytest.mark.parametrize("strategy", ["fedavg+fedavgm", "er+ifa:generation=1"])
def test_server_only_components_are_allowed_and_equal(strategy: str) -> None:
    check_strategy(build_strategy(strategy))
    run_both(strategy)


def learner_of(strategy: str):  # type: ignore[no-untyped-def]
    """The set-up learner of ``strategy`` (on a rot-mnist-like stream)."""
    built = build_strategy(strategy)
    built.setup(env())
    return built.learner


def test_replay_plans() -> None:
    # What each learner declares (``Learner.replay_plan``), which both executors run.
    assert learner_of("der").replay_plan() == ReplayPlan(1, (ReplayTerm(0, "mse", 1.0),))
    assert learner_of("der:alpha=0").replay_plan() == ReplayPlan()
    derpp = learner_of("derpp:alpha=0.2,beta=0").replay_plan()
    assert derpp == ReplayPlan(2, (ReplayTerm(0, "mse", 0.2),))
    both = learner_of("derpp").replay_plan()
    assert both == ReplayPlan(2, (ReplayTerm(0, "mse", 0.1), ReplayTerm(1, "ce", 0.5)))
    assert learner_of("er").replay_plan() == ReplayPlan(1, (ReplayTerm(0, "ce", 1.0),))
    assert learner_of("fedavg").replay_plan() == ReplayPlan()
    assert learner_of("agem").replay_plan() == ReplayPlan()
    assert learner_of("agem").offers_batches()
    assert not learner_of("agem:agem_fill=task_end").offers_batches()


def test_the_masked_replay_loss_by_hand() -> None:
    # Term 0, MSE × 0.5, rows 0 and 1 real: row means of squares (1² + 0²)/2 = 0.5 and
    # (0² + 2²)/2 = 2, mean 1.25, weighted 0.625. Term 1, CE × 1, row 0 real: equal
    # logits, CE = ln 2. Padded rows (9s) count for nothing.
    outputs = torch.tensor(
        [[[1.0, 0.0], [0.0, 2.0], [9.0, 9.0]], [[0.0, 0.0], [9.0, 0.0], [9.0, 9.0]]]
    )
    batch = ReplayBatch(
        x=torch.zeros(2, 3, 1),
        y=torch.zeros(2, 3, dtype=torch.long),
        logits=torch.zeros(2, 3, 2),
        mask=torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]]),
    )
    terms = (ReplayTerm(0, "mse", 0.5), ReplayTerm(1, "ce", 1.0))
    value = replay_loss(outputs, batch, terms, Classification())
    assert value.item() == pytest.approx(0.625 + math.log(2), rel=1e-6)
    empty = ReplayBatch(batch.x, batch.y, batch.logits, torch.zeros(2, 3))
    assert replay_loss(outputs, empty, terms, Classification()).item() == 0.0  # no term


def test_draw_replay_takes_the_sequential_samples_and_pads() -> None:
    # Client 0: 2 stored examples, replay batch 3 (one draw of min(3, 2) rows: randperm(2)
    # from the buffer's generator, padded to 3); client 1 has an empty buffer; client 2
    # takes no step.
    def full_buffer(seed: int) -> ReservoirBuffer:
        buf = ReservoirBuffer(4, (1,), 2, device=torch.device("cpu"), generator=torch.Generator())
        buf.generator.manual_seed(seed)
        buf.add(torch.arange(2.0)[:, None], torch.tensor([0, 1]), torch.eye(2), 0)
        return buf

    buf = full_buffer(5)
    empty = ReservoirBuffer(4, (1,), 2, device=torch.device("cpu"), generator=torch.Generator())
    ReservoirStack([buf, empty])
    clients = [client(0, buf), client(1, empty), None]
    reference = full_buffer(5).sample(3)
    plan = learner_of("er").replay_plan()
    batch = draw_replay(clients, plan, 3, None)
    assert batch is not None and reference is not None
    assert batch.x.shape == (3, 1, 3, 1)
    assert torch.equal(batch.x[0, 0, :2], reference.x)
    assert torch.equal(batch.y[0, 0, :2], reference.y)
    assert batch.mask.tolist() == [[[1, 1, 0]], [[0, 0, 0]], [[0, 0, 0]]]
    assert draw_replay([client(1, empty)], plan, 3, None) is None  # nobody replays: no batch


def test_learners_are_recognised_by_their_declarations() -> None:
    # A learner states its step only by its declared plan (no loss method to override);
    # the one refused is the learner declaring that its data grows with the history.
    from cfl_bench.strategies.base import Learner

    for hook in ("loss", "batch_loss", "observe"):
        assert not hasattr(Learner, hook), hook  # the plan is the only form of the loss
    assert learner_of("ideal").needs_history
    assert not learner_of("agem").needs_history and not learner_of("der").needs_history
    check_strategy(build_strategy("agem"))  # refine is pure: both executors run it
    with pytest.raises(UserError, match="grows with the task history"):
        check_strategy(build_strategy("ideal"))
    check_strategy(build_strategy("er+fedprox+fedavgm+moon"))
