"""Name → component class, and the listing shown by ``cfl-bench list strategies``."""

from __future__ import annotations

from strategies.agem import AGEM
from strategies.base import Component
from strategies.der import DER
from strategies.fedavg import FedAvg
from strategies.fedgp import FedGP
from strategies.ideal import Ideal


def component_classes() -> dict[str, type[Component]]:
    """All known components by name (built on call: no module-level mutable registry)."""
    classes: list[type[Component]] = [FedAvg, DER, AGEM, Ideal, FedGP]
    return {cls.name: cls for cls in classes}


def describe_components() -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for name, cls in component_classes().items():
        rows.append(
            {
                "name": name,
                "roles": sorted(role.value for role in cls.roles),
                "summary": cls.summary,
                "paper": cls.paper,
                "options": [
                    {
                        "name": o.name,
                        "default": o.default,
                        "help": o.help,
                        "choices": list(o.choices),
                    }
                    for o in cls.options
                ],
            }
        )
    return rows
