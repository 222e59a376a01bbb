"""Per-client task orders (``--task-order per-client``): FedWeIT's clients that see tasks in
different orders, for every learner.

FedWeIT (Yoon et al., ICML 2021) gives every client its own task sequence. The official code
(wyjeong/FedWeIT) does not draw the sequences: ``data/loader.py`` hard-codes, for its
NonIID-50 protocol, a table of 5 clients × 10 task names taken from the 50 tasks its
``data/generator.py`` cuts out of 8 datasets (classes shuffled with the seed 777, 5 classes
per task); the clients' task *sets* are disjoint, and each client is evaluated on its own
tasks seen so far (``get_test``: the tasks of its list up to the current one). The paper's
Overlapped-CIFAR-100 gives each client 10 of 20 superclass tasks, so sets overlap there.

Here every client trains a permutation of the *same* task set, the stream's T tasks: client
k trains stream task π_k(t) at step t (0-based), so all clients still cross task boundaries
together (the synchronous clock) and every task is trained by every client once. That is
the case where FedWeIT's rule "each client is scored on its own tasks so far" and the
suite's global accuracy matrix meet: the global model is scored on every task at every
step and client k's accuracy is read off the columns π_k(0..t) (docs/metrics.md). Disjoint
or overlapping task subsets per client (NonIID-50, Overlapped-CIFAR-100) are not this
option: they change what each task's data is split among.

π_k is ``torch.randperm(T)`` from its own generator (seed, "task-order", k), with the run
seed unless ``seed=N`` fixes the orders across run seeds. ``shared`` (the default) is every
client in the stream's order, π_k = identity: today's behaviour, with nothing recorded.

Parsed before torch is loaded (a typo is answered at once); the orders are a pure function
of (option, clients, tasks, run seed), so a resumed run rebuilds them.
"""

from __future__ import annotations

from dataclasses import dataclass

from cfl_bench.core.errors import UserError
from cfl_bench.core.text_values import non_negative_int, quoted, split_options

SHARED = "shared"
PER_CLIENT = "per-client"
NAMES = (SHARED, PER_CLIENT)
OPTION_HELP: dict[str, str] = {
    "seed": "the orders' seed (default: the run's seed), so runs of other seeds can share them",
}


@dataclass(frozen=True)
class TaskOrder:
    """``per-client``: every client its own seeded permutation of the stream's tasks."""

    seed: int | None = None

    def orders(
        self, num_clients: int, num_tasks: int, run_seed: int
    ) -> tuple[tuple[int, ...], ...]:
        """π_k for every client k: ``orders[k][t]`` is the stream task client k trains at
        step t. torch is imported here so that parsing the option does not load it."""
        import torch

        from cfl_bench.core.seeding import generator

        base = run_seed if self.seed is None else self.seed
        return tuple(
            tuple(
                int(i)
                for i in torch.randperm(num_tasks, generator=generator(base, "task-order", k))
            )
            for k in range(num_clients)
        )

    def describe(self) -> dict[str, object]:
        """The option in the protocol (runs with other orders are other protocols)."""
        return {"name": PER_CLIENT, "seed": self.seed}


def parse_task_order(spec: str) -> TaskOrder | None:
    """``shared`` (None: the stream's order for everyone) or ``per-client[:seed=N]``;
    anything else is refused in one line."""
    text = spec.strip()
    name, colon, opt_text = text.partition(":")
    name = name.strip()
    if name not in NAMES or (name == SHARED and colon):
        raise UserError(
            f"unknown --task-order {quoted(text or spec)}; write 'shared' (every client in the "
            f"stream's order) or 'per-client' / 'per-client:seed=N' (each client its own "
            f"permutation of the tasks)."
        )
    if name == SHARED:
        return None
    if not colon:
        return TaskOrder()
    raw = split_options("task-order", name, opt_text, list(OPTION_HELP), _unknown_key)
    try:
        return TaskOrder(seed=non_negative_int(raw["seed"])) if "seed" in raw else TaskOrder()
    except ValueError as exc:
        raise UserError(f"--task-order option seed {exc}, got {quoted(raw['seed'])}.") from None


def check_task_order_text(spec: str) -> str:
    """The option's grammar for ``RunConfig`` (ValueError("must …"), as every option's)."""
    try:
        parse_task_order(spec)
    except UserError:
        raise ValueError("must be shared, per-client or per-client:seed=N") from None
    return spec


def _unknown_key(key: str, _has_value: bool) -> str:
    return f"unknown --task-order option {quoted(key)}; its only option is seed."
