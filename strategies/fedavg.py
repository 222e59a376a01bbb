"""FedAvg local learner: plain SGD on cross-entropy of the current task (the lower bound).

McMahan et al., "Communication-Efficient Learning of Deep Networks from Decentralized Data",
AISTATS 2017. The server side (weighted or uniform averaging) is the engine's default
aggregator, chosen with the run option ``weighting``.
"""

from __future__ import annotations

from typing import ClassVar

from cfl_bench.strategies import declarations
from cfl_bench.strategies.base import Declaration, Learner


class FedAvg(Learner):
    declaration: ClassVar[Declaration] = declarations.FEDAVG
