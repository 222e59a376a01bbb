"""The vectorized executor reproduces the sequential one (``engine.vectorized``).

Every comparison runs the same tiny federation (embedded rot-digits, MLP, CPU, 1 thread)
with both executors: the global parameters must agree to 1e-5 relative (max |Δ| / max |θ|)
and every record (accuracies, losses, bytes, client spread) to 1e-4.
"""

from __future__ import annotations

import pytest
import torch

from cfl_bench.core.errors import UserError
from cfl_bench.engine.batches import ClientBatches
from cfl_bench.engine.loop import Federation, RunOutcome
from cfl_bench.engine.optim import FlatAdam, FlatSGD
from cfl_bench.engine.vectorized import (
    BatchedOptimizer,
    VectorizedExecutor,
    check_model,
    check_vectorizable,
)
from cfl_bench.runner.config import make_config
from cfl_bench.runner.models import build_model
from cfl_bench.runner.run import plan_run, run_identity
from cfl_bench.strategies.compose import build_strategy
from cfl_bench.streams.partition import DirichletPartitioner, Partitioner
from tests.helpers import client, digits_federation


@pytest.fixture(autouse=True)
def one_thread() -> object:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def both(strategy: str = "fedavg", vectorized: dict | None = None, **kw: object):  # type: ignore[no-untyped-def]
    """(sequential federation, its outcome, vectorized federation, its outcome)."""
    seq = digits_federation(strategy, executor="sequential", **kw)  # type: ignore[arg-type]
    vec = digits_federation(strategy, executor="vectorized", **{**kw, **(vectorized or {})})  # type: ignore[arg-type]
    assert isinstance(vec.executor, VectorizedExecutor)
    return seq, seq.run(), vec, vec.run()


def assert_same(seq: Federation, a: RunOutcome, vec: Federation, b: RunOutcome) -> float:
    """Parameters within 1e-5 relative, records equal to 1e-4; returns the relative gap."""
    theta_a, theta_b = seq.server.global_params, vec.server.global_params
    assert not torch.equal(theta_a, seq.model.params.new_zeros(theta_a.shape))
    gap = float((theta_a - theta_b).abs().max() / theta_a.abs().max())
    print(f"max relative parameter difference: {gap:.3e}")
    assert gap < 1e-5
    assert a.status == b.status == "finished"
    assert [r[:5] for r in a.records] == [r[:5] for r in b.records]
    for ra, rb in zip(a.records, b.records, strict=True):
        assert float(ra[5]) == pytest.approx(float(rb[5]), abs=1e-4), ra[:5]  # type: ignore[arg-type]
    return gap


def test_one_round_equals_the_sequential_executor() -> None:
    seq, a, vec, b = both(num_tasks=1, rounds_per_task=1)
    assert_same(seq, a, vec, b)
    # The working model ends on the last client's local model, as the sequential one does.
    assert torch.allclose(seq.model.params, vec.model.params, rtol=0, atol=1e-6)


def test_a_short_run_with_client_spread_equals_the_sequential_executor() -> None:
    seq, a, vec, b = both()  # 2 tasks × 2 rounds, 4 clients; probes at task ends
    assert_same(seq, a, vec, b)
    assert any(r[3] != "global" for r in b.records)  # client spread records compared too
    assert [c.tasks_started for c in seq.clients] == [c.tasks_started for c in vec.clients]
    assert all(
        torch.equal(c.generator.get_state(), d.generator.get_state())
        for c, d in zip(seq.clients, vec.clients, strict=True)
    )  # the same draws from every client's generator


def test_unequal_dirichlet_shards_and_partial_batches_equal() -> None:
    kw = dict(partitioner=DirichletPartitioner(alpha=0.1, min_size=2), batch_size=16, epochs=2)
    seq, a, vec, b = both(**kw)
    sizes = [c.num_samples for c in vec.clients]
    assert max(sizes) >= 2 * min(sizes)  # different step counts: masked steps happen
    assert any(n % 16 for n in sizes)  # and last partial batches
    assert_same(seq, a, vec, b)


class Skewed(Partitioner):
    """Client k holds a fixed fraction of the task: 0.5 %, 5 %, 20 %, the rest (from a
    few examples, less than one batch, to hundreds)."""

    name = "skewed"

    def split(
        self, labels: torch.Tensor, num_clients: int, *, task: int, seed: int
    ) -> list[torch.Tensor]:
        n = labels.shape[0]
        cuts = [0, n // 200, n // 200 + n // 20, n // 200 + n // 20 + n // 5, n]
        order = torch.randperm(n, generator=torch.Generator().manual_seed(task))
        return [order[cuts[k] : cuts[k + 1]].sort().values for k in range(num_clients)]


def test_very_unequal_shards_with_momentum_and_weight_decay_equal() -> None:
    kw = dict(partitioner=Skewed(), momentum=0.9, weight_decay=0.01, epochs=2)
    seq, a, vec, b = both(**kw)
    sizes = sorted(c.num_samples for c in vec.clients)
    assert sizes[0] < 32 and sizes[-1] > 100 * sizes[0], sizes  # one partial batch vs many
    assert_same(seq, a, vec, b)


def test_momentum_and_weight_decay_equal() -> None:
    kw = dict(momentum=0.9, weight_decay=0.01, partitioner=DirichletPartitioner(0.1, 2))
    assert_same(*both(**kw))


def test_fedprox_equals() -> None:
    assert_same(*both("fedavg+fedprox:mu=0.5", momentum=0.5))


def test_adam_equals(monkeypatch: pytest.MonkeyPatch) -> None:
    # Adam's update lr·m̂/(√v̂ + ε) has slope lr/ε at g = 0: 10⁶ at the default ε = 1e-8.
    # Under Dirichlet(0.1) a client's gradient on the output units of classes it lacks is
    # ~1e-8, so the last bits in which the executors' reductions differ (vmapped batched
    # matmuls vs plain ones; which bits depends on the torch build and the CPU's vector
    # unit) become steps of ~lr, and training amplifies them: measured on torch 2.14.1,
    # AVX2, 7.7e-4 after round 2 and 8.5e-2 after 4 rounds (6.8e-4 on an AVX512 machine).
    # The arithmetic is the same (the masked-step test below: bit for bit on equal
    # gradients), so the whole-run comparison uses ε = 1e-3, where the map is smooth at
    # float32's rounding. Measured after 4 rounds: AVX2, ε = 1e-4 6.3e-7 (1e-6: 1.2e-5);
    # AVX512 (Xeon, torch 2.14.1), ε = 1e-4 5.2e-2 (3.3e-7 after 2 rounds: one step of the
    # amplification), ε = 1e-3 2.4e-7, ε = 1e-2 2.2e-7.
    plain = FlatAdam.__init__

    def smooth(self: FlatAdam, *args: object, **kw: object) -> None:
        plain(self, *args, **{**kw, "eps": 1e-3})  # type: ignore[arg-type]

    monkeypatch.setattr(FlatAdam, "__init__", smooth)
    seq, a, vec, b = both(optimizer="adam", lr=0.01, partitioner=DirichletPartitioner(0.1, 2))
    assert isinstance(seq.executor.trainer.optimizer, FlatAdam)  # type: ignore[attr-defined]
    assert seq.executor.trainer.optimizer.eps == 1e-3  # type: ignore[attr-defined]
    assert_same(seq, a, vec, b)


def test_adam_steps_equal_bit_for_bit_on_equal_gradients() -> None:
    # Three steps of the batched Adam on rows of gradients equal FlatAdam's on each row
    # exactly: the executors' Adam arithmetic is one and the same, op for op.
    gen = torch.Generator().manual_seed(0)
    params = torch.randn(3, 50, generator=gen)
    grads = [torch.randn(3, 50, generator=gen) * 1e-6 for _ in range(3)]
    singles = [FlatAdam(params[k].clone(), torch.zeros(50), 0.01, 0.001) for k in range(3)]
    opt = BatchedOptimizer(singles[0], 0.01, params)
    batched = params
    for t, g in enumerate(grads, start=1):
        batched = opt.step(batched, g, None, t)
        for k, single in enumerate(singles):
            single.grads.copy_(g[k])
            single.step()
    for k, single in enumerate(singles):
        assert torch.equal(batched[k], single.params)


def test_diagnostics_equal() -> None:
    assert_same(*both(diagnostics=True, eval_every_round=True, num_tasks=1))


def test_chunked_equals_unchunked_and_sequential() -> None:
    kw = dict(partitioner=DirichletPartitioner(0.1, 2), num_clients=5, batch_size=16)
    whole = digits_federation("fedavg", executor="vectorized", **kw)  # type: ignore[arg-type]
    assert_same(*both(vectorized={"clients_per_chunk": 2}, **kw))  # chunks of 2, 2 and 1
    chunked = digits_federation(
        "fedavg",
        executor="vectorized",
        clients_per_chunk=2,
        **kw,  # type: ignore[arg-type]
    )
    assert_same(whole, whole.run(), chunked, chunked.run())


def test_a_masked_step_is_a_true_no_op_and_an_active_one_is_flatsgds() -> None:
    # Row 0 active, row 1 done. SGD lr 0.5, momentum 0.9, weight decay 0.1:
    # g = ∇ + 0.1θ = [1, 2] + 0.1·[1, −1] = [1.1, 1.9]; v₁ = g; θ₁ = θ − 0.5·g = [0.45, −1.95].
    params = torch.tensor([[1.0, -1.0], [3.0, 4.0]])
    grads = torch.tensor([[1.0, 2.0], [5.0, 6.0]])
    sgd = FlatSGD(params[0].clone(), grads[0].clone(), 0.5, 0.9, 0.1)
    opt = BatchedOptimizer(sgd, 0.5, params)
    active = torch.tensor([True, False])
    after = opt.step(params, grads, active, 1)
    assert torch.allclose(after[0], torch.tensor([0.45, -1.95]))
    assert opt.velocity is not None and torch.equal(opt.velocity[1], torch.zeros(2))
    assert torch.equal(after[1], params[1])
    # Step 2: v₂ = 0.9·v₁ + (∇ + 0.1θ₁) = 0.9·[1.1, 1.9] + [1.045, 1.805] = [2.035, 3.515].
    again = opt.step(after, grads, active, 2)
    assert torch.allclose(opt.velocity[0], torch.tensor([2.035, 3.515]))
    assert torch.allclose(again[0], after[0] - 0.5 * torch.tensor([2.035, 3.515]))
    assert torch.equal(again[1], params[1])
    # FlatSGD itself on row 0 gives the same numbers.
    for g in (grads[0], grads[0]):
        sgd.grads.copy_(g)
        sgd.step()
    assert torch.allclose(sgd.params, again[0])


def test_a_masked_adam_step_keeps_the_row_and_its_moments() -> None:
    params = torch.tensor([[1.0, -1.0], [3.0, 4.0]])
    grads = torch.tensor([[1.0, 2.0], [5.0, 6.0]])
    adam = FlatAdam(params[0].clone(), grads[0].clone(), 0.1, 0.0)
    opt = BatchedOptimizer(adam, 0.1, params)
    after = opt.step(params, grads, torch.tensor([True, False]), 1)
    adam.step()  # first Adam step moves each weight by −lr·sign(g): [0.9, −1.1]
    assert torch.allclose(after[0], torch.tensor([0.9, -1.1]))
    assert torch.equal(after[0], adam.params)
    assert torch.equal(after[1], params[1])
    assert opt.moments is not None
    assert not opt.moments[1][1].any() and not opt.moments[0][1].any()


def test_client_batches_draw_in_the_documented_order() -> None:
    # Both executors walk a client's data through ClientBatches. 5 examples, batch 2,
    # 2 epochs: randperm, three batches (2, 2, 1), each augmented
    # (a draw from the same generator), then the second epoch's randperm.
    cl = client(3, None)
    cl.train_x, cl.train_y = torch.arange(5.0)[:, None], torch.arange(5)

    def augment(x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        return x + torch.rand(x.shape, generator=gen)

    batches = ClientBatches(cl, 2, 2, augment, torch.device("cpu"))
    assert batches.total == 6
    drawn = [batches.next() for _ in range(6)]
    gen = torch.Generator().manual_seed(3)
    expected = []
    for _ in range(2):
        order = torch.randperm(5, generator=gen)
        for start in (0, 2, 4):
            rows = order[start : start + 2]
            expected.append((augment(cl.train_x[rows], gen), rows))
    for (x, y, raw), (ex, ey) in zip(drawn, expected, strict=True):
        assert torch.equal(x, ex) and torch.equal(y, ey)
        assert torch.equal(raw, cl.train_x[ey])  # the un-augmented rows (y = row index)


def test_the_masked_mean_is_the_mean_over_real_examples() -> None:
    fed = digits_federation("fedavg", executor="vectorized")
    executor = fed.executor
    assert isinstance(executor, VectorizedExecutor)
    x = torch.randn(3, 64)
    y = torch.tensor([1, 2, 0])
    padded_x = torch.cat([x, torch.zeros(2, 64)])
    padded_y = torch.cat([y, torch.zeros(2, dtype=torch.long)])
    mask = torch.tensor([1.0, 1, 1, 0, 0])
    params = dict(fed.model.module.named_parameters())
    loss, outputs = executor.grads._client_loss(params, padded_x, padded_y, mask)
    plain = torch.nn.functional.cross_entropy(fed.model.module(x), y)
    assert loss.item() == pytest.approx(plain.item(), rel=1e-6)
    assert torch.allclose(outputs[:3], fed.model.module(x))  # what a buffer would store


@pytest.mark.parametrize(
    ("strategy", "model", "match"),
    [
        ("ideal", "mlp", "not 'ideal' \\(its training data grows with the task history"),
        ("fedavg", "resnet8", "BatchNorm"),
        ("fedavg", "cifar-cnn", "BatchNorm"),
    ],
)
def test_refusals_name_the_reason_and_the_fix(strategy: str, model: str, match: str) -> None:
    shape = (1, 28, 28) if model in ("mlp", "mnist-cnn") else (3, 32, 32)
    module = build_model(model, shape, 10)
    with pytest.raises(UserError, match=match) as caught:
        check_vectorizable(build_strategy(strategy), module, model)
    assert "use --executor sequential" in str(caught.value)


def test_a_model_with_float_buffers_is_refused_without_its_name() -> None:
    module = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2))
    with pytest.raises(UserError, match="the model: its BatchNorm"):
        check_model(module)


def test_a_run_refuses_before_writing_anything(tmp_path: object) -> None:
    base = {"stream": "rot-digits", "threads": 1, "out": str(tmp_path), "clients": 4}
    with pytest.raises(UserError, match="not 'ideal'"):
        plan_run(make_config({**base, "strategy": "ideal", "executor": "vectorized"}))
    with pytest.raises(UserError, match="--clients-per-chunk applies to --executor vectorized"):
        plan_run(make_config({**base, "clients_per_chunk": 2}))
    with pytest.raises(UserError, match="executor"):
        make_config({**base, "executor": "parallel"})


def test_the_executor_is_recorded_but_outside_the_hashes(tmp_path: object) -> None:
    base = {"stream": "rot-digits", "threads": 1, "out": str(tmp_path), "clients": 4}
    seq = plan_run(make_config(base))
    vec = plan_run(make_config({**base, "executor": "vectorized", "clients_per_chunk": 2}))
    assert (seq.protocol_hash, seq.config_hash) == (vec.protocol_hash, vec.config_hash)
    recorded = vec.resolved["config"]
    assert isinstance(recorded, dict)
    assert (recorded["executor"], recorded["clients_per_chunk"]) == ("vectorized", 2)
    assert vec.schedule.executor == "vectorized" and vec.schedule.clients_per_chunk == 2
    same = run_identity(vec.config, vec.stream, vec.strategy, vec.partitioner)
    assert same[1:] == (seq.protocol_hash, seq.config_hash)


def test_compiled_step_equals_the_plain_one() -> None:
    # --compile wraps the vmapped loss-and-gradient calls in torch.compile: same run, same
    # results to float rounding (inductor may fuse and reorder), compiled calls really used.
    plain = digits_federation("der", executor="vectorized", num_tasks=1)
    compiled = digits_federation("der", executor="vectorized", num_tasks=1, compile_step=True)
    executor = compiled.executor
    assert isinstance(executor, VectorizedExecutor)
    assert hasattr(executor.grads.loss_and_grad, "_torchdynamo_orig_callable")  # compiled
    from torch._dynamo.utils import counters

    before = counters["stats"]["unique_graphs"]
    assert_same(plain, plain.run(), compiled, compiled.run())
    assert counters["stats"]["unique_graphs"] > before  # the compiled step really ran


def test_compile_is_refused_without_the_vectorized_executor() -> None:
    with pytest.raises(UserError, match="--compile applies to --executor vectorized"):
        plan_run(make_config({"strategy": "fedavg", "compile": True, "tasks": 1}))
