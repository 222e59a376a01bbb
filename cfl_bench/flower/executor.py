"""``FlowerExecutor``: the engine's ``Executor`` protocol over a Flower ``Grid``.

Client ``k`` of the run is the SuperNode whose node config says ``partition-id=K`` with
K = k (fixed for the run: a node keeps its client's state, named by a token, ``node_work``).
A simulation numbers its SuperNodes 0..N-1 itself; in a deployment each SuperNode is started
with ``--node-config partition-id=K``. The server learns which node is which from one
``query.identify`` phase before the first message (inside round 1, like the start-up). Each
phase pushes its messages and pulls the replies every 0.2 s in a deployment, 0.01 s in a
simulation (``send_and_receive`` sleeps 3 s between pulls in a deployment): ``train`` for a
round's jobs, ``query.request`` for a ``ClientRequest``, ``query.task_end`` for the learner's
task-end work. Replies are handed to the engine in the jobs' order (client-id order), so
aggregation sums in the sequential executor's order and the records are the same. After
each reply the engine's own ``ClientState`` (the mirror that buffer drift, request planning
and checkpoints read) is set to the node's state.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch
from flwr.app import ConfigRecord, Message, RecordDict
from flwr.serverapp import Grid

from cfl_bench.core.context import ClientState
from cfl_bench.core.payloads import ClientRequest
from cfl_bench.engine.client_update import ClientJob, ClientResult
from cfl_bench.engine.executor import AnswerSink, ResultSink
from cfl_bench.flower import records
from cfl_bench.flower.records import STALE, STATE, TOKEN_KEY
from cfl_bench.strategies.base import Learner

#: Seconds between pulls of a phase's replies: a simulation's grid is in this process (a pull
#: is a lookup); a deployment's is HTTP to the SuperLink (each pull costs it CPU).
IN_MEMORY_POLL_S = 0.01
HTTP_POLL_S = 0.2


def poll_seconds(grid: Grid) -> float:
    """How often to pull replies from ``grid``."""
    from flwr.superlink.grid.inmemory_grid import InMemoryGrid

    return IN_MEMORY_POLL_S if isinstance(grid, InMemoryGrid) else HTTP_POLL_S


def result_of(job: ClientJob, content: RecordDict) -> ClientResult:
    """The ``ClientResult`` a train reply carries; the job's client (the mirror) is set to
    the node's state."""
    client, device = job.client, job.broadcast.device
    facts = content.config_records["cfl.result"]
    if records.config_int(facts, "client") != client.index:
        raise RuntimeError(f"client {client.index}'s reply came from another client")
    records.load_state(content.array_records["cfl.mirror"], client, keep_version=True)
    upload = records.upload_of(
        content.array_records["cfl.upload"],
        client.index,
        records.config_int(facts, "num_samples"),
        device,
    )
    metrics = content.array_records["cfl.metrics"]
    result = ClientResult(
        client,
        upload,
        records.tensor_of(metrics["loss_sum"], device),
        records.config_int(facts, "steps"),
        records.config_float(facts, "train_seconds"),
    )
    if "probe_accuracy" in metrics:
        result.probe_accuracy = records.tensor_of(metrics["probe_accuracy"], device)
    if "class_accuracy" in metrics:  # --diagnostics
        result.class_accuracy = records.tensor_of(metrics["class_accuracy"], device)
        result.weight_divergence = records.tensor_of(metrics["weight_divergence"], device)
    return result


def stated(content: RecordDict, client: ClientState, token: str) -> RecordDict:
    """``content`` naming the client's state: its ``token``, or (none known) the state."""
    facts = ConfigRecord({**content.config_records["cfl.round"], TOKEN_KEY: token})
    named = RecordDict({**content, "cfl.round": facts})  # a new record: Flower caches ids
    if not token:
        named[STATE] = records.state_bytes(client.state_dict())
    return named


class FlowerExecutor:
    """Client updates as Flower messages to one simulated SuperNode per client."""

    def __init__(
        self,
        grid: Grid,
        num_clients: int,
        learner: Learner,
        wait_s: float = 600.0,
        poll_s: float | None = None,
    ) -> None:
        self.grid = grid
        self.num_clients = num_clients
        self.nodes: list[int] = []  # node id of client k, known after the identify phase
        self.learner = learner
        self.phase = 0
        self.round_index = 0
        self.wait_s = wait_s
        self.poll_s = poll_seconds(grid) if poll_s is None else poll_s
        self.tokens: dict[int, str] = {}  # client → the state token its node last replied

    def _connected(self) -> list[int]:
        """The node ids once at least ``num_clients`` SuperNodes are connected (a deployment's
        SuperNodes may still be starting when the run begins)."""
        deadline = time.monotonic() + self.wait_s
        while len(nodes := sorted(self.grid.get_node_ids())) < self.num_clients:
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"{self.num_clients} clients need as many SuperNodes; {len(nodes)} "
                    f"connected within {self.wait_s:.0f} s"
                )
            time.sleep(1.0)
        return nodes

    def _identify(self) -> None:
        """Map client k to the node whose ``partition-id`` is k (one ``query.identify``)."""
        nodes = self._connected()
        self.phase += 1
        messages = [
            Message(
                content=RecordDict(), dst_node_id=n, message_type="query.identify", group_id="0"
            )
            for n in nodes
        ]
        owner: dict[int, int] = {}
        for reply in self._push_pull(messages).values():
            if reply.has_error():
                raise RuntimeError(f"a Flower ClientApp failed on identify: {reply.error.reason}")
            k = records.config_int(reply.content.config_records["cfl.node"], "partition-id")
            if k in owner:
                raise RuntimeError(f"two SuperNodes say partition-id={k}; give each its own")
            owner[k] = reply.metadata.src_node_id
        missing = [k for k in range(self.num_clients) if k not in owner]
        if missing:
            raise RuntimeError(
                f"no SuperNode has partition-id={missing[0]}: start one SuperNode per client "
                f"with --node-config partition-id=K for K = 0..{self.num_clients - 1}"
            )
        self.nodes = [owner[k] for k in range(self.num_clients)]

    def _exchange(self, contents: list[tuple[ClientState, RecordDict]], kind: str) -> list[Message]:
        """Send one message per (client, content); replies in the same order. A node that
        does not hold the state the server last saw for its client (``node_work``: a
        restarted worker, a resumed run) answers stale; its message goes again with the
        server's mirror of the client's state."""
        if not self.nodes:
            self._identify()
        replies = self._phase(
            [(c, stated(m, c, self.tokens.get(c.index, ""))) for c, m in contents], kind
        )
        stale = [i for i, reply in enumerate(replies) if STALE in reply.content]
        if stale:
            for i in stale:
                self.tokens.pop(contents[i][0].index, None)
            again = self._phase(
                [
                    (c, stated(m, c, self.tokens.get(c.index, "")))
                    for c, m in (contents[i] for i in stale)
                ],
                kind,
            )
            for i, reply in zip(stale, again, strict=True):
                if STALE in reply.content:
                    raise RuntimeError(f"client {contents[i][0].index}'s node refused its state")
                replies[i] = reply
        for (client, _), reply in zip(contents, replies, strict=True):
            self.tokens[client.index] = str(reply.content.config_records["cfl.held"][TOKEN_KEY])
        return replies

    def _push_pull(self, messages: list[Message]) -> dict[int, Message]:
        """Push ``messages``; pull until every one has its reply; replies by node id."""
        waiting = set(self.grid.push_messages(messages))
        by_node: dict[int, Message] = {}
        while waiting:
            for reply in self.grid.pull_messages(waiting):
                waiting.discard(reply.metadata.reply_to_message_id)
                by_node[reply.metadata.src_node_id] = reply
            if waiting:
                time.sleep(self.poll_s)
        return by_node

    def _phase(self, contents: list[tuple[ClientState, RecordDict]], kind: str) -> list[Message]:
        """One message phase: push every message, pull the replies every ``poll_s`` (not
        ``send_and_receive``, which sleeps 3 s between pulls in a deployment); replies in
        the order of ``contents``, errors raised."""
        self.phase += 1
        group = str(self.phase)
        messages = [
            Message(
                content=content, dst_node_id=self.nodes[c.index], message_type=kind, group_id=group
            )
            for c, content in contents
        ]
        by_node = self._push_pull(messages)
        ordered = []
        for c, _ in contents:
            reply = by_node.get(self.nodes[c.index])
            if reply is None:
                raise RuntimeError(f"a Flower {kind} message got no reply")
            if reply.has_error():
                raise RuntimeError(f"a Flower ClientApp failed on {kind}: {reply.error.reason}")
            ordered.append(reply)
        return ordered

    def train(self, jobs: Sequence[ClientJob], sink: ResultSink) -> None:
        if jobs:  # a request after this round plans with the round's index
            self.round_index = jobs[0].broadcast.round_index
        contents = [(job.client, self._job_content(job)) for job in jobs]
        for job, reply in zip(jobs, self._exchange(contents, "train"), strict=True):
            sink(result_of(job, reply.content))

    def _job_content(self, job: ClientJob) -> RecordDict:
        b = job.broadcast
        content = RecordDict(
            {
                "cfl.broadcast": records.model_record(b.params, b.buffers, b.payloads),
                "cfl.round": records.round_record(b, job.client.index, job.client.task),
            }
        )
        if job.probes is not None:
            content["cfl.probes"] = records.probes_record(job.probes)
        if job.diagnose is not None:
            content["cfl.diagnose"] = records.probes_record([job.diagnose])
        return content

    def _at_global(
        self, client: ClientState, global_state: tuple[torch.Tensor, torch.Tensor], facts: dict
    ) -> RecordDict:
        params, buffers = global_state
        facts = {"client": client.index, "client_task": client.task, **facts}
        return RecordDict(
            {
                "cfl.broadcast": records.model_record(params, buffers, {}),
                "cfl.round": ConfigRecord(facts),
            }
        )

    def answer(
        self,
        request: ClientRequest,
        global_state: tuple[torch.Tensor, torch.Tensor],
        sink: AnswerSink,
    ) -> None:
        device = global_state[0].device
        facts = {
            "payload": request.payload,
            "train_mode": request.train_mode,
            "round_index": request.round_index,
        }
        contents = [(c, self._at_global(c, global_state, facts)) for c in request.clients]
        replies = self._exchange(contents, "query.request")
        for client, reply in zip(request.clients, replies, strict=True):
            records.load_state(reply.content.array_records["cfl.mirror"], client, True)
            answer = reply.content.array_records["cfl.answer"]["answer"]
            sink(client, records.tensor_of(answer, device))

    def end_tasks(
        self, ending: list[tuple[ClientState, int]], global_state: tuple[torch.Tensor, torch.Tensor]
    ) -> None:
        # A learner without task-end work (the base hook) needs no message phase.
        if not ending or type(self.learner).on_task_end is Learner.on_task_end:
            return
        contents = [(c, self._at_global(c, global_state, {"task": t})) for c, t in ending]
        for (client, _), reply in zip(
            ending, self._exchange(contents, "query.task_end"), strict=True
        ):
            records.load_state(reply.content.array_records["cfl.mirror"], client, True)
