"""What a method written outside cfl-bench imports: the component classes, the declaration
of its name, roles and options, the option parsers and the replay plan of a learner.

One module, so a plugin's imports do not depend on where the suite keeps each piece; every
name here is the one the built-in components use (docs/plugins.md). Torch-free, like the
declaration table: a plugin's own module imports torch where its hooks need it.

A learner in a few lines (docs/tutorial.md)::

    from dataclasses import dataclass
    from cfl_bench.plugin import Declaration, Learner, ReplayPlan, ReplayTerm, Role
    from cfl_bench.plugin import option, positive_float

    @dataclass(frozen=True)
    class Options:
        weight: float = option(1.0, "weight of the replay term", positive_float)

    class WeightedER(Learner):
        declaration = Declaration(
            name="weighted_er", roles=frozenset({Role.LEARNER}), options=Options
        )
        needs_buffer = True
        opts: Options

        def replay_plan(self) -> ReplayPlan:
            return ReplayPlan(1, (ReplayTerm(0, "ce", self.opts.weight),))
"""

from __future__ import annotations

from cfl_bench.core.payloads import ClientRequest, Payload
from cfl_bench.strategies.base import (
    ClientInputs,
    Component,
    Declaration,
    ExtraWork,
    FrozenForward,
    Learner,
    NoOptions,
    Role,
    StepView,
    StrategyEnv,
    boolean,
    finite_float,
    non_negative_float,
    non_negative_int,
    option,
    positive_float,
    positive_int,
    text,
    unit_fraction,
)
from cfl_bench.strategies.plugins import ENTRY_POINT_GROUP
from cfl_bench.strategies.replay import ReplayPlan, ReplayTerm

__all__ = [
    "ENTRY_POINT_GROUP",
    "ClientInputs",
    "ClientRequest",
    "Component",
    "Declaration",
    "ExtraWork",
    "FrozenForward",
    "Learner",
    "NoOptions",
    "Payload",
    "ReplayPlan",
    "ReplayTerm",
    "Role",
    "StepView",
    "StrategyEnv",
    "boolean",
    "finite_float",
    "non_negative_float",
    "non_negative_int",
    "option",
    "positive_float",
    "positive_int",
    "text",
    "unit_fraction",
]
