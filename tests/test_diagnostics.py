"""--diagnostics: in-local / out-local accuracy, weight divergence, class-wise forgetting."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from cfl_bench.cli import app
from cfl_bench.engine.diagnostics import (
    ClassForgetting,
    class_accuracy,
    class_shares,
    local_split_accuracy,
)


def test_class_accuracy_by_hand() -> None:
    # Predictions: class 0 → right, right, wrong; class 1 → right; class 2 absent.
    logits = torch.tensor([[5.0, 0, 0], [3, 1, 0], [0, 2, 0], [0, 4, 1]])
    y = torch.tensor([0, 0, 0, 1])
    acc = class_accuracy(logits, y, 3)
    assert acc[:2].tolist() == pytest.approx([200 / 3, 100.0]) and math.isnan(float(acc[2]))


def test_in_and_out_local_split_follows_fedntd_weights() -> None:
    # A client holding classes 0 and 1 as 3:1 among C = 4.
    shares = class_shares(torch.tensor([0, 0, 0, 1]), 4)
    assert shares.tolist() == [0.75, 0.25, 0.0, 0.0]
    acc = torch.tensor([80.0, 40.0, 10.0, 0.0])
    inside, outside = local_split_accuracy(acc, shares)
    assert float(inside) == pytest.approx(0.75 * 80 + 0.25 * 40)  # 70
    # (1 − p_c)/(C − 1): 0.25/3, 0.75/3, 1/3, 1/3.
    assert float(outside) == pytest.approx((0.25 * 80 + 0.75 * 40 + 10 + 0) / 3)


def test_class_forgetting_is_eq5_over_rounds() -> None:
    history = ClassForgetting()
    f, drop = history.update(torch.tensor([50.0, 20.0, torch.nan]))
    assert (float(f), float(drop)) == (0.0, 0.0)
    f, drop = history.update(torch.tensor([30.0, 60.0, 10.0]))
    # Class 2 has no earlier value; classes 0, 1: (50−30 + 20−60)/2 = −10; drops (20 + 0)/2.
    assert (float(f), float(drop)) == (-10.0, 10.0)
    f, drop = history.update(torch.tensor([40.0, 55.0, 0.0]))
    # Best so far 50, 60, 10 → (10 + 5 + 10)/3; since last round: (0 + 5 + 10)/3.
    assert float(f) == pytest.approx(25 / 3) and float(drop) == pytest.approx(5.0)
    restored = ClassForgetting()
    restored.load_state_dict(history.state_dict())
    assert float(restored.update(torch.tensor([50.0, 60.0, 10.0]))[0]) == 0.0


def _run(out: Path, *extra: str) -> CliRunner:
    args = [
        "run", "--stream", "rot-digits", "--tasks", "1", "--clients", "6",
        "--partition", "shards", "--participation", "0.5", "--rounds-per-task", "3",
        "--epochs", "1", "--threads", "1", "--eval-every-round", "--out", str(out), *extra,
    ]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    return result


def test_diagnostics_are_recorded_and_do_not_change_training(tmp_path: Path) -> None:
    _run(tmp_path / "plain")
    _run(tmp_path / "diag", "--diagnostics")
    plain = pd.read_csv(tmp_path / "plain" / "records.csv")
    diag = pd.read_csv(tmp_path / "diag" / "records.csv")
    new = {"in_local_acc", "out_local_acc", "weight_divergence", "class_forgetting",
           "round_forgetting"}  # fmt: skip
    assert set(diag.metric) - set(plain.metric) == new
    same = diag[~diag.metric.isin(new)].reset_index(drop=True)
    pd.testing.assert_frame_equal(same, plain)  # measuring does not change training
    clients = diag[diag.metric == "in_local_acc"]
    assert len(clients) == 3 * 3 and clients.scope.str.startswith("client_").all()
    inside = clients.value.to_numpy()
    outside = diag[diag.metric == "out_local_acc"].value.to_numpy()
    assert (inside > outside).all()  # shard clients know their own digits far better
    assert (diag[diag.metric == "weight_divergence"].value > 0).all()
    summary = json.loads((tmp_path / "diag" / "summary.json").read_text())
    assert summary["in_local_acc_final"] == pytest.approx(inside[-3:].mean(), rel=1e-6)
    assert "in_local_acc_final" not in json.loads((tmp_path / "plain" / "summary.json").read_text())


def test_diagnostics_need_per_round_evaluation(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app, ["run", "--stream", "rot-digits", "--diagnostics", "--out", str(tmp_path / "x")]
    )
    assert result.exit_code == 2
    assert "--diagnostics measures the global model after every round; add --eval-every-round" in (
        result.output
    )
    assert not (tmp_path / "x").exists()


def test_the_report_draws_the_per_round_curves(tmp_path: Path) -> None:
    from cfl_bench.leaderboard.report_curves import accuracy_by_round, diagnostics_by_round

    _run(tmp_path / "diag", "--diagnostics")
    records = pd.read_csv(tmp_path / "diag" / "records.csv")
    acc = accuracy_by_round(records)
    assert list(acc.index) == [0, 1, 2, 3] and list(acc.columns) == [0]
    diagnostics = diagnostics_by_round(records)
    assert list(diagnostics.columns) == ["in_local_acc", "out_local_acc", "class_forgetting"]
    assert list(diagnostics.index) == [1, 2, 3]
    result = CliRunner().invoke(app, ["report", str(tmp_path / "diag")])
    assert result.exit_code == 0, result.output
    page = (tmp_path / "diag" / "report.html").read_text()
    assert 'id="r-round-acc-figure_1"' in page and "what local training forgets" in page
