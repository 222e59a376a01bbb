"""FedProx and FedCurv penalties against hand-computed values on tiny vectors."""

from __future__ import annotations

import torch
from torch.nn import functional as F

from cfl_bench.core.context import ClientState, ServerState, Upload
from cfl_bench.strategies.fedcurv import FedCurv, curvature_penalty, diagonal_fisher
from cfl_bench.strategies.fedprox import FedProx, proximal_penalty
from tests.helpers import client, env, inputs_for, linear_model, local_round, server


def test_fedprox_gradient_is_mu_times_distance_to_round_start_model() -> None:
    theta = torch.tensor([1.0, 2.0, 3.0])
    anchor = torch.tensor([0.0, 1.0, 1.0])
    grads = torch.tensor([10.0, 0.0, 0.0])  # the data gradient already there
    penalized, value = proximal_penalty(theta, grads, anchor, mu=0.5)
    assert torch.allclose(penalized, torch.tensor([10.5, 0.5, 1.0]))
    assert torch.isclose(value, torch.tensor(0.25 * (1 + 1 + 4)))
    assert torch.equal(grads, torch.tensor([10.0, 0.0, 0.0]))  # a new tensor: g untouched
    # Two clients at once (parameter axis last): the second at θ_g has no penalty.
    rows = torch.stack([theta, anchor])
    chunk, values = proximal_penalty(rows, torch.stack([grads, grads]), anchor, mu=0.5)
    assert torch.allclose(chunk, torch.stack([penalized, grads]))
    assert torch.allclose(values, torch.tensor([1.5, 0.0]))


def test_fedprox_component_matches_autograd_of_the_penalty() -> None:
    model = linear_model()
    cl = client(0, None)
    srv = server(model, [cl])  # θ_g = the model's starting parameters
    with torch.no_grad():
        model.params.add_(torch.arange(6.0) / 10)  # local training moved θ away from θ_g
    prox = FedProx({"mu": 2.0})
    prox.setup(env())
    inputs = inputs_for(prox, cl, local_round(model, srv))
    assert inputs is not None
    penalized = prox.penalty(model.params, torch.zeros(6), inputs)
    theta = model.params.clone().requires_grad_(True)
    expected = 0.5 * 2.0 * ((theta - srv.global_params) ** 2).sum()
    expected.backward()
    assert penalized is not None and torch.isclose(penalized[1], expected.detach())
    assert theta.grad is not None and torch.allclose(penalized[0], theta.grad)
    assert FedProx().opts.mu == 0.01  # spec default


def test_curvature_penalty_value_and_gradient_by_hand() -> None:
    theta = torch.tensor([1.0, 2.0])
    grads, value = curvature_penalty(
        theta, torch.zeros(2), torch.tensor([3.0, 1.0]), torch.tensor([1.0, 0.0]), 0.5
    )
    # 0.5 * (1*3 + 4*1 - 2*(1*1 + 2*0)) = 2.5 ; grad = 2*0.5*(θ⊙U' − V') = [2, 2]
    assert torch.isclose(value, torch.tensor(2.5))
    assert torch.allclose(grads, torch.tensor([2.0, 2.0]))


def _fedcurv_after_one_round(
    lam: float = 1.0,
) -> tuple[FedCurv, list[ClientState], ServerState]:
    """Two clients uploaded known Fisher vectors in round 1; a third did not. Returns the
    server in round 2."""
    model = linear_model(in_features=1, classes=2)  # two parameters
    clients = [client(k, None) for k in range(3)]
    srv = server(model, clients)
    srv.round_index = 1
    curv = FedCurv({"lam": lam})
    curv.setup(env())
    for k, u, theta in ((0, [1.0, 0.0], [2.0, 3.0]), (1, [0.0, 2.0], [1.0, 1.0])):
        u_k = torch.tensor(u)
        v_k = u_k * torch.tensor(theta)
        clients[k].state_for("fedcurv").update(u=u_k, v=v_k, round=1)  # what after_local keeps
        extras = {"fedcurv.u": u_k, "fedcurv.v": v_k}
        curv.receive_upload(Upload(k, model.params, model.buffers, 1, extras), srv)
    curv.after_aggregate(srv)
    srv.round_index = 2
    return curv, clients, srv


def test_fedcurv_removes_own_terms_and_anchors_to_the_other_client() -> None:
    curv, clients, srv = _fedcurv_after_one_round()
    # U = [1, 2], V = [2, 2]; the broadcast sends both.
    payload = curv.broadcast(srv)
    assert torch.equal(payload["fedcurv.U"], torch.tensor([1.0, 2.0]))
    assert torch.equal(payload["fedcurv.V"], torch.tensor([2.0, 2.0]))
    model = srv.model
    inputs = inputs_for(curv, clients[0], local_round(model, srv, payload))
    assert inputs is not None
    theta = torch.tensor([5.0, 4.0])
    penalized = curv.penalty(theta, torch.zeros(2), inputs)
    # client 0: U − u_0 = [0, 2], V − v_0 = [0, 2] → λ(2·16 − 2·2·4) = 16, ∇ = 2[(0, 8) − (0, 2)]
    assert penalized is not None and torch.isclose(penalized[1], torch.tensor(16.0))
    assert torch.allclose(penalized[0], torch.tensor([0.0, 12.0]))
    # no aliasing: the shared sums are untouched by client 0's subtraction
    assert torch.equal(curv.broadcast(srv)["fedcurv.U"], torch.tensor([1.0, 2.0]))
    # client 2 did not contribute last round (its u_2 is from round 0, not in U): it is
    # penalised by the full sums
    clients[2].state_for("fedcurv").update(u=torch.ones(2), v=torch.ones(2), round=0)
    others = inputs_for(curv, clients[2], local_round(model, srv, payload))
    assert others is not None
    penalized = curv.penalty(theta, torch.zeros(2), others)
    expected = (torch.tensor([25.0, 16.0]) * torch.tensor([1.0, 2.0])).sum() - 2 * (
        torch.tensor([5.0, 4.0]) * torch.tensor([2.0, 2.0])
    ).sum()
    assert penalized is not None and torch.isclose(penalized[1], expected)


def test_fedcurv_is_silent_before_the_first_sums_and_after_an_empty_round() -> None:
    model = linear_model()
    cl = client(0, None)
    srv = server(model, [cl])
    curv = FedCurv()
    curv.setup(env())
    assert curv.broadcast(srv) == {}
    assert inputs_for(curv, cl, local_round(model, srv)) is None  # no penalty this round
    curv.after_aggregate(srv)  # a round with no uploads leaves no sums
    assert curv.broadcast(srv) == {}


def test_diagonal_fisher_is_mean_of_squared_batch_gradients() -> None:
    model = linear_model(seed=3)
    model.module.eval()
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(5, 3, generator=gen), torch.tensor([0, 1, 1, 0, 1])
    fisher = diagonal_fisher(model, x, y, batch_size=2)  # batches of 2, 2, 1
    expected = torch.zeros(6)
    for sl in (slice(0, 2), slice(2, 4), slice(4, 5)):
        w = model.params.view(2, 3).clone().requires_grad_(True)
        (g,) = torch.autograd.grad(F.cross_entropy(x[sl] @ w.T, y[sl]), w)
        expected += g.reshape(-1) ** 2
    assert torch.allclose(fisher, expected / 3)
    assert torch.count_nonzero(model.grads) == 0  # leaves no gradient behind


def test_fedcurv_after_local_uploads_fisher_of_about_samples_examples() -> None:
    model = linear_model()
    cl = client(0, None)
    gen = torch.Generator().manual_seed(2)
    cl.train_x, cl.train_y = (
        torch.randn(40, 3, generator=gen),
        torch.randint(0, 2, (40,), generator=gen),
    )
    srv = server(model, [cl])
    curv = FedCurv({"samples": 10})
    curv.setup(env(batch_size=4))
    upload = Upload(0, model.params, model.buffers, 40)
    srv.round_index = 3
    curv.after_local(cl, upload, local_round(model, srv))
    u, v = upload.extras["fedcurv.u"], upload.extras["fedcurv.v"]
    assert cl.state_for("fedcurv")["round"] == 3  # so the next round knows u is in U
    assert u.shape == model.params.shape and bool((u >= 0).all()) and bool((u > 0).any())
    assert torch.allclose(v, u * model.params)
    assert model.module.training  # mode restored for the engine
