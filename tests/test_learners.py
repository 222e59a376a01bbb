"""DER loss, A-GEM projection and FedAvg aggregation against hand-computed values."""

from __future__ import annotations

import torch
from torch.nn import functional as F

from cfl_bench.engine.aggregation import RunningAverage, client_weight
from cfl_bench.engine.one_client import OneClientStep, plan_loss
from cfl_bench.strategies.agem import AGEM
from cfl_bench.strategies.der import DER
from tests.helpers import buffer_with, client, env, linear_model, server, step

ENV = env("rot-mnist", "domain-il", 2, 5)


def test_der_loss_equals_ce_plus_alpha_mse_by_hand() -> None:
    model = linear_model()
    with torch.no_grad():
        model.params.copy_(torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 0.0]))  # W = [[1,0,0],[0,1,0]]
    bx = torch.tensor([[1.0, 2.0, 0.0], [0.0, 1.0, 1.0]])
    stored = torch.tensor([[0.0, 0.0], [1.0, 1.0]])
    cl = client(0, buffer_with(bx, torch.tensor([0, 1]), stored))
    x = torch.tensor([[2.0, 0.0, 5.0]])
    y = torch.tensor([0])
    der = DER({"alpha": 0.5})
    der.setup(ENV)
    loss = plan_loss(der, step(model, cl, server(model, [cl]), x, y))
    # logits(x) = [2, 0] → CE = log(1 + e^-2)
    ce = torch.log1p(torch.exp(torch.tensor(-2.0)))
    # buffer logits: [1,2] vs [0,0] and [0,1] vs [1,1] → squared errors 1,4,1,0 → mean 1.5
    assert torch.allclose(loss, ce + 0.5 * 1.5)


def test_der_without_buffer_content_is_plain_ce_and_default_alpha() -> None:
    model = linear_model()
    cl = client(0, None)
    der = DER()
    der.setup(ENV)
    assert der.alpha == 1.0  # MNIST-like default
    other = DER()
    other.setup(env("seq-cifar10", "class-il", 10, 5))
    assert other.alpha == 0.3
    x, y = torch.randn(4, 3), torch.tensor([0, 1, 0, 1])
    loss = plan_loss(der, step(model, cl, server(model, [cl]), x, y))
    assert torch.allclose(loss, F.cross_entropy(model.module(x), y))


def test_agem_projects_against_buffer_gradient() -> None:
    model = linear_model(seed=1)
    bx = torch.randn(6, 3, generator=torch.Generator().manual_seed(2))
    by = torch.tensor([0, 1, 1, 0, 1, 0])
    cl = client(0, buffer_with(bx, by, torch.zeros(6, 2)))
    with torch.no_grad():
        model.params.zero_()  # p = 0.5 everywhere: flipped labels give conflicting gradients
    x, y = bx[:4], 1 - by[:4]
    agem = AGEM()
    agem.setup(ENV)
    st = step(model, cl, server(model, [cl]), x, y)
    model.zero_grad()
    F.cross_entropy(model.module(x), y).backward()
    g = model.grads.clone()
    model.zero_grad()
    F.cross_entropy(model.module(bx), by).backward()
    gb = model.grads.clone()
    assert torch.dot(g, gb) < 0, "test batch must conflict"
    expected = g - torch.dot(g, gb) / torch.dot(gb, gb) * gb
    view = OneClientStep(model, cl, st.buffer_batch_size, agem.objective)
    refined = agem.refine(g, view)
    assert torch.allclose(refined, expected, atol=1e-6)
    assert torch.dot(refined, gb) >= -1e-6 * g.norm() * gb.norm()
    # A chunk (C, P): row 0 as above, row 1 a client with an empty buffer (zero g_b row).
    chunk = _ChunkView(torch.stack([gb, torch.zeros_like(gb)]))
    both = agem.refine(torch.stack([g, g]), chunk)
    assert torch.allclose(both[0], expected, atol=1e-6)
    assert torch.equal(both[1], g)
    assert agem.refine(g, _ChunkView(None)) is g  # no buffer holds anything: untouched


class _ChunkView:
    """A stand-in ``StepView`` that only answers ``buffer_gradient``."""

    def __init__(self, g_b: torch.Tensor | None) -> None:
        self.g_b = g_b

    def buffer_gradient(self) -> torch.Tensor | None:
        return self.g_b


def test_fedavg_weightings_by_hand() -> None:
    a, b = torch.tensor([1.0, 2.0]), torch.tensor([3.0, 6.0])
    avg = RunningAverage(a, torch.zeros(0))
    avg.add(a, torch.zeros(0), client_weight(100, "samples"))
    avg.add(b, torch.zeros(0), client_weight(300, "samples"))
    params, _ = avg.result()  # type: ignore[misc]
    assert torch.allclose(params, torch.tensor([2.5, 5.0]))  # (100·a + 300·b) / 400
    avg = RunningAverage(a, torch.zeros(0))
    avg.add(a, torch.zeros(0), client_weight(100, "uniform"))
    avg.add(b, torch.zeros(0), client_weight(300, "uniform"))
    params, _ = avg.result()  # type: ignore[misc]
    assert torch.allclose(params, torch.tensor([2.0, 4.0]))
    assert RunningAverage(a, torch.zeros(0)).result() is None
