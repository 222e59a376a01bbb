"""The engine issue's acceptance protocol as a test (slow: minutes; run with -m slow).

rot-mnist, 5 tasks × 5 rounds, 10 clients, seed 0: DER + FedGP must end with a higher Acc_T
than DER alone and than FedAvg.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from cfl_bench.runner.config import make_config
from cfl_bench.runner.run import execute


def run_protocol(strategy: str, data: Path, out: Path) -> dict[str, object]:
    """One run of the issues' acceptance protocol: rot-mnist, 5 tasks x 5 rounds, 10 clients."""
    cfg = make_config(
        {
            "stream": "rot-mnist",
            "strategy": strategy,
            "data_root": str(data),
            "tasks": 5,
            "rounds_per_task": 5,
            "clients": 10,
            "seed": 0,
            "out": str(out / strategy.replace("+", "_")),
        }
    )
    return execute(cfg).summary


@pytest.mark.slow
def test_der_fedgp_beats_der_and_fedavg_on_rot_mnist(tmp_path: Path, shared_data: Path) -> None:
    acc = {}
    for strategy in ("der+fedgp", "der", "fedavg"):
        acc[strategy] = run_protocol(strategy, shared_data, tmp_path)["Acc_T"]
    assert acc["der+fedgp"] > acc["der"]
    assert acc["der+fedgp"] > acc["fedavg"]


ZOO = (
    "fedprox",
    "fedcurv",
    "fedntd",
    "fedavg+fedproj",
    "der+fedgp+ifa",
    "derpp+fedgp",
    "er",
    "der+fedcurv+fedgp",
)


@pytest.mark.slow
def test_strategy_zoo_runs_on_rot_mnist(tmp_path: Path, shared_data: Path) -> None:
    """The strategy-zoo issue's acceptance: every listed composition runs to completion on
    the full protocol, and the replay-based ones beat FedAvg's Acc_T (55.3 at seed 0)."""
    acc = {}
    for strategy in ("fedavg", *ZOO):
        summary = run_protocol(strategy, shared_data, tmp_path)
        assert summary["status"] == "finished", strategy
        acc[strategy] = summary["Acc_T"]
    for replay in ("derpp+fedgp", "er", "der+fedcurv+fedgp"):
        assert acc[replay] > acc["fedavg"], replay
