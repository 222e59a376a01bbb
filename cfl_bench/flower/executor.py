"""``FlowerExecutor``: the engine's ``Executor`` protocol over a Flower ``Grid``.

Client ``k`` of the run is the ``k``-th SuperNode by node id (fixed for the run: a node
keeps its client's state in ``context.state``). Each phase is one ``send_and_receive``:
``train`` for a round's jobs, ``query.request`` for a ``ClientRequest``, ``query.task_end``
for the learner's task-end work. Replies are handed to the engine in the jobs' order
(client-id order), so aggregation sums in the sequential executor's order and the records
are the same. After each reply the engine's own ``ClientState`` (the mirror that buffer
drift, request planning and checkpoints read) is set to the node's state.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from flwr.app import ConfigRecord, Message, RecordDict
from flwr.serverapp import Grid

from cfl_bench.engine.client_update import ClientJob, ClientResult
from cfl_bench.engine.context import ClientState
from cfl_bench.engine.executor import AnswerSink, ResultSink
from cfl_bench.engine.payloads import ClientRequest
from cfl_bench.flower import records
from strategies.base import Component, Learner


class FlowerExecutor:
    """Client updates as Flower messages to one simulated SuperNode per client."""

    def __init__(self, grid: Grid, num_clients: int, learner: Component) -> None:
        nodes = sorted(grid.get_node_ids())
        if len(nodes) < num_clients:
            raise RuntimeError(f"{num_clients} clients need as many SuperNodes, got {len(nodes)}")
        self.grid = grid
        self.nodes = nodes[:num_clients]
        self.learner = learner
        self.phase = 0
        self.round_index = 0

    def _exchange(self, contents: list[tuple[int, RecordDict]], kind: str) -> list[Message]:
        """Send one message per (client, content); replies in the same order."""
        self.phase += 1
        group = str(self.phase)
        messages = [
            Message(content=content, dst_node_id=self.nodes[k], message_type=kind, group_id=group)
            for k, content in contents
        ]
        replies = list(self.grid.send_and_receive(messages))
        by_node = {reply.metadata.src_node_id: reply for reply in replies}
        ordered = []
        for k, _ in contents:
            reply = by_node.get(self.nodes[k])
            if reply is None:
                raise RuntimeError(f"a Flower {kind} message got no reply")
            if reply.has_error():
                raise RuntimeError(f"a Flower ClientApp failed on {kind}: {reply.error.reason}")
            ordered.append(reply)
        return ordered

    def train(self, jobs: Sequence[ClientJob], sink: ResultSink) -> None:
        if jobs:  # a request after this round plans with the round's index
            self.round_index = jobs[0].broadcast.round_index
        contents = [(job.client.index, self._job_content(job)) for job in jobs]
        for job, reply in zip(jobs, self._exchange(contents, "train"), strict=True):
            sink(self._result(job, reply.content))

    def _job_content(self, job: ClientJob) -> RecordDict:
        b = job.broadcast
        if job.diagnose is not None:
            raise RuntimeError("--diagnostics is not supported with --executor flower")
        content = RecordDict(
            {
                "cfl.broadcast": records.model_record(b.params, b.buffers, b.payloads),
                "cfl.round": records.round_record(b, job.client.index, job.client.task),
            }
        )
        if job.probes is not None:
            content["cfl.probes"] = records.probes_record(job.probes)
        return content

    def _result(self, job: ClientJob, content: RecordDict) -> ClientResult:
        client, device = job.client, job.broadcast.device
        facts = content.config_records["cfl.result"]
        if int(facts["client"]) != client.index:
            raise RuntimeError(f"client {client.index}'s reply came from another client")
        records.load_state(content.array_records["cfl.mirror"], client, keep_version=True)
        upload = records.upload_of(
            content.array_records["cfl.upload"], client.index, int(facts["num_samples"]), device
        )
        metrics = content.array_records["cfl.metrics"]
        result = ClientResult(
            client,
            upload,
            records.tensor_of(metrics["loss_sum"], device),
            int(facts["steps"]),
            float(facts["train_seconds"]),
        )
        if "probe_accuracy" in metrics:
            result.probe_accuracy = records.tensor_of(metrics["probe_accuracy"], device)
        return result

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
        contents = [(c.index, self._at_global(c, global_state, facts)) for c in request.clients]
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
        contents = [(c.index, self._at_global(c, global_state, {"task": t})) for c, t in ending]
        for (client, _), reply in zip(
            ending, self._exchange(contents, "query.task_end"), strict=True
        ):
            records.load_state(reply.content.array_records["cfl.mirror"], client, True)
