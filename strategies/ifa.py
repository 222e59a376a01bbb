"""IFA: iterative forgetting and adaptation, as a server schedule.

"Forget to Generalize: Iterative Adaptation" (2026). Training is cut into generations of
``generation`` rounds (default: one task's rounds). At the end of each generation, after
aggregation, a selected part of the global parameters is reset:

* ``mode=later`` — every parameter of the last layers, taken from the output side: the
  suffix of whole layers (modules that own parameters, in ``parameters()`` order) whose
  parameter count is nearest to ρ·P, at least one layer. Whole layers cannot hit ρ·P
  exactly: on ``mnist-cnn`` (21,840 parameters) ρ = 0.2 selects the output layer fc2
  (510 parameters, 2.3 %), because adding fc1 would reach 75.8 %.
* ``mode=random`` — round(ρ·P) scalar parameters drawn uniformly without replacement, a fresh
  draw per generation from the seeded generator ``(seed, "ifa", generation)``.

The selected values return to what they were at the start of that generation
(``reset_to=generation_start``, default) or to the run's initial random values
(``reset_to=init``). Only θ_g changes, so it composes with any learner and aggregator; it runs
before FedGP's server hook so the reference gradient is taken at the reset model.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from strategies.base import Component, Option, StrategyEnv, positive_int, text, unit_fraction

if TYPE_CHECKING:
    import torch

    from cfl_bench.engine.context import ServerState
    from cfl_bench.flat import ParamSlice


def generation_length(raw: str) -> int | None:
    """Rounds per generation, or ``task``/``auto`` (any case: None = one task's rounds); the
    refusal names every accepted form, not just the integer one."""
    if raw.lower() in ("task", "auto"):
        return None
    try:
        return positive_int(raw)
    except ValueError:
        raise ValueError("must be a positive integer, 'task' or 'auto'") from None


def later_layers_start(slices: tuple[ParamSlice, ...], rho: float) -> int:
    """Flat offset where the selected suffix of whole layers begins (``mode=later``)."""
    layers: list[tuple[str, int, int]] = []  # (module name, start, numel), parameters() order
    for s in slices:
        module = s.name.rpartition(".")[0]
        if layers and layers[-1][0] == module:
            name, start, numel = layers[-1]
            layers[-1] = (name, start, numel + s.numel)
        else:
            layers.append((module, s.start, s.numel))
    total = sum(numel for _, _, numel in layers)
    target = rho * total
    best_start, best_gap, count = layers[-1][1], float("inf"), 0
    for _, start, numel in reversed(layers):
        count += numel
        gap = abs(count - target)
        if gap < best_gap:
            best_start, best_gap = start, gap
    return best_start


def random_selection(num_params: int, rho: float, seed: int, index: int) -> torch.Tensor:
    """round(ρ·P) distinct flat indices (at least one), seeded per generation."""
    import torch

    from cfl_bench.seeding import generator

    count = max(1, round(rho * num_params))
    return torch.randperm(num_params, generator=generator(seed, "ifa", index))[:count]


class IFA(Component):
    name: ClassVar[str] = "ifa"
    summary: ClassVar[str] = "reset a ρ fraction of θ_g at every generation end"
    paper: ClassVar[str] = '"Forget to Generalize: Iterative Adaptation" (IFA), 2026'
    state_attributes: ClassVar[tuple[str, ...]] = ("initial", "start", "resets")
    options: ClassVar[tuple[Option, ...]] = (
        Option(
            "mode",
            "later",
            "later = last layers by parameter count; random = random scalars",
            text,
            choices=("later", "random"),
        ),
        Option("rho", 0.2, "fraction of the parameters to reset", unit_fraction),
        Option(
            "generation",
            "task",
            "rounds per generation ('task' = the rounds of one task)",
            generation_length,
            show=lambda value: "task" if value is None else str(value),
        ),
        Option(
            "reset_to",
            "generation_start",
            "reset to the generation's starting values or to the initial ones",
            text,
            choices=("generation_start", "init"),
        ),
    )

    def setup(self, env: StrategyEnv) -> None:
        self.mode = str(self.values["mode"])
        self.rho = float(str(self.values["rho"]))
        generation = self.values["generation"]
        self.generation = generation if isinstance(generation, int) else None
        self.to_init = self.values["reset_to"] == "init"
        self.seed = env.seed
        self.initial: torch.Tensor | None = None
        self.start: torch.Tensor | None = None
        self.resets = 0

    def _starts(self, server: ServerState) -> bool:
        if self.generation is None:  # one (global) task: see cfl_bench.engine.task_clock
            return server.round_in_task == 0
        return (server.round_index - 1) % self.generation == 0

    def _ends(self, server: ServerState) -> bool:
        if self.generation is None:
            return server.is_task_end
        return server.round_index % self.generation == 0

    def on_round_start(self, server: ServerState) -> None:
        if self.initial is None:
            self.initial = server.global_params.detach().clone()
        if self._starts(server) and not self.to_init:
            self.start = server.global_params.detach().clone()

    def after_aggregate(self, server: ServerState) -> None:
        if not self._ends(server):
            return
        source = self.initial if self.to_init else self.start
        assert source is not None  # on_round_start ran for this generation
        params = server.global_params
        if self.mode == "later":
            begin = later_layers_start(server.model.slices, self.rho)
            params[begin:] = source[begin:]
        else:
            idx = random_selection(params.numel(), self.rho, self.seed, self.resets).to(
                params.device
            )
            params[idx] = source[idx]
        self.resets += 1
