"""IFA: iterative forgetting and adaptation, as a server schedule.

"Forget to Generalize: Iterative Adaptation" (2026). Training is cut into generations of
``generation`` rounds (default: one task's rounds), or into ``generations`` equal parts of
the run. When a generation ends, a selected part of the global parameters is reset, and
the next generation trains from there (the paper's Alg. 1):

* ``mode=later`` — every parameter of the last layers, taken from the output side: the
  suffix of whole layers (modules that own parameters, in ``parameters()`` order) whose
  parameter count is nearest to ρ·P, at least one layer. Whole layers cannot hit ρ·P
  exactly: on ``mnist-cnn`` (21,840 parameters) ρ = 0.2 selects the output layer fc2
  (510 parameters, 2.3 %), because adding fc1 would reach 75.8 %.
  That is ``later_unit=params`` (default). ``later_unit=layers`` is the paper's reading:
  the last max(1, round(ρ·L)) of the model's L weight layers (convolutions and linear
  layers; a normalisation layer's affine parameters go with the weight layer before it,
  as in every ResNet's conv→BN pairs). On the CIFAR ResNet-18 (11.17M parameters,
  21 weight layers) ρ = 0.2 resets the last 4 (fc, layer4's last two convolutions and
  its shortcut: 43.5 % of the parameters), while ``params`` resets 21.2 % (the suffix
  from layer4.1.conv2).
* ``mode=random`` — round(ρ·P) scalar parameters drawn uniformly without replacement, a fresh
  draw per generation from the seeded generator ``(seed, "ifa", generation)``.

The selected values return to what they were at the start of the generation that just
ended (``reset_to=generation_start``, default) or to the run's initial random values
(``reset_to=init``).

Why the reset happens at the start of the next generation's first round (before its
broadcast) and not right after the generation's last aggregation: every evaluation at a
round's end then sees the model the generation trained, which is what the paper reports
as "Gen. g" (and what a task-end accuracy means), and a run's last generation end resets
nothing that no round adapts. Only θ_g changes, so it composes with any learner and
aggregator. Its cost: FedGP's reference gradient for that first round was taken after
the previous aggregation, at the model before the reset.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import torch
from torch import nn

from cfl_bench.core.errors import UserError
from cfl_bench.core.seeding import generator
from cfl_bench.strategies import declarations
from cfl_bench.strategies.base import Component, Declaration, StrategyEnv
from cfl_bench.strategies.declarations import IFAOptions

if TYPE_CHECKING:
    from cfl_bench.core.context import ServerState
    from cfl_bench.core.flat import ParamSlice


def later_layers_start(slices: tuple[ParamSlice, ...], rho: float) -> int:
    """Flat offset where the selected suffix of whole layers begins (``mode=later``)."""
    layers = _layers(slices)
    total = sum(numel for _, _, numel in layers)
    target = rho * total
    best_start, best_gap, count = layers[-1][1], float("inf"), 0
    for _, start, numel in reversed(layers):
        count += numel
        gap = abs(count - target)
        if gap < best_gap:
            best_start, best_gap = start, gap
    return best_start


def _layers(slices: tuple[ParamSlice, ...]) -> list[tuple[str, int, int]]:
    """(module name, flat start, numel) of every module that owns parameters, in
    ``parameters()`` order."""
    layers: list[tuple[str, int, int]] = []
    for s in slices:
        module = s.name.rpartition(".")[0]
        if layers and layers[-1][0] == module:
            name, start, numel = layers[-1]
            layers[-1] = (name, start, numel + s.numel)
        else:
            layers.append((module, s.start, s.numel))
    return layers


def later_weight_layers_start(
    slices: tuple[ParamSlice, ...], rho: float, norm_modules: frozenset[str]
) -> int:
    """Flat offset where the last max(1, round(ρ·L)) weight layers begin
    (``later_unit=layers``): L counts the modules owning parameters that are not in
    ``norm_modules``; a norm layer's parameters belong to the weight layer before it, so
    the suffix starts at a weight layer and takes every norm layer after it."""
    weight_layers = [start for name, start, _ in _layers(slices) if name not in norm_modules]
    if not weight_layers:  # a model made only of norm layers: reset everything
        return 0
    count = max(1, round(rho * len(weight_layers)))
    return weight_layers[-min(count, len(weight_layers))]


def norm_module_names(module: torch.nn.Module) -> frozenset[str]:
    """Names of the normalisation layers (batch, group, layer, instance norm) of ``module``."""
    kinds = (nn.modules.batchnorm._NormBase, nn.GroupNorm, nn.LayerNorm)
    return frozenset(name for name, m in module.named_modules() if isinstance(m, kinds))


def random_selection(num_params: int, rho: float, seed: int, index: int) -> torch.Tensor:
    """round(ρ·P) distinct flat indices (at least one), seeded per generation."""
    count = max(1, round(rho * num_params))
    return torch.randperm(num_params, generator=generator(seed, "ifa", index))[:count]


class IFA(Component):
    declaration: ClassVar[Declaration] = declarations.IFA
    opts: IFAOptions
    state_attributes: ClassVar[tuple[str, ...]] = ("initial", "start", "resets")

    def setup(self, env: StrategyEnv) -> None:
        self.mode = self.opts.mode
        self.rho = self.opts.rho
        generation = self.opts.generation
        self.generation = generation if isinstance(generation, int) else None
        self.count = self.opts.generations
        if self.count and "generation" in self.explicit:
            raise UserError(
                "ifa takes either generation=N (rounds per generation) or generations=N "
                "(equal parts of the run), not both; drop one."
            )
        self.to_init = self.opts.reset_to == "init"
        self.by_layers = self.opts.later_unit == "layers"
        self.num_tasks = env.num_tasks
        self.seed = env.seed
        self.initial: torch.Tensor | None = None
        self.start: torch.Tensor | None = None
        self.resets = 0

    def adjust_schedule(self, rounds_per_task: int, epochs: int) -> tuple[int, int]:
        """Resolve ``generations=N`` into rounds per generation (N must divide the T·R
        rounds), and refuse a run in which IFA would never reset: a generation at least as
        long as the run (on a static stream, one task's generation). Lead rounds of
        ``--lead-rounds`` join the last generation."""
        total = rounds_per_task * self.num_tasks
        if self.count:
            if self.count < 2 or total % self.count:
                raise UserError(
                    f"ifa:generations={self.count} must split the run's {total} rounds "
                    "into 2 or more equal generations; give a divisor of "
                    f"{total} above 1 or change --rounds-per-task."
                )
            self.generation = total // self.count
        length = rounds_per_task if self.generation is None else self.generation
        if length < total:
            return rounds_per_task, epochs
        given = "generation=task" if self.generation is None else f"generation={length}"
        raise UserError(
            f"ifa:{given} never resets in a {total}-round run; give ifa:generation=N "
            f"with N < {total} or ifa:generations=N (e.g. ifa:generations=2), or more "
            "rounds."
        )

    def _opens_generation(self, server: ServerState) -> bool:
        """Whether this round is the first of a generation after the first one."""
        if server.round_index <= 1:
            return False
        if self.generation is None:  # one (global) task: see cfl_bench.engine.task_clock
            return server.round_in_task == 0
        index, offset = divmod(server.round_index - 1, self.generation)
        return offset == 0 and (not self.count or index < self.count)

    def on_round_start(self, server: ServerState) -> None:
        if self.initial is None:
            self.initial = server.global_params.detach().clone()
            self.start = self.initial
        if not self._opens_generation(server):
            return
        self._reset(server)
        if not self.to_init:
            self.start = server.global_params.detach().clone()

    def _reset(self, server: ServerState) -> None:
        source = self.initial if self.to_init else self.start
        assert source is not None  # set in the first round
        params = server.global_params
        if self.mode == "later":
            begin = self._later_start(server)
            params[begin:] = source[begin:]
        else:
            idx = random_selection(params.numel(), self.rho, self.seed, self.resets).to(
                params.device
            )
            params[idx] = source[idx]
        self.resets += 1

    def _later_start(self, server: ServerState) -> int:
        slices = server.model.slices
        if not self.by_layers:
            return later_layers_start(slices, self.rho)
        norms = norm_module_names(server.model.module)
        return later_weight_layers_start(slices, self.rho, norms)
