"""FedGP: g_ref is the mean of the clients' buffer gradients at θ_g; projection at each step."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch.nn import functional as F

from cfl_bench.core.context import LocalRound
from cfl_bench.core.errors import UserError
from cfl_bench.strategies.fedgp import FedGP
from tests.helpers import (
    buffer_with,
    client,
    env,
    inputs_for,
    linear_model,
    round_server,
    server,
    step,
)


def ce_grad_by_hand(W: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """∇_W mean CE for logits = x Wᵀ: (softmax − onehot)ᵀ x / n, flattened row-major."""
    p = torch.softmax(x @ W.T, dim=1)
    onehot = F.one_hot(y, W.shape[0]).float()
    return ((p - onehot).T @ x / x.shape[0]).reshape(-1)


def test_gref_is_mean_of_client_buffer_gradients() -> None:
    model = linear_model(seed=4)
    gen = torch.Generator().manual_seed(5)
    x1, x2 = torch.randn(5, 3, generator=gen), torch.randn(7, 3, generator=gen)
    y1, y2 = torch.tensor([0, 1, 1, 0, 1]), torch.tensor([1, 1, 0, 0, 0, 1, 0])
    c1 = client(0, buffer_with(x1, y1, torch.zeros(5, 2)))
    c2 = client(1, buffer_with(x2, y2, torch.zeros(7, 2)))
    c3 = client(2, None)  # no buffer → contributes nothing
    srv = server(model, [c1, c2, c3])
    fedgp = FedGP({"gref_samples": "all", "gref_mode": "eval"})
    fedgp.setup(env("rot-mnist", "domain-il", 2, 2))
    rs, executor = round_server(srv, fedgp)
    rs.run_server_hooks(executor)
    W = srv.global_params.view(2, 3)
    expected = (ce_grad_by_hand(W, x1, y1) + ce_grad_by_hand(W, x2, y2)) / 2
    assert fedgp.gref is not None
    assert torch.allclose(fedgp.gref, expected, atol=1e-6)
    # each contributor uploads one gradient (and downloads θ_g once), counted by the engine
    assert rs.comm.by_payload["up:fedgp.gref"] == 2 * 6 * 4
    assert rs.comm.by_payload["down:model"] == 2 * 6 * 4
    assert c1.model_version == c2.model_version == srv.version
    rs.run_server_hooks(executor)  # they hold this θ_g now: no second download
    assert rs.comm.by_payload["down:model"] == 2 * 6 * 4
    assert fedgp.broadcast(srv) == {"fedgp.gref": fedgp.gref}


def test_fedgp_projects_local_gradient_only_on_conflict() -> None:
    model = linear_model()
    cl = client(0, None)
    srv = server(model, [cl])
    fedgp = FedGP()
    fedgp.setup(env("rot-mnist", "domain-il", 2, 2))
    st = step(model, cl, srv, torch.zeros(1, 3), torch.zeros(1, dtype=torch.long))
    # No g_ref in the broadcast yet → nothing on the client's steps.
    assert inputs_for(fedgp, cl, LocalRound(model, st.broadcast)) is None
    # The client projects against the g_ref its broadcast carries (not the server's copy).
    fedgp.gref = torch.tensor([9.0, 9.0, 0, 0, 0, 0])
    gref = torch.tensor([-1.0, 1.0, 0, 0, 0, 0])
    sent = dataclasses.replace(st.broadcast, payloads={"fedgp.gref": gref})
    inputs = inputs_for(fedgp, cl, LocalRound(model, sent))
    assert inputs is not None
    g = torch.tensor([1.0, 0, 0, 0, 0, 0])
    projected = fedgp.transform(g, inputs, None)  # type: ignore[arg-type]
    assert torch.allclose(projected, torch.tensor([0.5, 0.5, 0, 0, 0, 0]))  # g + 0.5 r
    assert torch.equal(g, torch.tensor([1.0, 0, 0, 0, 0, 0]))  # a new tensor
    kept = torch.tensor([0.0, 2.0, 0, 0, 0, 0])
    assert torch.equal(fedgp.transform(kept, inputs, None), kept)  # type: ignore[arg-type]


def test_gref_interval_keeps_stale_reference() -> None:
    model = linear_model()
    gen = torch.Generator().manual_seed(1)
    c1 = client(
        0,
        buffer_with(
            torch.randn(4, 3, generator=gen), torch.tensor([0, 1, 0, 1]), torch.zeros(4, 2)
        ),
    )
    srv = server(model, [c1])
    fedgp = FedGP({"gref_interval": 2, "gref_samples": "all"})
    fedgp.setup(env("rot-mnist", "domain-il", 2, 2))
    rs, executor = round_server(srv, fedgp)
    srv.round_index = 1
    rs.run_server_hooks(executor)  # first reference is always computed
    first = fedgp.gref.clone()  # type: ignore[union-attr]
    srv.global_params = srv.global_params + torch.tensor([1.0, 0, 0, 0, 0, 0])
    srv.round_index = 2
    rs.run_server_hooks(executor)  # round 2 of interval 2 → refresh
    assert not torch.allclose(first, fedgp.gref)  # type: ignore[arg-type]
    refreshed = fedgp.gref.clone()  # type: ignore[union-attr]
    srv.global_params = srv.global_params + torch.tensor([1.0, 0, 0, 0, 0, 0])
    srv.round_index = 3
    rs.run_server_hooks(executor)  # stale
    assert torch.equal(refreshed, fedgp.gref)  # type: ignore[arg-type]


def test_equal_comm_halves_rounds_doubles_epochs() -> None:
    assert FedGP({"equal_comm": True}).adjust_schedule(20, 1) == (10, 2)
    for odd in (1, 5):  # halving would change the local computation: refused
        with pytest.raises(UserError, match="needs an even --rounds-per-task"):
            FedGP({"equal_comm": True}).adjust_schedule(odd, 1)
    assert FedGP().adjust_schedule(20, 1) == (20, 1)
