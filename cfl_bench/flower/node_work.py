"""The client side of a Flower node: what a message asks of the node's client, computed with
the engine's own client pieces. Torch lives here, never in the ClientApp module.

Who calls it: the ClientApp itself when the node has no worker (a simulation: one Ray actor
holds the pieces for the run), or the node's long-lived worker (``flower.node_worker``) that
the ClientApp hands each message to in a deployment.

Per process, the run's pieces (stream, strategy, model, trainer) are built once from the run
configuration (``plan.plan_run``: the same code, seed and validation as the server) and
cached; the node loads its training shard itself from the run's stream and task split (the
same deterministic gather ``ClientData.assign`` does on the server), so no data travels.

The client's state and the *state token*. A node keeps its client's ``ClientState`` between
messages in a :class:`StateHolder`: ``context.state`` (a ``torch.save`` image, for the
ClientApp in a Ray actor) or nowhere but the process (a worker); either way the process's
own client object is used as it is when it holds the named state (``ClientRuntime.live``:
no image is loaded; in a Ray actor that is a cache per partition). Every reply carries a
new random token naming the state the node now holds (and the state itself, ``cfl.mirror``,
which the server's mirror loads). The server sends the token it last saw with each message;
when the server has none (a run's first message to the client, a resumed run) it sends its
mirror's state instead (``cfl.state``). A node that holds another token (a restarted worker,
a state lost with a SuperNode) computes nothing and answers ``cfl.stale``; the server then
sends the state. So a node never trains from a state the server does not know.

Messages: ``train`` (one ``ClientJob``), ``query.request`` (a ``ClientRequest`` at θ_g:
FedGP's reference gradient), ``query.task_end`` (the learner's task-end work at θ_g).
"""

from __future__ import annotations

import functools
import json
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from flwr.app import ArrayRecord, ConfigRecord, RecordDict

from cfl_bench.core.context import ClientState
from cfl_bench.core.flat import FlatModel
from cfl_bench.core.seeding import seed_torch_default
from cfl_bench.engine.client_data import ClientData
from cfl_bench.engine.client_update import ClientJob, LocalTrainer
from cfl_bench.engine.loop import build_trainer, new_clients
from cfl_bench.flower import records
from cfl_bench.flower.records import STALE, STATE, TOKEN_KEY


class StateHolder(Protocol):
    """Where a node keeps its client's state between messages."""

    def token(self, client: int) -> str:
        """The token of the state held for ``client`` ("" when none)."""
        ...

    def restore(self, client: ClientState) -> None:
        """Make ``client`` the held state (its token matched)."""
        ...

    def keep(self, client: int, image: ArrayRecord, token: str) -> None:
        """Hold ``image`` (the client's state after a message) under ``token``."""
        ...

    def drop(self, client: int) -> None:
        """Hold nothing valid for ``client`` (a message failed half-way through it)."""
        ...


class ContextState:
    """The state in Flower's ``context.state`` (a simulation's SuperNode keeps it for the
    run): the ``torch.save`` image and its token."""

    def __init__(self, state: Any) -> None:
        self.state = state

    def token(self, client: int) -> str:
        held = self.state.get("cfl.node")
        if held is None or int(held["client"]) != client:
            return ""
        return str(held[TOKEN_KEY])

    def restore(self, client: ClientState) -> None:
        records.load_state(self.state["cfl.client"], client)

    def keep(self, client: int, image: ArrayRecord, token: str) -> None:
        self.state["cfl.client"] = image
        self.state["cfl.node"] = ConfigRecord({"client": client, TOKEN_KEY: token})

    def drop(self, client: int) -> None:
        """Nothing to do: a failed message never changed the image in ``context.state``."""


class Nowhere:
    """No state beyond the process: a worker's clients live in its runtime (``live``)."""

    def token(self, client: int) -> str:
        return ""

    def restore(self, client: ClientState) -> None:
        raise AssertionError("nothing is held here to restore")

    def keep(self, client: int, image: ArrayRecord, token: str) -> None:
        """The runtime's live object is the state; nothing else to keep."""

    def drop(self, client: int) -> None:
        """Nothing held."""


class StaleStateError(Exception):
    """The node does not hold the state the server named; the server must send it."""


@dataclass
class ClientRuntime:
    """The run's client-side pieces in this process."""

    trainer: LocalTrainer
    data: ClientData
    fresh: list[ClientState]
    device: torch.device
    # client → the token of the state its object in ``fresh`` holds now (this process's own
    # copy: a worker's only one, a Ray actor's cache beside ``context.state``)
    live: dict[int, str] = field(default_factory=dict)

    def client(self, content: RecordDict, partition: int, holder: StateHolder) -> ClientState:
        """The message's client in the state the server names (see the module docstring)."""
        facts = content.config_records["cfl.round"]
        index = records.config_int(facts, "client")
        if partition != index:  # the server maps clients by partition-id
            raise RuntimeError(f"node partition-id={partition} got client {index}")
        client = self.fresh[index]
        sent, wanted = content.array_records.get(STATE), str(facts[TOKEN_KEY])
        if sent is not None:
            records.load_state(sent, client)
        elif wanted and self.live.get(index) == wanted:
            pass  # this process left the client in that state
        elif wanted and holder.token(index) == wanted:
            holder.restore(client)
        else:
            raise StaleStateError
        self.load_shard(client, records.config_int(facts, "client_task"))
        return client

    def keep(self, client: ClientState, holder: StateHolder) -> dict[str, Any]:
        """Hold ``client``'s state under a new token; the reply's records for the server."""
        image = records.state_bytes(client.state_dict())
        token = uuid.uuid4().hex
        self.live[client.index] = token
        holder.keep(client.index, image, token)
        return {"cfl.mirror": image, "cfl.held": ConfigRecord({TOKEN_KEY: token})}

    def load_shard(self, client: ClientState, task: int) -> None:
        """The client's part of ``task`` (what ``ClientData.assign`` gives it), after the
        public holdouts of the tasks up to it reached the client-side components."""
        data = self.data
        train = data.live_tasks.get(task) or data.stream.task_train(task)
        data.live_tasks[task] = train
        self.deliver_holdouts(task)
        split = data.split(task, len(self.fresh))
        data.assign(client, task, train.train_x, train.train_y, split.parts)

    def deliver_holdouts(self, task: int) -> None:
        """``on_task_start`` of the client-side components for every task up to ``task``
        not yet started here, with the task's public holdout (FedProj's memory is the
        union of the holdouts seen so far; a public set is available to every client
        beforehand, so nothing travels). In task order, as the engine does on the server."""
        data = self.data
        for t in range(task + 1):
            if t in data.started_tasks:
                continue
            data.started_tasks.add(t)
            held = data.split(t, len(self.fresh)).held
            holdout = None
            if held is not None:
                train = data.live_tasks.get(t) or data.stream.task_train(t)
                stored = train.train_x[held.to(train.train_x.device)]
                holdout = data.stream.as_model_input(stored)
            for component in self.trainer.strategy.all:
                # A node has no server state; the hook types its first argument ServerState
                # (strategies/base.py) though public-set components, its only users, take
                # any object. To go when the hook's type says ``ServerState | None``.
                component.on_task_start(None, t, holdout)  # type: ignore[arg-type]

    def at_global(self, content: RecordDict, train_mode: bool) -> None:
        """Load the θ_g ``content`` carries into the working model, in the given mode."""
        params, buffers, _ = records.model_of(content.array_records["cfl.broadcast"], self.device)
        self.trainer.model.load(params, buffers)
        self.trainer.model.module.train(train_mode)


def config_text(run_config: Mapping[str, Any]) -> str:
    """The run configuration (JSON) from the app's run config: a file path or the text."""
    path = str(run_config.get("cfl-config", ""))
    if path:
        with open(path) as f:
            return f.read()
    return str(run_config["cfl-config-json"])


@functools.lru_cache(maxsize=2)
def runtime(text: str) -> ClientRuntime:
    """Build the run's client side from its configuration (once per process and run; the
    two latest runs are kept, so a worker serving run after run does not grow)."""
    from cfl_bench.runner.config import RunConfig
    from cfl_bench.runner.plan import plan_run

    config = RunConfig(**json.loads(text))
    plan = plan_run(config)
    torch.set_num_threads(1)  # one CPU per Ray actor or node worker (docs/executors.md)
    s, device = plan.schedule, plan.device
    trainer = build_trainer(FlatModel(plan.model.to(device)), plan.strategy, s, plan.stream)
    data = ClientData(
        plan.stream, plan.partitioner, plan.strategy, s.clock(), s.seed, device, plan.splits
    )
    # A node trains its one client with the sequential trainer: per-client buffers.
    fresh = new_clients(plan.stream, s, plan.strategy.needs_buffer, device)
    return ClientRuntime(trainer, data, fresh, device)


def train(rt: ClientRuntime, content: RecordDict, client: ClientState) -> dict[str, Any]:
    """One client update (``LocalTrainer.update``) from the broadcast in ``content``."""
    facts = content.config_records["cfl.round"]
    broadcast = records.broadcast_of(content.array_records["cfl.broadcast"], facts, rt.device)
    probes_rec = content.array_records.get("cfl.probes")
    probes = None if probes_rec is None else records.probes_of(probes_rec, rt.device)
    diagnose_rec = content.array_records.get("cfl.diagnose")  # --diagnostics
    diagnose = None if diagnose_rec is None else records.probes_of(diagnose_rec, rt.device)[0]
    result = rt.trainer.update(ClientJob(client, broadcast, probes, diagnose))
    metrics = {"loss_sum": records.array_of(result.loss_sum)}
    for name in ("probe_accuracy", "class_accuracy", "weight_divergence"):
        value = getattr(result, name)
        if value is not None:
            metrics[name] = records.array_of(value)
    return {
        "cfl.upload": records.upload_record(result.upload),
        "cfl.metrics": ArrayRecord(array_dict=metrics),
        "cfl.result": ConfigRecord(
            {
                "client": client.index,
                "num_samples": result.upload.num_samples,
                "steps": result.steps,
                "train_seconds": result.train_seconds,
            }
        ),
    }


def request(rt: ClientRuntime, content: RecordDict, client: ClientState) -> dict[str, Any]:
    """A ``ClientRequest`` at θ_g. The computation is the owning component's client half,
    ``answer_request`` for the payload (the server sends only the payload name: code does
    not travel, and the client builds no server state)."""
    facts = content.config_records["cfl.round"]
    rt.at_global(content, bool(facts["train_mode"]))
    model = rt.trainer.model
    name = str(facts["payload"])
    owners = [
        component
        for component in rt.trainer.strategy.all
        if any(p.name == name and p.producer == "request" for p in component.payloads)
    ]
    if not owners:
        raise RuntimeError(f"client {client.index} cannot compute request {name!r}")
    seed = rt.trainer.steps.seed
    seed_torch_default(
        seed, "dropout-request", records.config_int(facts, "round_index"), client.index
    )
    answer = owners[0].answer_request(name, client, model)
    model.module.train(True)
    return {"cfl.answer": ArrayRecord(array_dict={"answer": records.array_of(answer)})}


def task_end(rt: ClientRuntime, content: RecordDict, client: ClientState) -> dict[str, Any]:
    """The learner's task-end work at θ_g (eval mode), as ``SequentialExecutor.end_tasks``."""
    rt.at_global(content, False)
    task = records.config_int(content.config_records["cfl.round"], "task")
    rt.trainer.strategy.learner.on_task_end(client, task, rt.trainer.model)
    rt.trainer.model.module.train()
    return {}


Work = Callable[[ClientRuntime, RecordDict, ClientState], dict[str, Any]]

#: What each message type asks of the node's client.
WORK: dict[str, Work] = {"train": train, "query.request": request, "query.task_end": task_end}


def handle(
    kind: str,
    content: RecordDict,
    run_config: Mapping[str, Any],
    partition: int,
    holder: StateHolder,
) -> RecordDict:
    """The reply content to a message of type ``kind`` for the node playing ``partition``."""
    rt = runtime(config_text(run_config))
    try:
        client = rt.client(content, partition, holder)
    except StaleStateError:
        return RecordDict({STALE: ConfigRecord({"client": partition})})
    rt.live.pop(client.index, None)  # the live state changes from here on
    holder.drop(client.index)
    reply = WORK[kind](rt, content, client)
    return RecordDict({**reply, **rt.keep(client, holder)})
