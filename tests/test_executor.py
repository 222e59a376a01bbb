"""The executor seam: client updates as explicit jobs, declared payloads, engine-owned traffic."""

from __future__ import annotations

import ast
import copy
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch

from cfl_bench.core.payloads import Payload
from cfl_bench.engine.client_update import ClientJob
from cfl_bench.engine.executor import ResultSink, SequentialExecutor
from cfl_bench.engine.loop import RunOutcome
from cfl_bench.strategies.base import Component, Role
from cfl_bench.strategies.compose import SERVER_HOOK_ORDER, TRANSFORM_CHAIN, build_strategy
from cfl_bench.strategies.registry import component_classes
from tests.helpers import digits_federation

ROOT = Path(__file__).resolve().parents[1]


class RecordingExecutor(SequentialExecutor):
    """The sequential executor, keeping every job it was given."""

    def __init__(self, inner: SequentialExecutor) -> None:
        super().__init__(inner.trainer)
        self.jobs: list[ClientJob] = []

    def train(self, jobs: Sequence[ClientJob], sink: ResultSink) -> None:
        self.jobs += jobs
        super().train(jobs, sink)


def test_a_round_runs_through_the_executor_with_the_broadcast_in_every_job() -> None:
    fed = digits_federation("der+fedgp", participation=0.5)
    recorder = RecordingExecutor(fed.executor)  # type: ignore[arg-type]
    fed.executor = recorder
    out = fed.run()
    assert out.status == "finished"
    rounds = fed.clock.total_rounds
    assert len(recorder.jobs) == rounds * 2  # two of four clients per round
    later = [job for job in recorder.jobs if job.broadcast.round_index > 1]
    assert later and all("fedgp.gref" in job.broadcast.payloads for job in later)
    ends = [job for job in recorder.jobs if job.broadcast.is_task_end]
    assert ends and all(job.probes is not None for job in ends)  # client spread at task ends
    assert all(job.probes is None for job in recorder.jobs if not job.broadcast.is_task_end)


def test_a_custom_executor_gives_the_same_records_as_the_built_in_one() -> None:
    plain = digits_federation("derpp+fedcurv").run()
    fed = digits_federation("derpp+fedcurv")
    fed.executor = RecordingExecutor(fed.executor)  # type: ignore[arg-type]
    wrapped = fed.run()
    assert [r[:5] for r in plain.records] == [r[:5] for r in wrapped.records]
    values = zip(plain.records, wrapped.records, strict=True)
    assert all(float(a[5]) == float(b[5]) for a, b in values)  # type: ignore[arg-type]


def test_a_client_update_depends_only_on_its_inputs() -> None:
    """Two updates of the same client from the same state and broadcast upload the same."""
    fed = digits_federation("der")
    fed.measure.eval_sets = []
    fed.enter_round(0)
    client = fed.clients[0]
    generator_state = client.generator.get_state()
    saved = copy.deepcopy({k: v for k, v in client.state_dict().items() if k != "generator"})
    broadcast = fed.round_server.open_round()
    trainer = fed.executor.trainer  # type: ignore[attr-defined]
    first = trainer.update(ClientJob(client, broadcast)).upload.params.clone()
    client.load_state_dict({**copy.deepcopy(saved), "generator": client.generator})
    client.generator.set_state(generator_state)
    second = trainer.update(ClientJob(client, broadcast)).upload.params.clone()
    assert torch.equal(first, second)
    assert not torch.equal(first, broadcast.params)  # it did train


class Leaky(Component):
    """A stand-in component that broadcasts a payload it never declared."""

    name = "leaky"

    def broadcast(self, server: object) -> dict[str, torch.Tensor]:  # type: ignore[override]
        return {"leaky.secret": torch.zeros(3)}


def test_an_undeclared_payload_is_refused_not_silently_uncounted() -> None:
    strategy = build_strategy("der")
    strategy.components.append(Leaky())
    fed = digits_federation(strategy)
    fed.enter_round(0)
    fed.server.round_index = 1
    with pytest.raises(RuntimeError, match=r"leaky\.secret.*no component declares it"):
        fed._round(RunOutcome())
    Leaky.payloads = (Payload("leaky.secret", "broadcast"),)
    try:
        fed2 = digits_federation(strategy)
        fed2.enter_round(0)
        fed2.server.round_index = 1
        fed2._round(RunOutcome())
        assert fed2.round_server.comm.by_payload["down:leaky.secret"] == 4 * 3 * 4
    finally:
        Leaky.payloads = ()


def test_no_component_touches_traffic_or_model_versions() -> None:
    """The engine moves and counts payloads: strategies never name the counter or versions."""
    offenders = []
    for path in sorted((ROOT / "strategies").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and node.attr in ("comm", "model_version"):
                offenders.append(f"{path.name}:{node.lineno} .{node.attr}")
    assert offenders == []


def test_the_transform_chain_and_server_order_name_real_components() -> None:
    classes = component_classes()
    transforms = {n for n, c in classes.items() if Role.GRAD_TRANSFORM in c.roles}
    assert transforms == set(TRANSFORM_CHAIN)
    assert set(SERVER_HOOK_ORDER) - {"*"} <= set(classes)
    # The declared places give exactly the orders the names used to list.
    assert TRANSFORM_CHAIN == ("scaffold", "fedproj", "fedgp")
    assert SERVER_HOOK_ORDER == ("scaffold", "ifa", "*", "fedgp")
    both = build_strategy("der+fedgp+ifa+scaffold+fedcurv")
    assert [c.name for c in both.server_hooks] == ["scaffold", "ifa", "der", "fedcurv", "fedgp"]
    assert [c.name for c in both.transforms] == ["scaffold", "fedgp"]
    strategy = build_strategy("fedgp+ifa+fedcurv")
    assert [c.name for c in strategy.server_hooks] == ["ifa", "fedavg", "fedcurv", "fedgp"]
    assert [c.name for c in build_strategy("fedgp+fedproj").transforms] == ["fedproj", "fedgp"]


def test_listed_roles_follow_from_hooks_and_payloads() -> None:
    classes = component_classes()
    assert classes["fedgp"].role_names() == [
        "communication",
        "gradient transform",
        "server schedule",
    ]
    assert classes["ifa"].role_names() == ["server schedule"]
    assert classes["fedcurv"].role_names() == ["communication", "loss term"]
    assert classes["fedproj"].role_names() == [
        "aggregator",
        "communication",
        "gradient transform",
    ]
    assert classes["der"].role_names() == ["learner"]


def test_lr_decay_scales_each_rounds_step_and_one_changes_nothing() -> None:
    """Round r trains with lr·decay^(r−1); decay 1 gives the undecayed run bit for bit."""
    from tests.helpers import digits_federation as federation
    from tests.helpers import first_update

    def update(decay: float, round_index: int) -> torch.Tensor:
        lr, moved = first_update(federation("fedavg", lr_decay=decay), round_index)
        assert lr == pytest.approx(0.05 * decay ** (round_index - 1))
        return moved

    assert torch.equal(update(1.0, 3), update(1.0, 1))
    step = update(0.5, 1)
    assert torch.equal(update(0.5, 1), step)
    assert not torch.equal(update(0.5, 3), step)


def test_dropout_masks_depend_only_on_seed_round_and_client() -> None:
    """A client update reseeds torch's default generator from (seed, round, client), so the
    masks do not depend on what ran before in the process — the property that makes the
    Flower simulation (a process per client) draw the sequential executor's masks."""
    from torch.nn import functional as F

    from cfl_bench.core.seeding import seed_torch_default

    ones = torch.ones(64)
    seed_torch_default(3, "dropout", 2, 5)
    first = F.dropout(ones, 0.5, training=True)
    torch.rand(1000)  # another client's draws in between
    seed_torch_default(3, "dropout", 2, 5)
    assert torch.equal(F.dropout(ones, 0.5, training=True), first)
    seed_torch_default(3, "dropout", 2, 6)
    assert not torch.equal(F.dropout(ones, 0.5, training=True), first)


def test_a_client_update_sums_its_first_epochs_step_losses_apart() -> None:
    """``LocalRound.first_epoch_loss`` (LANDER's best-model criterion): with one batch an
    epoch and lr 0, both epochs' steps have the same loss, so the first epoch's sum is half
    the round's; with one epoch it is the round's."""
    from cfl_bench.core.context import LocalRound

    seen: list[LocalRound] = []

    class Spy(Component):
        name = "spy"

        def after_local(self, client, upload, local):  # type: ignore[no-untyped-def]
            seen.append(local)

    for epochs in (2, 1):
        strategy = build_strategy("fedavg")
        strategy.components.append(Spy())
        fed = digits_federation(strategy, epochs=epochs, lr=1e-30, batch_size=10_000)
        fed.enter_round(0)
        trainer = fed.executor.trainer  # type: ignore[attr-defined]
        result = trainer.update(ClientJob(fed.clients[0], fed.round_server.make_broadcast()))
        first = seen[-1].first_epoch_loss
        assert first is not None and result.steps == epochs
        assert first.item() == pytest.approx(result.loss_sum.item() / epochs, rel=1e-6)
