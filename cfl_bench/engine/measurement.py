"""What a run measures besides training (docs/metrics.md): the global model on every task's
test set, memory drift on probes, the buffer drift of every client, the client spread.

Why a unit of its own: measurements read the model and the data but never change training,
so they are kept apart from the client update and the server; an executor that trains
elsewhere (a GPU batch, a Flower client) leaves this unit unchanged. Values are 0-d tensors
until the records are flushed: no host sync per evaluation.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import torch

from cfl_bench.core.context import ClientState
from cfl_bench.core.evaluation import EvalSet, classifier_scores, mean_kl
from cfl_bench.core.flat import FlatModel
from cfl_bench.core.objective import Objective
from cfl_bench.engine.client_update import ClientResult
from cfl_bench.engine.diagnostics import (
    ClassForgetting,
    class_accuracy,
    class_shares,
    local_split_accuracy,
)

# (round, trained_task, eval_task, scope, metric, value); value may be a 0-d tensor until flushed.
Record = tuple[int, int, int, str, str, object]
#: A strategy's ``own_model``: a context in which the model is a client's own for a task.
OwnModel = Callable[[ClientState, int, FlatModel], AbstractContextManager[bool]]


class EvaluationState:
    """What the measurements read and keep across rounds: the model and the objective, every
    task's evaluation set and its probes, the memory-drift references and the latest scores
    (checkpointed by ``state_dict``). :class:`Measurement` writes the records from them."""

    def __init__(
        self,
        model: FlatModel,
        probe_size: int,
        objective: Objective,
        decode: Callable[[torch.Tensor], torch.Tensor] | None = None,
        diagnostics: bool = False,
        classify: Callable[[torch.nn.Module, torch.Tensor], torch.Tensor | None] | None = None,
    ) -> None:
        self.model = model
        # A classifier replacing the model's outputs at evaluation (the strategy's
        # ``evaluation_classifier``: iCaRL's nearest mean of exemplars); None: the outputs.
        self.classify = classify
        # ``--diagnostics``: the global model's class-wise forgetting across rounds.
        self.forgetting = ClassForgetting() if diagnostics else None
        self.probe_size = probe_size
        self.objective = objective
        # Test data is kept in the stream's stored form (uint8 pixels): decoded per chunk.
        self.decode = decode
        self.eval_sets: list[EvalSet] = []
        # A held-out test domain no task trains on (CARLA's Town05), or None.
        self.test_domain: EvalSet | None = None
        self.reference_log_probs: dict[int, torch.Tensor] = {}
        # Mean accuracy over the seen tasks at the latest evaluation (progress display).
        self.latest_acc: float | None = None
        # ``--task-order per-client``: each client's tasks in its order; the displayed mean
        # is then each client's over its own tasks seen, averaged over the clients.
        self.orders: tuple[tuple[int, ...], ...] | None = None
        # The latest evaluation's headline per evaluated task ("task 1", …, "test"), for
        # live views; filled only when someone asks (one host sync per evaluation).
        self.latest_scores: dict[str, float] = {}

    def add_eval_set(self, eval_set: EvalSet) -> None:
        self.eval_sets.append(eval_set)

    def probe(self, i: int) -> EvalSet:
        """The first ``probe_size`` test examples of task ``i`` (drift and client spread)."""
        e = self.eval_sets[i]
        n = min(self.probe_size, e.y.shape[0])
        return EvalSet(e.x[:n], e.y[:n], e.classes)

    def probes(self, upto: int) -> list[EvalSet]:
        return [self.probe(i) for i in range(upto + 1)]

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        """The scores the evaluation ranks classes by: the classifier's where the strategy
        replaces the model's classifier and it can classify, else the model's outputs."""
        module = self.model.module
        if self.classify is not None:
            scores = classifier_scores(module, x, self.classify, decode=self.decode)
            if scores is not None:
                return scores
        return self.objective.predict(module, x, self.decode)

    @property
    def has_distribution(self) -> bool:
        """Whether the objective's outputs are a predictive distribution (class logits):
        memory and buffer drift are KL divergences, undefined for a detector's dense maps."""
        return "class_logits" in self.objective.capabilities

    # -- state (checkpoints) ------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {
            "reference_log_probs": self.reference_log_probs,
            "latest_acc": self.latest_acc,
        }
        if self.forgetting is not None:
            state["class_forgetting"] = self.forgetting.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.reference_log_probs = dict(state["reference_log_probs"])
        self.latest_acc = state["latest_acc"]
        if self.forgetting is not None:
            self.forgetting.load_state_dict(state["class_forgetting"])


class Measurement(EvaluationState):
    """The run's evaluation sets, memory-drift references and the latest mean accuracy, and
    the records measured from them: θ_g on the tasks' test sets, the clients' own models,
    memory and buffer drift, client spread and diagnostics."""

    def evaluate(
        self,
        records: list[Record],
        global_state: tuple[torch.Tensor, torch.Tensor],
        round_index: int,
        trained_task: int,
        upto: int,
        drift: bool,
    ) -> float | None:
        """θ_g on tasks 0..upto with the objective's metrics; returns the mean of the
        headline metric (accuracy) over the seen tasks."""
        self.model.load(*global_state)
        objective = self.objective
        headline = objective.metrics[0]
        seen: list[torch.Tensor] = []
        headlines: dict[str, torch.Tensor] = {}
        for i in range(upto + 1):
            e = self.eval_sets[i]
            logits = self.predict(e.x)
            scores = objective.score(logits, e.y, e.classes)
            for metric, value in scores.items():
                records.append((round_index, trained_task, i, "global", metric, value))
            if self.forgetting is not None and i == trained_task:
                self._class_forgetting(records, round_index, trained_task, e, logits)
            if i <= trained_task and self.orders is None:
                seen.append(scores[headline])
            headlines[f"task {i + 1}"] = scores[headline]
        if self.orders is not None and trained_task >= 0:
            steps = range(trained_task + 1)
            seen = [torch.stack([headlines[f"task {o[i] + 1}"] for i in steps]).mean()
                    for o in self.orders]  # fmt: skip
        if self.test_domain is not None:
            e = self.test_domain
            scores = objective.score(self.predict(e.x), e.y, e.classes)
            for metric, value in scores.items():
                records.append((round_index, trained_task, -1, "global", f"test_{metric}", value))
            headlines["test"] = scores[headline]
        if drift and self.has_distribution:
            self._memory_drift(records, round_index, trained_task)
        self.latest_acc = None if not seen else float(torch.stack(seen).mean().item())
        values = torch.stack(list(headlines.values())).tolist()  # one host sync
        self.latest_scores = dict(zip(headlines, values, strict=True))
        return self.latest_acc

    def evaluate_own(
        self,
        records: list[Record],
        clients: list[ClientState],
        own_model: OwnModel,
        global_state: tuple[torch.Tensor, torch.Tensor],
        round_index: int,
        trained_task: int,
    ) -> None:
        """Each client's own model (``own_model``: the strategy's, for a method scored by
        its clients' models) on every task the client has trained by step ``trained_task``
        (its own first tasks under per-client orders), on that task's whole test set:
        ``own_<metric>`` rows of scope ``client_k``; the displayed mean is the mean over
        clients of each client's mean over its tasks. θ_g is loaded back after."""
        headline = self.objective.metrics[0]
        means: list[torch.Tensor] = []
        for client in clients:
            steps = range(trained_task + 1)
            tasks = steps if self.orders is None else [self.orders[client.index][i] for i in steps]
            seen: list[torch.Tensor] = []
            for j in tasks:
                with own_model(client, j, self.model) as present:
                    if not present:
                        continue
                    e = self.eval_sets[j]
                    logits = self.objective.predict(self.model.module, e.x, self.decode)
                scores = self.objective.score(logits, e.y, e.classes)
                scope = f"client_{client.index}"
                for metric, value in scores.items():
                    records.append((round_index, trained_task, j, scope, f"own_{metric}", value))
                seen.append(scores[headline])
            if seen:
                means.append(torch.stack(seen).mean())
        self.model.load(*global_state)
        if means:
            self.latest_acc = float(torch.stack(means).mean().item())

    def _memory_drift(self, records: list[Record], round_index: int, trained_task: int) -> None:
        """KL of each older task's probe predictions from those right after its training."""
        module, objective = self.model.module, self.objective
        for i in range(trained_task + 1):
            current = objective.log_probs(objective.predict(module, self.probe(i).x, self.decode))
            if i == trained_task:
                self.reference_log_probs[i] = current
            else:
                kl = mean_kl(self.reference_log_probs[i], current)
                records.append((round_index, trained_task, i, "global", "kl_drift", kl))

    def buffer_drift(
        self,
        records: list[Record],
        clients: list[ClientState],
        global_state: tuple[torch.Tensor, torch.Tensor],
        round_index: int,
        t: int,
    ) -> None:
        """Per client: mean KL(softmax(stored logits) ‖ softmax(θ_g)) on its buffer."""
        if not clients or clients[0].buffer is None or not self.has_distribution:
            return
        self.model.load(*global_state)
        objective = self.objective
        for client in clients:
            draw = client.buffer.all() if client.buffer is not None else None
            if draw is None:
                continue
            current = objective.log_probs(objective.predict(self.model.module, draw.x))
            stored = objective.log_probs(draw.logits)
            scope = f"client_{client.index}"
            records.append((round_index, t, -1, scope, "buffer_drift", mean_kl(stored, current)))

    def _class_forgetting(
        self, records: list[Record], round_index: int, task: int, e: EvalSet, logits: torch.Tensor
    ) -> None:
        """The global model's class-wise forgetting on the current task (diagnostics)."""
        assert self.forgetting is not None
        class_acc = class_accuracy(logits, e.y, int(logits.shape[1]))
        forgetting, drop = self.forgetting.update(class_acc)
        records.append((round_index, task, task, "global", "class_forgetting", forgetting))
        records.append((round_index, task, task, "global", "round_forgetting", drop))

    @staticmethod
    def client_diagnostics(
        records: list[Record], round_index: int, task: int, result: ClientResult
    ) -> None:
        """A client's in-local / out-local accuracy and weight divergence (diagnostics)."""
        client = result.client
        assert result.class_accuracy is not None and client.train_y is not None
        shares = class_shares(client.train_y, int(result.class_accuracy.shape[0]))
        inside, outside = local_split_accuracy(result.class_accuracy, shares)
        scope = f"client_{client.index}"
        records.append((round_index, task, -1, scope, "in_local_acc", inside))
        records.append((round_index, task, -1, scope, "out_local_acc", outside))
        divergence = result.weight_divergence
        records.append((round_index, task, -1, scope, "weight_divergence", divergence))

    @staticmethod
    def client_spread(
        records: list[Record], round_index: int, task: int, client: int, value: torch.Tensor
    ) -> None:
        """A client's local model (before aggregation), mean accuracy on the seen tasks'
        probes — scored by the client itself (``ClientJob.probes``)."""
        records.append((round_index, task, -1, f"client_{client}", "client_acc", value))
