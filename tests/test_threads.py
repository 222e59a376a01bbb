"""The default thread count: the measured rule on hand-picked inputs, its record in
config.json, and a resumed run keeping its checkpoint's thread count."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from cfl_bench.runner.config import make_config
from cfl_bench.runner.models import build_model
from cfl_bench.runner.run import configure_cpu, execute
from cfl_bench.runner.threads import SMALL_FLOPS, choose_threads, forward_flops
from tests.test_resume import kill_after, options

MLP_FLOPS = 0.03e6  # the digits MLP (bench/threads.py)
RESNET18_FLOPS = 1.1e9


@pytest.fixture
def keep_threads() -> Iterator[None]:
    """Runs in this process set torch's thread count; put it back afterwards."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_small_models_get_one_thread_even_on_idle_cores() -> None:
    for cores in (2, 64):
        choice = choose_threads(None, MLP_FLOPS, cores=cores, load=0.0)
        assert choice.threads == 1
        assert "small model" in choice.reason
    assert choose_threads(None, None, cores=8, load=0.0).threads == 1  # size unknown


def test_a_big_model_on_two_idle_cores_gets_two() -> None:
    choice = choose_threads(None, RESNET18_FLOPS, cores=2, load=0.1)
    assert (choice.threads, choice.cores, choice.load) == (2, 2, 0.1)
    assert "2 of 2 usable cores free" in choice.reason


def test_a_loaded_machine_gets_one_thread() -> None:
    for load in (1.0, 1.8, 7.5):
        choice = choose_threads(None, RESNET18_FLOPS, cores=2, load=load)
        assert choice.threads == 1, load
        assert "busy machine" in choice.reason


def test_more_threads_only_up_to_the_free_cores() -> None:
    assert choose_threads(None, RESNET18_FLOPS, cores=16, load=4.2).threads == 12
    assert choose_threads(None, SMALL_FLOPS, cores=4, load=0.0).threads == 4
    assert choose_threads(None, RESNET18_FLOPS, cores=1, load=0.0).threads == 1


def test_an_explicit_thread_count_always_wins() -> None:
    for flops, load in ((MLP_FLOPS, 0.0), (RESNET18_FLOPS, 9.0)):
        choice = choose_threads(3, flops, cores=2, load=load)
        assert choice.threads == 3
        assert choice.reason == "--threads given"


def test_forward_flops_counts_one_sample_and_leaves_the_model_alone() -> None:
    model = build_model("mlp", (1, 8, 8), 10)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    flops = forward_flops(model, (1, 8, 8))
    assert flops == 2 * (64 * 100 + 100 * 100 + 100 * 10)
    assert torch.equal(torch.get_rng_state(), rng)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert model.training  # the count ran on a copy in eval mode


def test_configure_cpu_applies_the_choice(keep_threads: None) -> None:
    cpu = torch.device("cpu")
    assert configure_cpu(cpu, None) is None  # no model: torch's default left alone
    choice = configure_cpu(cpu, None, build_model("mlp", (1, 8, 8), 10), (1, 8, 8))
    assert choice is not None and choice.threads == 1 == torch.get_num_threads()
    choice = configure_cpu(cpu, 2)
    assert choice is not None and choice.threads == 2 == torch.get_num_threads()


def test_config_json_records_the_choice_and_its_reason(tmp_path: Path, keep_threads: None) -> None:
    values = {"tasks": 2, "rounds_per_task": 1, "clients": 3, "epochs": 1}
    execute(make_config({**values, "out": str(tmp_path / "auto")}))
    environment = json.loads((tmp_path / "auto" / "config.json").read_text())["environment"]
    choice = environment["threads_choice"]
    assert set(choice) == {"threads", "reason", "cores", "load"}
    assert choice["threads"] == environment["torch_threads"] == 1
    assert "small model" in choice["reason"]
    assert choice["cores"] >= 1 and choice["load"] >= 0

    execute(make_config({**values, "threads": 2, "out": str(tmp_path / "given")}))
    environment = json.loads((tmp_path / "given" / "config.json").read_text())["environment"]
    assert environment["threads_choice"]["threads"] == environment["torch_threads"] == 2
    assert environment["threads_choice"]["reason"] == "--threads given"


def test_a_resumed_run_keeps_the_checkpoints_thread_count(
    tmp_path: Path, keep_threads: None
) -> None:
    """The checkpoint was written with 2 threads; resumed without --threads, whose automatic
    choice is 1 (a small model), the run goes on with 2 and ends byte-identical to an
    uninterrupted 2-thread run."""
    whole = tmp_path / "whole"
    execute(make_config(options("der+fedgp", whole, threads=2)))
    killed = options("der+fedgp", tmp_path / "killed", threads=2)
    kill_after(killed, 3)
    notes: list[str] = []
    torch.set_num_threads(1)
    execute(make_config({**killed, "threads": None}), notify=notes.append)
    assert notes == [
        "note: using the checkpoint's 2 thread(s) instead of the automatic choice of 1, so "
        "the records match an uninterrupted run (--threads N sets the count).",
        "resuming after round 3 of 6 (next: round 4)",
    ]
    assert torch.get_num_threads() == 2
    resumed = (tmp_path / "killed" / "records.csv").read_bytes()
    assert resumed == (whole / "records.csv").read_bytes()


def test_an_explicit_thread_count_on_resume_is_kept_with_a_note(
    tmp_path: Path, keep_threads: None
) -> None:
    killed = options("fedavg", tmp_path / "killed", threads=2)
    kill_after(killed, 3)
    notes: list[str] = []
    execute(make_config({**killed, "threads": 1}), notify=notes.append)
    assert torch.get_num_threads() == 1
    assert notes[0].startswith("note: the checkpoint was written with 2 thread(s)")
