"""The server side of a round (docs/architecture.md, "One round"): sample, broadcast,
receive, aggregate, hooks.

Why one unit that owns the traffic counter and the model versions: every byte that crosses
the network passes through ``send`` / ``receive`` / ``ask`` here, counted from the real
tensors, and components only declare what they send (``core.payloads``). The client side
of the round is an executor's business; this unit never trains.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from cfl_bench.core.comm import CommCounter
from cfl_bench.core.context import Broadcast, ClientState, ServerState, tensor_bytes
from cfl_bench.core.evaluation import EvalSet
from cfl_bench.core.payloads import ClientRequest, Producer, Reply, undeclared
from cfl_bench.core.seeding import generator
from cfl_bench.engine.aggregation import RunningAverage, client_weight
from cfl_bench.engine.arrivals import ArrivalPlan
from cfl_bench.engine.client_update import ClientJob, ClientResult
from cfl_bench.engine.executor import Executor
from cfl_bench.strategies.compose import Strategy


class RoundServer:
    """The server's work in every round, over the explicit ``ServerState``."""

    def __init__(
        self,
        state: ServerState,
        strategy: Strategy,
        clients_per_round: int,
        weighting: str,
        seed: int,
        arrivals: ArrivalPlan | None = None,
    ) -> None:
        self.state = state
        self.arrivals = arrivals
        self.strategy = strategy
        self.clients_per_round = clients_per_round
        self.weighting = weighting
        self.comm = CommCounter()
        self.rng = generator(seed, "participation")
        self.declared: dict[str, set[str]] = {}
        for component in strategy.all:
            for payload in component.payloads:
                self.declared.setdefault(payload.producer, set()).add(payload.name)
        self._average: RunningAverage | None = None

    # -- round start --------------------------------------------------------------------------
    def open_round(self) -> Broadcast:
        """Sample the participants, run the round-start hooks and build the broadcast."""
        server = self.state
        server.participants = self._sample()
        for component in self.strategy.all:
            component.on_round_start(server)
        self._average = RunningAverage(server.global_params, server.global_buffers)
        return self.make_broadcast()

    def make_broadcast(self) -> Broadcast:
        """θ_g and the components' declared payloads, as they stand now."""
        server = self.state
        payloads: dict[str, torch.Tensor] = {}
        for component in self.strategy.all:
            payloads.update(component.broadcast(server))
        self._check(list(payloads), "broadcast")
        return Broadcast.of(server, payloads)

    def _sample(self) -> list[ClientState]:
        clients = self.state.clients
        if self.arrivals is not None:  # only clients that have joined, per_round of them
            there = self.arrivals.joined[self.state.task]
            take = min(self.arrivals.per_round, there)
            chosen = torch.randperm(there, generator=self.rng)[:take]
            return [clients[k] for k in sorted(chosen.tolist())]
        if self.clients_per_round >= len(clients):
            return list(clients)
        chosen = torch.randperm(len(clients), generator=self.rng)[: self.clients_per_round]
        return [clients[k] for k in sorted(chosen.tolist())]

    def send(self, client: ClientState, broadcast: Broadcast) -> None:
        """Count what ``client`` downloads: θ_g unless it holds this version, and payloads."""
        self._send_model(client)
        for name, tensor in broadcast.payloads.items():
            self.comm.down(tensor_bytes(tensor), name)

    def _send_model(self, client: ClientState) -> None:
        server = self.state
        if client.model_version != server.version:
            self.comm.down(server.model_bytes, "model")
            client.model_version = server.version

    def jobs(
        self,
        broadcast: Broadcast,
        probes: list[EvalSet] | None,
        diagnose: EvalSet | None = None,
    ) -> list[ClientJob]:
        """The participants' jobs, their downloads counted."""
        jobs = []
        for client in self.state.participants:
            self.send(client, broadcast)
            jobs.append(ClientJob(client, broadcast, probes, diagnose))
        return jobs

    # -- uploads ------------------------------------------------------------------------------
    def receive(self, result: ClientResult) -> None:
        """Count an upload, let components collect its payloads, fold it into the mean."""
        server, upload = self.state, result.upload
        self._check(list(upload.extras), "upload")
        self.comm.up(server.model_bytes, "model")
        for name, tensor in upload.extras.items():
            self.comm.up(tensor_bytes(tensor), name)
        for component in self.strategy.all:
            component.receive_upload(upload, server)
        result.client.model_version = -1  # it now holds its own local model
        assert self._average is not None, "receive() before open_round()"
        weight = client_weight(upload.num_samples, self.weighting)
        self._average.add(upload.params, upload.buffers, weight)

    # -- round end ----------------------------------------------------------------------------
    def close_round(self, executor: Executor) -> None:
        """θ_g ← the weighted mean (and the aggregator override), then the server hooks in
        ``SERVER_HOOK_ORDER``, each followed by the client computation it asks for."""
        server = self.state
        assert self._average is not None, "close_round() before open_round()"
        aggregated = self._average.result()
        self._average = None
        if aggregated is not None:
            server.global_params, server.global_buffers = aggregated
            if self.strategy.aggregator is not None:
                self.strategy.aggregator.aggregate(server)
        server.version += 1
        self.run_server_hooks(executor)

    def run_server_hooks(self, executor: Executor) -> None:
        """The server hooks in ``SERVER_HOOK_ORDER``, each followed by its client request."""
        server = self.state
        for component in self.strategy.server_hooks:
            component.after_aggregate(server)
            request = component.client_request(server)
            if request is not None:
                request.on_reply(self.ask(request, executor))

    def ask(self, request: ClientRequest, executor: Executor) -> Reply:
        """Run ``request`` through the executor, counting θ_g downloads and the answers."""
        self._check([request.payload], "request")
        server = self.state
        for client in request.clients:
            self._send_model(client)
        total: torch.Tensor | None = None
        count = 0

        def collect(client: ClientState, answer: torch.Tensor) -> None:
            nonlocal total, count
            if total is None:
                total = torch.zeros_like(answer)
            total.add_(answer)
            count += 1
            self.comm.up(tensor_bytes(answer), request.payload)

        request = dataclasses.replace(request, round_index=server.round_index)
        executor.answer(request, (server.global_params, server.global_buffers), collect)
        assert total is not None, "a request needs at least one client"
        return Reply(request.payload, total, count)

    def _check(self, names: list[str], producer: Producer) -> None:
        problem = undeclared(names, self.declared.get(producer, set()), producer)
        if problem is not None:
            raise RuntimeError(problem)

    # -- state (checkpoints) ------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        server = self.state
        return {
            "round_index": server.round_index,
            "version": server.version,
            "global_params": server.global_params,
            "global_buffers": server.global_buffers,
            "comm_by_payload": dict(self.comm.by_payload),
            "server_rng": self.rng,
            "components": {c.name: c.state_dict() for c in self.strategy.all},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        server = self.state
        server.round_index = int(state["round_index"])
        server.version = int(state["version"])
        server.global_params = state["global_params"]
        server.global_buffers = state["global_buffers"]
        self.comm.by_payload = dict(state["comm_by_payload"])
        self.rng.set_state(state["server_rng"].get_state())
        components = state["components"]
        if sorted(components) != sorted(c.name for c in self.strategy.all):
            raise ValueError("the checkpoint was written for another strategy")
        for component in self.strategy.all:
            component.load_state_dict(components[component.name])
