"""The ClientApp: one simulated SuperNode per client, running the engine's client update.

A node holds its client's ``ClientState`` in ``context.state`` (``cfl.client``, a
``torch.save`` image) between messages, and loads its training shard itself from the run's
stream and task split (the same deterministic gather ``ClientData.assign`` does on the
server), so no data travels. Per process, the run's pieces (stream, strategy, model,
trainer) are built once from the run configuration (``plan.plan_run``: the same code, seed and
validation as the server) and cached.

The run configuration is the app's run config: ``cfl-config`` (a file path: the simulation
``--executor flower`` starts on this machine) or ``cfl-config-json`` (the configuration
itself: an app folder written by ``cfl-bench flower app`` for a deployment, where the
SuperNodes may run on other machines).

Messages: ``query.identify`` (the node's ``partition-id``), ``train`` (one ``ClientJob``),
``query.request`` (a ``ClientRequest`` at θ_g: FedGP's reference gradient),
``query.task_end`` (the learner's task-end work at θ_g).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

from cfl_bench.engine.client_data import ClientData
from cfl_bench.engine.client_update import ClientJob, LocalTrainer
from cfl_bench.engine.context import ClientState
from cfl_bench.engine.loop import build_trainer, new_clients
from cfl_bench.flat import FlatModel
from cfl_bench.flower import records
from cfl_bench.seeding import seed_torch_default

app = ClientApp()


@dataclass
class ClientRuntime:
    """The run's client-side pieces in this process."""

    trainer: LocalTrainer
    data: ClientData
    fresh: list[ClientState]
    device: torch.device

    def client(self, index: int, context: Context) -> ClientState:
        """Client ``index`` as its node holds it (its initial state on the first message)."""
        if partition_id(context) != index:  # the server maps clients by partition-id
            raise RuntimeError(f"node partition-id={partition_id(context)} got client {index}")
        client = self.fresh[index]
        held = context.state.get("cfl.client")
        if held is not None:
            records.load_state(held, client)
        return client

    def keep(self, client: ClientState, context: Context) -> ArrayRecord:
        """Store ``client``'s state on its node; returns the same image for the mirror."""
        image = records.state_bytes(client.state_dict())
        context.state["cfl.client"] = image
        return image

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
                component.on_task_start(None, t, holdout)  # type: ignore[arg-type]


def config_text(context: Context) -> str:
    """The run configuration (JSON) from the run config: a file path or the text itself."""
    path = str(context.run_config.get("cfl-config", ""))
    if path:
        with open(path) as f:
            return f.read()
    return str(context.run_config["cfl-config-json"])


def partition_id(context: Context) -> int:
    """This node's ``partition-id`` (set by the simulation, or ``--node-config``), or -1."""
    return int(context.node_config.get("partition-id", -1))


def runtime_of(context: Context) -> ClientRuntime:
    return runtime(config_text(context))


@functools.cache
def runtime(text: str) -> ClientRuntime:
    """Build the run's client side from its configuration (once per process)."""
    from cfl_bench.config import RunConfig
    from cfl_bench.plan import plan_run

    config = RunConfig(**json.loads(text))
    plan = plan_run(config)
    torch.set_num_threads(1)  # one CPU per Ray actor (docs/executors.md)
    s, device = plan.schedule, plan.device
    trainer = build_trainer(FlatModel(plan.model.to(device)), plan.strategy, s, plan.stream)
    data = ClientData(
        plan.stream, plan.partitioner, plan.strategy, s.clock(), s.seed, device, plan.splits
    )
    # A node trains its one client with the sequential trainer: per-client buffers.
    fresh = new_clients(plan.stream, s, plan.strategy.needs_buffer, device)
    return ClientRuntime(trainer, data, fresh, device)


def reply_to(msg: Message, content: RecordDict) -> Message:
    return Message(content=content, reply_to=msg)


@app.query("identify")
def identify(msg: Message, context: Context) -> Message:
    """Which client this node plays: its ``partition-id`` (-1 when it has none)."""
    return reply_to(
        msg, RecordDict({"cfl.node": ConfigRecord({"partition-id": partition_id(context)})})
    )


@app.train()
def train(msg: Message, context: Context) -> Message:
    """One client update (``LocalTrainer.update``) from the broadcast in ``msg``."""
    rt = runtime_of(context)
    facts = msg.content.config_records["cfl.round"]
    client = rt.client(int(facts["client"]), context)
    rt.load_shard(client, int(facts["client_task"]))
    broadcast = records.broadcast_of(msg.content.array_records["cfl.broadcast"], facts, rt.device)
    probes_rec = msg.content.array_records.get("cfl.probes")
    probes = None if probes_rec is None else records.probes_of(probes_rec, rt.device)
    result = rt.trainer.update(ClientJob(client, broadcast, probes))
    metrics = {"loss_sum": records.array_of(result.loss_sum)}
    if result.probe_accuracy is not None:
        metrics["probe_accuracy"] = records.array_of(result.probe_accuracy)
    content = RecordDict(
        {
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
            "cfl.mirror": rt.keep(client, context),
        }
    )
    return reply_to(msg, content)


def at_global(rt: ClientRuntime, msg: Message, train_mode: bool) -> tuple[torch.Tensor, ...]:
    """Load the θ_g ``msg`` carries into the working model, in the given mode."""
    params, buffers, _ = records.model_of(msg.content.array_records["cfl.broadcast"], rt.device)
    rt.trainer.model.load(params, buffers)
    rt.trainer.model.module.train(train_mode)
    return params, buffers


@app.query("request")
def request(msg: Message, context: Context) -> Message:
    """A ``ClientRequest`` at θ_g. The computation is the owning component's client half,
    ``answer_request`` for the payload (the server sends only the payload name: code does
    not travel, and the client builds no server state)."""
    rt = runtime_of(context)
    facts = msg.content.config_records["cfl.round"]
    client = rt.client(int(facts["client"]), context)
    rt.load_shard(client, int(facts["client_task"]))
    at_global(rt, msg, bool(facts["train_mode"]))
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
    seed_torch_default(seed, "dropout-request", int(facts["round_index"]), client.index)
    answer = owners[0].answer_request(name, client, model)
    model.module.train(True)
    content = RecordDict(
        {
            "cfl.answer": ArrayRecord(array_dict={"answer": records.array_of(answer)}),
            "cfl.mirror": rt.keep(client, context),
        }
    )
    return reply_to(msg, content)


@app.query("task_end")
def task_end(msg: Message, context: Context) -> Message:
    """The learner's task-end work at θ_g (eval mode), as ``SequentialExecutor.end_tasks``."""
    rt = runtime_of(context)
    facts = msg.content.config_records["cfl.round"]
    client = rt.client(int(facts["client"]), context)
    rt.load_shard(client, int(facts["client_task"]))
    at_global(rt, msg, False)
    rt.trainer.strategy.learner.on_task_end(client, int(facts["task"]), rt.trainer.model)
    rt.trainer.model.module.train()
    return reply_to(msg, RecordDict({"cfl.mirror": rt.keep(client, context)}))
