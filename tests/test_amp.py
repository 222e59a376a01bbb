"""``--amp`` mixed precision of the local steps (``engine.amp``), both executors.

Tolerance of bf16 vectorized vs bf16 sequential (measured, embedded rot-digits, MLP, CPU,
1 thread): exact equality is not expected, because the batched (vmapped) bf16 kernels round
their outputs to bf16 after accumulating in another order than the unbatched ones, so each
path carries its own bf16 rounding noise. One gradient: ‖g_vec − g_seq‖/‖g_seq‖ = 2.4e-2,
while either path is 2.8e-2 from fp32 (fp32 vec vs seq: 0). After the default short run
(2 tasks × 2 rounds, 4 clients) the global parameters differ by max|Δ|/max|θ| = 4.3e-3
(fedavg; 2e-3 … 9e-3 over derpp, moon, agem+fedgp, fedntd, er+fedproj), as much as bf16
differs from fp32 (4.5e-3); the tests allow 2e-2 and equal task-end accuracies ± 2 points.
"""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

from cfl_bench.core.errors import UserError
from cfl_bench.core.objective import Classification
from cfl_bench.engine.amp import INIT_SCALE, LossScaler, Precision
from cfl_bench.engine.loop import Federation, RunOutcome
from cfl_bench.engine.vectorized import VectorizedExecutor
from cfl_bench.runner.config import make_config
from cfl_bench.runner.run import check_amp, plan_run
from tests.helpers import digits_federation
from tests.test_vectorized import one_thread  # noqa: F401 - the fixture

BF16_GAP = 2e-2  # max|Δθ| / max|θ| allowed between the executors under bf16 (measured 4.3e-3)


def run(strategy: str = "fedavg", **kw: object) -> tuple[Federation, RunOutcome]:
    federation = digits_federation(strategy, **kw)  # type: ignore[arg-type]
    return federation, federation.run()


def gap(a: Federation, b: Federation) -> float:
    theta_a, theta_b = a.server.global_params, b.server.global_params
    return float((theta_a - theta_b).abs().max() / theta_a.abs().max())


def accuracies(outcome: RunOutcome) -> list[float]:
    return [float(r[5]) for r in outcome.records if r[3] == "global" and r[4] == "acc"]


@pytest.mark.parametrize("strategy", ["fedavg", "derpp+moon"])
def test_bf16_vectorized_equals_bf16_sequential_within_the_rounding(strategy: str) -> None:
    seq, a = run(strategy, executor="sequential", amp="bf16")
    vec, b = run(strategy, executor="vectorized", amp="bf16")
    fp32, _ = run(strategy, executor="sequential")
    assert isinstance(vec.executor, VectorizedExecutor)
    assert gap(seq, vec) < BF16_GAP
    assert gap(fp32, seq) > 1e-4  # bf16 really ran (fp32 executors agree to 1e-5)
    for x, y in zip(accuracies(a), accuracies(b), strict=True):
        assert x == pytest.approx(y, abs=2.0)


def test_autocast_takes_effect_inside_vmap() -> None:
    """The first layer's output (before the fp32 cast) is bf16 in the vmapped lock-step,
    and the logits reaching the loss are fp32."""
    federation = digits_federation("fedavg", executor="vectorized", amp="bf16", num_tasks=1)
    module = federation.model.module
    first = next(m for m in module.modules() if isinstance(m, torch.nn.Linear))
    seen: list[torch.dtype] = []
    first.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    module.register_forward_hook(lambda m, i, o: seen.append(o.dtype))  # after the cast
    grads = federation.executor.grads  # type: ignore[attr-defined]
    params = federation.model.params.detach()[None].expand(2, -1)
    x = torch.randn(2, 4, *federation.stream.input_shape)
    y, mask = torch.zeros(2, 4, dtype=torch.long), torch.ones(2, 4)
    grads.gradients(params, x, y, mask, amp=True)
    assert seen == [torch.bfloat16, torch.float32]
    seen.clear()
    grads.gradients(params, x, y, mask)  # projections' gradients: fp32
    assert seen == [torch.float32, torch.float32]


def test_bf16_accuracy_is_within_a_few_points_of_fp32() -> None:
    kw = dict(executor="vectorized", num_tasks=1, rounds_per_task=3, epochs=3, lr=0.1)
    _, full = run(**kw)  # type: ignore[arg-type]
    _, half = run(amp="bf16", **kw)  # type: ignore[arg-type]
    assert accuracies(full)[-1] > 25  # learned (chance: 10); measured 34.7 and 34.4
    assert accuracies(half)[-1] == pytest.approx(accuracies(full)[-1], abs=3.0)


def test_scaler_skips_a_non_finite_gradient_and_halves_the_scale() -> None:
    scaler = LossScaler(torch.tensor([4.0, 8.0]), torch.tensor([5, 7]))
    grads = torch.tensor([[2.0, -4.0], [float("inf"), 8.0]])
    unscaled, finite = scaler.unscale(grads)
    # Row 0: [2, -4] / 4 = [0.5, -1]; row 1 holds inf: zeroed, not finite.
    assert torch.equal(unscaled, torch.tensor([[0.5, -1.0], [0.0, 0.0]]))
    assert finite.tolist() == [True, False]
    scaler.update(finite)
    # Client 0: 6 good steps, scale kept; client 1: scale 8 → 4, count restarted.
    assert scaler.scale.tolist() == [4.0, 4.0] and scaler.good.tolist() == [6, 0]
    scaler.update(torch.tensor([False, True]), stepped=torch.tensor([False, True]))
    assert scaler.scale.tolist() == [4.0, 4.0] and scaler.good.tolist() == [6, 1]  # 0 idle


def test_scaler_grows_after_2000_good_steps() -> None:
    scaler = LossScaler(torch.tensor([INIT_SCALE]), torch.tensor([1998]))
    scaler.update(torch.tensor([True]))  # the 1999th good step: no growth yet
    assert scaler.scale.tolist() == [2.0**16] and scaler.good.tolist() == [1999]
    scaler.update(torch.tensor([True]))  # the 2000th: ×2, count restarted
    assert scaler.scale.tolist() == [2.0**17] and scaler.good.tolist() == [0]


def test_fp16_skips_overflowing_steps_alike_in_both_executors() -> None:
    """Scales of 2^20 overflow fp16 in the backward (max 65504): the first steps are skipped
    and halve the scale until the gradient is finite; both executors make the same
    decisions (the engine runs fp16 on the CPU; the CLI refuses it there as slow)."""
    finals = []
    for executor in ("sequential", "vectorized"):
        federation = digits_federation("fedavg", executor=executor, amp="fp16", num_tasks=1)
        for client in federation.clients:
            client.state_for("amp")["scale"] = torch.tensor(2.0**20)
        federation.run()
        finals.append(federation)
    states = [[c.extras["amp"] for c in f.clients] for f in finals]
    scales = [[float(s["scale"]) for s in fed] for fed in states]
    assert scales[0] == scales[1]
    assert all(s < 2.0**20 and float(s).hex().startswith("0x1.0000000000000p") for s in scales[0])
    # Then steps were taken (measured scales 2^17, 2^16 ×3; good 20, 0, 7, 12 of 24 steps).
    assert sum(int(s["good"]) for s in states[0]) > 10
    initial = digits_federation("fedavg", num_tasks=1).server.global_params
    assert not torch.equal(finals[0].server.global_params, initial)
    assert gap(finals[0], finals[1]) < BF16_GAP


def test_fp16_unscaled_gradient_matches_fp32_by_hand() -> None:
    """Sequential fp16 step: the flat gradient after unscaling is the fp32 gradient up to
    fp16 rounding (|Δ| ≤ 1e-2 relative), i.e. the scale really was divided out."""
    federation = digits_federation("fedavg", amp="fp16", num_tasks=1)
    trainer = federation.executor.trainer  # type: ignore[attr-defined]
    model = federation.model
    x = torch.randn(8, *federation.stream.input_shape)
    y = torch.arange(8) % federation.stream.num_classes
    model.zero_grad()
    F.cross_entropy(model.module(x), y).backward()
    reference = model.grads.clone()
    trainer.backend.scaler = LossScaler(torch.tensor([1024.0]), torch.tensor([0]))
    model.zero_grad()
    with trainer.precision.autocast():
        loss = F.cross_entropy(model.module(x), y)
    assert trainer.backend.backward(loss)
    assert float((model.grads - reference).norm() / reference.norm()) < 1e-2
    assert trainer.backend.scaler.good.tolist() == [1]


def test_refusals(monkeypatch: pytest.MonkeyPatch) -> None:
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    base = {"stream": "rot-digits", "threads": 1, "clients": 4}
    with pytest.raises(UserError, match="needs a CUDA device"):
        check_amp(make_config({**base, "amp": "fp16"}), cpu, Classification())
    with pytest.raises(UserError, match="--optimizer adam"):
        check_amp(make_config({**base, "amp": "fp16", "optimizer": "adam"}), cuda, Classification())
    with pytest.raises(UserError, match="classification streams only"):
        check_amp(make_config({**base, "amp": "bf16"}), cpu, object())
    with pytest.raises(UserError, match="amp"):
        make_config({**base, "amp": "fp8"})
    check_amp(make_config({**base, "amp": "bf16"}), cpu, Classification())  # allowed
    with pytest.raises(UserError, match="under --compile"):
        vectorized = {**base, "executor": "vectorized", "compile": True}
        check_amp(make_config({**vectorized, "amp": "bf16"}), cpu, Classification())
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    with pytest.raises(UserError, match="bfloat16 support"):
        check_amp(make_config({**base, "amp": "bf16"}), cuda, Classification())


def test_a_cpu_fp16_run_is_refused_before_anything_is_written(tmp_path: object) -> None:
    config = make_config({"stream": "rot-digits", "threads": 1, "out": str(tmp_path) + "/r"})
    with pytest.raises(UserError, match="--amp fp16 needs a CUDA device"):
        plan_run(make_config({**config.to_dict(), "amp": "fp16", "device": "cpu"}))


def test_the_protocol_hash_is_unchanged_at_the_default_and_changes_with_bf16(
    tmp_path: object,
) -> None:
    base = {"stream": "rot-digits", "threads": 1, "clients": 4, "out": str(tmp_path)}
    default = plan_run(make_config(base))
    off = plan_run(make_config({**base, "amp": "off"}))
    bf16 = plan_run(make_config({**base, "amp": "bf16"}))
    assert "amp" not in default.config.protocol()
    assert (off.protocol_hash, off.config_hash) == (default.protocol_hash, default.config_hash)
    assert bf16.protocol_hash != default.protocol_hash
    assert bf16.config.protocol()["amp"] == "bf16"
    assert Precision("bf16").enabled and not Precision().enabled
