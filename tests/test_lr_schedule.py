"""``--lr-schedule task-cosine`` / ``task-exponential``: learning rates that restart at every
task, as LANDER's and MFCL's codes train (``engine.lr_schedule``)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from cfl_bench.engine.lr_schedule import TaskLR
from cfl_bench.runner.config import make_config
from cfl_bench.runner.plan import task_lr
from tests.helpers import digits_federation, first_update
from tests.sweep_helpers import in_process


def torch_cosine(base: float, end: float, rounds: int) -> list[float]:
    """The rates LANDER's ``_fl_train`` reads: a fresh SGD and ``CosineAnnealingLR(opt,
    com_round, eta_min)``, ``get_last_lr()`` before each round's ``scheduler.step()``."""
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=base)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, rounds, eta_min=end)
    rates = []
    for _ in range(rounds):
        rates.append(scheduler.get_last_lr()[0])
        optimizer.step()
        scheduler.step()
    return rates


def test_the_cosine_schedule_is_torchs_annealing_restarted_at_every_task() -> None:
    schedule = TaskLR("task-cosine", 1e-3, starts=(0, 5, 10), lengths=(5, 5, 5))
    got = [schedule.lr(0.1, r) for r in range(1, 16)]
    assert got == pytest.approx(torch_cosine(0.1, 1e-3, 5) * 3, rel=1e-12)
    # By hand: round 3 of a task of 5 (i = 2): 1e-3 + 0.099 · (1 + cos(2π/5)) / 2.
    assert schedule.lr(0.1, 8) == pytest.approx(1e-3 + 0.099 * (1 + math.cos(0.4 * math.pi)) / 2)


def test_the_exponential_schedule_is_mfcls_formula_restarted_at_every_task() -> None:
    schedule = TaskLR("task-exponential", 0.01, starts=(0, 4), lengths=(4, 4))
    # main.py:66: lr · exp(round / global_round · ln(lr_end / lr)): 0.1 · 0.1^(i/4).
    expected = [0.1 * 0.1 ** (i / 4) for i in range(4)] * 2
    assert [schedule.lr(0.1, r) for r in range(1, 9)] == pytest.approx(expected, rel=1e-12)
    # By hand: round 3 is i = 2 of 4: 0.1 · 0.1^(1/2); round 5 starts task 2 at 0.1 again.
    assert schedule.lr(0.1, 3) == pytest.approx(0.031622776601683794)
    assert schedule.lr(0.1, 5) == pytest.approx(0.1)


def test_the_plan_follows_the_runs_tasks_and_the_first_tasks_lead_rounds() -> None:
    values = {"stream": "rot-digits", "lr_schedule": "task-cosine", "lr_end": 0.001}
    plain = task_lr(make_config(values), num_tasks=3, rounds=4)
    assert plain is not None and (plain.starts, plain.lengths) == ((0, 4, 8), (4, 4, 4))
    led = task_lr(make_config({**values, "lead_rounds": 2}), num_tasks=3, rounds=4)
    assert led is not None and (led.starts, led.lengths) == ((0, 6, 10), (6, 4, 4))
    assert task_lr(make_config({"stream": "rot-digits"}), num_tasks=3, rounds=4) is None


def test_each_rounds_client_update_trains_at_its_tasks_rate() -> None:
    """2 tasks × 2 rounds, task-exponential to 0.005 from 0.05: rounds 1 and 3 at 0.05,
    rounds 2 and 4 at 0.05 · 0.1^(1/2); the steps differ with the rate."""
    schedule = TaskLR("task-exponential", 0.005, starts=(0, 2), lengths=(2, 2))

    def update(round_index: int) -> tuple[float, torch.Tensor]:
        return first_update(digits_federation("fedavg", task_lr=schedule), round_index)

    rates = [update(r)[0] for r in (1, 2, 3, 4)]
    low = 0.05 * 0.1**0.5
    assert rates == pytest.approx([0.05, low, 0.05, low], rel=1e-12)
    assert torch.equal(update(3)[1], update(1)[1])  # the same rate, the same step
    assert not torch.equal(update(2)[1], update(1)[1])


def test_the_default_schedule_leaves_the_protocol_unchanged() -> None:
    plain = make_config({"stream": "rot-digits"}).protocol()
    assert "lr_schedule" not in plain and "lr_end" not in plain
    cosine = make_config({"stream": "rot-digits", "lr_schedule": "task-cosine", "lr_end": 0.001})
    assert cosine.protocol()["lr_schedule"] == "task-cosine"
    assert cosine.protocol()["lr_end"] == 0.001


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("--lr-schedule", "task-cosine"), "needs the rate it moves towards; pass --lr-end"),
        (("--lr-end", "0.001"), "this run has none; pass --lr-schedule task-cosine"),
        (
            ("--lr-schedule", "task-exponential", "--lr-end", "0"),
            "cannot reach a rate of 0",
        ),
        (
            ("--lr-schedule", "task-cosine", "--lr-end", "0.001", "--lr-decay", "0.99"),
            "which --lr-decay does not follow; drop one of them",
        ),
        (
            ("--lr-schedule", "task-cosine", "--lr-end", "0.001", "--async-shift", "1"),
            "which --async-shift does not follow; drop one of them",
        ),
        (("--lr-schedule", "cosine"), "lr-schedule"),
    ],
)
def test_what_a_per_task_schedule_cannot_mean_is_refused_in_one_line(
    tmp_path: Path, args: tuple[str, ...], fragment: str
) -> None:
    out = tmp_path / "run"
    code, output = in_process("run", "--stream", "rot-digits", *args, "--out", str(out))
    assert code == 2 and fragment in " ".join(output.split()) and "Traceback" not in output
    assert not out.exists()
