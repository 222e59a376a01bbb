"""Client-side FL components under the vectorized executor (``engine.lock_step``): equal
to the sequential executor, per-client component state included.

Runs as tests/test_vectorized_replay.py: embedded rot-digits, MLP, 2 tasks × 2 rounds,
4 clients with unequal Dirichlet shards, a 20-example buffer, replay batches of 8.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import pytest
import torch

import cfl_bench.strategies.projection as projection
from cfl_bench.core.errors import UserError
from cfl_bench.engine import vectorized
from cfl_bench.engine.executor import SequentialExecutor
from cfl_bench.engine.loop import Federation
from cfl_bench.engine.vectorized import check_strategy
from cfl_bench.engine.vectorized_grad import ChunkTerm
from cfl_bench.strategies import fedproj
from cfl_bench.strategies.base import (
    ClientInputs,
    Component,
    Declaration,
    Learner,
    Role,
    non_negative_float,
    option,
)
from cfl_bench.strategies.compose import build_strategy
from cfl_bench.strategies.fedntd import not_true_distillation
from cfl_bench.strategies.projection import conflict_coefficients, row_dot
from cfl_bench.strategies.registry import component_classes
from tests.helpers import client, env
from tests.test_vectorized import Skewed, assert_same, both, one_thread  # noqa: F401 - the fixture
from tests.test_vectorized_replay import REPLAY, assert_same_buffers, run_both


def assert_same_client_state(seq: Federation, vec: Federation, component: str) -> None:
    """Every client's tensors kept for ``component`` (c_k, h_k, u_k, v_k) agree to float
    rounding, and at least one client holds a non-zero one."""
    nonzero = False
    for c, d in zip(seq.clients, vec.clients, strict=True):
        one, two = c.state_for(component), d.state_for(component)
        assert one.keys() == two.keys()
        for key, value in one.items():
            other = two[key]
            if isinstance(value, torch.Tensor) and value.is_floating_point():
                assert isinstance(other, torch.Tensor)
                assert torch.allclose(value, other, rtol=1e-4, atol=1e-6), (component, key)
                nonzero = nonzero or bool(value.abs().max() > 0)
            elif isinstance(value, torch.Generator):
                assert isinstance(other, torch.Generator)
                assert torch.equal(value.get_state(), other.get_state())
            else:
                assert value == other, (component, key)
    assert nonzero, component


def test_der_fedgp_equals_and_projects(monkeypatch: pytest.MonkeyPatch) -> None:
    # The FedGP protocol: g_ref from each client's buffer after every round, projection at
    # every step of rounds 2 to 4. Count the conflicting rows the batched projection met.
    conflicts = count_conflicts(monkeypatch, projection)
    answered = spy_sequential_answers(monkeypatch)
    seq, vec = run_both("der+fedgp")
    assert_same_buffers(seq, vec)
    assert_same_gref(seq, vec)
    # FedGP's own step function projected, one client at a time and a chunk at a time.
    chunked = [count for count, rows in conflicts if rows == 4]
    assert sum(chunked) > 0 and len(chunked) > 10
    assert any(rows == 1 and count for count, rows in conflicts)
    # g_ref after each of the 4 rounds, batched by the vectorized executor's own answer.
    assert answered == [seq.executor] * 4


def spy_sequential_answers(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Record which executor object each call of ``SequentialExecutor.answer`` ran on."""
    answered: list[object] = []
    original = SequentialExecutor.answer

    def spy(self: SequentialExecutor, *args: object) -> None:
        answered.append(self)
        original(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(SequentialExecutor, "answer", spy)
    return answered


def assert_same_gref(seq: Federation, vec: Federation) -> None:
    gref = [c.gref for c in (seq.strategy.components[0], vec.strategy.components[0])]
    assert gref[0] is not None and gref[1] is not None
    assert torch.allclose(gref[0], gref[1], rtol=0, atol=1e-6)


def test_batched_reference_gradients_of_unequal_buffers_equal() -> None:
    # gref_samples=all on very unequal shards: client 0 holds a handful of examples, so its
    # buffer holds fewer than the others' and the batched answer pads it (row mask). One
    # round: g_ref is compared, not trained with (projecting on these shards for 3 more
    # rounds amplifies rounding to ~1.2e-5 with either answer: docs/executors.md).
    kw = dict(partitioner=Skewed(), buffer_size=50, num_tasks=1, rounds_per_task=1)
    seq, vec = run_both("der+fedgp:gref_samples=all", **kw)
    filled = {c.buffer.filled for c in vec.clients if c.buffer is not None}
    assert len(filled) > 1, filled
    assert_same_gref(seq, vec)


@pytest.mark.parametrize(
    ("strategy", "component"),
    [
        ("fedavg+scaffold", "scaffold"),
        ("scaffold+ifa:generation=1", "scaffold"),
        ("fedavg+scaffold:variate=I", "scaffold"),
        ("er+fedcurv", "fedcurv"),
        ("fedavg+feddyn", "feddyn"),
    ],
)
def test_client_state_components_equal(strategy: str, component: str) -> None:
    seq, vec = run_both(strategy)
    assert_same_client_state(seq, vec, component)


def test_scaffold_with_momentum_and_fednova_equal() -> None:
    run_both("fedavg+fednova", momentum=0.5, epochs=2)
    seq, vec = run_both("fedavg+scaffold:server_lr=0.5", momentum=0.9)
    assert_same_client_state(seq, vec, "scaffold")


def test_every_batched_hook_in_one_composition_equals() -> None:
    # Penalties (FedProx, FedCurv) then transforms (SCAFFOLD, then FedGP's projection).
    seq, vec = run_both("derpp+fedprox:mu=0.1+fedcurv:lam=0.5+scaffold+fedgp")
    assert_same_buffers(seq, vec)
    assert_same_client_state(seq, vec, "scaffold")


def test_fedproj_client_projection_equals(monkeypatch: pytest.MonkeyPatch) -> None:
    # The memory gradient at every client's row (its memory batch from its own generator,
    # or the whole memory) and the projection, in rounds 2 to 4. distill_lr = 1e-12 keeps
    # the server's Adam distillation from amplifying the executors' rounding (at the
    # default 1e-4 the gap is 2.8e-5 with memory=batch: docs/executors.md). eps = 1e-6:
    # a memory gradient g_m with ‖g_m‖² of 1e-8 to 1e-6 (here down to 7.6e-9, a memory
    # the model already fits) is a difference of near-equal terms, so its direction is
    # set by rounding and the projection onto it carries the executors' last-bit
    # differences into θ. With the default eps = 1e-8 the gap after 4 rounds was 2.1e-4
    # with memory=all on torch 2.14.1 (AVX2) and under 1e-5 on an older build; eps = 1e-6
    # keeps those references out and leaves every well-conditioned projection in
    # (measured: 2.3e-7; 17 of the 129 client steps had a reference under eps).
    conflicts = count_conflicts(monkeypatch, fedproj)
    seq, vec = run_both("fedavg+fedproj:distill_lr=1e-12,eps=1e-6")
    chunked = [count for count, rows in conflicts if rows == 4]
    assert sum(chunked) > 0 and len(chunked) > 10
    for c, d in zip(seq.clients, vec.clients, strict=True):
        one, two = c.state_for("fedproj")["generator"], d.state_for("fedproj")["generator"]
        assert isinstance(one, torch.Generator) and isinstance(two, torch.Generator)
        assert torch.equal(one.get_state(), two.get_state())
    run_both("der+fedproj:memory=all,distill_lr=1e-12,eps=1e-6", augment=True)


@dataclass(frozen=True)
class PullOptions:
    mu: float = option(0.5, "weight μ", non_negative_float)


PULL = Declaration(
    name="pull-test",
    summary="pull towards the client's last local model",
    paper="(this test)",
    roles=frozenset({Role.LOSS_TERM}),
    options=PullOptions,
)


class PullToLastLocal(Component):
    """A method that exists only in this test, written as any new method is: a declaration
    row, its step function (a penalty) and its per-round inputs, no executor code.
    (μ/2)‖θ − a_k‖², a_k the client's own last local model (θ_g before its first round)."""

    declaration = PULL
    opts: PullOptions
    uses_after_local = True  # its after_local keeps the client's last local model

    def setup(self, env: object) -> None:
        self.mu = self.opts.mu

    def client_inputs(self, client: object, local: object) -> ClientInputs:
        state = client.state_for(self.name)  # type: ignore[attr-defined]
        return {"target": state.get("last", local.broadcast.params)}  # type: ignore[attr-defined]

    def penalty(
        self, params: torch.Tensor, grads: torch.Tensor, inputs: ClientInputs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        diff = params - inputs["target"]
        return grads.add(diff, alpha=self.mu), 0.5 * self.mu * row_dot(diff, diff)

    def after_local(self, client: object, upload: object, local: object) -> None:
        state = client.state_for(self.name)  # type: ignore[attr-defined]
        state["last"] = local.model.params.detach().clone()  # type: ignore[attr-defined]


def test_a_new_method_runs_vectorized_by_construction() -> None:
    # One module-level class outside the package, named by its import path (a plugin): both
    # executors run its penalty, the first round with one shared target, later rounds with a
    # stacked target per client; its state is kept under the name the strategy wrote.
    path = f"{__name__}.PullToLastLocal"
    seq, vec = run_both(f"der+{path}:mu=0.3+fedgp")
    assert_same_client_state(seq, vec, path)


def test_the_ideal_learner_is_refused() -> None:
    with pytest.raises(UserError, match="not 'ideal'") as caught:
        check_strategy(build_strategy("ideal"))
    assert str(caught.value).endswith("use --executor sequential.")


def test_every_component_passes_the_check() -> None:
    # Every component's client side is its step functions: none is refused but FedWeIT,
    # whose clients train private layers outside θ (``sequential_only``).
    for name, cls in component_classes().items():
        if issubclass(cls, Learner):
            continue
        if name == "fedweit":
            with pytest.raises(UserError, match="cannot run 'fedweit'"):
                check_strategy(build_strategy(f"der+{name}"))
            continue
        check_strategy(build_strategy(f"der+{name}"))


def count_conflicts(monkeypatch: pytest.MonkeyPatch, module: object) -> list[tuple[int, int]]:
    """Record, at every call of ``module``'s ``conflict_coefficients``, how many rows
    conflicted (a non-zero coefficient) and how many rows it had (1: one client)."""
    conflicts: list[tuple[int, int]] = []

    def counting(*args: torch.Tensor, **kw: float) -> torch.Tensor:
        coef = conflict_coefficients(*args, **kw)
        conflicts.append((int((coef != 0).sum()), coef.numel()))
        return coef

    monkeypatch.setattr(module, "conflict_coefficients", counting)
    return conflicts


def test_agem_equals_and_projects(monkeypatch: pytest.MonkeyPatch) -> None:
    # A-GEM's reference draw per step (buffer generator, then the replay augmentation from
    # the client's generator), its batched gradient and the per-client projection: one
    # ``refine`` for both, called on one client's (P,) gradient and on a chunk's (C, P).
    conflicts = count_conflicts(monkeypatch, projection)
    seq, vec = run_both("agem", augment=True, momentum=0.5)
    assert_same_buffers(seq, vec)
    chunk_rows = [c for c, rows in conflicts if rows > 1]
    one_client = [c for c, rows in conflicts if rows == 1]
    assert sum(chunk_rows) > 0 and len(chunk_rows) > 10
    assert sum(one_client) > 0


def test_agem_task_end_fill_and_a_composition_chunked_equal() -> None:
    # task_end: no insertion during training, the buffer filled at task ends (sequential
    # end_tasks), so the second task's steps project against the first task's examples.
    seq, vec = run_both("agem:agem_fill=task_end")
    for c, d in zip(seq.clients, vec.clients, strict=True):
        assert c.buffer is not None and d.buffer is not None and c.buffer.filled > 0
        assert torch.equal(c.buffer.x, d.buffer.x) and torch.equal(c.buffer.y, d.buffer.y)
    strategy = "agem+fedprox:mu=0.1+scaffold+fedgp"
    seq, a, vec, b = both(strategy, vectorized={"clients_per_chunk": 3}, **REPLAY)
    assert_same(seq, a, vec, b)
    assert_same_client_state(seq, vec, "scaffold")


def test_fedntd_equals() -> None:
    # The teacher's logits at θ_g on each client's (augmented) batch, the not-true
    # distillation in the vmapped loss, with replay (DER's joint forward) and without.
    run_both("fedavg+fedntd")
    run_both("der+fedntd:beta=0.5,tau=2", augment=True)
    run_both("fedavg+fedntd:beta=0")  # no term


def test_moon_equals_with_clients_joining_later(monkeypatch: pytest.MonkeyPatch) -> None:
    # Participation 0.5: a client's first round has no previous model (weight 0) while
    # others contrast with theirs, in the same lock-steps; the representation comes from
    # the vmapped forward (DER's joint forward too), z_glob from one forward at θ_g and
    # z_prev from the vmapped forward at the stacked previous models.
    weights: set[tuple[float, ...]] = set()
    original = vectorized.ClientGradients.term_values

    def spy(self: vectorized.ClientGradients, term: ChunkTerm, x: torch.Tensor) -> object:
        values = original(self, term, x)
        weights.add(tuple(values["weight"].tolist()))
        return values

    monkeypatch.setattr(vectorized.ClientGradients, "term_values", spy)
    seq, vec = run_both("fedavg+moon:mu=1", participation=0.5, rounds_per_task=3)
    assert_same_client_state(seq, vec, "moon")
    assert any(0.0 in w and 1.0 in w for w in weights)  # mixed lock-steps happened
    run_both("der+moon:mu=5", augment=True)
    run_both("fedavg+moon:mu=0")  # no term, no representation kept


def test_masked_not_true_distillation_equals_the_batchmean_on_real_rows() -> None:
    # Rows 0 and 1 real, row 2 padding (its logits 9s must not count): FedNTD's loss term
    # with the padded batch's mask equals the batchmean term on the two real rows.
    ntd = build_strategy("fedavg+fedntd:beta=0.5,tau=2").components[0]
    ntd.setup(env(num_classes=3))
    outputs = torch.tensor([[1.0, 2.0, 0.5], [0.0, -1.0, 3.0], [9.0, 9.0, 9.0]])
    teacher = torch.tensor([[0.5, 0.0, 2.0], [1.0, 1.0, 0.0], [9.0, -9.0, 9.0]])
    y = torch.tensor([0, 2, 1])
    mask = torch.tensor([1.0, 1.0, 0.0])
    value = ntd.loss_term(outputs, None, y, mask, {"teacher_logits": teacher})
    expected = 0.5 * not_true_distillation(outputs[:2], teacher[:2], y[:2], 2.0)
    assert value is not None and value.item() == pytest.approx(expected.item(), rel=1e-6)
    assert expected.item() > 0


def test_conflict_coefficients_by_hand() -> None:
    # r = (1, 0), ‖r‖² = 1. Row (−2, 1): g·r = −2 < 0, coef −2; row (3, 5): no conflict, 0;
    # row (0, 1): g·r = 0, not a conflict, 0.
    g = torch.tensor([[-2.0, 1.0], [3.0, 5.0], [0.0, 1.0]])
    ref = torch.tensor([1.0, 0.0])
    assert conflict_coefficients(g, ref).tolist() == [-2.0, 0.0, 0.0]
    # FedProj's ε: ‖r‖² = 1 ≤ ε = 1 switches projection off.
    assert conflict_coefficients(g, ref, min_norm_sq=1.0).tolist() == [0.0, 0.0, 0.0]
    # A reference per row (A-GEM): row 0 against (0, 2): g·r = 2, kept; row 1 against
    # (−1, 0): g·r = −3, ‖r‖² = 1, coef −3; row 2 against (0, 0): nothing to project on.
    refs = torch.tensor([[0.0, 2.0], [-1.0, 0.0], [0.0, 0.0]])
    assert conflict_coefficients(g, refs).tolist() == [0.0, -3.0, 0.0]


def test_fedgp_step_function_on_a_chunk_by_hand() -> None:
    # g_ref = (0, 2), ‖g_ref‖² = 4. Row (1, −1): g·r = −2, coef −0.5, g − coef·r = (1, 0);
    # row (1, 1): g·r = 2, kept. The same function projects one client's (P,) gradient.
    fedgp = build_strategy("fedavg+fedgp").components[0]
    fedgp.setup(env())
    broadcast = SimpleNamespace(payloads={"fedgp.gref": torch.tensor([0.0, 2.0])})
    inputs = fedgp.round_inputs(broadcast)  # type: ignore[arg-type]
    assert inputs is not None
    grads = torch.tensor([[1.0, -1.0], [1.0, 1.0]])
    assert fedgp.transform(grads, inputs, None).tolist() == [[1.0, 0.0], [1.0, 1.0]]  # type: ignore[arg-type]
    assert fedgp.transform(grads[0], inputs, None).tolist() == [1.0, 0.0]  # type: ignore[arg-type]
    assert fedgp.round_inputs(SimpleNamespace(payloads={})) is None  # type: ignore[arg-type]


def test_feddyn_step_function_on_a_chunk_by_hand() -> None:
    # α = 0.5, θ_g = (1, 1). Client 0: θ = (3, 1), h = (1, 0): ∇ += 0.5·(2, 0) − (1, 0) =
    # (0, 0), loss += 0.25·4 − 3 = −2. Client 1: θ = (1, 1), h = (0, 2): ∇ += (0, −2),
    # loss += 0 − 2 = −2. The chunk's h is the clients' h_k stacked (``chunk_inputs``).
    from cfl_bench.engine.lock_step import chunk_inputs

    feddyn = build_strategy("fedavg+feddyn:alpha=0.5").components[0]
    feddyn.setup(env())
    anchor = torch.ones(2)
    shared = feddyn.round_inputs(SimpleNamespace(params=anchor))  # type: ignore[arg-type]
    assert shared is not None
    rows = []
    for h in ([1.0, 0.0], [0.0, 2.0]):
        one = client(0, None)
        one.state_for("feddyn")["h"] = torch.tensor(h)
        local = SimpleNamespace(broadcast=SimpleNamespace(params=anchor))
        rows.append(feddyn.client_inputs(one, local))  # type: ignore[arg-type]
    inputs = chunk_inputs(shared, rows)
    assert inputs["anchor"] is anchor and inputs["h"].shape == (2, 2)
    params = torch.tensor([[3.0, 1.0], [1.0, 1.0]])
    penalized = feddyn.penalty(params, torch.zeros(2, 2), inputs)
    assert penalized is not None
    grads, losses = penalized
    assert grads.tolist() == [[0.0, 0.0], [0.0, -2.0]]
    assert losses.tolist() == [-2.0, -2.0]
