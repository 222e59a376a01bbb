"""FOT (Federated Orthogonal Training): the threshold on a known spectrum, the clients'
residual sketches, the server's projection against the equation written out densely, the
property that a projected update leaves old-task outputs unchanged, the bytes a task end
adds, the official code's defaults and MLP, refusals, and a digits run that resumes."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from cfl_bench.core.errors import UserError
from cfl_bench.core.flat import FlatModel
from cfl_bench.runner.models import FOTMLP, build_model
from cfl_bench.strategies.compose import build_strategy
from cfl_bench.strategies.declarations import FOTOptions
from cfl_bench.strategies.fot import (
    FOT,
    expand_basis,
    layer_inputs,
    layer_slots,
    project_update,
    residual_sketch,
    threshold_rank,
)
from tests.helpers import digits_federation, env
from tests.test_resume import assert_resumes_after_crash, uninterrupted
from tests.test_vectorized import assert_same, one_thread  # noqa: F401 - the fixture

# A 4 × 6 matrix with singular values 3, 2, 1, 0.5: energies 9, 4, 1, 0.25 of 14.25, so the
# kept fractions after 1, 2, 3, 4 vectors are 0.6316, 0.9123, 0.9825, 1.
SINGULAR = [3.0, 2.0, 1.0, 0.5]


def known_spectrum() -> tuple[torch.Tensor, torch.Tensor]:
    """(A, its left singular vectors), A = Q·diag(SINGULAR)·Pᵀ built from orthonormal Q, P."""
    g = torch.Generator().manual_seed(3)
    q, _ = torch.linalg.qr(torch.randn(4, 4, generator=g, dtype=torch.float64))
    p, _ = torch.linalg.qr(torch.randn(6, 4, generator=g, dtype=torch.float64))
    return q @ torch.diag(torch.tensor(SINGULAR, dtype=torch.float64)) @ p.T, q


@pytest.mark.parametrize(
    ("ratio", "epsilon", "k"),
    [
        (1.0, 0.96, 3),  # ε' = 0.96: 0.9825 is the first fraction above it
        (1.0, 0.6, 1),  # ε' = 0.6 < 0.6316
        (1.0, 0.99, 4),  # ε' = 0.99: only all four vectors pass
        (0.5, 0.96, 3),  # ε' = (0.5 − 0.04) / 0.5 = 0.92
        (0.2, 0.9, 1),  # ε' = (0.2 − 0.1) / 0.2 = 0.5
        (0.05, 0.9, 1),  # ε' = −1: the code still keeps one vector
    ],
)
def test_the_threshold_keeps_k_vectors_of_a_known_spectrum(
    ratio: float, epsilon: float, k: int
) -> None:
    a, q = known_spectrum()
    assert threshold_rank(torch.tensor(SINGULAR), ratio, epsilon) == k
    basis = expand_basis(None, a, ratio, epsilon)
    assert basis is not None and basis.shape == (4, k)
    want = q[:, :k] @ q[:, :k].T  # the span of the first k left singular vectors
    assert torch.allclose(basis @ basis.T, want, atol=1e-10)


def test_a_grown_basis_keeps_the_old_span_and_stays_orthonormal() -> None:
    a, q = known_spectrum()
    old = q[:, :1]
    grown = expand_basis(old, a - old @ (old.T @ a), 1.0, 0.6)  # the residual's top vector
    assert grown is not None and grown.shape == (4, 2)
    assert torch.allclose(grown.T @ grown, torch.eye(2, dtype=torch.float64), atol=1e-10)
    assert torch.allclose(grown @ (grown.T @ old), old, atol=1e-10)
    assert torch.allclose(grown @ grown.T, q[:, :2] @ q[:, :2].T, atol=1e-10)
    assert expand_basis(old, torch.zeros(4, 4, dtype=torch.float64), 0.0, 0.9) is old


def test_a_client_sketch_removes_the_old_subspace() -> None:
    acts = torch.tensor([[1.0, 2.0, 0.0, 1.0], [0.0, 1.0, 1.0, 0.0], [2.0, 0.0, 0.0, 1.0]])
    basis = torch.tensor([[1.0], [0.0], [0.0]])  # the first coordinate is old
    sketch, ratio = residual_sketch(acts, basis, torch.Generator().manual_seed(5))
    # R = A without its first row: ‖R‖² = 2 + 5 = 7 of ‖A‖² = 6 + 2 + 5 = 13 (a norm ratio)
    assert ratio == pytest.approx(math.sqrt(7 / 13), rel=1e-6)
    mix = torch.rand((4, 3), generator=torch.Generator().manual_seed(5)) * 2 - 1
    residual = torch.tensor([[0.0, 0.0, 0.0, 0.0], [0.0, 1.0, 1.0, 0.0], [2.0, 0.0, 0.0, 1.0]])
    assert torch.allclose(sketch, residual @ mix, atol=1e-6)
    assert sketch.shape == (3, 3) and not sketch[0].any()
    _, first = residual_sketch(acts, None, torch.Generator().manual_seed(5))
    assert first == 1.0  # before any basis the whole input is new


def two_layer_model() -> FlatModel:
    torch.manual_seed(0)
    return FlatModel(nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2)))


def test_the_projection_is_delta_minus_delta_u_ut_per_layer() -> None:
    model = two_layer_model()
    slots = layer_slots(model)
    assert [(s.name, s.out_features, s.in_features) for s in slots] == [
        ("0.weight", 3, 4),
        ("2.weight", 2, 3),
    ]
    old = model.params.clone()
    mean = old + torch.randn(old.shape, generator=torch.Generator().manual_seed(1))
    basis, _ = torch.linalg.qr(torch.randn(4, 2, generator=torch.Generator().manual_seed(2)))
    theta = project_update(old, mean, slots, [basis, None])
    # Written densely in float64: W_old + (W_mean − W_old)·(I − U·Uᵀ)
    w_old, w_mean = old[:12].double().view(3, 4), mean[:12].double().view(3, 4)
    u = basis.double()
    want = w_old + (w_mean - w_old) @ (torch.eye(4, dtype=torch.float64) - u @ u.T)
    assert torch.allclose(theta[:12].double().view(3, 4), want, atol=1e-6)
    assert torch.equal(theta[12:], mean[12:])  # biases and the unbased layer: the mean


def test_a_projected_update_leaves_old_task_outputs_unchanged() -> None:
    model = two_layer_model()
    g = torch.Generator().manual_seed(4)
    x = torch.randn(20, 2, generator=g) @ torch.randn(2, 4, generator=g)  # a 2-d subspace
    acts = layer_inputs(model.module, x, batch_size=8)
    bases = [expand_basis(None, a, 1.0, 0.9999) for a in acts]
    assert bases[0] is not None and bases[0].shape[1] == 2
    old = model.params.clone()
    with torch.no_grad():
        before, elsewhere = model.module(x), model.module(torch.randn(5, 4, generator=g))
    mean = old + torch.randn(old.shape, generator=g)
    for slot in layer_slots(model):  # the biases keep their value: only weights move
        bias = next(s for s in model.slices if s.name == slot.name.replace("weight", "bias"))
        mean[bias.start : bias.start + bias.numel] = old[bias.start : bias.start + bias.numel]
    model.params.copy_(project_update(old, mean, layer_slots(model), bases))
    with torch.no_grad():
        after, moved = model.module(x), model.module(torch.randn(5, 4, generator=g))
    assert torch.allclose(after, before, atol=1e-4)
    assert not torch.allclose(moved, elsewhere, atol=1e-2)  # new directions did change


def test_layer_inputs_are_taken_before_the_preceding_dropout() -> None:
    torch.manual_seed(0)
    mlp = FOTMLP(4, 2, hidden=3).train()
    x = torch.randn(6, 4)
    first, second, third, fourth = layer_inputs(mlp, x, batch_size=4)
    assert torch.equal(first, x.T)
    assert torch.allclose(second, torch.relu(mlp.layers[1](x)).T)  # the ReLU output, no mask
    assert third.shape == fourth.shape == (3, 6)


def test_the_official_defaults_and_mlp() -> None:
    defaults = FOTOptions(
        epsilon=0.96, eps_inc=0.0, act_mode="auto", sketch="auto", last_layer="auto"
    )
    assert FOTOptions() == defaults
    mlp = build_model("fot-mlp", (1, 28, 28), 10)
    # model/mlp.py: 784 → 400 → 400 → 400 → 10 with biases
    assert sum(p.numel() for p in mlp.parameters()) == 784 * 400 + 400 + 2 * 400 * 401 + 4010
    drops = [m.p for m in mlp.modules() if isinstance(m, nn.Dropout)]
    assert drops == [0.2, 0.5, 0.5]


@pytest.mark.parametrize(
    ("scenario", "choice", "free"),
    [
        ("task-il", "auto", True),  # the code's AlexNet: its per-task heads are not projected
        ("domain-il", "auto", False),  # the code's MLP: layers.9 is projected
        ("task-il", "project", False),
        ("domain-il", "free", True),
    ],
)
def test_the_output_layer_is_free_on_task_il_streams(
    scenario: str, choice: str, free: bool
) -> None:
    fot = FOT({"last_layer": choice})
    fot.setup(env(stream="perm-digits", scenario=scenario))
    names = [s.name for s in fot.projected_slots(two_layer_model())]
    assert names == (["0.weight"] if free else ["0.weight", "2.weight"])


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("fot:epsilon=0", "option fot:epsilon must be a fraction in (0, 1], got '0'."),
        ("fot:epsilon=1.5", "option fot:epsilon must be a fraction in (0, 1], got '1.5'."),
        ("fot:eps_inc=-1", "option fot:eps_inc must be a finite number ≥ 0, got '-1'."),
        (
            "fot:act_mode=test",
            "option fot:act_mode must be one of auto, train, eval, got 'test'.",
        ),
        (
            "fot:sketch=normal",
            "option fot:sketch must be one of auto, uniform, gaussian, got 'normal'.",
        ),
    ],
)
def test_bad_options_are_refused_in_one_line(text: str, message: str) -> None:
    with pytest.raises(UserError) as caught:
        build_strategy(text)
    assert str(caught.value) == message


# The MLP on 8×8 digits: its Linear layers read 64, 100 and 100 inputs.
MLP_BYTES = (64 * 100 + 100 + 100 * 100 + 100 + 100 * 10 + 10) * 4
SKETCH_BYTES = (64 * 64 + 100 * 100 + 100 * 100) * 4 + (3 + 1) * 4  # + r per layer and n


def test_a_task_end_adds_the_sketches_up_and_the_bases_down(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sent: list[list[int]] = []
    plain = FOT.broadcast

    def recording(self: FOT, server: object) -> dict[str, torch.Tensor]:
        payloads = plain(self, server)  # type: ignore[arg-type]
        if payloads:
            sent.append(payloads["fot.ranks"].tolist())
        return payloads

    monkeypatch.setattr(FOT, "broadcast", recording)
    federation = digits_federation("fot", weighting="uniform")
    result = federation.run()
    up = [r[5] for r in result.records if r[4] == "bytes_up"]
    down = [r[5] for r in result.records if r[4] == "bytes_down"]
    clients = 4
    assert up == [clients * (MLP_BYTES + e) for e in (0, SKETCH_BYTES, 0, SKETCH_BYTES)]
    assert len(sent) == 1 and all(k >= 1 for k in sent[0])  # only task 1's last round
    basis = 4 * (64 * sent[0][0] + 100 * sent[0][1] + 100 * sent[0][2]) + 3 * 8
    assert down == [clients * (MLP_BYTES + e) for e in (0, 0, 0, basis)]


@pytest.mark.parametrize(("task", "grows"), [(0, True), (1, False)])
def test_only_a_task_end_before_the_last_task_grows_the_bases(task: int, grows: bool) -> None:
    """Both layers' sketches (4 x 4 and 3 x 3, uniform law: width d) are summed at every
    task end, but decomposed only when a later task will be projected with the result:
    after the run's last task (task 1 of 2) the bases stay as they were and the sums are
    dropped, and ε still moves by eps_inc."""
    model = two_layer_model()
    fot = FOT({"last_layer": "project", "eps_inc": 0.01})
    fot.setup(env(stream="perm-digits", num_tasks=2))
    fot._sketches = [torch.cat((torch.eye(4).reshape(-1), torch.eye(3).reshape(-1)))]
    fot._ratios = torch.tensor([1.0, 1.0, 1.0])
    server = SimpleNamespace(model=model, task=task)
    fot.after_aggregate(server)  # type: ignore[arg-type]
    assert fot._sketches == [] and fot._ratios is None
    assert fot.epsilon == pytest.approx(0.97)
    if grows:
        assert [None if b is None else tuple(b.shape) for b in fot.bases] == [(4, 4), (3, 3)]
    else:
        assert fot.bases == []


def test_a_digits_run_resumes_identically(tmp_path: Path) -> None:
    extra = {"model": "fot-mlp", "stream": "perm-digits"}
    whole = uninterrupted(tmp_path, "fot", **extra)
    assert_resumes_after_crash(tmp_path / "crashed", "fot", whole, **extra)


def test_the_executors_agree_with_dropout_in_steps_and_activations() -> None:
    runs = []
    for executor in ("sequential", "vectorized"):
        federation = digits_federation("fot", model="fot-mlp", executor=executor)
        runs.append((federation, federation.run()))
    (seq, a), (vec, b) = runs
    assert_same(seq, a, vec, b)  # the global parameters within 1e-5 relative
    for ra, rb in zip(a.records, b.records, strict=True):
        x, y = float(ra[5]), float(rb[5])  # type: ignore[arg-type]
        assert abs(x - y) <= 1e-5 * max(abs(x), abs(y), 1.0), (ra[:5], x, y)
