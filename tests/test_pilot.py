"""`cfl-bench pilot boundary`: the Iris split, the disagreement measure on hand-made models,
the recording executor, the command's files and refusals, and FedProj's Fig. 1 claim."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from cfl_bench.cli import main
from cfl_bench.core.flat import FlatModel
from cfl_bench.pilot import boundary, strategy_list
from cfl_bench.pilot.iris import (
    DominantClassPartitioner,
    IrisPCAStream,
    load_iris_pca,
    plan_pilot_split,
)
from cfl_bench.pilot.measure import Box, disagreement, grid_points, plot_box, predict_labels
from cfl_bench.strategies.registry import component_classes
from cfl_bench.streams.partition import client_class_counts
from tests.test_startup import probe

FEDDF_REGISTERED = "feddf" in component_classes()


def run_main(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """``cfl-bench ARGV`` in this process: (exit code, stdout, stderr)."""
    with pytest.raises(SystemExit) as stop:
        main(argv)
    captured = capsys.readouterr()
    return int(stop.value.code or 0), captured.out, captured.err


# -- the split ----------------------------------------------------------------------------------
def test_dominant_class_split_of_hand_labels() -> None:
    # 10 points of each class, share 0.8: client k gets 8 of class k, and the 2 left of each
    # class are dealt one to each other client.
    labels = torch.arange(3).repeat_interleave(10)
    parts = DominantClassPartitioner(0.8).split(labels, 3, task=0, seed=0)
    assert client_class_counts(parts, labels, 3).tolist() == [[8, 1, 1], [1, 8, 1], [1, 1, 8]]


def test_iris_split_is_non_iid_covers_every_point_and_is_seeded() -> None:
    y = load_iris_pca().y
    split = plan_pilot_split(y, DominantClassPartitioner(), 3, seed=0)
    assert split.held is not None and split.held.numel() == 15  # 10 % public
    everything = torch.cat([*split.parts, split.held])
    assert torch.equal(torch.sort(everything).values, torch.arange(150))  # disjoint, complete
    counts = client_class_counts(split.parts, y, 3)
    for k, row in enumerate(counts.tolist()):
        assert row.index(max(row)) == k and row[k] >= 0.7 * sum(row), counts
    again = plan_pilot_split(y, DominantClassPartitioner(), 3, seed=0)
    other = plan_pilot_split(y, DominantClassPartitioner(), 3, seed=1)
    assert all(torch.equal(a, b) for a, b in zip(split.parts, again.parts, strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(split.parts, other.parts, strict=True))


def test_iris_stream_is_one_static_task_of_two_features() -> None:
    points = load_iris_pca()
    assert 0.95 < points.explained_variance < 0.97  # PCA of standardised Iris: 72.96 + 22.85 %
    stream = IrisPCAStream(points, torch.device("cpu"))
    task = stream.task(0)
    assert (stream.scenario, stream.num_tasks, stream.input_shape) == ("static", 1, (2,))
    assert torch.equal(task.train_x, points.x) and task.classes == (0, 1, 2)


# -- the measure --------------------------------------------------------------------------------
def linear(weight: list[list[float]], bias: list[float]) -> FlatModel:
    layer = nn.Linear(2, 2)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor(weight))
        layer.bias.copy_(torch.tensor(bias))
    return FlatModel(layer)


def labels_of(model: FlatModel, points: torch.Tensor) -> torch.Tensor:
    return predict_labels(model, model.params.clone(), model.buffers.clone(), points)


def test_disagreement_of_two_linear_classifiers_on_the_grid() -> None:
    box = Box(-1.0, 1.0, -1.0, 1.0)
    grid = grid_points(box, 200)  # cell centres x_j = -1 + (j + 0.5)/100, none on 0 or 0.5
    left_right = linear([[1, 0], [-1, 0]], [0, 0])  # class 0 iff x > 0
    up_down = linear([[0, 1], [0, -1]], [0, 0])  # class 0 iff y > 0
    shifted = linear([[1, 0], [-1, 0]], [-0.5, 0.5])  # class 0 iff x > 0.5
    a, b, c = (labels_of(m, grid) for m in (left_right, up_down, shifted))
    # sign(x) ≠ sign(y) in two of the four 100×100 quadrants: 20000 / 40000.
    assert disagreement(a, b) == 0.5
    # 0 < x < 0.5 holds for columns j = 100..149: 50 of 200 columns.
    assert disagreement(a, c) == 0.25
    assert disagreement(a, a) == 0.0
    with pytest.raises(ValueError, match="one shape"):
        disagreement(a, a[:10])


def test_grid_is_row_major_from_the_bottom_left() -> None:
    grid = grid_points(Box(0.0, 4.0, 0.0, 2.0), 2)
    # cells 2×1 wide/high: centres (1, 0.5), (3, 0.5), then the top row.
    assert grid.tolist() == [[1.0, 0.5], [3.0, 0.5], [1.0, 1.5], [3.0, 1.5]]
    box = plot_box(torch.tensor([[0.0, 0.0], [2.0, 4.0]]), 0.1)
    assert box.extent == pytest.approx((-0.2, 2.2, -0.4, 4.4))


# -- the engine, recorded -----------------------------------------------------------------------
def test_recording_changes_nothing_and_keeps_every_client_update() -> None:
    config = boundary.PilotConfig(("fedavg+fedproj",), rounds=2, epochs=2)
    points = load_iris_pca()
    stream = IrisPCAStream(points, boundary.CPU)
    split = plan_pilot_split(points.y, DominantClassPartitioner(), 3, config.seed)
    init = boundary.initial_states(points, config)["random"]
    [prepared] = boundary.prepare_strategies(config.strategies, stream, split, config)
    trace = boundary.run_federation(stream, split, prepared, init, config)
    assert [(s.round, s.client) for s in trace.snapshots] == [
        (r, k) for r in (1, 2) for k in range(3)
    ]
    model = boundary.PilotMLP(2, config.hidden, 3)
    model.load_state_dict(init)
    assert torch.equal(
        trace.snapshots[0].start[0], FlatModel(model).params
    )  # round 1 starts at init
    # The same run without the recorder ends at the same global model, bit for bit.
    [again] = boundary.prepare_strategies(config.strategies, stream, split, config)
    model = boundary.PilotMLP(2, config.hidden, 3)
    model.load_state_dict(init)
    fed = boundary.Federation(
        stream, DominantClassPartitioner(), again.strategy, model, again.schedule,
        boundary.CPU, {0: split},
    )  # fmt: skip
    assert fed.run().status == "finished"
    assert torch.equal(fed.server.global_params, trace.final[0])


# -- strategy lists -----------------------------------------------------------------------------
def test_strategy_list_keeps_options_after_commas() -> None:
    split = strategy_list.split_strategy_list
    assert split("fedavg, fedavg+fedproj:temperature=2,gamma=0.1,fedprox:mu=0.1") == [
        "fedavg",
        "fedavg+fedproj:temperature=2,gamma=0.1",
        "fedprox:mu=0.1",
    ]
    assert split("fedproj:distill_lr=1e+3,gamma=1") == ["fedproj:distill_lr=1e+3,gamma=1"]


def test_default_list_names_what_is_not_registered(monkeypatch: pytest.MonkeyPatch) -> None:
    known = {k: v for k, v in component_classes().items() if k not in ("fedproj", "feddf")}
    monkeypatch.setattr(strategy_list, "component_classes", lambda: known)
    available, unavailable = strategy_list.default_strategies()
    assert available == ["fedavg"]
    assert [u["strategy"] for u in unavailable] == ["fedavg+feddf", "fedavg+fedproj"]
    assert unavailable[1]["reason"] == "component fedproj is not registered in this build"


# -- the command --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def pilot_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """The default command once (seed 0, default strategies, 5 rounds): its folder and
    pilot.json."""
    out = tmp_path_factory.mktemp("pilot") / "boundary"
    with pytest.raises(SystemExit) as stop:
        main(["pilot", "boundary", "--out", str(out), "--threads", "1"])
    assert stop.value.code in (0, None)
    return out, json.loads((out / "pilot.json").read_text())


def test_command_writes_its_four_files(pilot_run: tuple[Path, dict[str, Any]]) -> None:
    out, record = pilot_run
    names = sorted(p.name for p in out.iterdir())
    assert names == ["boundary.png", "boundary.svg", "index.html", "pilot.json"]  # no temp left
    assert (out / "boundary.png").read_bytes().startswith(b"\x89PNG")
    assert b"<svg" in (out / "boundary.svg").read_bytes()[:2000]
    page = (out / "index.html").read_text()
    assert page.count("data:image/png;base64,") == 1 and "forgetting (area)" in page
    assert {"config", "data", "results", "strategies", "measure", "wall_time_s"} <= set(record)
    inits = [r["init"] for r in record["results"]]
    assert inits == ["random"] * (len(inits) // 2) + ["pretrained"] * (len(inits) // 2)
    for r in record["results"]:
        assert r["status"] == "finished"
        assert {"forgetting_area", "forgetting_data", "final_global_accuracy"} <= set(r)
        assert len(r["per_round"]["area"]) == 5 and all(len(x) == 3 for x in r["per_round"]["area"])
        assert 0.0 <= r["forgetting_area"] <= 1.0 and 0.0 <= r["forgetting_data"] <= 1.0
    assert record["data"]["public_points"] == 15
    assert record["pretrained_accuracy"] > 0.9  # near-optimal on 2-D Iris


@pytest.mark.skipif(FEDDF_REGISTERED, reason="feddf is registered: the default list is complete")
def test_default_list_says_feddf_is_not_run(pilot_run: tuple[Path, dict[str, Any]]) -> None:
    _, record = pilot_run
    assert record["strategies"]["run"] == ["fedavg", "fedavg+fedproj"]
    assert [u["strategy"] for u in record["strategies"]["unavailable_defaults"]] == ["fedavg+feddf"]


def test_fedproj_forgets_less_than_fedavg(pilot_run: tuple[Path, dict[str, Any]]) -> None:
    """FedProj's Fig. 1 claim on seed 0 (it held on seeds 0–3 when written; docs/pilot.md):
    clients of FedAvg forget more of the global boundary than those of FedProj, from a random
    and from a pretrained model, on the area and on the data."""
    _, record = pilot_run
    by = {(r["init"], r["strategy"]): r for r in record["results"]}
    for init in ("random", "pretrained"):
        fedavg, fedproj = by[(init, "fedavg")], by[(init, "fedavg+fedproj")]
        assert fedavg["forgetting_area"] > fedproj["forgetting_area"], init
        assert fedavg["forgetting_data"] > fedproj["forgetting_data"], init


@pytest.mark.skipif(not FEDDF_REGISTERED, reason="feddf is not registered in this build")
def test_feddf_runs_in_the_pilot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "p"
    code, _, err = run_main(
        ["pilot", "boundary", "--out", str(out), "--rounds", "2", "--strategies", "fedavg+feddf"],
        capsys,
    )
    assert code == 0, err
    record = json.loads((out / "pilot.json").read_text())
    assert [r["strategy"] for r in record["results"]] == ["fedavg+feddf"] * 2
    assert all(r["status"] == "finished" for r in record["results"])
    assert strategy_list.default_strategies()[1] == []


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--strategies", "fedavg,foo"], "unknown strategy component 'foo'"),
        (["--strategies", "fedavg,,fedproj"], "has an empty entry"),
        (["--strategies", "fedproj,fedavg+fedproj"], "are the same strategy"),
        (["--strategies", "fedproj:public_size=30"], "the pilot withholds 15 from every client"),
        (["--strategies", "fedproj:public=fashion-mnist"], "use fedproj:public=holdout"),
        (["--rounds", "0"], "--rounds must be a positive integer, got 0."),
        (["--threads", "0"], "--threads must be a positive integer, got 0."),
    ],
)
def test_refusals_are_one_line_exit_2_and_write_nothing(
    args: list[str], fragment: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "p"
    code, _, err = run_main(["pilot", "boundary", "--out", str(out), *args], capsys)
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and fragment in err, err
    assert not out.exists()


def test_help_and_a_misspelled_strategy_import_nothing_heavy(tmp_path: Path) -> None:
    heavy, code, output = probe("pilot", "boundary", "--help")
    assert code == 0 and heavy == [], output
    heavy, code, output = probe(
        "pilot", "boundary", "--out", str(tmp_path / "p"), "--strategies", "fedavgg"
    )
    assert code == 2 and "unknown strategy component 'fedavgg'" in output and heavy == [], output
