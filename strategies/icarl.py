"""Federated iCaRL: exemplars kept per client and distillation of the old classes.

Rebuffi et al., "iCaRL: Incremental Classifier and Representation Learning", CVPR 2017,
federated as the FCL code bases run it: the reference is the iCaRL learner shipped in TARGET's
code base (zj-jayzhang/Federated-Class-Continual-Learning, ``methods/icarl.py`` on PyCIL's
``methods/base.py``), whose table rows the FCL papers copy. Each client, at every local step
of task t > 0, minimises on a batch of its task data joined with its exemplars

    L = CE(f(x), y) + λ · KD_T(f(x)[old], f_old(x)[old]),
    KD_T(z, z') = −(1/B) Σ_rows Σ_{c ∈ old} softmax(z'/T)_c · log softmax(z/T)_c

where ``old`` are the classes of the tasks before t (softmaxes over them only), f_old the
model that finished task t − 1 (the global model the client receives when it enters task t,
kept on the client as LwF's teacher: nothing extra travels) and T = 2, λ = 1 (the code's
``_KD_loss`` with its global ``T``, added with weight 1). Task 0 trains on CE alone. The
server averages the models (the code's unweighted ``average_weights``: the suite's FedAvg,
which weights by examples, equals it when the clients hold equally many).

Exemplars (``selection``; the memory's hooks are ``strategies.icarl_exemplars``'s):
- ``random`` (the code, default): from task 1 on, the code rebuilds each client's whole
  earlier data in every round (``get_all_previous_dataset``) and joins a uniform draw of
  ``memory_size`` of its examples to the task data (``combine_dataset``; BaseLearner sets
  ``memory_size`` = 2000, overriding main.py's 300). Here the draw is made once per task,
  at the end of the previous one, and kept exactly uniform over everything the client has
  seen without keeping it: the new memory takes k of the old memory's rows and
  ``memory`` − k of the finished task's, k the number of a uniform ``memory``-subset of
  (seen + new) that falls among the seen (a client with fewer examples keeps them all;
  the code would fail there). Differences from the code: one draw per task, not per round.
- ``herding`` (the paper, Algorithm 4 and 5; PyCIL's ``_construct_exemplar``): at a task
  end every class the client held is given m = ``memory`` // (classes seen so far) rows,
  chosen greedily so that the mean of the chosen L2-normalised features (the global model's
  ``representation``) stays closest to the class's mean; the older classes keep their
  first m rows (``_reduce_exemplar``). The code base never calls this (its iCaRL inherits
  the method but its ``after_task`` does not build the memory).

Classifier (``classifier``): ``cnn`` (the code, default) scores the model's outputs: the code's
``_eval_nme`` needs class means its federated iCaRL never computes, so its tables hold the
softmax accuracy. ``nme`` (the paper, with ``selection=herding``) scores the nearest mean of
exemplars: at every task end the server asks every client (a ``ClientRequest`` at the final
θ_g) for, per class, the sum of the L2-normalised features of the exemplars it keeps when the
task ends and their count ((classes, d + 1) floats up); the server sums the answers, and at
evaluation divides, normalises each mean (PyCIL's ``mean / ‖mean‖``) and predicts the class
whose mean is nearest the normalised features; a class without exemplars is never
predicted. The records' ``acc`` (and ``acc_task_il``) then hold the NME accuracy.
Loss (``loss``): ``softmax`` (the code, default) is the CE + KD above. ``sigmoid`` (the
paper, Algorithm 3) replaces both by one binary cross-entropy per class seen so far (the
classes of tasks 0..t), old classes against the old model's sigmoid outputs σ(f_old(x)_c),
the others against the one-hot label, summed over the classes and averaged over the rows
(the paper sums over examples too: its SGD's mean over a batch is the suite's); the
objective's CE on the batch is then weighted 0 (``ReplayPlan.batch_weight``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import torch
from torch.nn import functional as F

from cfl_bench.core.errors import UserError
from cfl_bench.core.objective import masked_mean
from cfl_bench.core.payloads import ClientRequest, Reply
from cfl_bench.strategies import declarations
from cfl_bench.strategies.base import (
    Classifier,
    ClientInputs,
    Declaration,
    ExtraWork,
    FrozenForward,
    Learner,
    StrategyEnv,
)
from cfl_bench.strategies.declarations import ICaRLOptions
from cfl_bench.strategies.icarl_exemplars import (  # noqa: F401 - importable from here too
    EPSILON,
    ExemplarMemory,
    features_of,
    herding,
    normalised,
    random_memory_split,
)
from cfl_bench.strategies.replay import ReplayPlan

if TYPE_CHECKING:
    from cfl_bench.core.context import Broadcast, ClientState, LocalRound, ServerState
    from cfl_bench.core.flat import FlatModel

CLASS_SUMS = "icarl.class_sums"


def old_class_kd(
    outputs: torch.Tensor,
    teacher_outputs: torch.Tensor,
    old: torch.Tensor,
    temperature: float,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """KD_T on the ``old`` classes (a 0/1 vector over the outputs, at least one 1): the
    softened teacher's cross-entropy, summed over the old classes, averaged over the rows
    (``mask``: a padded batch's real rows)."""
    keep = old > 0
    hidden = torch.tensor(float("-inf"), dtype=outputs.dtype, device=outputs.device)
    student = F.log_softmax(torch.where(keep, outputs, hidden) / temperature, dim=1)
    target = F.softmax(torch.where(keep, teacher_outputs, hidden) / temperature, dim=1)
    per_row = -(target * torch.where(keep, student, torch.zeros_like(student))).sum(dim=1)
    return per_row.mean() if mask is None else masked_mean(per_row, mask)


def sigmoid_loss(
    outputs: torch.Tensor,
    teacher_outputs: torch.Tensor,
    y: torch.Tensor,
    old: torch.Tensor,
    seen: torch.Tensor,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """The paper's loss (Algorithm 3): per row, Σ over the ``seen`` classes of the binary
    cross-entropy of σ(z_c) against σ(z_old_c) for the ``old`` classes and [c = y] for the
    others; the mean over the rows (``mask``: a padded batch's real rows)."""
    onehot = F.one_hot(y, outputs.shape[1]).to(outputs.dtype)
    target = torch.where(old > 0, torch.sigmoid(teacher_outputs), onehot)
    per_class = F.binary_cross_entropy_with_logits(outputs, target, reduction="none")
    per_row = (per_class * seen).sum(dim=1)
    return per_row.mean() if mask is None else masked_mean(per_row, mask)


def class_feature_sums(features: torch.Tensor, y: torch.Tensor, num_classes: int) -> torch.Tensor:
    """Per class: the sum of the rows of ``features`` labelled with it, then their count
    ((num_classes, d + 1)); what a client sends for the class means."""
    ones = torch.ones(features.shape[0], 1, dtype=features.dtype, device=features.device)
    sums = torch.zeros(num_classes, features.shape[1] + 1, device=features.device)
    return sums.index_add_(0, y.to(features.device), torch.cat([features, ones], dim=1))


def nme_scores(features: torch.Tensor, sums: torch.Tensor) -> torch.Tensor:
    """−‖φ − μ_c‖² per row and class, μ_c the mean of class c's exemplar features divided by
    its norm (PyCIL's ``_class_means``); −∞ for a class no client holds an exemplar of."""
    counts = sums[:, -1]
    present = counts > 0
    means = sums[:, :-1] / counts.clamp(min=1).unsqueeze(1)
    means = means / means.norm(dim=1, keepdim=True).clamp(min=torch.finfo(means.dtype).tiny)
    distances = ((features.unsqueeze(1) - means.unsqueeze(0)) ** 2).sum(dim=2)
    return (-distances).masked_fill(~present.unsqueeze(0), float("-inf"))


class ICaRL(ExemplarMemory, Learner):
    declaration: ClassVar[Declaration] = declarations.ICARL
    opts: ICaRLOptions
    requires: ClassVar[frozenset[str]] = frozenset({"class_logits"})
    keeps_exemplars: ClassVar[bool] = True
    # Old and seen classes are [0, t·c) and [0, (t+1)·c) for a client in task t.
    assumes_stream_order: ClassVar[bool] = True
    state_attributes: ClassVar[tuple[str, ...]] = ("class_sums",)

    def setup(self, env: StrategyEnv) -> None:
        """Refuse streams without classes per task and, for herding, models without
        features."""
        if env.scenario != "class-il" or env.classes_per_task <= 0:
            raise UserError(
                f"icarl keeps exemplars of the classes of earlier tasks and distils them, so "
                f"it needs a class-incremental stream (seq-cifar10, seq-cifar100), not "
                f"{env.stream_name!r} ({env.scenario})."
            )
        if self.opts.selection == "herding" and "features" not in env.model.capabilities:
            offering = ", ".join(env.model.models_offering("features"))
            raise UserError(
                f"icarl:selection=herding chooses exemplars by the model's features, which "
                f"model {env.model.name!r} does not expose; use --model {offering} or "
                f"icarl:selection=random."
            )
        unused = sorted({"temperature", "weight"} & self.explicit)
        if self.opts.loss == "sigmoid" and unused:
            raise UserError(
                f"icarl:{unused[0]} has no effect with loss=sigmoid (the paper's binary "
                f"cross-entropy has no temperature or weight); drop it or use loss=softmax."
            )
        if self.opts.classifier == "nme" and self.opts.selection != "herding":
            raise UserError(
                "icarl:classifier=nme classifies by the means of the exemplars herding "
                "chooses (the paper's pair); add selection=herding."
            )
        self.num_classes = env.num_classes
        self.classes_per_task = env.classes_per_task
        # Σ of the clients' per-class sums of normalised exemplar features, the counts in
        # the last column ((classes, d + 1)), from the latest task end; empty before it.
        self.class_sums = torch.zeros(0)
        # The classes the global model knows: those of the global tasks so far (set at
        # every round start, so a resumed run has it before its first evaluation).
        self.known_classes = self.classes_per_task

    def extra_work(self) -> ExtraWork:
        """Herding's forward over every client's shard and exemplars at its task ends, and
        with ``classifier=nme`` a second (herding again for the class sums' request)."""
        herds = self.opts.selection == "herding"
        return ExtraWork(task_end_client_passes=int(herds) + int(self.opts.classifier == "nme"))

    def on_round_start(self, server: ServerState) -> None:
        self.known_classes = min(self.num_classes, (server.task + 1) * self.classes_per_task)

    def offers_batches(self) -> bool:
        """No reservoir buffer: the exemplars are chosen at task ends."""
        return False

    # -- the distillation ------------------------------------------------------------------------
    def replay_plan(self) -> ReplayPlan:
        """No buffer draws; with the paper's sigmoid loss the loss term replaces the
        objective's cross-entropy on the batch."""
        return ReplayPlan(batch_weight=0.0 if self.replaces_batch_loss() else 1.0)

    def exemplar_memory(self) -> int:
        """Every client joins at most ``memory`` exemplars to its task data (GLFC's
        per-class budget too: memory // classes, times the classes)."""
        return self.opts.memory

    def replaces_batch_loss(self) -> bool:
        """The paper's sigmoid loss replaces the objective's cross-entropy."""
        return self.opts.loss == "sigmoid"

    def round_inputs(self, broadcast: Broadcast) -> ClientInputs | None:
        """Nothing to add to the softmax form at λ = 0."""
        return None if self.opts.loss == "softmax" and self.opts.weight == 0 else {}

    def client_inputs(self, client: ClientState, local: LocalRound) -> ClientInputs:
        """The teacher (θ_g when the client entered its task), the 0/1 vectors of the old
        classes (none in task 0) and of the classes seen so far, and whether there is a
        teacher (0 in task 0: the teacher is then θ_g, unused)."""
        state = client.state_for(self.name)
        broadcast = local.broadcast
        if state.get("task", client.task) != client.task:
            state["teacher"] = broadcast.params.detach().clone()
            state["teacher_buffers"] = broadcast.buffers.detach().clone()
        state["task"] = client.task
        has_teacher = "teacher" in state and client.task > 0
        device = broadcast.params.device
        old = torch.zeros(self.num_classes, device=device)
        if has_teacher:
            old[: client.task * self.classes_per_task] = 1.0
        seen = torch.zeros(self.num_classes, device=device)
        seen[: (client.task + 1) * self.classes_per_task] = 1.0
        return {
            "teacher": state["teacher"] if has_teacher else broadcast.params,
            "teacher_buffers": state["teacher_buffers"] if has_teacher else broadcast.buffers,
            "old": old,
            "seen": seen,
            "weight": torch.tensor(float(has_teacher), device=device),
        }

    def frozen_forwards(self) -> tuple[FrozenForward, ...]:
        return (FrozenForward("teacher_outputs", "teacher", "teacher_buffers"),)

    def term_inputs(self) -> tuple[str, ...]:
        return ("old", "seen", "weight")

    def loss_term(
        self,
        outputs: torch.Tensor,
        representation: torch.Tensor | None,
        y: torch.Tensor,
        mask: torch.Tensor | None,
        values: dict[str, torch.Tensor],
    ) -> torch.Tensor:
        """softmax: λ · KD_T on the old classes (0 without a teacher); sigmoid: the
        paper's binary cross-entropy over the classes seen."""
        teacher, old, weight = values["teacher_outputs"], values["old"], values["weight"]
        if self.opts.loss == "sigmoid":
            return sigmoid_loss(outputs, teacher, y, old, values["seen"], mask)
        # Without a teacher every class stands in for the old ones (the term is weighted 0
        # there): an empty set would make the softmaxes NaN, and 0 · NaN is NaN.
        kept = torch.clamp(old + (1.0 - weight), max=1.0)
        kd = old_class_kd(outputs, teacher, kept, self.opts.temperature, mask)
        return self.opts.weight * weight * kd

    # -- the nearest-mean-of-exemplars classifier ------------------------------------------------
    def client_request(self, server: ServerState) -> ClientRequest | None:
        """At a task end, with ``classifier=nme``: ask every client that holds data for its
        per-class sums of exemplar features at the final θ_g (before the evaluation that
        scores it). A client that has not joined yet (``--arrivals``) holds no data and no
        exemplars: it is not asked, and nothing of it is counted."""
        if self.opts.classifier != "nme" or not server.is_task_end:
            return None
        return ClientRequest(
            CLASS_SUMS,
            [client for client in server.clients if client.train_y is not None],
            lambda client, model: self.answer_request(CLASS_SUMS, client, model),
            self.receive_reply,
            train_mode=False,
        )

    def answer_request(self, payload: str, client: ClientState, model: FlatModel) -> torch.Tensor:
        """The client's (classes, d + 1) answer: per class, the sum of the L2-normalised
        features of the exemplars it keeps when its task ends now, and their count."""
        if payload != CLASS_SUMS:
            return super().answer_request(payload, client, model)
        x, y = self._herded_memory(client, model, client.task)
        with torch.inference_mode():
            features = normalised(features_of(model.module, client.decode(x)))
        return class_feature_sums(features, y, self.num_classes)

    def receive_reply(self, reply: Reply) -> None:
        """Σ over the clients of their sums and counts: the server divides at evaluation."""
        self.class_sums = reply.total.detach().clone()

    def evaluation_classifier(self) -> Classifier | None:
        return self.nearest_mean if self.opts.classifier == "nme" else self.known_outputs

    def known_outputs(self, module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        """The model's outputs over the classes of the tasks so far, −∞ for the others.

        Why: the reference codes grow their head with the tasks (PyCIL's ``update_fc`` for
        TARGET's iCaRL, GLFC's ``Incremental_learning``), so their CNN accuracy is an argmax
        over the known classes only. The suite's model has every class's output from the
        start; scored over all of them, outputs no loss has touched (GLFC's and iCaRL's
        sigmoid losses read only the known classes) outrank trained ones, and a run scored
        0 % class-IL at the smoke scale of the GLFC table."""
        outputs = module(x)
        unknown = torch.arange(outputs.shape[1], device=outputs.device) >= self.known_classes
        return outputs.masked_fill(unknown, float("-inf"))

    def nearest_mean(self, module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor | None:
        """NME scores of ``x`` under the latest class means (None before the first task
        end: the model's outputs are scored)."""
        if self.class_sums.numel() == 0:
            return None
        sums = self.class_sums.to(x.device)
        return nme_scores(normalised(features_of(module, x)), sums)
