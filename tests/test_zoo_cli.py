"""Every strategy component end to end through the CLI on a small real MNIST slice, with the
communication it must add counted exactly."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from tests.test_cli import in_process

MODEL = 21_840 * 4  # mnist-cnn parameters as float32 bytes
CLIENTS = 4  # all participate, 2 tasks x 2 rounds
SLICE = [
    *("--tasks", "2", "--rounds-per-task", "2", "--clients", str(CLIENTS)),
    *("--train-size", "2000", "--test-size", "300", "--probe-size", "100", "--lr", "0.05"),
]
LOGITS = 1000 * 10 * 4  # fedproj: 1000 public images x 10 classes


def run(tmp_path: Path, shared_data: Path, strategy: str) -> tuple[dict, pd.DataFrame]:
    out = tmp_path / "run"
    code, output = in_process(
        "run",
        "--stream",
        "rot-mnist",
        "--data-root",
        str(shared_data),
        *SLICE,
        "--threads",
        "1",
        "--strategy",
        strategy,
        "--out",
        str(out),
    )
    assert code == 0, output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "finished"
    records = pd.read_csv(out / "records.csv")
    return summary, records


def per_round(records: pd.DataFrame, metric: str) -> list[float]:
    return records[records.metric == metric].value.tolist()


# (strategy, extra bytes up per client per round, extra down per client in round 1 / later)
CASES = [
    ("er", 0, 0, 0),
    ("derpp", 0, 0, 0),
    ("fedprox", 0, 0, 0),
    ("fedntd", 0, 0, 0),
    ("fedcurv", 2 * MODEL, 0, 2 * MODEL),
    ("fedavg+fedproj", LOGITS, 0, LOGITS),
    # generation=3: the reset lands mid task 2 and round 4 relearns before the final
    # evaluation (with the default one-task generation every evaluation follows a reset).
    ("der+fedgp+ifa:generation=3", MODEL, MODEL, MODEL),  # round 1: θ_g for the g_ref phase
]


@pytest.mark.parametrize(("strategy", "extra_up", "extra_down_first", "extra_down"), CASES)
def test_component_runs_end_to_end_with_its_traffic(
    tmp_path: Path,
    shared_data: Path,
    strategy: str,
    extra_up: int,
    extra_down_first: int,
    extra_down: int,
) -> None:
    summary, records = run(tmp_path, shared_data, strategy)
    assert summary["Acc_T"] > 20  # chance is 10 %; 2 short rounds per task already beat it
    assert per_round(records, "bytes_up") == [CLIENTS * (MODEL + extra_up)] * 4
    down = per_round(records, "bytes_down")
    assert down[0] == CLIENTS * (MODEL + extra_down_first)
    assert down[1:] == [CLIENTS * (MODEL + extra_down)] * 3


def test_everything_composes_in_one_strategy(tmp_path: Path, shared_data: Path) -> None:
    strategy = "derpp+fedprox+fedcurv+fedntd+fedproj:gamma=0.1+fedgp+ifa:mode=random"
    summary, _ = run(tmp_path, shared_data, strategy)
    assert summary["Acc_T"] > 20
    payloads = summary["bytes_by_payload"]
    for key in ("up:fedcurv.u", "up:fedproj.logits", "up:fedgp.gref", "down:fedcurv.U"):
        assert payloads[key] > 0, key
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    names = [c["name"] for c in config["strategy"]["components"]]
    assert names[0] == "derpp" and "ifa" in names
    fedproj = next(c for c in config["strategy"]["components"] if c["name"] == "fedproj")
    assert fedproj["options"]["public"] == "fashion-mnist"  # auto, resolved and recorded
