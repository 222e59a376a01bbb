"""Composition on static streams: the continual-learning components and the FL baselines
compose there as anywhere (``der+fedgp`` asks "does it help in plain non-IID FL?"), and
nonsense is refused before training with its reason."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from cfl_bench.core.errors import UserError
from cfl_bench.runner.config import RunConfig
from cfl_bench.runner.run import plan_run

ALLOWED = [
    "der+fedgp",
    "fedavg+fedntd",
    "fedavg+fedprox+ifa:generation=2",
    "fedavg+moon+ifa:generation=2",
    "der+fedgp+ifa:generation=2",
    "fedavg+feddyn+fedntd",
    "fedavg+fedproj",
    "fedavg+scaffold+ifa:generation=2",
    "fedavg+scaffold+fedgp",
    "fedavg+fednova",
    "der+fedavgm",
    "fedavg+fedopt:server_opt=yogi",
    "fedavg+feddf",
]

REFUSED = {
    # one task's generation (or one as long as the run): IFA would never reset
    "fedavg+ifa": "ifa:generation=task never resets in a 5-round run",
    "fedavg+ifa:generation=5": "ifa:generation=5 never resets in a 5-round run",
    "feddyn+fedproj": "overrides aggregation twice",
    "der+er": "two local learners",
    "fedavg+fedavg": "appears twice",
    "fedavg+fednova+feddyn": "overrides aggregation twice",
}


def static_config(shared_data: Path, tmp_path: Path, strategy: str, **changes: object) -> RunConfig:
    return dataclasses.replace(
        RunConfig(
            stream="mnist",
            strategy=strategy,
            model="mlp",
            clients=10,
            participation=0.5,
            rounds_per_task=5,
            train_size=2000,
            test_size=200,
            data_root=str(shared_data),
            threads=1,
            out=str(tmp_path / "run"),
        ),
        **changes,
    )


@pytest.mark.parametrize("strategy", ALLOWED)
def test_compositions_plan_on_a_static_stream(
    strategy: str, shared_data: Path, tmp_path: Path
) -> None:
    plan = plan_run(static_config(shared_data, tmp_path, strategy))
    assert plan.stream.scenario == "static"
    assert plan.strategy.name == strategy


@pytest.mark.parametrize(("strategy", "reason"), sorted(REFUSED.items()))
def test_nonsense_is_refused_with_its_reason(
    strategy: str, reason: str, shared_data: Path, tmp_path: Path
) -> None:
    with pytest.raises(UserError, match=reason):
        plan_run(static_config(shared_data, tmp_path, strategy))
    assert not (tmp_path / "run").exists()


def test_moon_is_refused_for_a_model_without_features(shared_data: Path, tmp_path: Path) -> None:
    """``features`` is a model capability: a model outside the table is refused by name."""
    from cfl_bench.strategies.base import ModelFacts, StrategyEnv
    from cfl_bench.strategies.compose import build_strategy, requirement_refusal

    moon = build_strategy("moon").components[0]
    env = StrategyEnv("mnist", "static", 10, 1, None, 0, 32, (1, 28, 28), None)  # type: ignore[arg-type]
    env = dataclasses.replace(env, model=ModelFacts("centernet", frozenset(), ()))
    refusal = requirement_refusal(moon, env)
    assert refusal is not None and "does not provide" in refusal
