"""IFA resets exactly the chosen parameters at generation ends, and nothing else."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from cfl_bench.core.context import ServerState
from cfl_bench.core.errors import UserError
from cfl_bench.core.flat import FlatModel
from cfl_bench.runner.models import build_model
from cfl_bench.strategies.ifa import (
    IFA,
    later_layers_start,
    later_weight_layers_start,
    norm_module_names,
    random_selection,
)
from tests.helpers import env, server


def two_layer_server() -> tuple[FlatModel, ServerState]:
    torch.manual_seed(0)
    model = FlatModel(nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2)))  # 16 + 10 params
    srv = server(model, [])
    srv.rounds_per_task = 2
    return model, srv


def run_rounds(
    ifa: IFA, srv: ServerState, rounds: int
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Simulate ``rounds`` rounds in which 'training' adds 1 to every parameter; return the
    model each round broadcasts (after the round-start hooks) and the one it evaluates."""
    sent, evaluated = [], []
    for _ in range(rounds):
        srv.round_index += 1
        srv.round_in_task = (srv.round_index - 1) % srv.rounds_per_task
        ifa.on_round_start(srv)
        sent.append(srv.global_params.clone())
        srv.global_params = srv.global_params + 1.0  # aggregation makes a new tensor
        ifa.after_aggregate(srv)
        evaluated.append(srv.global_params.clone())
    return sent, evaluated


def test_later_mode_resets_the_output_layer_when_the_next_generation_opens() -> None:
    """Generations of 2 rounds (one task): rounds 1-2 train untouched and round 2's
    evaluation sees the trained model; round 3 opens generation 2 with the output layer
    back at generation 1's start; round 5 resets it to generation 2's start."""
    _, srv = two_layer_server()
    start = srv.global_params.clone()
    ifa = IFA({"rho": 0.3})  # target 7.8 of 26: the output layer (10) is nearest
    ifa.setup(env())
    sent, evaluated = run_rounds(ifa, srv, 5)
    assert torch.equal(sent[0], start) and torch.equal(sent[1], start + 1)
    assert torch.allclose(evaluated[1], start + 2)  # Gen. 1 as trained, no reset yet
    assert torch.allclose(sent[2][:16], start[:16] + 2)  # first layer keeps its training
    assert torch.equal(sent[2][16:], start[16:])  # output layer back to generation 1's start
    assert torch.allclose(evaluated[3][16:], start[16:] + 2)  # Gen. 2 adapted from there
    assert torch.allclose(sent[4][:16], start[:16] + 4)
    assert torch.equal(sent[4][16:], sent[2][16:])  # generation 2's start
    assert ifa.resets == 2


def test_reset_to_init_uses_the_initial_values() -> None:
    _, srv = two_layer_server()
    start = srv.global_params.clone()
    ifa = IFA({"rho": 0.3, "reset_to": "init", "generation": 1})
    ifa.setup(env())
    sent, evaluated = run_rounds(ifa, srv, 3)
    assert torch.equal(sent[2][16:], start[16:])
    assert torch.allclose(sent[2][:16], start[:16] + 2)
    assert torch.allclose(evaluated[2][16:], start[16:] + 1)


def test_random_mode_resets_a_seeded_rho_fraction() -> None:
    _, srv = two_layer_server()
    start = srv.global_params.clone()
    ifa = IFA({"mode": "random", "rho": 0.5})
    ifa.setup(env(seed=7))
    sent, _ = run_rounds(ifa, srv, 3)
    reset = sent[2] == start
    assert int(reset.sum()) == 13  # round(0.5 * 26)
    assert torch.allclose(sent[2][~reset], start[~reset] + 2)
    chosen = random_selection(26, 0.5, 7, 0)
    assert torch.equal(torch.sort(chosen).values, torch.nonzero(reset).flatten())
    assert torch.equal(random_selection(26, 0.5, 7, 0), chosen)  # seeded
    assert not torch.equal(random_selection(26, 0.5, 8, 0), chosen)
    assert not torch.equal(random_selection(26, 0.5, 7, 1), chosen)  # fresh per generation


def test_generations_split_the_run_into_equal_parts() -> None:
    """generations=3 over 2 tasks x 6 rounds: generations of 4 rounds, resets when rounds
    5 and 9 open, none after the last round (and none for a 13th lead round)."""
    _, srv = two_layer_server()
    srv.rounds_per_task = 6
    ifa = IFA({"rho": 0.3, "generations": 3})
    ifa.setup(env(num_tasks=2))
    assert ifa.adjust_schedule(6, 1) == (6, 1)
    assert ifa.generation == 4
    opened = []
    for round_index in range(1, 14):
        srv.round_index, srv.round_in_task = round_index, (round_index - 1) % 6
        before = ifa.resets
        ifa.on_round_start(srv)
        opened += [round_index] if ifa.resets > before else []
    assert opened == [5, 9]
    assert "generations" not in IFA().resolved_options()  # quiet default: old hashes hold


def test_later_selection_on_the_mnist_cnn() -> None:
    model = FlatModel(build_model("mnist-cnn", (1, 28, 28), 10))
    assert later_layers_start(model.slices, 0.2) == 21_840 - 510  # fc2 only
    assert later_layers_start(model.slices, 0.7) == 21_840 - 16_560  # fc1 + fc2
    assert later_layers_start(model.slices, 1.0) == 0


def test_later_unit_layers_counts_weight_layers_with_their_norms() -> None:
    """conv(3→2, 3×3) 56, bn 4, conv(2→2, 1×1) 6, bn 4, linear(2→3) 9: L = 3 weight layers.
    ρ = 0.4 → round(1.2) = 1 layer (the linear); ρ = 0.5 → round(1.5) = 2 (from the second
    conv, its BN included); ρ = 0.01 still resets one layer."""
    module = nn.Sequential(
        nn.Conv2d(3, 2, 3), nn.BatchNorm2d(2), nn.Conv2d(2, 2, 1), nn.BatchNorm2d(2),
        nn.Flatten(), nn.Linear(2, 3),
    )  # fmt: skip
    model = FlatModel(module)
    norms = norm_module_names(module)
    assert norms == frozenset({"1", "3"})
    assert later_weight_layers_start(model.slices, 0.4, norms) == 56 + 4 + 6 + 4
    assert later_weight_layers_start(model.slices, 0.5, norms) == 56 + 4
    assert later_weight_layers_start(model.slices, 0.01, norms) == 70
    assert later_weight_layers_start(model.slices, 1.0, norms) == 0


def test_later_units_differ_on_resnet18_as_the_paper_reading_says() -> None:
    """ρ = 0.2 on the CIFAR ResNet-18: the paper's last 4 of 21 weight layers are 43.5 % of
    the parameters; the nearest-ρ·P suffix is 21.2 %."""
    module = build_model("resnet18", (3, 32, 32), 10)
    model = FlatModel(module)
    total = model.params.numel()
    by_layers = later_weight_layers_start(model.slices, 0.2, norm_module_names(module))
    by_params = later_layers_start(model.slices, 0.2)
    assert round(100 * (total - by_layers) / total, 1) == 43.5
    assert round(100 * (total - by_params) / total, 1) == 21.2
    starts = {s.start: s.name for s in model.slices}
    assert starts[by_layers] == "layer4.0.shortcut.0.weight"


def test_later_unit_layers_resets_what_it_selects() -> None:
    _, srv = two_layer_server()
    start = srv.global_params.clone()
    ifa = IFA({"rho": 0.9, "later_unit": "layers"})  # round(1.8) = both linear layers
    ifa.setup(env())
    sent, _ = run_rounds(ifa, srv, 3)
    assert torch.equal(sent[2], start)
    assert IFA({"later_unit": "layers"}).resolved_options()["later_unit"] == "layers"
    assert "later_unit" not in IFA().resolved_options()  # quiet default: old hashes hold


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, "generation=task never resets in a 20-round run"),
        ({"generation": 20}, "generation=20 never resets"),
        ({"generation": 25}, "generation=25 never resets"),
        ({"generations": 3}, "generations=3 must split the run's 20 rounds"),
        ({"generations": 1}, "into 2 or more equal generations"),
        ({"generations": 2, "generation": 5}, "not both"),
    ],
)
def test_runs_in_which_ifa_never_resets_are_refused(
    options: dict[str, object], message: str
) -> None:
    """A static run of 20 rounds: one task's generation (or a longer one) never resets;
    generations must divide the rounds."""
    with pytest.raises(UserError, match=message):
        ifa = IFA(options)
        ifa.setup(env("cifar10", "static", 10, 1))
        ifa.adjust_schedule(20, 1)


def test_static_runs_accept_generations_that_reset() -> None:
    """Any generation shorter than the run resets at least once; a generation end on the
    last round resets nothing (the next generation never opens)."""
    for options in ({"generation": 8}, {"generation": 10}, {"generations": 10}):
        ifa = IFA(options)
        ifa.setup(env("cifar10", "static", 10, 1))
        assert ifa.adjust_schedule(20, 1) == (20, 1)
    continual = IFA()  # a task's generation on a continual stream of several tasks
    continual.setup(env())
    assert continual.adjust_schedule(20, 1) == (20, 1)
