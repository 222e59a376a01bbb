"""Asynchronous task boundaries: the clock's schedule properties and the engine following it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from cfl_bench.core.errors import UserError
from cfl_bench.engine.loop import RunOutcome
from cfl_bench.engine.task_clock import TaskClock
from tests.helpers import digits_federation as federation


def rounds_per_client_task(clock: TaskClock, k: int) -> list[int]:
    tasks = [clock.client_task(k, g) for g in range(clock.total_rounds)]
    return [tasks.count(t) for t in range(clock.num_tasks)]


def test_zero_shift_is_the_synchronous_schedule() -> None:
    clock = TaskClock.draw(num_tasks=3, rounds_per_task=4, num_clients=5, shift=0, seed=7)
    assert clock.offsets == (0,) * 5 and clock.total_rounds == 12
    assert [clock.eval_round(t) for t in range(3)] == [3, 7, 11]
    for g in range(12):
        assert clock.global_task(g) == g // 4
        assert {clock.client_task(k, g) for k in range(5)} == {g // 4}
    assert clock.ending_tasks(3) == [(k, 0) for k in range(5)]
    assert clock.ending_tasks(4) == []


def test_offsets_are_seeded_and_within_the_shift() -> None:
    a = TaskClock.draw(5, 3, 100, shift=2, seed=0)
    assert a == TaskClock.draw(5, 3, 100, shift=2, seed=0)
    assert a.offsets != TaskClock.draw(5, 3, 100, shift=2, seed=1).offsets
    assert set(a.offsets) == {0, 1, 2}  # 100 uniform draws hit every value
    assert a.lag == 2 and a.total_rounds == 5 * 3 + 2


def test_each_client_delays_its_boundaries_by_its_offset() -> None:
    clock = TaskClock(num_tasks=4, rounds_per_task=3, offsets=(0, 2, 1))
    assert clock.total_rounds == 14
    # task 0 gets R + o, middle tasks R, the last task the remaining R + L - o rounds
    assert rounds_per_client_task(clock, 0) == [3, 3, 3, 5]
    assert rounds_per_client_task(clock, 1) == [5, 3, 3, 3]
    assert rounds_per_client_task(clock, 2) == [4, 3, 3, 4]
    for k in range(3):
        tasks = [clock.client_task(k, g) for g in range(clock.total_rounds)]
        assert tasks == sorted(tasks)  # never goes back
        first_boundary = tasks.index(1)
        assert first_boundary == 3 + clock.offsets[k]


def test_a_task_is_evaluated_when_its_last_client_has_finished_it() -> None:
    clock = TaskClock(num_tasks=4, rounds_per_task=3, offsets=(0, 2, 1))
    for t in range(4):
        e = clock.eval_round(t)
        last_rounds = [
            max(g for g in range(clock.total_rounds) if clock.client_task(k, g) == t)
            for k in range(3)
        ]
        if t < 3:
            assert max(last_rounds) == e  # the slowest client (offset 2) ends task t there
        assert all(r <= e for r in last_rounds)
    assert [clock.task_rounds(t) for t in range(4)] == [5, 3, 3, 3]
    assert sum(clock.task_rounds(t) for t in range(4)) == clock.total_rounds
    assert [clock.global_task(g) for g in (0, 4, 5, 7, 8, 13)] == [0, 0, 1, 1, 2, 3]


def test_every_client_ends_every_task_exactly_once() -> None:
    clock = TaskClock.draw(4, 2, 10, shift=3, seed=5)
    ends = [e for g in range(clock.total_rounds) for e in clock.ending_tasks(g)]
    assert sorted(ends) == sorted((k, t) for k in range(10) for t in range(4))


def test_negative_shift_is_refused() -> None:
    with pytest.raises(UserError, match="async-shift"):
        TaskClock.draw(2, 2, 3, shift=-1, seed=0)


def test_clients_hold_their_own_task_while_others_moved_on() -> None:
    fed = federation("der", num_clients=6, rounds_per_task=2, async_shift=3, seed=4)
    clock = fed.clock
    assert 0 in clock.offsets and clock.lag > 0  # both kinds of client exist
    fed.enter_round(0)
    fed.enter_round(2)  # the first boundary of the clients with offset 0
    for client in fed.clients:
        expected = clock.client_task(client.index, 2)
        assert client.task == expected == (1 if clock.offsets[client.index] == 0 else 0)
        part = fed.data.splits[expected].parts[client.index]
        assert client.train_y is not None
        assert torch.equal(client.train_y, fed.stream.task(expected).train_y[part])


def test_async_run_evaluates_at_the_clock_and_offers_every_task_once() -> None:
    fed = federation("der", num_clients=6, rounds_per_task=2, async_shift=2, seed=4)
    out = fed.run()
    assert out.status == "finished"
    clock = fed.clock
    losses = [r for r in out.records if r[4] == "train_loss"]
    assert len(losses) == clock.total_rounds == 2 * 2 + clock.lag
    evals = sorted({(r[0], r[1]) for r in out.records if r[4] == "acc" and r[1] >= 0})
    assert evals == [(clock.eval_round(t) + 1, t) for t in range(2)]
    for client in fed.clients:  # first pass of each task's shard, once, by every client
        assert client.buffer is not None
        sizes = sum(int(fed.data.splits[t].parts[client.index].numel()) for t in range(2))
        assert client.buffer.num_seen == sizes


def test_agem_fills_each_clients_memory_at_its_own_task_end() -> None:
    fed = federation("agem:agem_fill=task_end", buffer_size=40, async_shift=2, seed=4)
    clock = fed.clock
    assert 0 in clock.offsets and clock.lag > 0
    fed._prepare_eval_sets()

    first_end = min(clock.rounds_per_task + o - 1 for o in clock.offsets)
    for g in range(first_end + 1):
        fed.enter_round(g)
        fed.server.round_index = g + 1
        fed._round(RunOutcome())
        fed.end_tasks(g)
    for client in fed.clients:
        done = clock.rounds_per_task + clock.offsets[client.index] - 1 <= first_end
        assert client.buffer is not None
        assert client.buffer.filled == (20 if done else 0)


def test_cli_records_the_offsets_and_prints_them(tmp_path: Path) -> None:
    from tests.test_cli import in_process

    out = tmp_path / "r"
    code, output = in_process(
        "run", "--tasks", "2", "--rounds-per-task", "1", "--clients", "4",
        "--async-shift", "2", "--train-size", "400", "--test-size", "100",
        "--seed", "3", "--out", str(out),
    )  # fmt: skip
    assert code == 0, output
    record = json.loads((out / "config.json").read_text())
    clock = TaskClock.draw(2, 1, 4, shift=2, seed=3)
    assert record["task_clock"]["offsets"] == list(clock.offsets)
    assert record["task_clock"]["eval_rounds"] == [clock.eval_round(t) + 1 for t in range(2)]
    assert record["protocol"]["async_shift"] == 2
    code, output = in_process("clients", str(out), "--task", "1")
    assert code == 0 and ("delay" in output) == any(clock.offsets)
    code, output = in_process("run", "--async-shift", "-1", "--out", str(tmp_path / "bad"))
    assert code == 2 and "--async-shift must be an integer in [0, 100000], got -1." in output


def test_lead_rounds_lengthen_the_first_task_only() -> None:
    """--lead-rounds 50 with 10 rounds per task: the paper's 60 urban rounds, then 10."""
    clock = TaskClock.draw(num_tasks=2, rounds_per_task=10, num_clients=3, shift=0, seed=0, lead=50)
    assert clock.total_rounds == 70
    assert [clock.eval_round(t) for t in range(2)] == [59, 69]
    assert rounds_per_client_task(clock, 0) == [60, 10]
    assert clock.global_task(59) == 0 and clock.global_task(60) == 1
    assert clock.ending_tasks(59) == [(k, 0) for k in range(3)]


def test_lead_rounds_add_to_an_async_shift() -> None:
    plain = TaskClock.draw(num_tasks=3, rounds_per_task=4, num_clients=6, shift=2, seed=3)
    led = TaskClock.draw(num_tasks=3, rounds_per_task=4, num_clients=6, shift=2, seed=3, lead=5)
    assert led.offsets == tuple(o + 5 for o in plain.offsets)
    assert led.total_rounds == plain.total_rounds + 5


def test_negative_lead_is_refused() -> None:
    with pytest.raises(UserError, match="--lead-rounds must be an integer >= 0"):
        TaskClock.draw(num_tasks=2, rounds_per_task=2, num_clients=2, shift=0, seed=0, lead=-1)
