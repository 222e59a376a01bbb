"""The composition grammar and its validation.

Syntax (documented in the README)::

    strategy  := component ("+" component)*
    component := name [":" key "=" value ("," key "=" value)*]

e.g. ``der:alpha=0.5+fedgp:gref_samples=all,gref_mode=eval``. Without a learner the
default ``fedavg`` learner is implied (``fedgp`` ≡ ``fedavg+fedgp``). Validation refuses
unknown names and options, duplicates, two learners, and components whose requirements the
stream does not meet — before any data is loaded.
"""

from __future__ import annotations

from dataclasses import dataclass

from cfl_bench.errors import UserError
from strategies.base import Component, Learner, Role, StrategyEnv
from strategies.registry import component_classes


@dataclass(frozen=True)
class ComponentSpec:
    name: str
    options: dict[str, object]


def parse_strategy(text: str) -> list[ComponentSpec]:
    """Parse the strategy string into component names and converted option values."""
    classes = component_classes()
    if not text or not text.strip():
        raise UserError(
            "the strategy is empty; give one like 'der+fedgp' (see `cfl-bench list strategies`)."
        )
    specs: list[ComponentSpec] = []
    for part in text.strip().split("+"):
        part = part.strip()
        name, _, opt_text = part.partition(":")
        name = name.strip().lower()
        if not name:
            raise UserError(f"strategy '{text}' has an empty component; write names joined by '+'.")
        cls = classes.get(name)
        if cls is None:
            raise UserError(
                f"unknown strategy component '{name}'; choose from: {', '.join(sorted(classes))}."
            )
        by_name = {o.name: o for o in cls.options}
        values: dict[str, object] = {}
        for item in filter(None, (s.strip() for s in opt_text.split(","))):
            key, eq, raw = item.partition("=")
            key = key.strip()
            if not eq:
                raise UserError(
                    f"option '{item}' of '{name}' needs a value; write {name}:{key}=VALUE."
                )
            option = by_name.get(key)
            if option is None:
                known = ", ".join(sorted(by_name)) or "none"
                raise UserError(f"unknown option '{key}' for '{name}'; its options are: {known}.")
            values[key] = option.convert(name, raw.strip())
        specs.append(ComponentSpec(name, values))
    return specs


@dataclass
class Strategy:
    """A validated composition: one learner plus ordered components."""

    learner: Learner
    components: list[Component]

    @property
    def all(self) -> list[Component]:
        return [self.learner, *self.components]

    @property
    def transforms(self) -> list[Component]:
        """Gradient transforms in the fixed documented order (agem → fedproj → fedgp)."""
        chain = [c for c in self.components if Role.GRAD_TRANSFORM in c.roles]
        return sorted(chain, key=lambda c: c.transform_order)

    @property
    def loss_terms(self) -> list[Component]:
        return [c for c in self.components if Role.LOSS_TERM in c.roles]

    @property
    def aggregator(self) -> Component | None:
        """The aggregation override (at most one; validated at build time)."""
        overrides = [c for c in self.components if Role.AGGREGATOR in c.roles]
        return overrides[0] if overrides else None

    @property
    def server_hooks(self) -> list[Component]:
        """Every component in ascending ``server_order`` (stable for equal orders)."""
        return sorted(self.all, key=lambda c: c.server_order)

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

    @property
    def name(self) -> str:
        """Canonical name: components in written order, non-default options spelled out."""
        parts = []
        for c in self.all:
            opts = ",".join(f"{k}={c.values[k]}" for k in sorted(c.explicit))
            parts.append(f"{c.name}:{opts}" if opts else c.name)
        return "+".join(parts)

    def setup(self, env: StrategyEnv) -> None:
        for c in self.all:
            missing = c.requires - capabilities(env)
            if missing:
                raise UserError(
                    f"'{c.name}' needs {', '.join(sorted(missing))}, which stream "
                    f"'{env.stream_name}' does not provide; pick another stream or drop it."
                )
            c.setup(env)

    def describe(self) -> dict[str, object]:
        return {
            "name": self.name,
            "components": [
                {
                    "name": c.name,
                    "roles": sorted(r.value for r in c.roles),
                    "options": c.resolved_options(),
                }
                for c in self.all
            ],
        }


def capabilities(env: StrategyEnv) -> frozenset[str]:
    """What a stream offers components: class logits for every classification scenario."""
    caps = {"class_logits"} if env.scenario in ("class-il", "domain-il", "task-il") else set()
    return frozenset(caps)


def build_strategy(text: str) -> Strategy:
    """Parse and validate a composition (stream-independent checks)."""
    specs = parse_strategy(text)
    classes = component_classes()
    seen: set[str] = set()
    for spec in specs:
        if spec.name in seen:
            raise UserError(f"'{spec.name}' appears twice in strategy '{text}'; use it once.")
        seen.add(spec.name)
    learners = [s for s in specs if issubclass(classes[s.name], Learner)]
    if len(learners) > 1:
        names = " and ".join(s.name for s in learners)
        raise UserError(
            f"strategy '{text}' has two local learners ({names}); keep exactly one learner "
            f"and add components such as fedgp."
        )
    learner_spec = learners[0] if learners else ComponentSpec("fedavg", {})
    learner = classes[learner_spec.name](learner_spec.options)
    if not isinstance(learner, Learner):  # the registry guarantees this; keep mypy honest
        raise TypeError(f"{learner_spec.name} is not a learner")
    others = [classes[s.name](s.options) for s in specs if s is not learner_spec]
    aggregators = [c.name for c in others if Role.AGGREGATOR in c.roles]
    if len(aggregators) > 1:
        raise UserError(
            f"strategy '{text}' overrides aggregation twice ({' and '.join(aggregators)}); "
            f"keep at most one aggregator."
        )
    return Strategy(learner, others)
