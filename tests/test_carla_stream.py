"""The CARLA detection streams on the real shared frames: per-round data, the highway shift,
evaluation sets, refusals, and end-to-end runs through the engine and the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import torch

from cfl_bench.carla_bridge.stream import frame_stream
from cfl_bench.core.errors import UserError
from cfl_bench.streams.base import StreamRequest
from tests.conftest import requires_shared_data
from tests.test_cli import assert_user_error, cli, in_process

CPU = torch.device("cpu")


def stream(name: str = "carla-highway", tasks: int = 2, clients: int = 4, **kw: object):
    root = requires_shared_data()
    request = StreamRequest(
        num_tasks=tasks,
        seed=0,
        device=CPU,
        data_root=str(root),
        download=False,
        num_clients=clients,
        **kw,  # type: ignore[arg-type]
    )
    return frame_stream(name, request)


def towns(keys: tuple[str, ...]) -> set[str]:
    return {key.split("_")[0] for key in keys}


@pytest.mark.shared_data
def test_vehicles_receive_their_towns_frames_each_round() -> None:
    s = stream()
    first = s.round_data(0, {k: (0,) for k in range(4)})
    # 200 simulated seconds at one frame per 9 s: ticks 0..22.
    assert [first[k].x.shape[0] for k in range(4)] == [23, 23, 23, 23]
    assert [towns(first[k].keys) for k in range(4)] == [
        {"Town01"}, {"Town02"}, {"Town03"}, {"Town01"},
    ]  # fmt: skip
    assert first[0].x.dtype == torch.uint8 and first[0].x.shape[1:] == (3, 192, 320)
    assert first[0].y.shape[1:] == (100, 5) and first[0].y.dtype == torch.float32
    # Two vehicles in Town01 are at different points of its loop.
    assert first[0].keys[0] != first[3].keys[0]
    second = s.round_data(1, {k: (0,) for k in range(4)})
    assert second[0].keys[0] != first[0].keys[0]  # time moves on


@pytest.mark.shared_data
def test_the_highway_shift_moves_vehicle_0_only_and_others_drive_on() -> None:
    shifted, plain = stream(), stream()
    after = shifted.round_data(3, {k: (0, 3) for k in range(4)})
    unshifted = plain.round_data(3, {k: (0,) for k in range(4)})
    assert towns(after[0].keys) == {"Town04"}
    for k in (1, 2, 3):  # the others continue their own loop as if nothing happened
        assert after[k].keys == unshifted[k].keys


@pytest.mark.shared_data
def test_held_out_frames_test_each_task_and_are_never_streamed() -> None:
    s = stream()
    urban, highway, town05 = s.task_test(0), s.task_test(1), s.test_domain()
    assert town05 is not None
    assert (urban.test_x.shape[0], highway.test_x.shape[0], town05.test_x.shape[0]) == (24, 5, 40)
    # Boxes per set: the shared labels, counted by hand from the files' totals.
    assert int((town05.test_y[..., 0] >= 0).sum()) == 291
    streamed: set[str] = set()
    for g in range(12):
        data = s.round_data(g, {k: ((0,) if g < 6 else (0, 6)) for k in range(4)})
        streamed |= {key for d in data.values() for key in d.keys}
    held = {f.name for f in s.supply.task_frames(0)} | {f.name for f in s.supply.task_frames(1)}
    assert held and not held & streamed


@pytest.mark.shared_data
def test_arrival_order_puts_every_vehicle_in_task_ts_town() -> None:
    s = stream("carla-det", tasks=4, clients=2)
    for t, town in enumerate(("Town01", "Town02", "Town03", "Town04")):
        started = tuple(range(t + 1))
        data = s.round_data(t, {0: started, 1: started})
        assert towns(data[0].keys) == towns(data[1].keys) == {town}


@pytest.mark.shared_data
@pytest.mark.parametrize(
    ("name", "tasks", "extra", "message"),
    [
        ("carla-highway", 3, {}, "use --tasks 2"),
        ("carla-det", 5, {}, "use --tasks 1..4"),
        ("carla-det", 2, {"train_size": 10}, "do not apply"),
    ],
)
def test_bad_stream_requests_are_refused(
    name: str, tasks: int, extra: dict[str, object], message: str
) -> None:
    with pytest.raises(UserError, match=message):
        stream(name, tasks=tasks, **extra)


def test_a_folder_without_frames_is_refused(tmp_path: Path) -> None:
    request = StreamRequest(2, 0, CPU, str(tmp_path), False, num_clients=2)
    with pytest.raises(UserError, match="no CARLA frames under"):
        frame_stream("carla-highway", request)


def test_live_stream_needs_a_server_address() -> None:
    request = StreamRequest(2, 0, CPU, "/some/folder", False, num_clients=2)
    with pytest.raises(UserError, match="carla://HOST:PORT"):
        frame_stream("carla-live", request)


RUN = [
    "run", "--stream", "carla-highway", "--clients", "2", "--rounds-per-task", "1",
    "--lead-rounds", "1", "--batch-size", "8", "--threads", "1", "--probe-size", "4",
]  # fmt: skip


#: The killed-run test's configuration (below): 2 tasks of 2 rounds after a lead round, so
#: task 0 is rounds 1-3 and the highway shift rounds 4-5.
KILLED_RUN = {
    "stream": "carla-highway", "tasks": 2, "clients": 2, "rounds_per_task": 2,
    "lead_rounds": 1, "batch_size": 8, "epochs": 1, "threads": 1, "probe_size": 4,
    "buffer_size": 30, "checkpoint_every": 1,
}  # fmt: skip


@pytest.fixture(scope="module")
def der_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """One DER run through the CLI (in this process, whose frame supply later tests reuse),
    in the killed-run test's configuration: the end-to-end test checks it and the killed-run
    test resumes to it (one run, and one process start-up, less)."""
    root = requires_shared_data()
    out = tmp_path_factory.mktemp("carla-der") / "run"
    flags = [f"--{name.replace('_', '-')}={value}" for name, value in KILLED_RUN.items()]
    code, output = in_process("run", *flags, "--data-root", str(root), "--strategy", "der",
                              "--out", str(out))  # fmt: skip
    assert code == 0, output
    return out, output


@pytest.mark.shared_data
def test_der_runs_end_to_end_and_reports_map(der_run: tuple[Path, str]) -> None:
    out, stdout = der_run
    records = pd.read_csv(out / "records.csv")
    glob = records[records["scope"] == "global"]
    # Round 0 and the two task ends (rounds 1+2 = 3 with the lead round, then 5) evaluate
    # both domains and the test town.
    evaluated = glob[glob["metric"] == "map50"]
    assert sorted(set(evaluated["round"])) == [0, 3, 5]
    assert set(evaluated["eval_task"]) == {0, 1}
    assert set(glob[glob["metric"] == "test_map50"]["eval_task"]) == {-1}
    assert records["value"][records["metric"].isin(["map50", "map"])].between(0, 100).all()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["Acc_T"] == summary["map50_T"]  # the headline of a detection stream
    assert summary["test_map50_final"] is not None and summary["MD_T"] is None
    config = json.loads((out / "config.json").read_text())
    assert config["task_clock"]["eval_rounds"] == [3, 5]
    assert "mAP@0.5" in stdout


@pytest.mark.shared_data
@pytest.mark.parametrize(
    ("strategy", "fragment"),
    [("fedntd", "class_logits"), ("fedproj", "class_logits")],
)
def test_class_logit_methods_are_refused(tmp_path: Path, strategy: str, fragment: str) -> None:
    root = requires_shared_data()
    result = cli(*RUN, "--data-root", str(root), "--strategy", strategy, "--out", str(tmp_path))
    assert_user_error(result, fragment)


@pytest.mark.shared_data
def test_a_partition_is_refused_on_a_per_round_stream(tmp_path: Path) -> None:
    root = requires_shared_data()
    base = [*RUN, "--data-root", str(root), "--out", str(tmp_path / "x")]
    assert_user_error(cli(*base, "--partition", "iid"), "--partition does not apply")


@pytest.mark.shared_data
def test_model_and_objective_must_match(tmp_path: Path) -> None:
    root = requires_shared_data()
    result = cli(*RUN, "--data-root", str(root), "--model", "mlp", "--out", str(tmp_path / "x"))
    assert_user_error(result, "is a detection stream and model 'mlp' a classifier")
    digits = ["run", "--stream", "rot-digits", "--model", "centernet", "--out", str(tmp_path)]
    assert_user_error(cli(*digits), "is a detector and stream 'rot-digits' a classification")


@pytest.mark.shared_data
def test_the_joint_learner_trains_on_every_distinct_frame_received() -> None:
    from cfl_bench.core.context import ClientState
    from cfl_bench.engine.client_data import ClientData
    from cfl_bench.engine.task_clock import TaskClock
    from cfl_bench.strategies.compose import build_strategy

    s = stream(clients=2)
    clients = [ClientState(k, torch.Generator(), None) for k in range(2)]
    clock = TaskClock(num_tasks=2, rounds_per_task=3, offsets=(3, 3))
    started: list[int] = []
    data = ClientData(s, None, build_strategy("ideal"), clock, 0, CPU)  # type: ignore[arg-type]
    seen: list[set[str]] = [set(), set()]
    for g in range(9):
        data.advance(g, clients, lambda t, _holdout: started.append(t))
        entries = {
            k: tuple(clock.client_task_start(k, t) for t in range(clock.client_task(k, g) + 1))
            for k in range(2)
        }
        received = s.round_data(g, entries)
        for k in range(2):
            seen[k] |= set(received[k].keys)
            assert clients[k].num_samples == len(seen[k])
    assert started == [0, 1]
    # Town02 streams 26 frames (34 minus 8 held out): 9 rounds went round its loop.
    assert len(seen[1]) == 26 and clients[0].task == 1


@pytest.mark.shared_data
@pytest.mark.parametrize(
    "strategy",
    # ideal (the joint learner's received-frame history in the checkpoint) takes ~70 s
    ["der", pytest.param("ideal", marks=pytest.mark.slow)],
)
def test_a_killed_carla_run_resumes_to_identical_records(
    tmp_path: Path, strategy: str, request: pytest.FixtureRequest
) -> None:
    """Killed in the shift phase (round 4 of 5, checkpoint after round 4): the resumed run
    must ask the frame supply the same questions (shift times from the clock, histories
    replayed) and end with the same records. DER's uninterrupted run is the module's
    ``der_run`` (through the CLI: the same configuration gives the same records)."""
    from cfl_bench.runner.config import make_config
    from cfl_bench.runner.run import execute
    from tests.test_resume import assert_same_run, kill_after

    root = requires_shared_data()
    values = {**KILLED_RUN, "data_root": str(root), "strategy": strategy}
    if strategy == "der":
        whole = request.getfixturevalue("der_run")[0]
    else:
        whole = tmp_path / "whole"
        execute(make_config({**values, "out": str(whole)}))
    killed = {**values, "out": str(tmp_path / "killed")}
    kill_after(killed, 4)
    execute(make_config(killed))
    assert_same_run(tmp_path / "killed", whole)


# The demo's run and page: tests/test_interrupts.py's SIGTERM test checks them on its resumed
# demo (one demo run for both).
