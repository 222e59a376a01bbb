"""MOON: the model-contrastive loss by hand, where its gradient points, the models'
representation, the first round, the refusal on models without features, and runs."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch
from torch.nn import functional as F

from cfl_bench.core.context import Upload
from cfl_bench.core.errors import UserError
from cfl_bench.core.flat import FlatModel
from cfl_bench.engine.one_client import plan_loss
from cfl_bench.runner.config import make_config
from cfl_bench.runner.model_catalogue import MODEL_CAPABILITIES, model_capabilities, models_offering
from cfl_bench.runner.models import build_model
from cfl_bench.runner.run import execute
from cfl_bench.strategies.base import MODEL_CAPABILITIES as BASE_MODEL_CAPABILITIES
from cfl_bench.strategies.base import ModelFacts
from cfl_bench.strategies.compose import build_strategy
from cfl_bench.strategies.fedavg import FedAvg
from cfl_bench.strategies.moon import MOON, model_contrastive_loss
from tests.helpers import client, env, inputs_for, local_round, sequential_term, server, step
from tests.test_resume import assert_resumes_after_crash, uninterrupted

MLP_FACTS = ModelFacts("mlp", model_capabilities("mlp"), models_offering())


def test_loss_by_hand_on_two_rows() -> None:
    z = torch.tensor([[1.0, 0.0], [3.0, 4.0]])
    z_glob = torch.tensor([[1.0, 1.0], [3.0, 4.0]])
    z_prev = torch.tensor([[0.0, 1.0], [-3.0, -4.0]])
    # row 0: sim_g = 1/√2, sim_p = 0 → −log(e^{√2}/(e^{√2} + 1)) = log(1 + e^{−√2}) = 0.2176217
    # row 1: sim_g = 1, sim_p = −1 → logits [2, −2] → log(1 + e^{−4}) = 0.0181499
    expected = (math.log(1 + math.exp(-math.sqrt(2))) + math.log(1 + math.exp(-4))) / 2
    assert expected == pytest.approx(0.1178858, abs=1e-7)
    value = model_contrastive_loss(z, z_glob, z_prev, tau=0.5)
    assert value.item() == pytest.approx(expected, abs=1e-6)


def test_a_gradient_step_pulls_z_toward_the_global_and_away_from_the_previous() -> None:
    gen = torch.Generator().manual_seed(0)
    z = torch.randn(8, 5, generator=gen).requires_grad_(True)
    z_glob, z_prev = torch.randn(8, 5, generator=gen), torch.randn(8, 5, generator=gen)
    (grad,) = torch.autograd.grad(model_contrastive_loss(z, z_glob, z_prev, 0.5), z)
    moved = z.detach() - 0.01 * grad
    before_g, after_g = F.cosine_similarity(z, z_glob), F.cosine_similarity(moved, z_glob)
    before_p, after_p = F.cosine_similarity(z, z_prev), F.cosine_similarity(moved, z_prev)
    assert torch.all(after_g > before_g.detach())
    assert torch.all(after_p < before_p.detach())


@pytest.mark.parametrize("name", sorted(MODEL_CAPABILITIES))
def test_models_with_features_classify_their_representation(name: str) -> None:
    shape = (1, 28, 28) if name in {"mlp", "mnist-cnn"} else (3, 32, 32)
    torch.manual_seed(0)
    model = build_model(name, shape, 10)
    x = torch.randn(3, *shape)
    model.eval()
    with torch.no_grad():
        z = model.representation(x)  # type: ignore[operator]
        assert z.dim() == 2 and z.shape[0] == 3
        assert torch.equal(model.classify(z), model(x))  # type: ignore[operator]
    assert "features" in model_capabilities(name)


def test_models_without_the_capability_have_no_representation() -> None:
    assert set().union(*MODEL_CAPABILITIES.values()) <= BASE_MODEL_CAPABILITIES
    assert model_capabilities("linear") == frozenset()
    assert not hasattr(build_model("linear", (4,), 3), "representation")


def test_the_learner_keeps_z_with_the_same_outputs() -> None:
    """The kept forward is bit for bit the plain one (dropout draws included)."""
    model = FlatModel(build_model("mnist-cnn", (1, 28, 28), 10))
    cl = client(0, None)
    srv = server(model, [cl])
    x, y = torch.randn(4, 1, 28, 28), torch.tensor([0, 1, 2, 3])
    model.module.train()
    outputs = []
    for keep in (False, True):
        st = dataclasses.replace(step(model, cl, srv, x, y), keep_representation=keep)
        torch.manual_seed(3)
        plan_loss(FedAvg(), st)
        outputs.append(st.outputs)
        assert (st.representation is not None) == keep
    assert outputs[0] is not None and outputs[1] is not None
    assert torch.equal(outputs[0], outputs[1])


def _moon(**values: object) -> MOON:
    component = MOON(values)
    component.setup(dataclasses.replace(env(), model=MLP_FACTS))
    return component


def test_first_round_skips_then_contrasts_with_the_stored_local_model() -> None:
    torch.manual_seed(0)
    model = FlatModel(build_model("mlp", (4,), 3))
    cl = client(0, None)
    srv = server(model, [cl])
    moon = _moon(mu=2.0, tau=0.5)
    assert moon.wants_representation()
    x, y = torch.randn(5, 4, generator=torch.Generator().manual_seed(1)), torch.tensor([0] * 5)
    st = dataclasses.replace(step(model, cl, srv, x, y), keep_representation=True)
    plan_loss(FedAvg(), st)
    first = sequential_term(moon, model, cl, local_round(model, srv), st)
    assert first is not None and first.item() == 0.0  # no previous local model: weight 0
    with torch.no_grad():
        model.params.add_(0.1)  # local training
    previous = model.params.clone()
    moon.after_local(cl, Upload(0, model.params, model.buffers, 5), local_round(model, srv))
    assert torch.equal(cl.state_for("moon")["params"], previous)
    # next round: θ_g moved on; the client starts from it and contrasts
    srv.global_params = srv.global_params - 0.2
    model.load(srv.global_params, srv.global_buffers)
    local = local_round(model, srv)
    with torch.no_grad():
        model.params.mul_(1.5)  # the student moved; the frozen models must not
    st = dataclasses.replace(step(model, cl, srv, x, y), keep_representation=True)
    plan_loss(FedAvg(), st)
    term = sequential_term(moon, model, cl, local, st)
    module = model.module
    with torch.no_grad():
        z = module.representation(x)  # type: ignore[operator]
        model.load(srv.global_params, srv.global_buffers)
        z_glob = module.representation(x)  # type: ignore[operator]
        model.load(previous, srv.global_buffers)
        z_prev = module.representation(x)  # type: ignore[operator]
    expected = 2.0 * model_contrastive_loss(z, z_glob, z_prev, 0.5)
    assert term is not None and torch.isclose(term.detach(), expected)
    assert term.requires_grad


def test_mu_zero_costs_nothing() -> None:
    moon = _moon(mu=0.0)
    assert not moon.wants_representation()
    model = FlatModel(build_model("mlp", (4,), 3))
    cl = client(0, None)
    srv = server(model, [cl])
    moon.after_local(cl, Upload(0, model.params, model.buffers, 1), local_round(model, srv))
    assert inputs_for(moon, cl, local_round(model, srv)) is None  # no term, no forwards
    assert cl.state_for("moon") == {}  # no stored model
    assert MOON().resolved_options() == {"mu": 0.1, "tau": 0.5}  # FedNTD's config/moon.json


def test_moon_is_refused_on_a_model_without_features() -> None:
    strategy = build_strategy("moon")
    linear = ModelFacts("linear", model_capabilities("linear"), models_offering())
    with pytest.raises(
        UserError,
        match=r"'moon' needs the model's features, which model 'linear' does not provide; "
        r"use --model cifar-cnn or fedavg-cnn or mlp or mnist-cnn or resnet18 or resnet32 "
        r"or resnet8, "
        r"or drop 'moon'\.",
    ):
        strategy.setup(dataclasses.replace(env(), model=linear))
    unknown = r"which this run's model does not provide; use a model that has them"
    with pytest.raises(UserError, match=unknown):
        build_strategy("moon").setup(dataclasses.replace(env(), model=ModelFacts()))


def test_a_linear_model_run_is_refused_before_training(tmp_path: Path) -> None:
    values = {"strategy": "moon", "model": "linear", "tasks": 1, "out": str(tmp_path / "r")}
    with pytest.raises(UserError, match=r"'moon' needs the model's features"):
        execute(make_config(values))
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("option", ["moon:tau=0", "moon:mu=-1"])
def test_bad_options_are_refused(option: str) -> None:
    with pytest.raises(UserError, match=f"option {option.split('=')[0]} must be"):
        build_strategy(option)


def test_digits_run_contrasts_finishes_and_resumes_identically(tmp_path: Path) -> None:
    extra = {"model": "mlp", "participation": 0.5}
    whole = uninterrupted(tmp_path, "moon:mu=5", **extra)
    plain = uninterrupted(tmp_path / "plain", "fedavg", **extra)
    assert (whole / "records.csv").read_bytes() != (plain / "records.csv").read_bytes()
    assert_resumes_after_crash(tmp_path / "crashed", "moon:mu=5", whole, **extra)
