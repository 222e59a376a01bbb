"""FedNTD: the not-true distillation term against its formula, and where its gradient goes."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch.nn import functional as F

from cfl_bench.core.errors import UserError
from cfl_bench.core.objective import Classification
from cfl_bench.strategies.compose import build_strategy
from cfl_bench.strategies.fedntd import FedNTD, drop_true_class, not_true_distillation
from tests.helpers import client, env, linear_model, local_round, sequential_term, server, step


def test_drop_true_class_keeps_the_original_order() -> None:
    logits = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    assert torch.equal(
        drop_true_class(logits, torch.tensor([1, 0])), torch.tensor([[1.0, 3.0], [5.0, 6.0]])
    )


def test_loss_equals_tau_squared_kl_batchmean_by_hand() -> None:
    z = torch.tensor([[2.0, 0.0, 1.0], [0.5, -1.0, 3.0]])
    zg = torch.tensor([[0.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    y = torch.tensor([0, 2])
    tau = 2.0
    # not-true logits: row 0 → z [0, 1], zg [1, 1]; row 1 → z [0.5, -1], zg [1, 1]
    total = 0.0
    for zs, zt in (([0.0, 1.0], [1.0, 1.0]), ([0.5, -1.0], [1.0, 1.0])):
        q = torch.softmax(torch.tensor(zs) / tau, 0)
        p = torch.softmax(torch.tensor(zt) / tau, 0)
        total += float((p * (p.log() - q.log())).sum())
    expected = tau * tau * total / 2
    assert torch.isclose(not_true_distillation(z, zg, y, tau), torch.tensor(expected), atol=1e-6)


def test_true_class_logit_gets_gradient_only_from_ce() -> None:
    gen = torch.Generator().manual_seed(0)
    z = torch.randn(4, 5, generator=gen).requires_grad_(True)
    zg = torch.randn(4, 5, generator=gen)
    y = torch.tensor([0, 3, 3, 4])
    (g_kd,) = torch.autograd.grad(not_true_distillation(z, zg, y, 1.0), z)
    rows = torch.arange(4)
    assert torch.all(g_kd[rows, y] == 0)
    assert torch.count_nonzero(g_kd) == 4 * 4  # every not-true logit is distilled
    (g_total,) = torch.autograd.grad(
        F.cross_entropy(z, y) + not_true_distillation(z, zg, y, 1.0), z
    )
    (g_ce,) = torch.autograd.grad(F.cross_entropy(z, y), z)
    assert torch.allclose(g_total[rows, y], g_ce[rows, y])


def test_component_distils_from_the_frozen_round_start_model() -> None:
    model = linear_model(in_features=3, classes=4)
    cl = client(0, None)
    srv = server(model, [cl])
    ntd = FedNTD({"tau": 3.0, "beta": 0.5})
    ntd.setup(env(num_classes=4))
    local = local_round(model, srv)
    x, y = (
        torch.randn(6, 3, generator=torch.Generator().manual_seed(4)),
        torch.tensor([0, 1, 2, 3, 0, 1]),
    )
    teacher_logits = model.module(x).detach()
    with torch.no_grad():
        model.params.mul_(-2.0)  # local training moved the student; the teacher must not move
    st = step(model, cl, srv, x, y)
    st.outputs = model.module(x)
    term = sequential_term(ntd, model, cl, local, st)
    expected = 0.5 * not_true_distillation(st.outputs, teacher_logits, y, 3.0)
    assert term is not None and torch.isclose(term, expected)
    assert FedNTD().resolved_options() == {"tau": 1.0, "beta": 1.0}


def test_fedntd_is_refused_where_there_are_no_class_logits() -> None:
    strategy = build_strategy("der+fedntd")
    no_logits = Classification(capabilities=frozenset())  # e.g. a detection objective
    with pytest.raises(UserError, match=r"fedntd.*class_logits"):
        strategy.setup(dataclasses.replace(env(), objective=no_logits))


def test_gather_matches_boolean_mask_on_random_logits() -> None:
    gen = torch.Generator().manual_seed(5)
    z = torch.randn(64, 10, generator=gen)
    y = torch.randint(0, 10, (64,), generator=gen)
    keep = torch.ones_like(z, dtype=torch.bool)
    keep.scatter_(1, y.unsqueeze(1), False)
    assert torch.equal(drop_true_class(z, y), z[keep].view(64, 9))
