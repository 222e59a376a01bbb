"""The ClientApp: one SuperNode per client. It imports no torch.

Why: Flower (1.21 and later) starts a new ``flwr-clientapp`` process for every message. A
ClientApp that imported torch and rebuilt the run's client side would pay seconds per
message. So the app is a thin shim:

- on a SuperNode started by ``cfl-bench flower node`` (its node config names
  ``cfl-worker``, a local socket), each message is handed to that node's long-lived worker
  (``flower.node_worker``), which holds torch, the node's data and its client's state across
  messages and runs;
- elsewhere (a simulation's Ray actor, which lives for the run; or a SuperNode started
  without a worker) the message is computed in this process (``flower.node_work``), the
  client's state kept in ``context.state``.

Either way the work is ``node_work.handle``. ``query.identify`` (which client this node
plays: its ``partition-id``) is answered here.
"""

from __future__ import annotations

from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

from cfl_bench.flower import wire

app = ClientApp()


def partition_id(context: Context) -> int:
    """This node's ``partition-id`` (set by the simulation, or ``--node-config``), or -1."""
    return int(context.node_config.get("partition-id", -1))


def answer(kind: str, msg: Message, context: Context) -> Message:
    """The reply to ``msg``, computed by the node's worker or in this process."""
    partition = partition_id(context)
    worker = str(context.node_config.get("cfl-worker", ""))
    if worker:
        run_config = dict(context.run_config)
        outcome, value = wire.call(worker, (kind, msg.content, run_config, partition))
        if outcome != "ok":
            raise RuntimeError(f"the node's worker failed: {value}")
        content = value
    else:
        from cfl_bench.flower import node_work  # torch: in this process, once per actor

        holder = node_work.ContextState(context.state)
        content = node_work.handle(kind, msg.content, context.run_config, partition, holder)
    return Message(content=content, reply_to=msg)


@app.query("identify")
def identify(msg: Message, context: Context) -> Message:
    """Which client this node plays: its ``partition-id`` (-1 when it has none)."""
    node = ConfigRecord({"partition-id": partition_id(context)})
    return Message(content=RecordDict({"cfl.node": node}), reply_to=msg)


@app.train()
def train(msg: Message, context: Context) -> Message:
    return answer("train", msg, context)


@app.query("request")
def request(msg: Message, context: Context) -> Message:
    return answer("query.request", msg, context)


@app.query("task_end")
def task_end(msg: Message, context: Context) -> Message:
    return answer("query.task_end", msg, context)
