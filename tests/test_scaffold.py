"""SCAFFOLD: the corrected gradient, both control-variate options, the server's c and η_g by
hand; refusals; compositions end to end with the control variates counted; resume."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import cast

import pytest
import torch

from cfl_bench.core.context import LocalRound, Upload
from cfl_bench.core.errors import UserError
from cfl_bench.strategies.compose import build_strategy
from cfl_bench.strategies.scaffold import DC, C, Scaffold, local_gradient
from tests.helpers import broadcast, client, env, inputs_for, linear_model, server
from tests.test_resume import assert_resumes_after_crash, uninterrupted
from tests.test_zoo_cli import CLIENTS, MODEL, per_round, run


def scaffold(
    optimizer: str = "sgd", momentum: float = 0.0, batch_size: int = 4, **values: object
) -> Scaffold:
    component = Scaffold(values)
    run_env = env(batch_size=batch_size)
    component.setup(dataclasses.replace(run_env, optimizer=optimizer, momentum=momentum))
    return component


def test_transform_subtracts_c_k_and_adds_c() -> None:
    model = linear_model(in_features=3, classes=1)
    cl = client(0, None)
    srv = server(model, [cl])
    sc = scaffold()
    sc.c = torch.tensor([0.5, -1.0, 0.0])
    cl.state_for("scaffold")["c"] = torch.tensor([1.0, 2.0, -3.0])
    inputs = inputs_for(sc, cl, LocalRound(model, broadcast(srv, sc.broadcast(srv)), lr=0.1))
    assert inputs is not None
    g = sc.transform(torch.tensor([1.0, 1.0, 1.0]), inputs, None)  # type: ignore[arg-type]
    # g − c_k + c = [1 − 1 + 0.5, 1 − 2 − 1, 1 + 3 + 0] = [0.5, −2, 4]
    assert torch.equal(g, torch.tensor([0.5, -2.0, 4.0]))
    # A chunk of two clients: the same function on (C, P) rows, c − c_k stacked per client.
    rows = torch.stack([inputs["correction"], torch.zeros(3)])
    chunk = sc.transform(torch.ones(2, 3), {"correction": rows}, None)  # type: ignore[arg-type]
    assert torch.equal(chunk, torch.tensor([[0.5, -2.0, 4.0], [1.0, 1.0, 1.0]]))


def _train_by_hand(sc: Scaffold, lr: float, steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Client 0 of a two-parameter model, c = [0.5, −1], c_k = [1, 2], θ_g = 0, takes
    ``steps`` SGD steps on L = ½‖θ − a‖² (a = [1, 2]) with the SCAFFOLD correction; returns
    its new c_k and the uploaded Δc_k."""
    model = linear_model(in_features=2, classes=1)
    cl = client(0, None)
    srv = server(model, [cl])
    srv.global_params = torch.zeros(2)
    with torch.no_grad():
        model.params.zero_()
    sc.c = torch.tensor([0.5, -1.0])
    cl.state_for("scaffold")["c"] = torch.tensor([1.0, 2.0])
    local = LocalRound(model, broadcast(srv, sc.broadcast(srv)), lr=lr)
    inputs = inputs_for(sc, cl, local)
    assert inputs is not None
    target = torch.tensor([1.0, 2.0])
    for _ in range(steps):
        model.zero_grad()
        model.grads.add_(model.params.detach() - target)
        model.grads.copy_(sc.transform(model.grads, inputs, None))  # type: ignore[arg-type]
        with torch.no_grad():
            model.params.sub_(model.grads, alpha=lr)
    upload = Upload(0, model.params, model.buffers, 1)
    sc.after_local(cl, upload, dataclasses.replace(local, steps=steps))
    return cast(torch.Tensor, cl.state_for("scaffold")["c"]), upload.extras[DC]


def test_option_ii_control_variate_by_hand() -> None:
    c_k, dc = _train_by_hand(scaffold(), lr=0.1, steps=2)
    # c − c_k = [−0.5, −3]. Step 1 at θ = 0: g = [−1, −2] + [−0.5, −3] = [−1.5, −5],
    # θ₁ = [0.15, 0.5]. Step 2: g = [−0.85, −1.5] + [−0.5, −3] = [−1.35, −4.5],
    # θ₂ = [0.285, 0.95]. c_k⁺ = c_k − c + (θ_g − θ_k)/(Kη) = [0.5, 3] + [−0.285, −0.95]/0.2
    # = [0.5, 3] + [−1.425, −4.75] = [−0.925, −1.75] — the mean *uncorrected* local gradient.
    assert torch.allclose(c_k, torch.tensor([-0.925, -1.75]))
    assert torch.allclose(dc, torch.tensor([-1.925, -3.75]))  # c_k⁺ − c_k


def test_option_ii_momentum_divisor_uses_fednovas_step_count() -> None:
    plain, _ = _train_by_hand(scaffold(momentum=0.5, divisor="steps"), lr=0.1, steps=2)
    assert torch.allclose(plain, torch.tensor([-0.925, -1.75]))  # divisor=steps ignores ρ
    scaled, _ = _train_by_hand(scaffold(momentum=0.5), lr=0.1, steps=2)  # the default
    # a_K = [2 − 0.5(1 − 0.25)/0.5]/0.5 = 2.5: c_k⁺ = [0.5, 3] + [−0.285, −0.95]/0.25
    assert torch.allclose(scaled, torch.tensor([0.5 - 1.14, 3.0 - 3.8]))


def test_option_i_takes_the_full_data_gradient_at_the_broadcast_model() -> None:
    torch.manual_seed(1)
    model = linear_model(in_features=3, classes=2)
    cl = client(0, None)
    cl.train_x, cl.train_y = torch.randn(5, 3), torch.tensor([0, 1, 1, 0, 1])
    srv = server(model, [cl])
    theta_g = srv.global_params.clone()
    # The same gradient by one full-batch autograd pass (batches of 2 + 2 + 1 above).
    weights = theta_g.view(2, 3).clone().requires_grad_(True)
    loss = torch.nn.functional.cross_entropy(cl.train_x @ weights.T, cl.train_y)
    loss.backward()
    assert weights.grad is not None
    expected = weights.grad.flatten()
    assert torch.allclose(local_gradient(model, cl, 2, scaffold().objective), expected)
    assert torch.count_nonzero(model.grads) == 0 and model.module.training
    sc = scaffold(variate="I", batch_size=2)
    old = torch.arange(6.0)
    cl.state_for("scaffold")["c"] = old.clone()
    local = LocalRound(model, broadcast(srv, sc.broadcast(srv)), lr=0.1)
    inputs_for(sc, cl, local)
    with torch.no_grad():
        model.params.add_(1.0)  # local training moves θ; option I ignores it
    upload = Upload(0, model.params, model.buffers, 5)
    sc.after_local(cl, upload, dataclasses.replace(local, steps=3))
    assert torch.allclose(cast(torch.Tensor, cl.state_for("scaffold")["c"]), expected)
    assert torch.allclose(upload.extras[DC], expected - old)


def _server_round(sc: Scaffold, uploads: list[list[float]], mean: list[float]) -> torch.Tensor:
    """Four clients (N = 4); the given ones upload Δc_k; θ_old = [1, 1], the engine's mean
    ``mean``. Returns θ_g after SCAFFOLD's server hook."""
    model = linear_model(in_features=2, classes=1)
    srv = server(model, [client(k, None) for k in range(4)])
    srv.global_params = torch.tensor([1.0, 1.0])
    sc.broadcast(srv)
    for k, dc in enumerate(uploads):
        upload = Upload(k, torch.zeros(2), torch.zeros(0), 1, {DC: torch.tensor(dc)})
        sc.receive_upload(upload, srv)
    srv.global_params = torch.tensor(mean)
    sc.after_aggregate(srv)
    return srv.global_params


def test_server_c_moves_by_s_over_n_of_the_mean_and_server_lr_steps() -> None:
    sc = scaffold(server_lr=0.5)
    sc.c = torch.tensor([0.5, 0.5])
    theta = _server_round(sc, [[1.0, 2.0], [3.0, -2.0]], [3.0, -1.0])
    # c + (|S|/N)·mean Δc = [0.5, 0.5] + (2/4)·[2, 0] = [1.5, 0.5]
    assert sc.c is not None and torch.allclose(sc.c, torch.tensor([1.5, 0.5]))
    # θ_old + η_g(θ_avg − θ_old) = [1, 1] + 0.5·[2, −2] = [2, 0]
    assert torch.allclose(theta, torch.tensor([2.0, 0.0]))
    plain = scaffold()
    mean = [3.0, -1.0]
    assert torch.equal(_server_round(plain, [[1.0, 1.0]], mean), torch.tensor(mean))
    assert plain.c is not None and torch.allclose(plain.c, torch.tensor([0.25, 0.25]))


def test_state_survives_a_checkpoint_and_defaults() -> None:
    sc = scaffold()
    _server_round(sc, [[1.0, 2.0]], [0.0, 0.0])
    again = scaffold()
    again.load_state_dict(sc.state_dict())
    assert again.c is not None and sc.c is not None and torch.equal(again.c, sc.c)
    assert Scaffold().resolved_options() == {
        "variate": "II",
        "server_lr": 1.0,
        "divisor": "momentum",
    }


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("scaffold:variate=III", r"scaffold:variate must be one of II, I"),
        ("scaffold:server_lr=0", r"scaffold:server_lr must be .*> 0"),
        ("scaffold:divisor=adaptive", r"scaffold:divisor must be one of steps, momentum"),
        ("scaffold+scaffold", r"'scaffold' appears twice"),
    ],
)
def test_bad_options_are_refused(text: str, message: str) -> None:
    with pytest.raises(UserError, match=message):
        build_strategy(text)


def test_option_ii_is_refused_with_local_adam_and_option_i_is_not() -> None:
    with pytest.raises(UserError, match=r"scaffold:variate=II.*--optimizer adam"):
        scaffold(optimizer="adam")
    assert scaffold(optimizer="adam", variate="I").variate == "I"


def test_order_in_the_chain_and_the_server_hooks() -> None:
    strategy = build_strategy("fedgp+ifa+fedproj+scaffold")
    assert [c.name for c in strategy.transforms] == ["scaffold", "fedproj", "fedgp"]
    assert [c.name for c in strategy.server_hooks] == [
        "scaffold",
        "ifa",
        "fedavg",
        "fedproj",
        "fedgp",
    ]


def test_run_counts_c_down_and_dc_up_every_round(tmp_path: Path) -> None:
    summary, records = run(tmp_path, "scaffold")
    assert summary["Acc_T"] > 20  # chance is 10 %
    # c (down) and Δc_k (up) are model-sized, for every participant in all four rounds
    assert per_round(records, "bytes_up") == [CLIENTS * 2 * MODEL] * 4
    assert per_round(records, "bytes_down") == [CLIENTS * 2 * MODEL] * 4
    payloads = summary["bytes_by_payload"]
    assert payloads["down:scaffold.c"] == payloads["up:scaffold.dc"] == 4 * CLIENTS * MODEL


@pytest.mark.parametrize("strategy", ["scaffold+ifa", "scaffold:variate=I+fedgp", "der+scaffold"])
def test_compositions_run_end_to_end(tmp_path: Path, strategy: str) -> None:
    summary, _ = run(tmp_path, strategy)
    assert summary["Acc_T"] > 20
    payloads = summary["bytes_by_payload"]
    assert payloads["down:scaffold.c"] == payloads["up:scaffold.dc"] == 4 * CLIENTS * MODEL
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert "scaffold" in [c["name"] for c in config["strategy"]["components"]]


def test_digits_run_resumes_identically(tmp_path: Path) -> None:
    extra = {"model": "mlp", "participation": 0.5}
    strategy = "scaffold:server_lr=0.8"
    whole = uninterrupted(tmp_path, strategy, **extra)
    assert_resumes_after_crash(tmp_path / "crashed", strategy, whole, **extra)


def test_broadcast_payload_is_c() -> None:
    model = linear_model()
    srv = server(model, [client(0, None)])
    sc = scaffold()
    payloads = sc.broadcast(srv)
    assert list(payloads) == [C] and torch.equal(payloads[C], torch.zeros(6))
