"""The typed component contract: options as frozen dataclasses, role protocols, and the
torch-free declaration table (issue 40).

Why these tests: the option values a run records (config.json, the protocol hash) must be
exactly the parsed ones, so the refusals, the types and the recorded values are pinned; the
declaration table is what keeps `cfl-bench` start-up free of torch while the component
modules import it at their top; and a component's declared roles must match what it
implements, since the engine dispatches on the declaration alone.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from cfl_bench.core.errors import UserError
from cfl_bench.strategies import declarations, roles
from cfl_bench.strategies.base import Component, Learner, Role, option, options_of, positive_int
from cfl_bench.strategies.compose import build_strategy, validate_strategy
from cfl_bench.strategies.declarations import FedGPOptions, IFAOptions
from cfl_bench.strategies.registry import component_class, component_classes, component_table
from tests.helpers import env

ROOT = Path(__file__).resolve().parent.parent

# The one-line refusals as they were with the untyped options (taken from the code before
# the change): the grammar and the messages are the user's interface, unchanged.
REFUSALS = [
    ("fedprox:mu=-1", "option fedprox:mu must be a finite number ≥ 0, got '-1'."),
    ("der:alpha=inf", "option der:alpha must be a finite number ≥ 0, got 'inf'."),
    (
        "fedgp:gref_samples=0",
        "option fedgp:gref_samples must be a positive integer or 'all', got '0'.",
    ),
    ("fedgp:gref_mode=test", "option fedgp:gref_mode must be one of train, eval, got 'test'."),
    (
        "ifa:generation=epoch",
        "option ifa:generation must be a positive integer, 'task' or 'auto', got 'epoch'.",
    ),
    ("fedopt:beta1=1", "option fedopt:beta1 must be a number in [0, 1), got '1'."),
    ("fedgp:equal_comm=maybe", "option fedgp:equal_comm must be true or false, got 'maybe'."),
    (
        "fedproj:public=imagenet",
        "option fedproj:public must be one of auto, fashion-mnist, holdout, cifar100, "
        "got 'imagenet'.",
    ),
    ("scaffold:variate=III", "option scaffold:variate must be one of II, I, got 'III'."),
    ("fedcurv:samples=2.5", "option fedcurv:samples must be a positive integer, got '2.5'."),
    ("fedprox:nu=1", "unknown option 'nu' for 'fedprox'; its options are: mu."),
    ("fedavg:mu=1", "component 'fedavg' takes no options; drop ':mu=1' after it."),
]


@pytest.mark.parametrize(("text", "message"), REFUSALS)
def test_bad_values_are_refused_with_the_same_one_line_message(text: str, message: str) -> None:
    for check in (validate_strategy, build_strategy):  # the torch-free check and the build
        with pytest.raises(UserError) as caught:
            check(text)
        assert str(caught.value) == message


def test_parsed_options_are_typed_values_of_the_components_dataclass() -> None:
    strategy = build_strategy("der:alpha=0.5+fedgp:gref_samples=8,gref_mode=eval+ifa")
    fedgp, ifa = strategy.components
    assert isinstance(fedgp.opts, FedGPOptions)
    assert fedgp.opts == FedGPOptions(gref_samples=8, gref_mode="eval")
    assert type(fedgp.opts.gref_samples) is int and type(fedgp.opts.gref_interval) is int
    assert type(strategy.learner.opts.alpha) is float
    assert isinstance(ifa.opts, IFAOptions)
    # The default keeps its written form: 'task' is recorded, not the parser's None.
    assert ifa.resolved_options()["generation"] == "task"
    assert build_strategy("ifa:generation=task").components[0].opts.generation is None
    assert build_strategy("fedgp:gref_samples=ALL").components[0].opts.gref_samples == "all"


def test_an_options_object_is_frozen() -> None:
    fedgp = build_strategy("fedgp").components[0]
    with pytest.raises(dataclasses.FrozenInstanceError):
        fedgp.opts.gref_samples = 4  # type: ignore[misc]


def test_auto_defaults_resolve_into_a_new_options_object_the_config_records() -> None:
    """``der:alpha`` (auto) is resolved at set-up by replacing the frozen object, and the
    run's config records the resolved value, as it did with the untyped dict."""
    der = build_strategy("der").learner
    before = der.opts
    assert der.resolved_options() == {"alpha": None}
    der.setup(env("rot-digits"))
    assert der.resolved_options() == {"alpha": 1.0} and before.alpha is None
    assert build_strategy("der:alpha=auto").name == "der:alpha=auto"


def test_every_option_is_declared_with_its_metadata() -> None:
    @dataclasses.dataclass(frozen=True)
    class Undeclared:
        k: int = 1

    with pytest.raises(TypeError, match=r"Undeclared\.k is not declared with option"):
        options_of(Undeclared)

    @dataclasses.dataclass(frozen=True)
    class Declared:
        k: int = option(2, "help", positive_int, quiet_default=True)

    (k,) = options_of(Declared)
    assert (k.name, k.default, k.help, k.quiet_default, k.convert("c", "3")) == (
        "k",
        2,
        "help",
        True,
        3,
    )


def test_the_declaration_table_imports_without_torch() -> None:
    """The grammar, the canonical name and the listing read only the table."""
    code = (
        "import sys\n"
        "from strategies.compose import validate_strategy, TRANSFORM_CHAIN\n"
        "from strategies.registry import describe_components\n"
        "assert validate_strategy('der:alpha=0.5+fedgp:gref_samples=all').name == "
        "'der:alpha=0.5+fedgp:gref_samples=all'\n"
        "assert len(describe_components()) > 20 and TRANSFORM_CHAIN\n"
        "print('torch' in sys.modules)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True
    )
    assert result.stdout.strip() == "False"


@pytest.mark.parametrize("name", sorted(component_table()))
def test_a_class_takes_its_declaration(name: str) -> None:
    row = component_table()[name]
    cls = component_class(row)
    assert cls.declaration is row
    assert (cls.name, cls.roles, cls.Options, cls.payloads) == (
        row.name,
        row.roles,
        row.options,
        row.payloads,
    )
    assert [o.name for o in cls.options] == [f.name for f in dataclasses.fields(row.options)]
    assert issubclass(cls, Learner) == row.is_learner
    assert cls.role_names() == row.role_names()


def overrides(cls: type[Component], *hooks: str) -> bool:
    """Whether ``cls`` implements any of ``hooks`` itself (not the base's do-nothing one).
    Here only, to check declarations against implementations; nothing dispatches on it."""
    base = Learner if issubclass(cls, Learner) else Component
    return any(getattr(cls, hook) is not getattr(base, hook) for hook in hooks)


ROLE_HOOKS: list[tuple[Role | str, type, tuple[str, ...]]] = [
    (Role.LOSS_TERM, roles.LossTerm, ("loss_term", "penalty")),
    (Role.GRAD_TRANSFORM, roles.GradientTransform, ("transform",)),
    (Role.AGGREGATOR, roles.Aggregator, ("aggregate", "after_aggregate")),
    ("server schedule", roles.ServerHook, ("on_round_start", "client_request")),
    (
        "communication",
        roles.PayloadProducer,
        ("broadcast", "after_local", "receive_upload", "answer_request"),
    ),
]


@pytest.mark.parametrize(("role", "protocol", "hooks"), ROLE_HOOKS)
def test_each_declared_role_is_implemented(role: Role | str, protocol: type, hooks: tuple) -> None:
    """Each component of a role satisfies the role's protocol and implements a hook its role
    is about; a server schedule is declared exactly by the components that have one."""
    label = role.value if isinstance(role, Role) else role
    members = {n: cls for n, cls in component_classes().items() if label in cls.role_names()}
    assert members, f"no component has role {label}"
    for name, cls in members.items():
        assert isinstance(cls(), protocol), name
        assert overrides(cls, *hooks), f"{name} declares {label} but implements none of {hooks}"
    if role == "server schedule":
        scheduled = {n for n, c in component_classes().items() if overrides(c, *hooks)}
        assert scheduled == set(members)


def test_the_strategy_lists_hold_their_roles() -> None:
    strategy = build_strategy("der+scaffold+fedprox+fedproj+fedgp")
    assert [c.name for c in strategy.transforms] == ["scaffold", "fedproj", "fedgp"]
    assert all(isinstance(c, roles.GradientTransform) for c in strategy.transforms)
    assert [c.name for c in strategy.loss_terms] == ["fedprox"]
    assert isinstance(strategy.aggregator, roles.Aggregator)
    assert strategy.aggregator.name == "fedproj"
    assert all(isinstance(c, roles.ServerHook) for c in strategy.server_hooks)


def test_the_table_lists_every_component_module_once() -> None:
    targets = [row.target for row in declarations.TABLE]
    assert len(set(targets)) == len(targets) == len(component_table())
