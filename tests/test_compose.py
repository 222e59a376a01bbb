"""The composition grammar: parsing, options, canonical names and every refusal."""

from __future__ import annotations

import pytest

from cfl_bench.core.errors import UserError
from cfl_bench.strategies.base import Role
from cfl_bench.strategies.compose import build_strategy, parse_strategy


def test_parses_components_and_typed_options() -> None:
    specs = parse_strategy("der:alpha=0.5+fedgp:gref_samples=all,gref_mode=eval,gref_interval=3")
    assert [s.name for s in specs] == ["der", "fedgp"]
    assert specs[0].options == {"alpha": 0.5}
    assert specs[1].options == {"gref_samples": "all", "gref_mode": "eval", "gref_interval": 3}


@pytest.mark.parametrize(
    "text",
    [
        "der+fedgp",
        "agem+fedgp",
        "fedavg+fedgp",
        "ideal",
        "fedgp",
        "derpp+fedprox+fedcurv+fedntd+fedproj+fedgp+ifa",
        "er+ifa:mode=random",
    ],
)
def test_valid_compositions(text: str) -> None:
    strategy = build_strategy(text)
    assert isinstance(strategy.learner.name, str)
    assert strategy.needs_buffer == (text != "ideal")
    assert len(strategy.all) == len(text.split("+")) + (text == "fedgp")


def test_implied_fedavg_learner_and_canonical_name() -> None:
    strategy = build_strategy("fedgp:gref_samples=64")
    assert strategy.learner.name == "fedavg"
    assert strategy.name == "fedavg+fedgp:gref_samples=64"
    assert build_strategy("der+fedgp").name == "der+fedgp"


def test_transform_chain_order_is_fixed() -> None:
    strategy = build_strategy("fedgp+agem")
    assert strategy.learner.name == "agem"
    assert [c.name for c in strategy.transforms] == ["fedgp"]
    assert Role.GRAD_TRANSFORM in strategy.transforms[0].roles
    written = build_strategy("fedgp+ifa+fedproj+fedcurv+der")
    assert [c.name for c in written.transforms] == ["fedproj", "fedgp"]
    assert written.aggregator is not None and written.aggregator.name == "fedproj"
    # server hooks: IFA resets before FedGP takes g_ref at the final θ_g
    hooks = [c.name for c in written.server_hooks]
    assert hooks.index("ifa") < hooks.index("fedgp") == len(hooks) - 1
    assert [c.name for c in written.loss_terms] == ["fedcurv"]


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("fedgp+fedgp", "appears twice"),
        ("der+agem", "two local learners"),
        ("nosuch", "unknown strategy component 'nosuch'"),
        ("der:beta=1", "unknown option 'beta' for 'der'"),
        ("der:alpha", "needs a value"),
        ("der:alpha=-1", "option der:alpha must be a finite number ≥ 0"),
        ("fedgp:gref_mode=test", "must be one of train, eval"),
        ("fedgp:gref_samples=0", "must be a positive integer or 'all'"),
        ("fedgp:equal_comm=maybe", "true or false"),
        ("der++fedgp", "empty component"),
        ("er+derpp", "two local learners"),
        ("fedntd+fedntd", "appears twice"),
        ("ifa:rho=0", "fraction in"),
        ("ifa:generation=0", "must be a positive integer, 'task' or 'auto'"),
        ("fedcurv:samples=0", "must be a positive integer"),
        ("fedproj:distill_lr=0", "must be a finite number > 0"),
        ("", "empty"),
    ],
)
def test_refusals_are_user_errors(text: str, fragment: str) -> None:
    with pytest.raises(UserError, match=fragment):
        build_strategy(text)


def test_quiet_default_options_stay_out_of_the_recorded_config() -> None:
    """An option added after runs were recorded keeps their config (and protocol hash)
    unchanged while it is left at its default, and is recorded once it is written."""
    from dataclasses import dataclass
    from typing import ClassVar

    from cfl_bench.strategies.base import Component, option, positive_int

    @dataclass(frozen=True)
    class ProbeOptions:
        old: int = option(1, "recorded since the first runs", positive_int)
        new: int = option(2, "added later", positive_int, quiet_default=True)

    class Probe(Component):
        name: ClassVar[str] = "probe"
        Options = ProbeOptions

    assert Probe().resolved_options() == {"old": 1}
    assert Probe({"new": 2}).resolved_options() == {"old": 1, "new": 2}
    assert Probe({"new": 3}).resolved_options() == {"old": 1, "new": 3}


@pytest.mark.parametrize("text", ["DER", "der+FedGP", "Scaffold", "fedavg+FEDPROX:mu=0.1"])
def test_component_names_are_case_sensitive(text: str) -> None:
    """Issue 41: "DER" was folded to "der" for the method but not for the run's folder and
    hash, so one method got two run folders. Names are lower-case, never folded."""
    with pytest.raises(UserError, match="component names are lower-case: write '"):
        parse_strategy(text)
