"""ER and DER++ losses against hand-computed values; DER++ uses two independent draws."""

from __future__ import annotations

import torch
from torch.nn import functional as F

from cfl_bench.core.buffer import BufferDraw
from cfl_bench.core.flat import FlatModel
from cfl_bench.engine.one_client import plan_loss
from cfl_bench.strategies.derpp import DERPP
from cfl_bench.strategies.er import ER
from tests.helpers import buffer_with, client, env, linear_model, server, step

BX = torch.tensor([[1.0, 2.0, 0.0], [0.0, 1.0, 1.0]])
BY = torch.tensor([1, 0])
STORED = torch.tensor([[0.0, 0.0], [1.0, 1.0]])
X, Y = torch.tensor([[2.0, 0.0, 5.0]]), torch.tensor([0])
CE_BATCH = torch.log1p(torch.exp(torch.tensor(-2.0)))  # logits [2, 0], label 0
# buffer logits [1, 2] (label 1) and [0, 1] (label 0)
CE_BUFFER = (
    torch.log1p(torch.exp(torch.tensor(-1.0))) + torch.log1p(torch.exp(torch.tensor(1.0)))
) / 2


def identity_like_model() -> FlatModel:
    model = linear_model()
    with torch.no_grad():
        model.params.copy_(torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 0.0]))  # W = [[1,0,0],[0,1,0]]
    return model


def test_er_adds_ce_of_the_buffer_draw() -> None:
    model = identity_like_model()
    cl = client(0, buffer_with(BX, BY, STORED))
    er = ER()
    er.setup(env())
    loss = plan_loss(er, step(model, cl, server(model, [cl]), X, Y))  # draw of 32 ⇒ both examples
    assert torch.isclose(loss, CE_BATCH + CE_BUFFER)


def test_er_without_buffer_content_is_plain_ce() -> None:
    model = identity_like_model()
    cl = client(0, None)
    loss = plan_loss(ER(), step(model, cl, server(model, [cl]), X, Y))
    assert torch.isclose(loss, F.cross_entropy(model.module(X), Y))


def test_derpp_is_ce_plus_alpha_mse_plus_beta_ce() -> None:
    model = identity_like_model()
    cl = client(0, buffer_with(BX, BY, STORED))
    derpp = DERPP({"alpha": 0.2, "beta": 0.7})
    derpp.setup(env())
    loss = plan_loss(derpp, step(model, cl, server(model, [cl]), X, Y))
    mse = torch.tensor(1.5)  # squared errors 1, 4, 1, 0
    assert torch.isclose(loss, CE_BATCH + 0.2 * mse + 0.7 * CE_BUFFER)
    defaults = DERPP()
    defaults.setup(env())
    assert (defaults.alpha, defaults.beta) == (0.1, 0.5)


def test_derpp_draws_twice_independently() -> None:
    model = linear_model()
    gen = torch.Generator().manual_seed(3)
    bx = torch.randn(8, 3, generator=gen)
    by = torch.randint(0, 2, (8,), generator=gen)
    cl = client(0, buffer_with(bx, by, torch.randn(8, 2, generator=gen)))
    buffer = cl.buffer
    assert buffer is not None
    draws: list[torch.Tensor] = []
    original = buffer.sample

    def spy(m: int) -> BufferDraw | None:
        draw = original(m)
        assert draw is not None
        draws.append(draw.x)
        return draw

    buffer.sample = spy  # type: ignore[method-assign]
    derpp = DERPP()
    derpp.setup(env())
    for _ in range(20):
        plan_loss(derpp, step(model, cl, server(model, [cl]), X, Y, buffer_batch_size=2))
    assert len(draws) == 40  # two draws per step
    pairs = [(draws[i], draws[i + 1]) for i in range(0, 40, 2)]
    assert any(not torch.equal(a, b) for a, b in pairs)  # not one draw used twice
