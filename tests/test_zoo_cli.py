"""Every strategy component end to end through the CLI on the embedded rot-digits stream,
with the communication it must add counted exactly."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from tests.test_cli import in_process

# The MLP on 8×8 inputs: 64·100 + 100 + 100·100 + 100 + 100·10 + 10 float32 parameters.
MODEL = (64 * 100 + 100 + 100 * 100 + 100 + 100 * 10 + 10) * 4
CLIENTS = 4  # all participate, 2 tasks x 2 rounds
SLICE = [
    *("--tasks", "2", "--rounds-per-task", "2", "--clients", str(CLIENTS)),
    *("--probe-size", "100", "--lr", "0.05"),
]
# fedproj on 8×8 inputs: public=auto is a holdout of 10 % of each task's 1,437 training
# images; the public memory gains a task's slice when the task starts, and Z_ens (10 logits
# each) covers the examples the clients labelled in the previous round.
HOLDOUT = 1437 // 10
LOGITS = HOLDOUT * 10 * 4


def run(tmp_path: Path, strategy: str) -> tuple[dict, pd.DataFrame]:
    out = tmp_path / "run"
    code, output = in_process(
        *("run", "--stream", "rot-digits", *SLICE, "--threads", "1"),
        *("--strategy", strategy, "--out", str(out)),
    )
    assert code == 0, output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "finished"
    assert summary["num_params"] * 4 == MODEL
    records = pd.read_csv(out / "records.csv")
    return summary, records


def per_round(records: pd.DataFrame, metric: str) -> list[float]:
    return records[records.metric == metric].value.tolist()


# (strategy, extra bytes up per client in rounds 1..4, extra bytes down per client in 1..4)
CASES = [
    ("er", [0] * 4, [0] * 4),
    ("derpp", [0] * 4, [0] * 4),
    ("fedprox", [0] * 4, [0] * 4),
    ("fedntd", [0] * 4, [0] * 4),
    ("fedcurv", [2 * MODEL] * 4, [0] + [2 * MODEL] * 3),  # (u, v) up; (U, V) after round 1
    # up: logits on the public memory (task 0's slice, then both tasks' slices); down: Z_ens
    # from round 2 on, one round behind the memory it will cover.
    ("fedavg+fedproj", [LOGITS, LOGITS, 2 * LOGITS, 2 * LOGITS], [0, LOGITS, LOGITS, 2 * LOGITS]),
    # generation=3: the reset lands mid task 2 and round 4 relearns before the final
    # evaluation (with the default one-task generation every evaluation follows a reset).
    ("der+fedgp+ifa:generation=3", [MODEL] * 4, [MODEL] * 4),  # round 1: θ_g for g_ref
]


@pytest.mark.parametrize(("strategy", "extra_up", "extra_down"), CASES, ids=[c[0] for c in CASES])
def test_component_runs_end_to_end_with_its_traffic(
    tmp_path: Path, strategy: str, extra_up: list[int], extra_down: list[int]
) -> None:
    summary, records = run(tmp_path, strategy)
    assert summary["Acc_T"] > 20  # chance is 10 %; 2 short rounds per task already beat it
    assert per_round(records, "bytes_up") == [CLIENTS * (MODEL + e) for e in extra_up]
    assert per_round(records, "bytes_down") == [CLIENTS * (MODEL + e) for e in extra_down]


def test_everything_composes_in_one_strategy(tmp_path: Path) -> None:
    strategy = "derpp+fedprox+fedcurv+fedntd+fedproj:gamma=0.1+fedgp+ifa:mode=random"
    summary, _ = run(tmp_path, strategy)
    assert summary["Acc_T"] > 20
    payloads = summary["bytes_by_payload"]
    for key in ("up:fedcurv.u", "up:fedproj.logits", "up:fedgp.gref", "down:fedcurv.U"):
        assert payloads[key] > 0, key
    # 4 clients upload 10 logits per public example: task 0's slice twice, then both slices
    assert payloads["up:fedproj.logits"] == CLIENTS * (2 * LOGITS + 2 * 2 * LOGITS)
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    names = [c["name"] for c in config["strategy"]["components"]]
    assert names[0] == "derpp" and "ifa" in names
    fedproj = next(c for c in config["strategy"]["components"] if c["name"] == "fedproj")
    assert fedproj["options"]["public"] == "holdout"  # auto, resolved and recorded
