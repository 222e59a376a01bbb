"""TARGET: its client objective (``strategies.target_loss``, ``strategies.target``) against
values computed by hand from the equations of its official code (methods/target.py), on
small tensors; its defaults; a tiny run, its resume and its refusals."""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
import torch
from PIL import Image
from torch import nn

from cfl_bench.core.context import Broadcast, ClientState, LocalRound, StepContext
from cfl_bench.core.errors import UserError
from cfl_bench.core.flat import FlatModel
from cfl_bench.engine.batches import ClientBatches
from cfl_bench.flower.kind import check_flower
from cfl_bench.leaderboard.report import build_report
from cfl_bench.runner.config import make_config
from cfl_bench.runner.run import execute
from cfl_bench.strategies.compose import build_strategy
from cfl_bench.strategies.declarations import TARGETOptions
from cfl_bench.strategies.replay import ReplayTerm, replay_term_loss
from cfl_bench.strategies.synthesis import SynthesisOptions
from cfl_bench.strategies.target import TARGET, PoolWalk, stream_normalisation
from cfl_bench.strategies.target_loss import (
    finetune_loss,
    kd_loss,
    new_class_ce,
    steps_per_epoch,
    synthetic_batch_size,
)
from tests import data_free_runs
from tests.data_free_runs import engine_loss, run_args, two_task_values
from tests.helpers import env
from tests.test_cli import in_process
from tests.test_resume import assert_config_resumes_after_crash, assert_same_run

# The tiny CIFAR-10 folder (a module fixture shared with the other data-free learners).
cifar_root = data_free_runs.cifar_root

LN3 = math.log(3.0)
# Row 1: teacher softmax([ln 3, 0]) = (3/4, 1/4) at T = 2, student uniform: −ln ½ = ln 2.
# Row 2: teacher uniform, student (3/4, 1/4): −(½ ln ¾ + ½ ln ¼) = ln 4 − ½ ln 3.
KD_TWO_ROWS = (math.log(2.0) + math.log(4.0) - 0.5 * LN3) / 2


def test_kd_loss_is_the_soft_cross_entropy_summed_over_classes_and_averaged_over_rows() -> None:
    student = torch.tensor([[0.0, 0.0], [2 * LN3, 0.0]])
    teacher = torch.tensor([[2 * LN3, 0.0], [0.0, 0.0]])
    assert math.isclose(kd_loss(student, teacher, 2.0).item(), KD_TWO_ROWS, rel_tol=1e-6)
    assert math.isclose(KD_TWO_ROWS, 0.7650677, rel_tol=1e-6)


def test_the_new_class_ce_reads_only_the_tasks_own_outputs() -> None:
    # known = 2, the task's classes {2, 3}: the old outputs (9, 9) and the future one (9)
    # are outside the softmax; label 3 → shifted 1, softmax([0, ln 3]) = (¼, ¾) → ln 4/3.
    outputs = torch.tensor([[9.0, 9.0, 0.0, LN3, 9.0]])
    value = new_class_ce(outputs, torch.tensor([3]), known=2, classes=2).item()
    assert math.isclose(value, math.log(4 / 3), rel_tol=1e-6)


def test_the_finetune_loss_adds_kd_times_the_old_class_distillation() -> None:
    outputs = torch.tensor([[9.0, 9.0, 0.0, LN3, 9.0]])
    # the synthetic rows' outputs beyond the two old classes must not count
    syn = torch.tensor([[0.0, 0.0, 7.0, 1.0, 2.0], [2 * LN3, 0.0, -5.0, 0.0, 3.0]])
    teacher = torch.tensor([[2 * LN3, 0.0, 4.0, 4.0, 4.0], [0.0, 0.0, 1.0, -1.0, 8.0]])
    value = finetune_loss(outputs, torch.tensor([3]), syn, teacher, 2, 2, 25.0, 2.0).item()
    assert math.isclose(value, math.log(4 / 3) + 25 * KD_TWO_ROWS, rel_tol=1e-6)
    assert math.isclose(value, 19.41437, rel_tol=1e-5)


def test_the_synthetic_batch_and_the_epoch_length_follow_the_codes_arithmetic() -> None:
    # main.py defaults: 5 users, 5 tasks, local_bs 128 → ⌈50000 / 3200⌉ = 16 → 8000 // 16
    assert synthetic_batch_size(8000, 50000, 5, 5, 128) == 500
    # 10 tasks: ⌈50000 / 6400⌉ = 8 → 1000
    assert synthetic_batch_size(8000, 50000, 5, 10, 128) == 1000
    # a client with 2000 rows (16 batches) and the 2,560-image pool in batches of 500 (6)
    assert steps_per_epoch(2000, 128, 2560, 500) == 6
    assert steps_per_epoch(300, 128, 2560, 500) == 3


# -- the component ----------------------------------------------------------------------------

TINY = "target:syn_round=2,g_steps=2,synthesis_batch_size=4"


def test_the_options_default_to_the_official_codes_values() -> None:
    o = TARGETOptions()
    # main.py:87 (kd), target.py:716 (T), main.py:86 (nums), target.py:40, 26, 24, 29, 28
    assert (o.kd, o.temperature, o.nums) == (25.0, 2.0, 8000)
    assert (o.syn_round, o.g_steps, o.synthesis_batch_size) == (10, 10, 256)
    assert (o.warmup, o.kd_steps) == (20, 400)
    # the engine's own defaults are the code's where TARGET does not set them
    e = SynthesisOptions()
    assert (e.nz, e.lr_g, e.lr_z, e.bn, e.oh) == (256, 0.002, 0.01, 10.0, 0.5)


def tiny_model() -> nn.Module:
    """A 4-class model with BatchNorm (so the step's two forwards are visibly apart)."""
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 2, 1), nn.BatchNorm2d(2), nn.Flatten(), nn.Linear(2 * 2 * 2, 4)
    )


def target_client(learner: TARGET, model: FlatModel, pool: torch.Tensor) -> tuple:
    """A task-1 client of 3 examples that receives ``pool`` with the global θ as teacher."""
    client = ClientState(index=0, generator=torch.Generator().manual_seed(0), buffer=None)
    client.task = 1
    client.train_x = torch.arange(3 * 12, dtype=torch.uint8).reshape(3, 3, 2, 2)
    client.train_y = torch.tensor([2, 3, 2])
    client.decode = lambda x: x.float() / 255
    server = SimpleNamespace(
        global_params=model.params.detach(),
        global_buffers=model.buffers.detach(),
        version=1,
        round_index=3,
        task=1,
        is_task_end=False,
        device=torch.device("cpu"),
    )
    broadcast = Broadcast.of(server, {"target.pool": pool})  # type: ignore[arg-type]
    local = LocalRound(model, broadcast)
    return client, local, learner.client_inputs(client, local)


def test_a_step_is_the_codes_ce_on_the_batch_plus_kd_on_a_separate_synthetic_forward() -> None:
    learner = TARGET({"synthetic_batch": 4})
    facts = env("seq-cifar10", "class-il", 4, 2, input_shape=(3, 2, 2))
    learner.setup(dataclasses.replace(facts, classes_per_task=2))
    learner.known_classes = 4  # task 1 of 2 classes each
    model = FlatModel(tiny_model())
    teacher = FlatModel(copy.deepcopy(model.module))
    with torch.no_grad():  # the student has moved away from the teacher it received
        teacher.module[3].weight.mul_(-2.0)
    pool = torch.randint(0, 256, (6, 3, 2, 2), dtype=torch.uint8, generator=torch.Generator())
    t_params, t_buffers = teacher.params.detach().clone(), teacher.buffers.detach().clone()
    client, local, inputs = target_client(learner, teacher, pool)
    inputs = {**inputs, "teacher": t_params, "teacher_buffers": t_buffers}
    x = client.decode(client.train_x[:2])
    step = StepContext(
        model=model,
        client=client,
        broadcast=local.broadcast,
        x=x,
        y=client.train_y[:2],
        task=1,
        epoch=0,
        offer_to_buffer=False,
        buffer_batch_size=32,
        inputs={"target": inputs},
    )
    loss = engine_loss(model, learner, step)
    # The reference: the walk's first batch of 4 synthetic rows (the client's generator's
    # first permutation of 6), both forwards in training mode apart, the teacher in eval.
    order = torch.randperm(6, generator=torch.Generator().manual_seed(0))[:4]
    s = pool[order].float() / 255
    reference_model = FlatModel(copy.deepcopy(model.module))
    reference_model.module.train()
    frozen = copy.deepcopy(teacher.module).eval()
    with torch.no_grad():
        t_out = frozen(s)
    expected = finetune_loss(
        reference_model.module(x), torch.tensor([2, 3]), reference_model.module(s), t_out,
        known=2, classes=2, kd=25.0, temperature=2.0,
    )  # fmt: skip
    assert torch.allclose(loss, expected, rtol=1e-6)


def test_the_pool_walk_is_a_new_permutation_each_epoch_in_consecutive_batches() -> None:
    images = torch.arange(5, dtype=torch.uint8).reshape(5, 1, 1, 1)
    walk = PoolWalk(
        images, lambda x: x.float(), torch.Generator().manual_seed(3), torch.device("cpu")
    )
    seen = []
    for epoch in (0, 1):
        batches = [walk.at(epoch).sample(2) for _ in range(3)]
        rows = [b.x.flatten().long().tolist() for b in batches if b is not None]
        assert [len(r) for r in rows] == [2, 2, 1]  # the last batch short
        walked = [row for batch in rows for row in batch]
        assert sorted(walked) == [0, 1, 2, 3, 4]  # every image once an epoch
        seen.append(walked)
        assert walk.at(epoch).sample(2) is None  # the epoch's walk is through
    gen = torch.Generator().manual_seed(3)
    assert seen == [torch.randperm(5, generator=gen).tolist() for _ in range(2)]


def test_an_epoch_ends_with_the_shorter_of_the_data_and_the_pool() -> None:
    client = ClientState(index=0, generator=torch.Generator().manual_seed(0), buffer=None)
    client.train_x, client.train_y = torch.arange(10.0)[:, None], torch.arange(10)
    batches = ClientBatches(client, 2, 3, None, torch.device("cpu"), epoch_steps=2)
    assert batches.total == 4  # 2 epochs × min(⌈10/3⌉, 2)
    rows = [batches.next()[1].tolist() for _ in range(batches.total)]
    assert [batches.epoch] == [1] and all(len(r) == 3 for r in rows)
    gen = torch.Generator().manual_seed(0)
    first, second = (torch.randperm(10, generator=gen)[:6].tolist() for _ in range(2))
    assert rows[0] + rows[1] == first and rows[2] + rows[3] == second
    uncapped = ClientBatches(client, 2, 3, None, torch.device("cpu"))
    assert uncapped.total == 8


def test_a_client_keeps_the_pool_it_receives_and_walks_it_again_next_round() -> None:
    learner = TARGET({"synthetic_batch": 2})
    facts = env("seq-cifar10", "class-il", 4, 2, input_shape=(3, 2, 2))
    learner.setup(dataclasses.replace(facts, classes_per_task=2))
    model = FlatModel(tiny_model())
    pool = torch.full((5, 3, 2, 2), 9, dtype=torch.uint8)
    client, local, inputs = target_client(learner, model, pool)
    assert int(inputs["known"]) == 2 and learner.epoch_steps(client) == 3  # ⌈5 / 2⌉
    walk = learner.replay_source(client, 0)
    assert walk is not None and walk.filled == 5
    # the next round's broadcast carries no pool: the client walks the copy it kept
    quiet = dataclasses.replace(local.broadcast, payloads={})
    learner.client_inputs(client, LocalRound(model, quiet))
    again = learner.replay_source(client, 0)
    assert again is not None and again is not walk and again.filled == 5
    state = client.state_for("target")
    assert state["pool_task"] == 1 and torch.equal(state["pool"], pool)  # type: ignore[arg-type]


def test_the_synthetic_batch_follows_the_codes_formula_for_the_run() -> None:
    learner = TARGET()
    facts = env("seq-cifar100", "class-il", 100, 5, input_shape=(3, 32, 32))
    learner.setup(dataclasses.replace(facts, classes_per_task=20, batch_size=128, num_clients=5))
    assert learner.syn_bs == 500  # ⌊8000 / ⌈50000 / (5 · 5 · 128)⌉⌋ = ⌊8000 / 16⌋
    tiny = TARGET({"nums": 3})
    with pytest.raises(UserError, match=r"synthetic batch .* is 0 for nums=3"):
        tiny.setup(dataclasses.replace(facts, classes_per_task=20, batch_size=1, num_clients=1))


def test_the_stream_normalisation_is_read_off_its_inputs() -> None:
    mean, std = (0.5, 0.25, 0.0), (0.5, 0.25, 1.0)

    def inputs(x: torch.Tensor) -> torch.Tensor:
        scaled = x.float() / 255
        return (scaled - torch.tensor(mean)[:, None, None]) / torch.tensor(std)[:, None, None]

    facts = dataclasses.replace(
        env("seq-cifar10", "class-il", 10, 5, input_shape=(3, 2, 2)), public_inputs=inputs
    )
    got_mean, got_std = stream_normalisation(facts)
    assert got_mean == pytest.approx(mean, abs=1e-6) and got_std == pytest.approx(std, abs=1e-6)


def test_a_run_sends_the_pool_once_in_the_next_task(cifar_root: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    code, output = in_process(*run_args(cifar_root, out, TINY))
    assert code == 0, output
    records = pd.read_csv(out / "records.csv")
    down = records[records.metric == "bytes_down"].value.to_numpy()
    # 2 synthesis rounds × 4 images of 3×32×32 uint8, to each of the 2 clients
    assert down[1] - down[0] == 2 * (2 * 4) * 3 * 32 * 32
    assert json.loads((out / "summary.json").read_text())["bytes_down_total"] == down.sum()
    # the pool can be looked at: a grid of task 1's 2 classes, 8 columns, in the report
    with Image.open(out / "synthetic-images" / "after-task-1.png") as grid:
        assert grid.size == (8 * 32 + 7, 2 * 32 + 1) and grid.info["classes"] == "0,1"
    page, _ = build_report(str(out))
    html = page.read_text()
    assert 'id="synthetic-after-task-1"' in html and "data:image/png;base64," in html


@pytest.mark.parametrize("crash_round", [1, 2])
def test_a_crashed_run_resumes_to_the_same_records(
    cifar_root: Path, tmp_path: Path, crash_round: int
) -> None:
    # 2 tasks × 2 rounds: round 2 ends task 0 (the synthesis), round 3 is task 1's first
    values = two_task_values(cifar_root, TINY)
    assert_config_resumes_after_crash(values, tmp_path, crash_round=crash_round + 1)


MID_SYNTHESIS_KILLER = """
import json, os, signal, sys
from cfl_bench.runner.config import make_config
from cfl_bench.runner.run import execute
from cfl_bench.strategies.synthesis import Synthesizer
from cfl_bench.strategies.synthesis_nayer import NayerSynthesizer
from cfl_bench.strategies.synthesis_mfcl import MFCLSynthesizer

def one_round_then_kill(self):  # the task end's synthesis: its first round, then SIGKILL
    self.step()
    os.kill(os.getpid(), signal.SIGKILL)

Synthesizer.run = NayerSynthesizer.run = MFCLSynthesizer.run = one_round_then_kill
execute(make_config(json.loads(sys.argv[1])))
"""


@pytest.mark.parametrize(
    "strategy",
    [
        TINY,
        "lander:syn_round=2,warmup=0,g_steps=2,synthesis_batch_size=4,kd_steps=2",
        "mfcl:pi=2,server_ss=4,z_dim=4,syn_size=4",
    ],
)
def test_a_run_killed_mid_synthesis_resumes_to_the_same_records(
    cifar_root: Path, tmp_path: Path, strategy: str
) -> None:
    # 2 tasks × 2 rounds: round 2 ends task 0, and its server step synthesises 2 rounds; the
    # child process is SIGKILLed after the first of them (its last checkpoint is round 1's),
    # then the same command resumes it.
    values = two_task_values(cifar_root, strategy)
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    execute(make_config({**values, "out": str(whole)}))
    env_vars = {**os.environ, "OMP_NUM_THREADS": "1"}
    child = subprocess.run(
        [sys.executable, "-c", MID_SYNTHESIS_KILLER, json.dumps({**values, "out": str(killed)})],
        capture_output=True,
        text=True,
        timeout=300,
        env=env_vars,
    )
    assert child.returncode == -signal.SIGKILL, child.stderr
    rows = (killed / "records.csv").read_text().splitlines()
    # only our patched synthesis kills (the return code); round 2 never ended
    assert {row.split(",")[0] for row in rows[1:]} == {"0", "1"}
    assert (killed / "checkpoint.pt").is_file()
    assert not (killed / "summary.json").exists()
    execute(make_config({**values, "out": str(killed)}))
    assert_same_run(killed, whole)
    assert (killed / "synthetic-images" / "after-task-1.png").read_bytes() == (
        whole / "synthetic-images" / "after-task-1.png"
    ).read_bytes()


@pytest.mark.parametrize(
    ("stream", "extra", "fragment"),
    [
        ("rot-digits", (), "needs a class-incremental stream"),
        ("seq-cifar10", ("--model", "mlp"), "lacks; use --model resnet32"),
        ("seq-cifar10", ("--executor", "vectorized"), "draw the server's synthetic images"),
    ],
)
def test_what_target_cannot_run_is_refused_in_one_line(
    cifar_root: Path, tmp_path: Path, stream: str, extra: tuple[str, ...], fragment: str
) -> None:
    out = tmp_path / "run"
    args = run_args(cifar_root, out, TINY, *extra)
    if stream != "seq-cifar10":  # an embedded stream: no data root
        at = args.index("seq-cifar10")
        args[at : at + 3] = [stream]
    code, output = in_process(*args)
    assert code == 2, output
    assert fragment in " ".join(output.split()) and "Traceback" not in output
    assert not (out / "records.csv").exists()


@pytest.mark.parametrize(
    ("name", "method"), [("target", "TARGET"), ("lander", "LANDER"), ("mfcl", "MFCL")]
)
def test_the_flower_executor_is_refused(
    monkeypatch: pytest.MonkeyPatch, name: str, method: str
) -> None:
    import cfl_bench.flower

    monkeypatch.setattr(cfl_bench.flower, "require_flwr", lambda: None)
    run = SimpleNamespace(
        config=SimpleNamespace(clients_per_chunk=None, compile=False),
        stream=SimpleNamespace(per_round=False),
        strategy=build_strategy(name),
    )
    with pytest.raises(UserError, match=f"cannot run '{name}': {method}'s clients draw"):
        check_flower(run)  # type: ignore[arg-type]


def test_the_synthesis_is_priced_in_steps_by_kind_and_off_on_the_probe_copy() -> None:
    # The code's schedule: 10 rounds of 10 generator steps, warm-up 20: plain steps only.
    learner = TARGET({"synthesis_batch_size": 2})
    facts = env("seq-cifar10", "class-il", 4, 2, input_shape=(3, 8, 8))
    learner.setup(dataclasses.replace(facts, classes_per_task=2))
    model = nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(256, 4)
    )
    work = learner.extra_work().task_end_server
    assert work is not None
    ((units, unit),) = work(model)
    assert units == 100.0
    unit()  # one generator step runs on a copy of the model
    # 5 rounds of 3 steps, warm-up 2: rounds 1 plain, 2–5 adversarial, 3–5 followed by 4
    # KD steps each.
    learner.opts = dataclasses.replace(learner.opts, syn_round=5, g_steps=3, warmup=2, kd_steps=4)
    kinds = learner.extra_work().task_end_server(model)  # type: ignore[misc]
    assert [n for n, _ in kinds] == [3.0, 12.0, 12.0]
    for _, unit in kinds:
        unit()  # the KD step makes its pool first
    learner.probe_copy()
    assert not learner.synthesizes


def test_the_cost_estimate_counts_the_pool_rows() -> None:
    # 10 rounds × 256 images = 2,560 below nums = 8,000; 2 × 4 = 8 above nums = 5
    assert build_strategy("target").learner.exemplar_memory() == 2560
    assert TARGET({"syn_round": 2, "synthesis_batch_size": 4, "nums": 5}).exemplar_memory() == 5


def test_the_kd_replay_term_distils_the_leading_outputs_over_the_real_rows() -> None:
    term = ReplayTerm(draw=0, kind="kd", weight=1.0, temperature=2.0, outputs=2)
    # the first two outputs are KD_TWO_ROWS's rows; the third output and row must not count
    student = torch.tensor([[0.0, 0.0, 9.0], [2 * LN3, 0.0, -9.0], [7.0, 1.0, 0.0]])
    stored = torch.tensor([[2 * LN3, 0.0, 5.0], [0.0, 0.0, 5.0], [0.0, 3.0, 0.0]])
    objective = build_strategy("target").learner.objective
    mask = torch.tensor([1.0, 1.0, 0.0])  # the third row is padding
    value = replay_term_loss(
        term, student, torch.zeros(3, dtype=torch.long), stored, objective, mask
    )
    assert math.isclose(value.item(), KD_TWO_ROWS, rel_tol=1e-6)
    unmasked = replay_term_loss(term, student[:2], torch.zeros(2), stored[:2], objective)
    assert math.isclose(unmasked.item(), KD_TWO_ROWS, rel_tol=1e-6)
