"""IFA resets exactly the chosen parameters at generation ends, and nothing else."""

from __future__ import annotations

import torch
from torch import nn

from cfl_bench.engine.context import ServerState
from cfl_bench.flat import FlatModel
from cfl_bench.models import build_model
from strategies.ifa import IFA, later_layers_start, random_selection
from tests.helpers import env, server


def two_layer_server() -> tuple[FlatModel, ServerState]:
    torch.manual_seed(0)
    model = FlatModel(nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2)))  # 16 + 10 params
    srv = server(model, [])
    srv.rounds_per_task = 2
    return model, srv


def run_generation(ifa: IFA, srv: ServerState, rounds: int) -> list[torch.Tensor]:
    """Simulate ``rounds`` rounds in which 'training' adds 1 to every parameter."""
    seen = []
    for _ in range(rounds):
        srv.round_index += 1
        srv.round_in_task = (srv.round_index - 1) % srv.rounds_per_task
        ifa.on_round_start(srv)
        srv.global_params = srv.global_params + 1.0  # aggregation makes a new tensor
        ifa.after_aggregate(srv)
        seen.append(srv.global_params.clone())
    return seen


def test_later_mode_resets_the_output_layer_to_the_generation_start() -> None:
    _, srv = two_layer_server()
    start = srv.global_params.clone()
    ifa = IFA({"rho": 0.3})  # target 7.8 of 26: the output layer (10) is nearest
    ifa.setup(env())
    after_r1, after_r2 = run_generation(ifa, srv, 2)
    assert torch.equal(after_r1, start + 1)  # not a generation end: untouched
    assert torch.allclose(after_r2[:16], start[:16] + 2)  # first layer keeps its training
    assert torch.equal(after_r2[16:], start[16:])  # output layer back to round-1 start
    # second generation starts from the reset model
    _, after_r4 = run_generation(ifa, srv, 2)
    assert torch.equal(after_r4[16:], after_r2[16:])
    assert torch.allclose(after_r4[:16], start[:16] + 4)


def test_reset_to_init_uses_the_initial_values() -> None:
    _, srv = two_layer_server()
    start = srv.global_params.clone()
    ifa = IFA({"rho": 0.3, "reset_to": "init", "generation": 1})
    ifa.setup(env())
    run_generation(ifa, srv, 3)
    assert torch.equal(srv.global_params[16:], start[16:])
    assert torch.allclose(srv.global_params[:16], start[:16] + 3)


def test_random_mode_resets_a_seeded_rho_fraction() -> None:
    _, srv = two_layer_server()
    start = srv.global_params.clone()
    ifa = IFA({"mode": "random", "rho": 0.5})
    ifa.setup(env(seed=7))
    run_generation(ifa, srv, 2)
    reset = srv.global_params == start
    assert int(reset.sum()) == 13  # round(0.5 * 26)
    assert torch.allclose(srv.global_params[~reset], start[~reset] + 2)
    chosen = random_selection(26, 0.5, 7, 0)
    assert torch.equal(torch.sort(chosen).values, torch.nonzero(reset).flatten())
    assert torch.equal(random_selection(26, 0.5, 7, 0), chosen)  # seeded
    assert not torch.equal(random_selection(26, 0.5, 8, 0), chosen)
    assert not torch.equal(random_selection(26, 0.5, 7, 1), chosen)  # fresh per generation


def test_later_selection_on_the_mnist_cnn() -> None:
    model = FlatModel(build_model("mnist-cnn", (1, 28, 28), 10))
    assert later_layers_start(model.slices, 0.2) == 21_840 - 510  # fc2 only
    assert later_layers_start(model.slices, 0.7) == 21_840 - 16_560  # fc1 + fc2
    assert later_layers_start(model.slices, 1.0) == 0
