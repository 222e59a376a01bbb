"""Name → component class, and the listing shown by ``cfl-bench list strategies``."""

from __future__ import annotations

from strategies.agem import AGEM
from strategies.base import Component
from strategies.der import DER
from strategies.derpp import DERPP
from strategies.er import ER
from strategies.ewc import OnlineEWC
from strategies.fedavg import FedAvg
from strategies.fedcurv import FedCurv
from strategies.feddf import FedDF
from strategies.feddyn import FedDyn
from strategies.fedgp import FedGP
from strategies.fednova import FedNova
from strategies.fedntd import FedNTD
from strategies.fedopt import FedAvgM, FedOpt
from strategies.fedproj import FedProj
from strategies.fedprox import FedProx
from strategies.ideal import Ideal
from strategies.ifa import IFA
from strategies.lwf import LwF
from strategies.moon import MOON
from strategies.scaffold import Scaffold


def component_classes() -> dict[str, type[Component]]:
    """All known components by name (built on call: no module-level mutable registry)."""
    classes: list[type[Component]] = [
        # local learners
        FedAvg,
        ER,
        DER,
        DERPP,
        AGEM,
        Ideal,
        # loss terms
        FedProx,
        FedCurv,
        FedNTD,
        MOON,
        LwF,
        OnlineEWC,
        # gradient transforms, aggregators, schedules
        FedProj,
        FedGP,
        IFA,
        FedDyn,
        # static-FL baselines: drift correction and server optimizers
        Scaffold,
        FedNova,
        FedAvgM,
        FedOpt,
        FedDF,
    ]
    return {cls.name: cls for cls in classes}


def describe_components() -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for name, cls in component_classes().items():
        rows.append(
            {
                "name": name,
                "roles": cls.role_names(),
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
