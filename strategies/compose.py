"""The composition grammar and its validation.

Syntax (documented in the README)::

    strategy  := component ("+" component)*
    component := name [":" option ("," option)*]
    option    := key "=" value

e.g. ``der:alpha=0.5+fedgp:gref_samples=all,gref_mode=eval``. Names, keys and choice values are
case-sensitive (``DER`` is refused, naming ``der``). A component outside the package is named
by its entry point's name, or by its import path (``my_methods.WeightedER:weight=2``: a name
holding a ``.``, which no built-in name does; see ``strategies.plugins``). Whitespace around
every token is ignored. A ``+`` is a sign, not a separator, where a number needs one: right
after ``=`` (``der:alpha=+0.5``) or in an exponent (``fedproj:distill_lr=1e+3``), followed
by a digit or ``.`` — component names (and import paths) never start with one, so this is
unambiguous, and canonical names such as ``fedprox:mu=1e+20`` parse back. Numbers are plain
decimals (see ``strategies.base.finite_float``). Without a learner the default ``fedavg``
learner is implied (``fedgp`` ≡ ``fedavg+fedgp``).

Validation refuses, each with one sentence naming the fix: empty pieces (``der+``, ``+der``,
``der++fedgp``, ``der:``, ``der:alpha=1,``), a second ``:`` or ``=``, unknown names and
options, options given twice, components given twice, two learners, two aggregators, and
components whose requirements the stream or the model does not meet — before any data is
loaded. Why empty pieces are refused rather than skipped: they are where something was meant
to be written (an unset shell variable in ``der:alpha=1,$MORE``), and a run that silently drops it
would be recorded as if the user had asked for the defaults.
"""

from __future__ import annotations

import contextlib
import difflib
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from cfl_bench.core.errors import UserError
from cfl_bench.core.text_values import split_options
from cfl_bench.strategies.base import (
    MODEL_CAPABILITIES,
    Classifier,
    Component,
    Declaration,
    Learner,
    Option,
    Role,
    StrategyEnv,
    quoted,
)
from cfl_bench.strategies.registry import Catalogue, catalogue, component_table
from cfl_bench.strategies.roles import Aggregator, GradientTransform, LossTerm, ServerHook

if TYPE_CHECKING:
    from cfl_bench.core.context import ClientState
    from cfl_bench.core.flat import FlatModel

# "+" separates components unless it is a number's sign: directly after "=" or after a digit
# and an exponent letter ("1e+3"), and directly before a digit or ".".
_SEPARATOR = re.compile(r"(?<!=)(?<![0-9][eE])\+|\+(?![0-9.])")
_COUNT_WORDS = {2: "two", 3: "three", 4: "four", 5: "five", 6: "six"}


def transform_chain() -> tuple[str, ...]:
    """The gradient-transform chain of a local step, by name, in order: every component
    that declares a ``transform_order`` (``Strategy.transforms`` sorts by it). A-GEM's
    projection is the learner's ``refine`` and runs before the chain; the components'
    declarations say why each sits where it does (SCAFFOLD, FedProj, FedGP)."""
    ordered = sorted(
        (row for row in component_table().values() if row.transform_order is not None),
        key=lambda row: row.transform_order or 0,
    )
    return tuple(row.name for row in ordered)


def server_hook_order() -> tuple[str, ...]:
    """The server hooks after aggregation, by name, in order; ``*`` stands for every
    component at the default place 0 (in written order, the learner first). From the
    components' declared ``server_hook_order`` (``Strategy.server_hooks`` sorts by it)."""
    placed = sorted(
        (row for row in component_table().values() if row.server_hook_order != 0),
        key=lambda row: row.server_hook_order,
    )
    before = tuple(row.name for row in placed if row.server_hook_order < 0)
    after = tuple(row.name for row in placed if row.server_hook_order > 0)
    return (*before, "*", *after)


#: Both orders as names, derived from the declarations (for listings, docs and tests):
#: ("scaffold", "fedproj", "fedgp") and ("scaffold", "ifa", "*", "fedgp").
TRANSFORM_CHAIN: tuple[str, ...] = transform_chain()
SERVER_HOOK_ORDER: tuple[str, ...] = server_hook_order()


@dataclass(frozen=True)
class ComponentSpec:
    name: str
    options: dict[str, object]
    # The declaration the name resolved to (a plugin's is bound to the name written).
    declaration: Declaration | None = field(default=None, compare=False, repr=False)

    @property
    def row(self) -> Declaration:
        if self.declaration is None:
            raise TypeError(f"component spec {self.name!r} was not resolved")
        return self.declaration


def parse_strategy(text: str, components: Catalogue | None = None) -> list[ComponentSpec]:
    """Parse the strategy string into component names and converted option values."""
    classes = components or catalogue()
    if not text or not text.strip():
        raise UserError(
            "the strategy is empty; give one like 'der+fedgp' (see `cfl-bench list strategies`)."
        )
    parts = [part.strip() for part in _SEPARATOR.split(text.strip())]
    if not any(parts):
        raise UserError(
            f"strategy {quoted(text)} names no component; give one like 'der+fedgp' "
            f"(see `cfl-bench list strategies`)."
        )
    specs: list[ComponentSpec] = []
    for index, part in enumerate(parts):
        if not part:
            raise UserError(_empty_component(text, index, len(parts)))
        specs.append(_parse_component(part, classes))
    return specs


def _empty_component(text: str, index: int, count: int) -> str:
    """Say where the empty component is: a leading, trailing or doubled ``+``."""
    if index == 0:
        return (
            f"strategy {quoted(text)} has an empty component before its first '+'; "
            f"remove the leading '+'."
        )
    if index == count - 1:
        return (
            f"strategy {quoted(text)} has an empty component after its last '+'; "
            f"remove the trailing '+' or add a component after it."
        )
    return (
        f"strategy {quoted(text)} has an empty component between two '+'; "
        f"write one '+' between components."
    )


def _parse_component(part: str, classes: Catalogue) -> ComponentSpec:
    """One ``name[:key=value,...]`` piece (already stripped, never empty)."""
    raw_name, colon, opt_text = part.partition(":")
    # Case-sensitive, never folded: "DER" accepted as "der" made a second run folder (and
    # another config hash) beside der's for the same method.
    name = raw_name.strip()
    if not name:
        raise UserError(
            f"component {quoted(part)} has no name before ':'; write the component first, "
            f"e.g. der:alpha=0.5."
        )
    row = classes.declaration(name)
    if row is None:
        raise UserError(_unknown_component(raw_name.strip(), bool(colon), classes.names()))
    if not colon:
        return ComponentSpec(name, {}, row)
    by_name = {o.name: o for o in row.option_list}
    raw_values = split_options(
        "component",
        name,
        opt_text,
        list(by_name),
        lambda key, has_value: _unknown_option(row, key, has_value, classes.builtin),
    )
    values = {key: by_name[key].convert(name, raw) for key, raw in raw_values.items()}
    return ComponentSpec(name, values, row)


def _unknown_component(raw_name: str, has_colon: bool, classes: list[str]) -> str:
    """The refusal for a name that is no component, with the likely slip when there is one."""
    choose = f"choose from: {', '.join(classes)}"
    if "=" in raw_name and not has_colon:  # der:alpha=1+beta=2 → the piece "beta=2"
        return (
            f"{quoted(raw_name)} is not a strategy component; options follow their component's "
            f"':' and are separated by ',' (e.g. derpp:alpha=0.1,beta=0.5), not '+'."
        )
    if "," in raw_name:  # der,fedgp
        return (
            f"{quoted(raw_name)} is not a strategy component; join components with '+' "
            f"(e.g. der+fedgp), or {choose}."
        )
    if raw_name.lower() in classes:
        return (
            f"unknown strategy component {quoted(raw_name)}; component names are lower-case: "
            f"write '{raw_name.lower()}'."
        )
    guess = difflib.get_close_matches(raw_name.lower(), list(classes), n=1)
    hint = f" (did you mean '{guess[0]}'?)" if guess else ""
    return f"unknown strategy component {quoted(raw_name)}; {choose}{hint}."


def _unknown_option(
    row: Declaration, key: str, has_value: bool, classes: dict[str, Declaration]
) -> str:
    """The refusal for a key the component lacks, pointing at its owner when it has one."""
    name = row.name
    if not has_value and key.lower() in classes:  # der:fedgp — a component, not an option
        return (
            f"'{key.lower()}' is a strategy component, not an option of '{name}'; join "
            f"components with '+', e.g. {name}+{key.lower()}."
        )
    known = ", ".join(o.name for o in row.option_list) or "none"
    message = f"unknown option {quoted(key)} for '{name}'; its options are: {known}"
    owners = [n for n, c in classes.items() if n != name and key in {o.name for o in c.option_list}]
    if owners:  # stated, not prescribed: adding the owner may itself be refused (two learners)
        message += f" ('{key}' is an option of {' and '.join(owners)})"
    return message + "."


@dataclass
class Strategy:
    """A validated composition: one learner plus ordered components."""

    learner: Learner
    components: list[Component]

    @property
    def all(self) -> list[Component]:
        return [self.learner, *self.components]

    @property
    def transforms(self) -> list[GradientTransform]:
        """Gradient transforms in their declared order (``Component.transform_order``)."""
        chain = [c for c in self.components if Role.GRAD_TRANSFORM in c.roles]
        ordered: list[Component] = sorted(chain, key=transform_position)
        return list[GradientTransform](ordered)

    @property
    def loss_terms(self) -> list[LossTerm]:
        """The components with a loss term, the learner first when it has one of its own
        (iCaRL's distillation)."""
        return [c for c in self.all if Role.LOSS_TERM in c.roles]

    def evaluation_classifier(self) -> Classifier | None:
        """The classifier that replaces the model's outputs at evaluation: the first
        component's that has one (None: the model's outputs are scored)."""
        for c in self.all:
            classifier = c.evaluation_classifier()
            if classifier is not None:
                return classifier
        return None

    @property
    def aggregator(self) -> Aggregator | None:
        """The aggregation override (at most one; validated at build time)."""
        overrides = [c for c in self.components if Role.AGGREGATOR in c.roles]
        return overrides[0] if overrides else None

    @property
    def server_hooks(self) -> list[ServerHook]:
        """Every component in its declared order (``Component.server_hook_order``; a
        stable sort, so equal places keep the written order, the learner first)."""
        ordered: list[Component] = sorted(self.all, key=lambda c: c.server_hook_order)
        return list[ServerHook](ordered)

    def protocol_changes(self) -> dict[str, object]:
        changes: dict[str, object] = {}
        for c in self.all:
            changes.update(c.protocol_changes())
        return changes

    def holdout_per_task(self, train_size: int) -> int:
        return max(c.holdout_per_task(train_size) for c in self.all)

    @property
    def needs_buffer(self) -> bool:
        return any(c.needs_buffer for c in self.all)

    def own_model(
        self, client: ClientState, task: int, model: FlatModel
    ) -> contextlib.AbstractContextManager[bool]:
        """The client's own model for ``task`` from the first component scored by its
        clients' models (``Component.own_model``); a context entered with False if none."""
        for c in self.all:
            if c.scored_by_clients:
                return c.own_model(client, task, model)
        return contextlib.nullcontext(False)

    @property
    def scored_by_clients(self) -> str:
        """Why the global model is not what this strategy is scored by (its components'
        ``scored_by_clients``, '; '-joined); empty when it is."""
        return "; ".join(c.scored_by_clients for c in self.all if c.scored_by_clients)

    @property
    def name(self) -> str:
        """Canonical name: components in written order, non-default options spelled out."""
        return "+".join(
            written(c.name, c.options, {k: getattr(c.opts, k) for k in c.explicit})
            for c in self.all
        )

    def setup(self, env: StrategyEnv) -> None:
        for c in self.all:
            refusal = requirement_refusal(c, env)
            if refusal is not None:
                raise UserError(refusal)
            c.objective = env.objective
            c.setup(env)

    def describe(self) -> dict[str, object]:
        return {
            "name": self.name,
            "components": [
                {
                    "name": c.name,
                    "roles": c.role_names(),
                    "options": c.resolved_options(),
                }
                for c in self.all
            ],
        }


def transform_position(component: Component) -> int:
    """A gradient transform's place in the chain; one without a declared place is a
    programming error the registry test catches, refused here in one line."""
    if component.transform_order is None:
        raise TypeError(f"gradient transform {component.name!r} declares no transform_order")
    return component.transform_order


def capabilities(env: StrategyEnv) -> frozenset[str]:
    """What a run offers components: its objective's capabilities (class logits for every
    classification stream) and its model's (``features`` for models with a representation)."""
    return env.objective.capabilities | env.model.capabilities


def requirement_refusal(component: Component, env: StrategyEnv) -> str | None:
    """The sentence refusing ``component`` when the model or the stream lacks something it
    requires, naming what would provide it; None when nothing is missing."""
    missing = component.requires - capabilities(env)
    for need in sorted(missing & MODEL_CAPABILITIES):  # another --model fixes these
        model = f"model '{env.model.name}'" if env.model.name else "this run's model"
        models = env.model.models_offering(need)
        fix = f"use --model {' or '.join(models)}" if models else "use a model that has them"
        return (
            f"'{component.name}' needs the model's {need}, which {model} does not provide; "
            f"{fix}, or drop '{component.name}'."
        )
    if missing:
        return (
            f"'{component.name}' needs {', '.join(sorted(missing))}, which stream "
            f"'{env.stream_name}' does not provide; pick another stream or drop it."
        )
    return None


def written(name: str, options: tuple[Option, ...], explicit: dict[str, object]) -> str:
    """A component as the canonical strategy name writes it: the options the user wrote,
    sorted, each as its option shows it."""
    shows = {o.name: o.show for o in options}
    opts = ",".join(f"{k}={shows[k](explicit[k])}" for k in sorted(explicit))
    return f"{name}:{opts}" if opts else name


@dataclass(frozen=True)
class StrategySpec:
    """A validated composition before any component is built: what the grammar and the
    stream-independent checks know, from the declaration table alone (no torch)."""

    learner: ComponentSpec
    components: tuple[ComponentSpec, ...]

    @property
    def all(self) -> tuple[ComponentSpec, ...]:
        return (self.learner, *self.components)

    @property
    def name(self) -> str:
        """The canonical name ``Strategy.name`` gives the built strategy before set-up."""
        return "+".join(written(s.name, s.row.option_list, s.options) for s in self.all)


def validate_strategy(text: str, components: Catalogue | None = None) -> StrategySpec:
    """Parse and validate a composition (stream-independent checks) without building it:
    what ``cfl-bench run`` refuses at once and a sweep names its points by."""
    specs = parse_strategy(text, components)
    seen: set[str] = set()
    for spec in specs:
        if spec.name in seen:
            raise UserError(f"'{spec.name}' appears twice in strategy {quoted(text)}; use it once.")
        seen.add(spec.name)
    check_payload_names(text, specs)
    learners = [s for s in specs if s.row.is_learner]
    if len(learners) > 1:
        count = _COUNT_WORDS.get(len(learners), str(len(learners)))
        names = ", ".join(s.name for s in learners[:-1]) + f" and {learners[-1].name}"
        raise UserError(
            f"strategy {quoted(text)} has {count} local learners ({names}); keep exactly one "
            f"learner and add components such as fedgp."
        )
    learner = learners[0] if learners else ComponentSpec("fedavg", {}, component_table()["fedavg"])
    others = tuple(s for s in specs if s is not learner)
    aggregators = [s.name for s in others if Role.AGGREGATOR in s.row.roles]
    if len(aggregators) > 1:
        raise UserError(
            f"strategy {quoted(text)} overrides aggregation twice ({' and '.join(aggregators)}); "
            f"keep at most one aggregator."
        )
    return StrategySpec(learner, others)


def check_payload_names(text: str, specs: list[ComponentSpec]) -> None:
    """Refuse two components declaring one payload (a plugin subclassing a built-in one,
    composed with it): their tensors would overwrite each other in the broadcast or upload."""
    owners: dict[str, str] = {}
    for spec in specs:
        for payload in spec.row.payloads:
            first = owners.setdefault(payload.name, spec.name)
            if first != spec.name:
                raise UserError(
                    f"'{first}' and '{spec.name}' in strategy {quoted(text)} both send payload "
                    f"'{payload.name}'; keep one of them."
                )


def build_strategy(text: str) -> Strategy:
    """Parse, validate and build a composition: each component's class from its
    declaration (this imports the component modules, and so torch)."""
    components = catalogue()
    spec = validate_strategy(text, components)
    learner = components.component_class(spec.learner.row)(spec.learner.options)
    if not isinstance(learner, Learner):  # the table guarantees this; keep mypy honest
        raise TypeError(f"{spec.learner.name} is not a learner")
    others = [components.component_class(s.row)(s.options) for s in spec.components]
    return Strategy(learner, others)
