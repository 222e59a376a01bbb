"""GLFC's clients: exemplar memory, gradient compensation and relation distillation.

Dong et al., "Federated Class-Incremental Learning", CVPR 2022, as its official code
(conditionWang/FCIL, ``src/GLFC.py``, ``src/fl_main.py``, ``src/option.py``) runs it. Each
client, at every local step, minimises on a batch of its task data joined with its exemplars

    task 0 / no old model:  L = L_GC
    otherwise:              L = gc_weight · L_GC + rd_weight · L_RD   (code: 0.5, 0.5)

    L_GC = 1/(B·C) Σ_i Σ_{c ≤ C} w_i · BCE(z_ic, [c = y_i])
    L_RD = 1/(B·C) Σ_i Σ_{c ≤ C} BCE(z_ic, q_ic),  q_ic = σ(z^old_ic) for c old, [c = y_i] else

with C the classes of the tasks up to the client's (the code's ``numclass`` columns; the
suite's model has every class's output, the later ones are left out), BCE the binary
cross-entropy of σ(z) (``binary_cross_entropy_with_logits``), and the **class-aware gradient
compensation** weights (``efficient_old_class_weight``)

    g_i = |σ(z_{i,y_i}) − 1|  (no gradient: the magnitude of the last layer's gradient
          at the true class),
    w_i = g_i / mean_{j: y_j old} g_j  for rows of the client's learned (exemplar) classes,
    w_i = g_i / mean_{j: y_j new} g_j  for the others,
    w_i = 1 while the client has learned no class.

L_RD is the **class-semantic relation distillation** as the code writes it: the one-hot
label with the old classes' columns replaced by the old model's sigmoid outputs, the same
binary cross-entropy (no temperature: the code has none).

The old model (``proxy``): ``code`` (the default) is the proxy server's (``src/
ProxyServer.py``; its hooks are ``strategies.glfc_server``'s): in the round a client's
data changes (its ``signal``) it uploads, for each class of its task, the LeNet encoder's
gradient at a prototype (``glfc_proxy``); the
server inverts the gradients by L-BFGS after aggregation, scores θ_g on the rebuilt
samples every round and keeps best_2 (the best so far) and best_1 (best_2 when the last
gradients came), broadcasting both; a client distils from best_2 in its signal round and
from best_1 after (``old_model_choice``). The old classes are the old model's outputs (the
classes of the tasks up to the one it was kept in). ``none`` is the global model the
client received when it entered its task (kept on the client, as LwF's and iCaRL's
teacher: nothing extra travels), the old classes those of the tasks before the client's;
in task 0 there is none.

Exemplars (``_construct_exemplar_set``, ``_reduce_exemplar_sets``): when a client's task
ends, every class it held gets m = ``memory`` // (classes it has learned so far) rows,
chosen by herding on the L2-normalised features of the global model at that moment; each
pick is the row that brings the running mean closest to the class mean, **with
repetition** (the code does not exclude rows already picked, so a class always keeps m
rows, some repeated); older classes keep their first m rows. The code's memory is 2,000.

Differences from the code, all forced by the suite's protocol and said in docs/methods.md:
- the code's client notices a new task by an entropy jump of its outputs (> 1.2) and
  builds its exemplars then; here the task clock says when (the same rounds whenever the
  code's test fires on a task change);
- the code counts a class twice in ``learned_numclass`` when a client draws it in two
  tasks; here the kept classes are counted once;
- the proxy server scores float iterates once each (the code: 8-bit images through its
  training augmentation, batches of 64 without the last partial one), and the prototype
  is the model's input (the code: the raw [0, 1] image); see docs/methods.md.
The learning rate (2.0), weight decay (1e-5), its decay at local epochs 100/150/180 and 20
local epochs are the run's optimiser settings, not this component's.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, ClassVar

import torch
from torch.nn import functional as F

from cfl_bench.core.errors import UserError
from cfl_bench.strategies import declarations
from cfl_bench.strategies.base import (
    Classifier,
    ClientInputs,
    Declaration,
    ExtraWork,
    Learner,
    StrategyEnv,
)
from cfl_bench.strategies.declarations import GLFCOptions
from cfl_bench.strategies.glfc_proxy import (
    PROTO_LR_DIVISOR,
    flat_gradient,
    prototype_index,
    refine_prototype,
    sample_gradient,
)
from cfl_bench.strategies.glfc_server import (  # noqa: F401 - importable from here too
    BEST,
    BEST_CLASSES,
    MONITOR_CHUNK,
    PROTO_GRAD,
    ProxyServer,
    ProxyTeacher,
    old_model_choice,
)
from cfl_bench.strategies.icarl import ICaRL, features_of, normalised
from cfl_bench.strategies.replay import ReplayPlan

if TYPE_CHECKING:
    from cfl_bench.core.context import Broadcast, ClientState, LocalRound, ServerState, Upload
    from cfl_bench.core.flat import FlatModel


def herding_with_repeats(features: torch.Tensor, m: int) -> torch.Tensor:
    """``m`` row indices of normalised ``features`` (n, d) as GLFC's code herds: step k
    takes the row whose addition brings the mean of the k picks closest (Euclidean) to the
    mean of all rows; a row may be picked again; ties go to the first row."""
    target = features.mean(dim=0)
    total = torch.zeros_like(target)
    order: list[int] = []
    for k in range(1, m + 1):
        i = int((target - (features + total) / k).norm(dim=1).argmin())
        order.append(i)
        total = total + features[i]
    return torch.tensor(order, dtype=torch.long, device=features.device)


def compensation_weights(
    outputs: torch.Tensor, y: torch.Tensor, learned: torch.Tensor, mask: torch.Tensor | None
) -> torch.Tensor:
    """w_i (B,): |σ(z_{i,y_i}) − 1| over its mean among the rows of the same group (labels
    in ``learned``, a 0/1 vector over the classes, or not); all 1 when ``learned`` is
    empty. ``mask``: a padded batch's real rows (padding gets weight 0)."""
    g = (1.0 - torch.sigmoid(outputs.detach().gather(1, y.unsqueeze(1)).squeeze(1))).abs()
    real = torch.ones_like(g) if mask is None else mask.to(g.dtype)
    if float(learned.sum()) == 0:
        return real
    old = learned[y] * real
    new = (1.0 - learned[y]) * real
    w = torch.zeros_like(g)
    for group in (old, new):
        if float(group.sum()) > 0:
            w = w + g * group / ((g * group).sum() / group.sum())
    return w


def seen_bce(
    outputs: torch.Tensor, target: torch.Tensor, seen: torch.Tensor, row_weight: torch.Tensor
) -> torch.Tensor:
    """Σ over rows and ``seen`` classes of row_weight_i · BCE(z_ic, target_ic), divided by
    (rows with weight) · (classes seen): the code's ``torch.mean`` over its columns."""
    per = F.binary_cross_entropy_with_logits(outputs, target, reduction="none")
    total = (per * seen * row_weight.unsqueeze(1)).sum()
    return total / seen.sum()


def glfc_loss(
    outputs: torch.Tensor,
    teacher_outputs: torch.Tensor,
    y: torch.Tensor,
    values: dict[str, torch.Tensor],
    weights: tuple[float, float],
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """L_GC alone (``values['weight']`` 0: no old model) or gc·L_GC + rd·L_RD; ``values``
    holds the 0/1 class vectors ``old``, ``seen``, ``learned``."""
    old, seen, learned = values["old"], values["seen"], values["learned"]
    real = torch.ones(y.shape[0], device=outputs.device) if mask is None else mask.float()
    rows = real.sum()
    onehot = F.one_hot(y, outputs.shape[1]).to(outputs.dtype)
    w = compensation_weights(outputs, y, learned, mask)
    gc = seen_bce(outputs, onehot, seen, w) / rows
    target = torch.where(old > 0, torch.sigmoid(teacher_outputs), onehot)
    rd = seen_bce(outputs, target, seen, real) / rows
    has_teacher = values["weight"]
    gc_weight, rd_weight = weights
    return (1 - has_teacher) * gc + has_teacher * (gc_weight * gc + rd_weight * rd)


class GLFC(ProxyTeacher, ProxyServer, ICaRL):
    """GLFC's client side on iCaRL's mechanisms (exemplars via ``local_data``, a teacher
    per client); the loss and the exemplar rule are GLFC's code's."""

    declaration: ClassVar[Declaration] = declarations.GLFC
    opts: GLFCOptions  # type: ignore[assignment]
    uses_after_local: ClassVar[bool] = True
    # The proxy server's state: the two kept global models (θ and buffers in one vector;
    # empty: none yet), their class counts, the best score and the rebuilt evaluation set.
    state_attributes: ClassVar[tuple[str, ...]] = (
        "best_1",
        "best_2",
        "best_classes",
        "best_perf",
        "proxy_x",
        "proxy_y",
    )

    def setup(self, env: StrategyEnv) -> None:
        """Refuse streams without classes per task and models without features."""
        if env.scenario != "class-il" or env.classes_per_task <= 0:
            raise UserError(
                f"glfc keeps exemplars of the classes of earlier tasks and distils them, so "
                f"it needs a class-incremental stream (seq-cifar10, seq-cifar100), not "
                f"{env.stream_name!r} ({env.scenario})."
            )
        if "features" not in env.model.capabilities:
            offering = ", ".join(env.model.models_offering("features"))
            raise UserError(
                f"glfc herds its exemplars by the model's features, which model "
                f"{env.model.name!r} does not expose; use --model {offering}."
            )
        self.num_classes = env.num_classes
        self.classes_per_task = env.classes_per_task
        self.known_classes = self.classes_per_task  # as iCaRL: set at every round start
        self.class_sums = torch.zeros(0)
        self._setup_proxy(env)

    def extra_work(self) -> ExtraWork:
        """The proxy server's work at task starts (``ProxyServer``), and herding's forward
        over every client's shard and exemplars at its task ends."""
        return dataclasses.replace(ProxyServer.extra_work(self), task_end_client_passes=1)

    def on_task_end(self, client: ClientState, task: int, model: FlatModel) -> None:
        """Herd the exemplars the client keeps for the next tasks (``model`` at θ_g)."""
        if client.train_x is None or client.train_y is None:
            return
        state = client.state_for(self.name)
        state["x"], state["y"] = self._herded_memory(client, model, task)

    def _herded(
        self, client: ClientState, model: FlatModel, task: int, rows: int, old_y: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows of the old exemplars and of the finished shard to keep: m = memory // (the
        client's kept classes and the shard's), the first m of each kept class, m herded
        (with repeats) of each of the shard's classes."""
        assert client.train_y is not None
        new_y = client.train_y[:rows]
        classes = set(torch.unique(old_y).tolist()) | set(torch.unique(new_y).tolist())
        m = self.opts.memory // max(len(classes), 1)
        device = client.train_y.device
        fresh = torch.unique(new_y).tolist()
        keep_old = [
            torch.nonzero(old_y == c).flatten()[:m]
            for c in torch.unique(old_y).tolist()
            if c not in fresh
        ]
        keep_new: list[torch.Tensor] = []
        with torch.inference_mode():
            for c in fresh:
                idx = torch.nonzero(new_y == c).flatten()
                features = normalised(features_of(model.module, client.inputs(idx)))
                keep_new.append(idx[herding_with_repeats(features, m).to(device)])
        empty = torch.zeros(0, dtype=torch.long, device=device)
        return torch.cat([empty, *keep_old]), torch.cat([empty, *keep_new])

    def replay_plan(self) -> ReplayPlan:
        """No buffer draws; GLFC's loss replaces the objective's cross-entropy."""
        return ReplayPlan(batch_weight=0.0)

    def replaces_batch_loss(self) -> bool:
        """Always: L_GC (and L_RD) replace the objective's cross-entropy."""
        return True

    def round_inputs(self, broadcast: Broadcast) -> ClientInputs | None:
        """Every round adds the loss."""
        return {}

    def client_inputs(self, client: ClientState, local: LocalRound) -> ClientInputs:
        """The teacher (the proxy server's, or iCaRL's with ``proxy=none``), the class
        vectors, and the classes the client has learned (those of its exemplars) for the
        compensation weights."""
        if self.opts.proxy == "none":
            inputs = super().client_inputs(client, local)
        else:
            inputs = self._proxy_inputs(client, local.broadcast)
        learned = torch.zeros(self.num_classes, device=local.broadcast.params.device)
        kept = client.state_for(self.name).get("y")
        if isinstance(kept, torch.Tensor) and kept.numel() > 0:
            learned[torch.unique(kept).to(learned.device)] = 1.0
        inputs["learned"] = learned
        return inputs

    def term_inputs(self) -> tuple[str, ...]:
        return ("old", "seen", "learned", "weight")

    def loss_term(
        self,
        outputs: torch.Tensor,
        representation: torch.Tensor | None,
        y: torch.Tensor,
        mask: torch.Tensor | None,
        values: dict[str, torch.Tensor],
    ) -> torch.Tensor:
        """GLFC's loss (the module docstring)."""
        weights = (self.opts.gc_weight, self.opts.rd_weight)
        return glfc_loss(outputs, values["teacher_outputs"], y, values, weights, mask)

    def evaluation_classifier(self) -> Classifier | None:
        """The code's global model scores the classes of the tasks so far (its head grows)."""
        return self.known_outputs

    def on_round_start(self, server: ServerState) -> None:
        """Every client there checks whether its data changed since the last round (the
        code's ``update_new_set`` runs for every client, chosen or not, every round): only
        then is this round its first of a task (``signal``)."""
        super().on_round_start(server)
        if self.opts.proxy == "none":
            return
        for client in server.clients:
            if client.train_y is None:
                continue
            state = client.state_for(self.name)
            state["signal"] = state.get("proxy_task") != client.task
            state["proxy_task"] = client.task

    def after_local(self, client: ClientState, upload: Upload, local: LocalRound) -> None:
        """In its first round of a task, the client uploads the encoder's gradient at one
        prototype of each class of its task (``proto_grad_sharing``)."""
        if self._probing or self.opts.proxy == "none":
            return
        if not client.state_for(self.name).get("signal"):
            return
        grads = self._prototype_gradients(client, local)
        if grads.numel() > 0:
            upload.extras[PROTO_GRAD] = grads

    def _prototype_gradients(self, client: ClientState, local: LocalRound) -> torch.Tensor:
        """(classes, encoder parameters): per class of the task's shard, its row nearest the
        class mean of the local model's normalised features, moved by ``refine_prototype``
        (lr / 10, the classes seen), then ∇ of the encoder's cross-entropy there."""
        _, (_, new_y), _ = self._shard_and_exemplars(client)
        module = local.model.module
        was_training = module.training
        module.eval()
        seen = (client.task + 1) * self.classes_per_task
        rows: list[torch.Tensor] = []
        for c in torch.unique(new_y).tolist():
            idx = torch.nonzero(new_y == c).flatten()
            with torch.no_grad():
                features = normalised(features_of(module, client.inputs(idx)))
            x = client.inputs(idx[prototype_index(features)].reshape(1))[0].float()
            x = refine_prototype(module, x, int(c), seen, local.lr / PROTO_LR_DIVISOR)
            rows.append(flat_gradient(sample_gradient(self.encoder, x, int(c))))
        module.train(was_training)
        return torch.stack(rows) if rows else torch.zeros(0)

    # iCaRL's nearest-mean classifier and its request are not GLFC's (the code scores the
    # model's outputs): the base's do-nothing hooks, so no server schedule is declared.
    client_request = Learner.client_request
    answer_request = Learner.answer_request


__all__ = ["GLFC", "compensation_weights", "glfc_loss", "herding_with_repeats"]
