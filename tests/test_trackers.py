"""--log tensorboard / --log mlflow: the run's records mirrored offline, read back with the
real packages and compared with records.csv."""

from __future__ import annotations

from pathlib import Path

import pytest

from cfl_bench.core.records import read_rows
from cfl_bench.runner.trackers import parse_trackers, scalars
from tests.test_bad_inputs import TINY, run_main


def test_scalars_tag_every_record_and_average_the_trained_tasks() -> None:
    rows = [
        (2, 0, -1, "global", "train_loss", 1.5),
        (2, 0, 0, "global", "acc", 50.0),
        (2, 0, 1, "global", "acc", 10.0),  # task 2 before training: not in avg_seen
        (4, 1, 0, "global", "acc", 40.0),
        (4, 1, 1, "global", "acc", 70.0),
        (4, 1, -1, "client_3", "client_acc", 33.0),
    ]
    got = scalars(rows)
    assert ("train_loss", 1.5, 2) in got
    assert ("acc/task2", 10.0, 2) in got
    assert ("client_acc/client_3", 33.0, 4) in got
    assert [s for s in got if s[0] == "acc/avg_seen"] == [
        ("acc/avg_seen", 50.0, 2),
        ("acc/avg_seen", 55.0, 4),
    ]


@pytest.mark.parametrize("text", ["wandb", "tensorboard,tensorboard", "", "mlflow,"])
def test_unknown_or_repeated_trackers_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="must be tensorboard, mlflow"):
        parse_trackers(text)


def test_a_run_mirrors_its_records_to_tensorboard_and_mlflow(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("tensorboard")
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "r"
    code, err = run_main(["run", "--out", str(out), "--log", "tensorboard,mlflow", *TINY], capsys)
    assert code == 0, err
    records = read_rows(out / "records.csv")
    acc = records[(records["metric"] == "acc") & (records["eval_task"] == 1)]
    want = [(int(r), float(v)) for r, v in zip(acc["round"], acc["value"], strict=True)]

    events = EventAccumulator(str(out / "tensorboard"))
    events.Reload()
    got_tb = [(e.step, e.value) for e in events.Scalars("acc/task2")]
    assert got_tb == [(r, pytest.approx(v, abs=1e-6)) for r, v in want]  # stored as float32

    client = MlflowClient(f"sqlite:///{out / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("cfl-bench")
    assert experiment is not None
    (run,) = client.search_runs([experiment.experiment_id])
    history = client.get_metric_history(run.info.run_id, "acc.task2")
    assert [(m.step, m.value) for m in history] == want  # doubles: exact
    assert run.data.params["stream"] == "rot-digits"
    assert run.info.status == "FINISHED"
