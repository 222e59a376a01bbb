"""The stream's task objective: the loss, metric and buffer outputs everything else uses."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch.nn import functional as F

from cfl_bench.core.errors import UserError
from cfl_bench.core.objective import Classification
from cfl_bench.strategies.compose import build_strategy
from tests.helpers import digits_federation, env


def test_classification_loss_is_cross_entropy_and_metrics_follow_the_scenario() -> None:
    logits = torch.tensor([[2.0, 0.0, 1.0, 0.0], [0.0, 0.5, 0.0, 3.0]])
    y = torch.tensor([2, 1])
    domain, classes = Classification(), Classification(task_il=True)
    assert torch.equal(domain.loss(logits, y), F.cross_entropy(logits, y))
    assert domain.metrics == ("acc",) and classes.metrics == ("acc", "acc_task_il")
    # argmax is class 0 and 3: both wrong; masked to classes (1, 2) both are right
    scores = classes.score(logits, y, (1, 2))
    assert float(scores["acc"]) == 0.0 and float(scores["acc_task_il"]) == 100.0
    assert list(domain.score(logits, y, (1, 2))) == ["acc"]
    assert torch.allclose(domain.log_probs(logits).exp().sum(dim=1), torch.ones(2))
    assert domain.buffer_outputs(logits) is logits


def test_streams_provide_their_objective() -> None:
    fed = digits_federation("fedavg")
    assert fed.stream.objective == Classification(task_il=False)
    assert fed.measure.objective == fed.stream.objective


@dataclasses.dataclass(frozen=True)
class BoxesStandIn(Classification):
    """A stand-in for a detection objective: everything but class logits."""

    capabilities: frozenset[str] = frozenset({"boxes"})


@pytest.mark.parametrize("name", ["fedntd", "fedproj"])
def test_class_logit_components_are_refused_for_other_objectives(name: str) -> None:
    detection = dataclasses.replace(env(), objective=BoxesStandIn())
    with pytest.raises(UserError, match=f"'{name}' needs class_logits"):
        build_strategy(name).setup(detection)
    build_strategy("der+fedgp").setup(detection)  # objective-agnostic components are fine


def test_components_take_their_loss_from_the_objective() -> None:
    calls: list[int] = []

    @dataclasses.dataclass(frozen=True)
    class Counting(Classification):
        def loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
            calls.append(int(targets.shape[0]))
            return super().loss(outputs, targets)

    strategy = build_strategy("er")
    strategy.setup(dataclasses.replace(env(), objective=Counting()))
    assert all(isinstance(c.objective, Counting) for c in strategy.all)  # set by setup
    fed = digits_federation("er")  # sets the digits stream's objective up; count it instead
    fed.strategy.learner.objective = Counting()
    fed.run()
    assert len(calls) > 0  # the learner's base loss and its replay loss went through it


def test_every_metric_an_objective_records_is_registered() -> None:
    """A metric the engine records must be in the registry, or no table would show it."""
    from cfl_bench.core.metric_registry import recorded

    for objective in (Classification(), Classification(task_il=True)):
        for name in objective.metrics:
            assert recorded(name) is not None, name
