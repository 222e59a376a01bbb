"""GLFC's proxy server as component hooks: the wiring of ``strategies.glfc_proxy``'s pure
pieces into a run (docs/methods.md, section ``glfc``, ``proxy=code``).

Why a module of its own: the proxy server (its encoder, the pooled prototype gradients, the
rebuilt evaluation set, the two kept models best_1 and best_2) is one concern, separate
from GLFC's client loss and exemplars (``strategies.glfc``). ``ProxyServer`` holds the
server half and ``ProxyTeacher`` the client's choice among the models it broadcasts, as
component methods mixed in before ``ICaRL`` (``class GLFC(ProxyTeacher, ProxyServer,
ICaRL)``), so these override the component defaults; the state they keep is the
component's, saved by its ``state_attributes`` as before.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, ClassVar

import torch

from cfl_bench.core.errors import UserError
from cfl_bench.core.seeding import generator
from cfl_bench.strategies.base import ClientInputs, ExtraWork
from cfl_bench.strategies.glfc_proxy import (
    KEEP,
    LBFGS_EVALUATIONS,
    PROTO_STEPS,
    encoder,
    gradient_label,
    keep_best,
    monitor_accuracy,
    one_closure,
    reconstruct,
    split_gradient,
)

if TYPE_CHECKING:
    from cfl_bench.core.context import Broadcast, ClientState, ServerState, Upload
    from cfl_bench.strategies.base import StrategyEnv
    from cfl_bench.strategies.declarations import GLFCOptions

PROTO_GRAD = "glfc.proto_grad"
BEST = ("glfc.best_1", "glfc.best_2")
BEST_CLASSES = "glfc.best_classes"
# The proxy server scores a model on its rebuilt samples in chunks of this many.
MONITOR_CHUNK = 256


def old_model_choice(signal: bool, has_best_1: bool, has_best_2: bool) -> str:
    """Which old model a client distils from this round (``GLFC_model.train`` on
    ``model_back()``): ``best_2`` in its first round of a task (``signal``), ``best_1``
    after (``none`` while there is no best_1); before the proxy server kept any model,
    ``none`` in a first round and ``keep`` (the one it had) otherwise."""
    if has_best_2:
        if signal:
            return "best_2"
        return "best_1" if has_best_1 else "none"
    return "none" if signal else "keep"


class ProxyServer:
    """The proxy server (``src/ProxyServer.py``): its encoder and state, the gradients it
    pools, the evaluation set it rebuilds and the models it keeps and broadcasts."""

    name: ClassVar[str]  # the component's (``Component.name``)
    opts: GLFCOptions
    explicit: frozenset[str]
    num_classes: int
    classes_per_task: int
    shape: tuple[int, ...]
    seed: int
    encoder: torch.nn.Module
    best_1: torch.Tensor
    best_2: torch.Tensor
    best_classes: torch.Tensor
    best_perf: int
    proxy_x: torch.Tensor
    proxy_y: torch.Tensor
    _pool: list[torch.Tensor]
    _probing: bool

    def _setup_proxy(self, env: StrategyEnv) -> None:
        """The proxy server's encoder (one draw from the run's seed: every client and the
        server hold the same LeNet, as the code's shared ``encode_model``) and empty state;
        refuse inputs the encoder cannot read."""
        if self.opts.proxy == "none" and "inversion_iterations" in self.explicit:
            raise UserError(
                "glfc:inversion_iterations has no effect with proxy=none (no gradient is "
                "inverted); drop it or use proxy=code."
            )
        self.shape = tuple(env.input_shape)
        self.seed = env.seed
        self.best_1, self.best_2 = torch.zeros(0), torch.zeros(0)
        self.best_classes = torch.zeros(2, dtype=torch.long)
        self.best_perf = 0
        self.proxy_x, self.proxy_y = torch.zeros(0), torch.zeros(0, dtype=torch.long)
        self._pool = []
        self._probing = False
        if self.opts.proxy == "none":
            return
        if len(self.shape) != 3:
            raise UserError(
                f"glfc:proxy=code inverts gradients of GLFC's LeNet encoder, which reads "
                f"images (channels, height, width), but stream {env.stream_name!r} gives "
                f"inputs of shape {self.shape}; use glfc:proxy=none or an image stream."
            )
        shape = (self.shape[0], self.shape[1], self.shape[2])
        gen = generator(env.seed, "glfc.encoder")
        self.encoder = encoder(shape, env.num_classes, gen).to(env.device)

    def extra_work(self) -> ExtraWork:
        """Per client entering a task, at most ``classes_per_task`` classes: 50 prototype
        steps each on the client, and on the server each gradient's inversion, up to
        L-BFGS's default 20 closure evaluations a step (``one_closure``, which the probe
        times: the encoder is not the run's model)."""
        if self.opts.proxy == "none":
            return ExtraWork()
        closures = self.opts.inversion_iterations * LBFGS_EVALUATIONS
        shape = (self.shape[0], self.shape[1], self.shape[2])
        return ExtraWork(
            task_start_samples=PROTO_STEPS * self.classes_per_task,
            task_start_server_units=closures * self.classes_per_task,
            server_unit=functools.partial(one_closure, self.encoder, shape),
        )

    def probe_copy(self) -> None:
        """The cost probe's copy neither moves prototypes nor inverts (priced above)."""
        self._probing = True

    def broadcast(self, server: ServerState) -> dict[str, torch.Tensor]:
        """best_1 and best_2 (θ and buffers each) and their class counts, once kept."""
        if self.opts.proxy == "none" or self.best_2.numel() == 0:
            return {}
        sent = {BEST[1]: self.best_2, BEST_CLASSES: self.best_classes}
        if self.best_1.numel() > 0:
            sent[BEST[0]] = self.best_1
        return sent

    def receive_upload(self, upload: Upload, server: ServerState) -> None:
        """The server pools the uploaded gradients (copies: uploads are only lent)."""
        grads = upload.extras.get(PROTO_GRAD)
        if grads is not None:
            self._pool.extend(row.detach().clone() for row in grads)

    def after_aggregate(self, server: ServerState) -> None:
        """The proxy server (``dataloader``): new gradients rebuild its evaluation set and
        move best_2 to best_1; then θ_g, scored on the set, becomes best_2 when it scores at
        least the best score so far."""
        if self.opts.proxy == "none":
            return
        if self._pool:
            self.proxy_x, self.proxy_y = self._rebuild(self._pool, server.round_index)
            self._pool = []
            self.best_1 = self.best_2
            self.best_classes = torch.stack([self.best_classes[1], self.best_classes[1]])
        if self.proxy_y.numel() == 0:
            return
        classes = (server.task + 1) * self.classes_per_task
        accuracy = self._score(server, classes)
        if keep_best(self.best_perf, accuracy):
            self.best_perf = accuracy
            self.best_2 = torch.cat([server.global_params, server.global_buffers]).detach().clone()
            self.best_classes = torch.stack([self.best_classes[0], torch.tensor(classes)])

    def _rebuild(
        self, pool: list[torch.Tensor], round_index: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Every pooled gradient inverted (the last ``KEEP`` iterates each), labelled by the
        label it gives away, in the code's order: by label, then as they arrived."""
        grads = [split_gradient(g, self.encoder) for g in pool]
        labels = [gradient_label(g) for g in grads]
        order = sorted(range(len(grads)), key=lambda i: labels[i])
        gen = generator(self.seed, "glfc.inversion", round_index)
        iterations = self.opts.inversion_iterations
        keep = min(KEEP, iterations)
        shape = (self.shape[0], self.shape[1], self.shape[2])
        xs = [reconstruct(self.encoder, grads[i], shape, gen, iterations, keep) for i in order]
        ys = [torch.full((keep,), labels[i], dtype=torch.long) for i in order]
        return torch.cat(xs), torch.cat(ys).to(xs[0].device)

    def _score(self, server: ServerState, classes: int) -> int:
        """θ_g's ``monitor_accuracy`` on the rebuilt samples (eval mode)."""
        model = server.model
        model.load(server.global_params, server.global_buffers)
        was_training = model.module.training
        model.module.eval()
        with torch.no_grad():
            outputs = torch.cat(
                [model.module(chunk) for chunk in self.proxy_x.split(MONITOR_CHUNK)]
            )
        model.module.train(was_training)
        return monitor_accuracy(outputs, self.proxy_y, classes)


class ProxyTeacher:
    """The client's side of the proxy server: which of the broadcast models it distils from
    this round (``old_model_choice``), kept in its state between rounds."""

    name: ClassVar[str]  # the component's (``Component.name``)
    num_classes: int
    classes_per_task: int

    def _proxy_inputs(self, client: ClientState, broadcast: Broadcast) -> ClientInputs:
        """The old model ``old_model_choice`` picks (kept on the client between rounds), the
        old classes (its outputs: the classes of the tasks up to the one it was kept in),
        the classes seen, and whether there is one."""
        state = client.state_for(self.name)
        payloads = broadcast.payloads
        choice = old_model_choice(
            bool(state.get("signal")), BEST[0] in payloads, BEST[1] in payloads
        )
        if choice in ("best_1", "best_2"):
            which = 0 if choice == "best_1" else 1
            flat, n = payloads[BEST[which]], broadcast.params.numel()
            state["old_model"], state["old_buffers"] = flat[:n].clone(), flat[n:].clone()
            state["old_classes"] = int(payloads[BEST_CLASSES][which])
        elif choice == "none":
            for key in ("old_model", "old_buffers", "old_classes"):
                state.pop(key, None)
        device = broadcast.params.device
        seen = torch.zeros(self.num_classes, device=device)
        seen[: (client.task + 1) * self.classes_per_task] = 1.0
        has_teacher = "old_model" in state
        old = torch.zeros(self.num_classes, device=device)
        if has_teacher:
            old[: int(state["old_classes"])] = 1.0  # type: ignore[call-overload]
        return {
            "teacher": state["old_model"] if has_teacher else broadcast.params,
            "teacher_buffers": state["old_buffers"] if has_teacher else broadcast.buffers,
            "old": old * seen,
            "seen": seen,
            "weight": torch.tensor(float(has_teacher), device=device),
        }
