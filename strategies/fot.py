"""FOT: Federated Orthogonal Training (Bakman, Yaldiz, Ezzeldin, Avestimehr, ICLR 2024).

At the end of every task the server learns, for each Linear and Conv2d layer l, an
orthonormal basis U_l (d_l × k_l) of the inputs that layer saw on the tasks so far; from then
on every aggregated update of that layer's weight is projected orthogonally to it on the
server:

    Δ_l = θ_avg,l − θ_old,l        θ_g,l = θ_old,l + Δ_l − Δ_l · U_l · U_lᵀ

so W_new · a = W_old · a for every old-task input a in span(U_l) (biases are averaged
unprojected, as in the code). A Conv2d's weight (out, C, k_h, k_w) is read as the matrix
(out × C·k_h·k_w) and its "inputs" are its input patches (one per example and output
position, ``unfolded``), so every output the conv computes on an old-task patch is kept.
Clients train plain FedAvg; nothing changes in their steps.

How U grows, as the official code (duygunuryldz/Federated_Orthogonal_Training, algorithm
``orth``: ``trainer/mnist_trainer.py`` and ``trainer/cifar_trainer.py``
``collect_activations``, ``FedAVGAggregator.expand_orth_set``) does it:

1. In the last round of a task the broadcast also carries the current bases (``fot.basis``,
   their column counts ``fot.ranks``). Each participant, after its local training, runs its
   *local* model once over its current-task examples and records each layer's input A_l
   (d_l × n_l; a conv layer's patches unfolded with its own kernel, dilation, padding and
   stride). The MLP trainer records in train mode (dropout on), a hidden layer's input
   before the dropout that feeds it (the ReLU output the code hooks); the CIFAR trainer
   records in eval mode the actual layer inputs (``act_mode=auto`` picks by the model).
2. It removes the old subspace, R_l = A_l − U_l·U_lᵀ·A_l, and uploads a random sketch
   R_l · M_l (``fot.sketch``, never the activations), with r_l = ‖R_l‖_F / ‖A_l‖_F and n_c
   (``fot.stats``). M_l is n_l × d_l uniform in [−1, 1] in the MLP trainer; in the CIFAR
   trainer standard normal, n_l × d_l for a conv layer and n_l × 5·d_l for a Linear layer
   (``sketch=auto`` picks by the model: Gaussian as soon as it has a convolution).
3. The server sums the sketches S_l = Σ_c R_c,l·M_c,l (a random projection of all
   clients' residuals side by side), averages r_l weighted by n_c, turns the threshold ε
   into ε' = (r̄ − (1 − ε)) / r̄, takes the SVD S_l = V·Σ·Wᵀ and keeps the first k
   singular vectors, k the smallest with Σ_{i≤k} σ_i² / ‖S_l‖_F² > ε' (all of them if
   none). U_l ← orthonormalised [U_l, V_{:, :k}] (QR). Then ε ← ε + ``eps_inc``.

The code's ratio r is a norm ratio, not an energy ratio (GPM squares it): followed as is.
The paper's own equations could not be read here (the stored pages hold its abstract and the
first lines of its introduction only), so no paper-vs-code option is offered; the options
``act_mode`` and ``sketch`` choose between the code's two trainers, and docs/methods.md says
so.

Traffic at a task end, per participant: down Σ_l d_l·k_l floats (+ L ranks), up Σ_l d_l·w_l
floats (w_l the sketch width) (+ L+1 stats) — with the code's MLP 4.38 MB up, more than the
2.6 MB model; with the code's AlexNet 107 MB up (its two 2048-wide Linear layers' 5·d
sketches are 105 MB of it), 4× the 26.8 MB model.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import torch
from torch import nn
from torch.nn import functional as F

from cfl_bench.core.errors import UserError
from cfl_bench.core.seeding import generator, seed_torch_default
from cfl_bench.strategies import declarations
from cfl_bench.strategies.base import Component, Declaration, ExtraWork, StrategyEnv, TaskEndWork
from cfl_bench.strategies.declarations import FOTOptions

if TYPE_CHECKING:
    from cfl_bench.core.context import ClientState, LocalRound, ServerState, Upload
    from cfl_bench.core.flat import FlatModel

#: The models whose weighted layers are all Linear or Conv2d (no normalisation layers): the
#: layers FOT projects.
PROJECTABLE_MODELS: tuple[str, ...] = (
    "fot-mlp",
    "fot-alexnet",
    "mlp",
    "linear",
    "mnist-cnn",
    "fedavg-cnn",
)


#: The shorter side of the largest SVD the cost probe times (``scaled_svds``).
SVD_PROBE_SIDE = 384


@dataclass(frozen=True)
class LayerSlot:
    """Where one layer's weight lives in the flat parameter vector, read as the matrix the
    projection acts on: (out × in) for a Linear layer, (out × C·k_h·k_w) for a Conv2d (its
    (out, C, k_h, k_w) weight flattened per output channel, as the code's
    ``grad.view(grad.size(0), -1)``). ``conv`` holds a Conv2d's unfolding parameters
    (kernel, dilation, padding, stride); None for a Linear layer."""

    name: str
    start: int
    out_features: int
    in_features: int
    conv: tuple[tuple[int, int], tuple[int, int], tuple[int, int], tuple[int, int]] | None = None

    def view(self, flat: torch.Tensor) -> torch.Tensor:
        size = self.out_features * self.in_features
        return flat[self.start : self.start + size].view(self.out_features, self.in_features)


def pair(value: int | tuple[int, ...] | str) -> tuple[int, int]:
    """A Conv2d's kernel/stride/padding/dilation as two ints (refusing 'same' padding)."""
    if isinstance(value, str):
        raise UserError(f"fot cannot unfold a convolution with padding={value!r}; pad by ints.")
    return (value, value) if isinstance(value, int) else (int(value[0]), int(value[1]))


def layer_slots(model: FlatModel) -> list[LayerSlot]:
    """Every Linear and Conv2d weight slot, in the order the modules are registered (the
    order of the sketches and bases)."""
    starts = {s.name: s.start for s in model.slices}
    return module_slots(model.module, starts)


def module_slots(model: nn.Module, starts: dict[str, int] | None = None) -> list[LayerSlot]:
    """``layer_slots`` of a plain module: each weight's start in the flat vector from
    ``starts`` (0 without it, where only the shapes matter: the cost estimate's sizes)."""
    slots = []
    for name, module in model.named_modules():
        if not isinstance(module, nn.Linear | nn.Conv2d):
            continue
        weight = f"{name}.weight" if name else "weight"
        start = 0 if starts is None else starts[weight]
        if isinstance(module, nn.Linear):
            slots.append(LayerSlot(weight, start, module.out_features, module.in_features))
            continue
        if module.groups != 1:
            raise UserError(f"fot cannot project grouped convolution '{name}'; use groups=1.")
        unfold = (module.kernel_size, module.dilation, module.padding, module.stride)
        per_out = module.weight[0].numel()
        conv = (pair(unfold[0]), pair(unfold[1]), pair(unfold[2]), pair(unfold[3]))
        slots.append(LayerSlot(weight, start, module.out_channels, per_out, conv))
    return slots


def unfolded(conv: nn.Conv2d, x: torch.Tensor) -> torch.Tensor:
    """A Conv2d's input as the rows its weight multiplies: one row per (example, output
    position), C·k_h·k_w columns in the weight's (C, k_h, k_w) order, so that
    ``conv(x)`` at each position is ``row @ W.view(out, -1).T`` (the code's ``nn.Unfold``
    with the layer's kernel, then ``permute(0, 2, 1)`` and ``reshape(-1, C·k·k)``)."""
    patches = F.unfold(
        x, conv.kernel_size, dilation=conv.dilation, padding=pair(conv.padding), stride=conv.stride
    )
    return patches.transpose(1, 2).reshape(-1, patches.shape[1])


def layer_inputs(module: nn.Module, x: torch.Tensor, batch_size: int) -> list[torch.Tensor]:
    """Each Linear/Conv2d layer's inputs over ``x`` as a (d_l × n_l) matrix, in registration
    order (n_l = examples for a Linear layer, examples × output positions for a conv).

    Why the dropout hook: the MLP code records a hidden layer's input as the ReLU output,
    before the dropout that feeds it, while the forward itself runs with dropout (train
    mode); so a layer whose input *is* a Dropout's output records that Dropout's input. A
    layer with anything else in between (the AlexNet's max-pool) records its actual input,
    as the CIFAR code does (which records in eval mode, where dropout is the identity)."""
    layers = [m for m in module.modules() if isinstance(m, nn.Linear | nn.Conv2d)]
    seen: list[list[torch.Tensor]] = [[] for _ in layers]
    dropped: list[tuple[torch.Tensor, torch.Tensor] | None] = [None]

    def after_dropout(_: nn.Module, args: tuple[torch.Tensor, ...], out: torch.Tensor) -> None:
        dropped[0] = (out, args[0])

    def before_layer(index: int) -> Callable[[nn.Module, tuple[torch.Tensor, ...]], None]:
        def hook(layer: nn.Module, args: tuple[torch.Tensor, ...]) -> None:
            taken = args[0]
            if dropped[0] is not None and dropped[0][0] is taken:
                taken = dropped[0][1]
            taken = taken.detach()
            if isinstance(layer, nn.Conv2d):
                seen[index].append(unfolded(layer, taken))
            else:
                seen[index].append(taken.reshape(-1, taken.shape[-1]))

        return hook

    handles = [
        m.register_forward_hook(after_dropout)
        for m in module.modules()
        if isinstance(m, nn.Dropout)
    ]
    handles += [m.register_forward_pre_hook(before_layer(i)) for i, m in enumerate(layers)]
    try:
        with torch.no_grad():
            for start in range(0, x.shape[0], batch_size):
                module(x[start : start + batch_size])
    finally:
        for handle in handles:
            handle.remove()
    return [torch.cat(parts).T for parts in seen]


def residual_sketch(
    acts: torch.Tensor,
    basis: torch.Tensor | None,
    rng: torch.Generator,
    law: str = "uniform",
    width: int | None = None,
) -> tuple[torch.Tensor, float]:
    """One client's upload for one layer: (R·M, ‖R‖_F/‖A‖_F) with R = A − U·Uᵀ·A (R = A
    before any basis) and M (n × width, width d by default) drawn from ``rng``: uniform in
    [−1, 1] (the MLP trainer) or standard normal (``gaussian``: the CIFAR trainer)."""
    residual = acts if basis is None else acts - basis @ (basis.T @ acts)
    ratio = 1.0
    if basis is not None:
        whole = float(torch.linalg.matrix_norm(acts))
        ratio = float(torch.linalg.matrix_norm(residual)) / whole if whole > 0 else 0.0
    d, n = acts.shape
    shape = (n, d if width is None else width)
    if law == "gaussian":
        mix = torch.randn(shape, generator=rng, device=rng.device, dtype=acts.dtype)
        return residual @ mix.to(acts.device), ratio
    mix = torch.rand(shape, generator=rng, device=rng.device, dtype=acts.dtype)
    return residual @ mix.mul_(2).sub_(1).to(acts.device), ratio


def sketch_widths(slots: list[LayerSlot], law: str) -> list[int]:
    """Each layer's sketch width: d_l, except a Linear layer's 5·d_l under the CIFAR
    trainer's Gaussian sketch (``mat.shape[0] * 5`` there; its conv layers keep d_l)."""
    wide = law == "gaussian"
    return [s.in_features * (5 if wide and s.conv is None else 1) for s in slots]


def scaled_svds(sizes: list[tuple[int, int]]) -> tuple[float, Callable[[], object]]:
    """(units, unit): the SVDs of matrices of ``sizes`` priced by one call of ``unit``, the
    same SVDs with every side scaled by s so that the largest matrix's shorter side is at
    most ``SVD_PROBE_SIDE``, and ``units`` = Σ d·w·min(d, w) over the scaled sum (an SVD's
    cost grows as d·w·min(d, w)). Why scaled: the largest real one takes up to a minute,
    too long for the probe; at a shorter side of 384 one call takes a fraction of a second.
    Measured on one thread at load 3 for the code's AlexNet (the 48², 576², 512², 1,024 ×
    5,120 and 2,048 × 10,240 sketches): 151.7 units of 0.185 s predict 28 s; the SVDs took
    37 s."""

    def work(d: int, w: int) -> float:
        return float(d * w * min(d, w))

    largest = max(sizes, key=lambda dw: work(*dw))
    s = min(1.0, SVD_PROBE_SIDE / min(largest))
    small = [(max(1, round(d * s)), max(1, round(w * s))) for d, w in sizes]
    units = sum(work(*dw) for dw in sizes) / sum(work(*dw) for dw in small)

    def unit() -> None:
        gen = torch.Generator().manual_seed(0)
        for d, w in small:
            torch.linalg.svd(torch.randn(d, w, generator=gen), full_matrices=False)

    return units, unit


def threshold_rank(singular: torch.Tensor, ratio: float, epsilon: float) -> int:
    """How many leading singular vectors the code keeps: the smallest k with
    Σ_{i≤k} σ_i² / Σ σ_i² > (r − (1 − ε)) / r; all of them when no k passes."""
    target = (ratio - (1.0 - epsilon)) / ratio
    energy = singular.double().square()
    kept = torch.cumsum(energy, 0) / energy.sum()
    passing = torch.nonzero(kept > target)
    return int(passing[0]) + 1 if passing.numel() else int(singular.numel())


def expand_basis(
    basis: torch.Tensor | None, sketch: torch.Tensor, ratio: float, epsilon: float
) -> torch.Tensor | None:
    """U after one task end: [U, first k left singular vectors of the summed sketch],
    orthonormalised by QR; unchanged when nothing of the inputs is left outside U."""
    if ratio <= 0 or not bool(sketch.any()):
        return basis
    left, singular, _ = torch.linalg.svd(sketch, full_matrices=False)
    k = threshold_rank(singular, ratio, epsilon)
    grown = left[:, :k] if basis is None else torch.cat((basis, left[:, :k]), dim=1)
    q, _ = torch.linalg.qr(grown[:, : grown.shape[0]])
    return q


def project_update(
    old: torch.Tensor,
    mean: torch.Tensor,
    slots: list[LayerSlot],
    bases: list[torch.Tensor | None],
) -> torch.Tensor:
    """θ_g: the mean, except each based layer's weight θ_old + Δ − Δ·U·Uᵀ (Δ = mean − old)."""
    theta = mean.clone()
    for slot, basis in zip(slots, bases, strict=True):
        if basis is None:
            continue
        delta = slot.view(mean) - slot.view(old)
        slot.view(theta).copy_(slot.view(old) + delta - (delta @ basis) @ basis.T)
    return theta


def pack(bases: list[torch.Tensor | None]) -> tuple[torch.Tensor, torch.Tensor]:
    """The broadcast form of the bases: one flat tensor and each layer's column count."""
    ranks = [0 if b is None else int(b.shape[1]) for b in bases]
    parts = [b.reshape(-1) for b in bases if b is not None]
    return torch.cat(parts), torch.tensor(ranks, dtype=torch.int64, device=parts[0].device)


def unpack(flat: torch.Tensor, ranks: torch.Tensor, dims: list[int]) -> list[torch.Tensor | None]:
    """The bases back from ``pack``'s tensors (a layer of rank 0 has none)."""
    bases: list[torch.Tensor | None] = []
    offset = 0
    for d, k in zip(dims, ranks.tolist(), strict=True):
        bases.append(None if k == 0 else flat[offset : offset + d * k].view(d, k))
        offset += d * k
    return bases


class FOT(Component):
    declaration: ClassVar[Declaration] = declarations.FOT
    opts: FOTOptions
    uses_after_local: ClassVar[bool] = True
    # The bases, the current ε, and the task end's sums being collected (sketches, Σ n·r per
    # layer, Σ n): everything the next rounds need survives a checkpoint.
    state_attributes: ClassVar[tuple[str, ...]] = ("bases", "epsilon", "_sketches", "_ratios")

    def extra_work(self) -> ExtraWork:
        """Each participant's forward pass over its current examples at every task end, and
        the server's SVD of one d × w sketch per projected layer at every task end but the
        last (about 24 s a task end on one CPU thread for the code's AlexNet, whose fc2
        sketch is 2,048 × 10,240; the clients' sketch products are not counted)."""
        return ExtraWork(task_end_forward=True, task_end_server=self.svd_work)

    def svd_work(self, model: nn.Module) -> TaskEndWork:
        """The task end's SVDs for ``model``'s layers, as units of a scaled-down copy."""
        slots = self.projected(module_slots(model))
        widths = sketch_widths(slots, self.recipe(slots)[1])
        return (scaled_svds([(s.in_features, w) for s, w in zip(slots, widths, strict=True)]),)

    def setup(self, env: StrategyEnv) -> None:
        """Refuse a model with weighted layers FOT does not project (it handles Linear and
        Conv2d layers; a normalisation layer's parameters would be averaged unprojected)."""
        name = env.model.name
        if name and name not in PROJECTABLE_MODELS:
            raise UserError(
                f"fot projects Linear and Conv2d layers only and model '{name}' has other "
                f"weighted layers; use --model {', '.join(PROJECTABLE_MODELS)}."
            )
        self.seed = env.seed
        self.batch_size = env.batch_size
        self.num_tasks = env.num_tasks
        # The code projects its MLP's output layer (layers.9) but not its AlexNet's per-task
        # heads (``last``): a task-IL stream's output layer is its heads.
        choice = self.opts.last_layer
        self.free_last = choice == "free" or (choice == "auto" and env.scenario == "task-il")
        self.bases: list[torch.Tensor | None] = []
        self.epsilon = self.opts.epsilon
        self._sketches: list[torch.Tensor] = []
        self._ratios: torch.Tensor | None = None  # Σ_c n_c·r_c,l per layer, then Σ n_c
        self._old: torch.Tensor | None = None

    def projected_slots(self, model: FlatModel) -> list[LayerSlot]:
        """The layers FOT bases and projects: every Linear and Conv2d, or all but the output
        layer."""
        return self.projected(layer_slots(model))

    def projected(self, slots: list[LayerSlot]) -> list[LayerSlot]:
        """``slots`` without the output layer when it is left free (``last_layer``)."""
        return slots[:-1] if self.free_last else slots

    def recipe(self, slots: list[LayerSlot]) -> tuple[bool, str]:
        """(record in train mode?, the sketch's law) after ``auto``: the official trainer of
        the model's kind — the MLP trainer (train mode, uniform) for Linear-only models, the
        CIFAR trainer (eval mode, Gaussian, Linear sketches 5·d wide) for models with
        convolutions."""
        conv = any(s.conv is not None for s in slots)
        mode, law = self.opts.act_mode, self.opts.sketch
        if mode == "auto":
            mode = "eval" if conv else "train"
        if law == "auto":
            law = "gaussian" if conv else "uniform"
        return mode == "train", law

    def broadcast(self, server: ServerState) -> dict[str, torch.Tensor]:
        """The bases go out only in a task's last round, where clients need them."""
        if not server.is_task_end or not any(b is not None for b in self.bases):
            return {}
        flat, ranks = pack(self.bases)
        return {"fot.basis": flat, "fot.ranks": ranks}

    def after_local(self, client: ClientState, upload: Upload, local: LocalRound) -> None:
        """At a task end: the sketches of this client's layer inputs at its local model."""
        if not local.broadcast.is_task_end or client.train_x is None or client.num_samples == 0:
            return
        module = local.model.module
        slots = self.projected_slots(local.model)
        if not slots:  # a one-layer model whose only layer is the free output layer
            return
        dims = [s.in_features for s in slots]
        payloads = local.broadcast.payloads
        bases: list[torch.Tensor | None] = [None] * len(slots)
        if "fot.basis" in payloads:
            bases = unpack(payloads["fot.basis"], payloads["fot.ranks"], dims)
        rows = torch.arange(client.num_samples, device=client.train_x.device)
        training = module.training
        record_training, law = self.recipe(slots)
        module.train(record_training)
        seed_torch_default(self.seed, "fot-activations", local.broadcast.round_index, client.index)
        acts = layer_inputs(module, client.inputs(rows), self.batch_size)[: len(slots)]
        module.train(training)
        rng = generator(self.seed, self.random_stream, client.index, local.broadcast.task)
        sketches, ratios = [], []
        widths = sketch_widths(slots, law)
        for a, basis, width in zip(acts, bases, widths, strict=True):
            sketch, ratio = residual_sketch(a, basis, rng, law, width)
            sketches.append(sketch.reshape(-1))
            ratios.append(ratio)
        stats = [*ratios, float(client.num_samples)]
        upload.extras["fot.sketch"] = torch.cat(sketches)
        upload.extras["fot.stats"] = torch.tensor(stats, dtype=torch.float32)

    def receive_upload(self, upload: Upload, server: ServerState) -> None:
        """Keep θ_old for the projection; sum the sketches and the n-weighted ratios."""
        self._old = server.global_params  # θ_old until aggregation replaces it
        if "fot.sketch" not in upload.extras:
            return
        stats = upload.extras["fot.stats"]
        weighted = torch.cat((stats[:-1] * stats[-1], stats[-1:]))
        if not self._sketches:
            self._sketches = [upload.extras["fot.sketch"].clone()]
            self._ratios = weighted
        else:
            assert self._ratios is not None
            self._sketches[0].add_(upload.extras["fot.sketch"])
            self._ratios.add_(weighted)

    def aggregate(self, server: ServerState) -> None:
        """Project each based layer's aggregated update orthogonally to its basis."""
        old, self._old = self._old, None
        if old is None or not any(b is not None for b in self.bases):
            return
        slots = self.projected_slots(server.model)
        server.global_params = project_update(old, server.global_params, slots, self.bases)

    def after_aggregate(self, server: ServerState) -> None:
        """After a task end's projection: grow every layer's basis, then ε += eps_inc.

        Not after the run's last task: no later round projects with those bases, so the
        SVDs (AlexNet's fc2 sketch is 2,048 x 10,240, about a minute on one CPU thread)
        would change nothing a run records. The clients' sketches still travel and count."""
        if not self._sketches:
            return
        if server.task < self.num_tasks - 1:
            self._grow_bases(server)
        self.epsilon += self.opts.eps_inc
        self._sketches, self._ratios = [], None

    def _grow_bases(self, server: ServerState) -> None:
        """Each layer's basis, expanded by its slice of the summed sketch."""
        assert self._ratios is not None
        slots = self.projected_slots(server.model)
        if not self.bases:
            self.bases = [None] * len(slots)
        ratios = (self._ratios[:-1] / self._ratios[-1]).tolist()
        offset = 0
        widths = sketch_widths(slots, self.recipe(slots)[1])
        for i, (slot, width) in enumerate(zip(slots, widths, strict=True)):
            d = slot.in_features
            sketch = self._sketches[0][offset : offset + d * width].view(d, width)
            offset += d * width
            self.bases[i] = expand_basis(self.bases[i], sketch, ratios[i], self.epsilon)
