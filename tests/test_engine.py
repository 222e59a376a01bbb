"""Engine behaviour on the embedded digits stream: buffer policies, the joint learner,
participation, evaluation frequency, communication counts and divergence."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import torch

from cfl_bench.core.errors import UserError
from cfl_bench.engine.loop import Federation, RunOutcome
from cfl_bench.engine.splits import holdout_split
from cfl_bench.runner.config import make_config
from cfl_bench.runner.run import execute
from tests.helpers import digits_federation as federation
from tests.helpers import end_task, enter_task

CPU = torch.device("cpu")


def test_first_pass_offers_each_example_once_per_task() -> None:
    fed = federation("der", epochs=3, rounds_per_task=3)
    fed.run()
    for client in fed.clients:
        assert client.buffer is not None
        assert client.buffer.num_seen == 2 * client.num_samples  # 2 tasks, once each


def test_every_step_offers_after_every_step() -> None:
    fed = federation("der", epochs=2, rounds_per_task=3, buffer_offer="every_step")
    fed.run()
    for client in fed.clients:
        assert client.buffer.num_seen == 2 * 3 * 2 * client.num_samples  # type: ignore[union-attr]


def test_ideal_trains_on_union_of_own_shards() -> None:
    fed = federation("ideal")
    enter_task(fed, 0)
    shard = fed.clients[0].num_samples
    enter_task(fed, 1)
    assert fed.clients[0].num_samples == 2 * shard
    assert fed.clients[0].buffer is None


def test_agem_task_end_fill_uses_m_over_t_and_no_buffer_in_task_one() -> None:
    fed = federation("agem:agem_fill=task_end", buffer_size=40)
    fed._prepare_eval_sets()
    enter_task(fed, 0)
    fed.server.round_index = 1
    fed._round(RunOutcome())
    assert all(c.buffer.filled == 0 for c in fed.clients)  # type: ignore[union-attr]
    end_task(fed, 0)
    assert all(c.buffer.filled == 20 for c in fed.clients)  # type: ignore[union-attr]
    assert all(int(c.buffer.task[:20].max()) == 0 for c in fed.clients)  # type: ignore[union-attr]


def test_participation_samples_clients_and_counts_bytes() -> None:
    fed = federation("fedavg", num_clients=8, participation=0.5)
    out = fed.run()
    rec = pd.DataFrame(out.records, columns=["round", "tt", "et", "scope", "metric", "value"])
    model_bytes = fed.model.num_params * 4
    down = rec[rec.metric == "bytes_down"].value.tolist()
    up = rec[rec.metric == "bytes_up"].value.tolist()
    assert down == [4 * model_bytes] * 4 and up == [4 * model_bytes] * 4
    clients = rec[rec.metric == "client_acc"].scope.unique()
    assert 0 < len(clients) <= 8


def test_eval_every_round_records_each_round(tmp_path: Path) -> None:
    cfg = make_config(
        {
            "strategy": "fedavg",
            "tasks": 2,
            "rounds_per_task": 3,
            "epochs": 1,
            "clients": 4,
            "eval_every_round": True,
            "out": str(tmp_path / "r"),
        }
    )
    result = execute(cfg)
    rec = pd.read_csv(tmp_path / "r" / "records.csv")
    assert sorted(rec[rec.metric == "acc"]["round"].unique()) == [0, 1, 2, 3, 4, 5, 6]
    # the summary still uses the task-end (last) round of each task
    acc = rec[(rec.metric == "acc") & (rec["round"] == 3) & (rec.eval_task == 0)].value.item()
    assert result.summary["acc_matrix"][0][0] == pytest.approx(acc)


def test_diverging_run_is_recorded_as_diverged(tmp_path: Path) -> None:
    cfg = make_config(
        {
            "strategy": "fedavg",
            "tasks": 2,
            "rounds_per_task": 2,
            "clients": 4,
            "lr": 1000.0,
            "out": str(tmp_path / "r"),
        }
    )
    result = execute(cfg)
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["status"] == "diverged" == result.summary["status"]
    assert "training loss became" in summary["message"]
    assert summary["Acc_T"] is None  # never reached the last task


def test_flat_views_survive_training() -> None:
    fed = federation("der+fedgp")
    fed.run()
    assert fed.model.check_views()


def test_holdout_split_is_disjoint_seeded_and_complete() -> None:
    held, kept = holdout_split(100, 10, task=0, seed=3, owner="fedproj")
    assert held is not None and kept is not None
    assert held.numel() == 10 and kept.numel() == 90
    assert torch.equal(torch.sort(torch.cat([held, kept])).values, torch.arange(100))
    again, _ = holdout_split(100, 10, task=0, seed=3, owner="fedproj")
    other_task, _ = holdout_split(100, 10, task=1, seed=3, owner="fedproj")
    assert again is not None and torch.equal(held, again)
    assert other_task is not None and not torch.equal(held, other_task)
    assert holdout_split(100, 0, task=0, seed=3, owner="fedproj") == (None, None)
    with pytest.raises(UserError, match="lower fedproj:public_size"):
        holdout_split(100, 100, task=0, seed=3, owner="fedproj")


def test_fedproj_holdout_is_withheld_from_every_client() -> None:
    fed = federation("fedproj:public=holdout,public_size=50")
    enter_task(fed, 0)
    task = fed.stream.task(0)
    held, kept = holdout_split(task.train_y.shape[0], 50, task=0, seed=0, owner="fedproj")
    assert held is not None and kept is not None
    public = fed.strategy.components[0].public_x  # type: ignore[attr-defined]
    assert torch.equal(public, task.train_x[held])
    client_rows = sum(c.num_samples for c in fed.clients)
    assert client_rows <= kept.numel()
    held_set = {tuple(r.tolist()) for r in task.train_x[held].flatten(1)}
    for c in fed.clients:
        assert c.train_x is not None
        inputs = c.inputs(torch.arange(c.num_samples))  # model inputs, like the holdout's
        assert not held_set & {tuple(r.tolist()) for r in inputs.flatten(1)}
    enter_task(fed, 1)
    assert public.shape[0] == 50 and fed.strategy.components[0].public_x.shape[0] == 100  # type: ignore[attr-defined]


def test_public_holdout_is_part_of_the_protocol(tmp_path: Path) -> None:
    """Withholding data from clients changes the protocol hash; a plain strategy change does
    not, so leaderboards never rank holdout runs against full-data runs."""

    def protocol_hash(strategy: str) -> str:
        cfg = make_config(
            {
                "strategy": strategy,
                "tasks": 2,
                "rounds_per_task": 1,
                "clients": 4,
                "train_size": 400,
                "test_size": 100,
                "out": str(tmp_path / strategy.replace(":", "_")),
            }
        )
        return str(execute(cfg).summary["protocol_hash"])

    plain = protocol_hash("fedavg")
    assert protocol_hash("der+fedgp") == plain
    holdout = protocol_hash("fedproj")  # rot-digits: auto → holdout
    assert holdout != plain
    config = json.loads((tmp_path / "fedproj" / "config.json").read_text())
    assert config["protocol"]["public_holdout_per_task"] == "10% (at most 1000)"


def one_augmented_round(replay_augment: bool) -> tuple[Federation, int]:
    """One DER round on a stream whose augmentation adds 1000 (never seen in raw pixels);
    returns the federation and how often the augmentation ran."""
    fed = federation("der", buffer_size=30, replay_augment=replay_augment)
    calls = [0]

    def shift(x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        calls[0] += 1
        return x + 1000.0

    fed.stream.augments = True
    fed.stream.augment = shift  # type: ignore[method-assign]
    fed.executor.trainer.augment = shift  # type: ignore[attr-defined]  # wired at construction
    fed._prepare_eval_sets()
    enter_task(fed, 0)
    fed.server.round_index = 1
    fed._round(RunOutcome())
    return fed, calls[0]


def test_augmented_streams_store_raw_inputs_and_augment_replays() -> None:
    fed, calls = one_augmented_round(replay_augment=True)
    steps = sum(-(-c.num_samples // 32) for c in fed.clients)
    assert calls > steps  # every batch, plus the replays once buffers had content
    for c in fed.clients:
        assert c.buffer is not None and c.buffer.filled > 0
        assert float(c.buffer.x[: c.buffer.filled].max()) <= 1.0  # raw pixels were stored
    _, calls = one_augmented_round(replay_augment=False)
    assert calls == steps  # batches only: replays as stored


def test_config_records_what_each_client_holds(tmp_path: Path) -> None:
    from tests.test_cli import in_process

    cfg = make_config(
        {"tasks": 2, "rounds_per_task": 1, "clients": 5, "out": str(tmp_path / "r"), "seed": 1}
    )
    execute(cfg)
    config = json.loads((tmp_path / "r" / "config.json").read_text())
    tables = config["client_class_counts"]
    assert set(tables) == {"1", "2"}
    counts = torch.tensor(tables["1"])
    assert counts.shape == (5, 10)
    # shards: 1437 digits → 10 shards of 143 (7 dropped), 2 per client
    assert counts.sum(1).tolist() == [286] * 5
    assert int((counts > 0).sum(1).max()) <= 4  # two label-sorted shards span few classes
    fed = federation("fedavg", num_clients=5, seed=1)
    enter_task(fed, 0)
    for k, client in enumerate(fed.clients):
        assert client.train_y is not None
        assert torch.bincount(client.train_y, minlength=10).tolist() == tables["1"][k]
    code, output = in_process("clients", str(tmp_path / "r"), "--task", "2")
    assert code == 0 and "samples per client and class" in output
    code, output = in_process("clients", str(tmp_path / "r"), "--task", "3")
    assert code == 2 and "no task 3" in output


def test_task_independent_splits_are_drawn_once_and_shared() -> None:
    from cfl_bench.engine.splits import plan_splits
    from cfl_bench.strategies.compose import build_strategy
    from cfl_bench.streams.partition import DirichletPartitioner, ShardPartitioner

    fed = federation("fedavg")
    stream, strategy = fed.stream, fed.strategy
    shared = plan_splits(stream, strategy, ShardPartitioner(), 4, 2, seed=0)
    assert shared[1] is shared[0]  # same labels, task-independent draw: reused
    fresh = plan_splits(stream, strategy, DirichletPartitioner(min_size=5), 4, 2, seed=0)
    assert not all(torch.equal(a, b) for a, b in zip(fresh[0].parts, fresh[1].parts, strict=True))
    holdout = build_strategy("fedproj:public=holdout,public_size=50")
    held = plan_splits(stream, holdout, ShardPartitioner(), 4, 2, seed=0)
    assert held[0].held is not None and held[1].held is not None
    assert not torch.equal(held[0].held, held[1].held)  # per-task holdout: never shared


def test_the_clients_table_never_cuts_a_count(tmp_path: Path) -> None:
    # At 80 columns the ten classes fit one table; narrower, the classes split into blocks
    # that each repeat the client and total columns. Either way every count is whole.
    from typer.testing import CliRunner

    from cfl_bench.cli import app

    cfg = make_config({"tasks": 1, "rounds_per_task": 1, "clients": 5, "out": str(tmp_path / "r")})
    execute(cfg)
    counts = json.loads((tmp_path / "r" / "config.json").read_text())["client_class_counts"]["1"]
    held = [str(c) for c in range(len(counts[0])) if any(row[c] for row in counts)]
    for columns, one_table in (("80", True), ("30", False)):
        result = CliRunner().invoke(app, ["clients", str(tmp_path / "r")], env={"COLUMNS": columns})
        assert result.exit_code == 0, result.output
        lines = result.output.splitlines()
        assert "…" not in result.output
        assert all(len(line) <= int(columns) for line in lines)
        headers = [line.split() for line in lines if line.startswith("client")]
        assert (len(headers) == 1) is one_table
        assert [c for h in headers for c in h[1:-1]] == held  # every class once, in order
        totals = [line.split() for line in lines if line.startswith("total")]
        assert [int(t[-1]) for t in totals] == [sum(map(sum, counts))] * len(headers)
        rows = [line.split() for line in lines if line[:1].isdigit()]
        assert [int(r[-1]) for r in rows[:5]] == [sum(row) for row in counts]
