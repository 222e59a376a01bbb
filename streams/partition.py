"""Partitioners: which client holds which training indices of a task.

A partitioner is a seeded, deterministic function of (labels, number of clients, task,
seed) returning one sorted int64 CPU index tensor per client, disjoint across clients —
except ``class-subsets``, GLFC's split, where clients share examples by design.
Every random draw uses its own seed from ``derive_seed(seed, "partition", <name>)``, so
partitions never shift when other random consumers are added.

Whether the draw depends on the task is a per-partitioner protocol decision:

* ``shards`` and ``iid`` ignore ``task``: the FedGP protocol draws the MNIST client split
  once and reuses it for every task, which keeps domain-IL tasks comparable (client k sees
  the same digits in every task). Because the draw is fixed, the split is identical for
  every task whose labels are identical, so callers may cache it.
* ``dirichlet`` (the LDA split of seq-CIFAR) folds ``task`` into its seed, since each
  class-IL task has new classes and the paper redraws per task.

Asynchronous schedules (when a client reaches each task) are a separate concept and do not
belong here: a partitioner only says *what* data a client holds within one task.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from cfl_bench.core.errors import UserError
from cfl_bench.core.seeding import derive_seed, generator
from cfl_bench.core.text_values import quoted
from cfl_bench.streams.partition_base import (
    Partitioner,
    check_labels,
    check_positive_int,
    task_classes,
)
from cfl_bench.streams.partition_quantity import LabelQuantityPartitioner
from cfl_bench.streams.partition_spec import (  # noqa: F401 - re-exported: the partition names
    OPTION_PARSERS,
    PARTITIONERS,
    parse_partition_spec,
    unknown_option,
    unknown_partition,
)


class ShardPartitioner(Partitioner):
    """The FedGP/FedAvg pathological non-IID split.

    Sort the training indices by label (stable, so ties keep their original order), cut the
    sorted list into ``shards_per_client * K`` equal contiguous shards and give each client
    ``shards_per_client`` shards chosen at random. If N is not divisible by the number of
    shards, the last ``N mod shards`` indices of the label-sorted order (samples of the
    highest labels) are dropped, so every shard and every client has the same size; for
    MNIST with K = 10 or 100 and 2 shards each nothing is dropped.
    """

    name = "shards"

    def __init__(self, shards_per_client: int = 2) -> None:
        check_positive_int("shards_per_client", shards_per_client)
        self.shards_per_client = shards_per_client

    def split(
        self, labels: torch.Tensor, num_clients: int, *, task: int, seed: int
    ) -> list[torch.Tensor]:
        labels = check_labels(labels)
        check_positive_int("number of clients", num_clients)
        num_shards = self.shards_per_client * num_clients
        total = labels.shape[0]
        if total < num_shards:
            raise UserError(
                f"the shards partition needs at least {num_shards} training samples "
                f"({num_clients} clients x {self.shards_per_client} shards), the task has "
                f"{total}; use fewer clients or shards per client, or more data"
            )
        shard_size = total // num_shards
        by_label = torch.sort(labels, stable=True).indices
        shards = by_label[: num_shards * shard_size].view(num_shards, shard_size)
        # Deliberately independent of `task`: the split is drawn once for the whole stream.
        order = torch.randperm(num_shards, generator=generator(seed, "partition", "shards"))
        owned = order.view(num_clients, self.shards_per_client)
        return [torch.sort(shards[row].flatten()).values for row in owned]

    def describe(self) -> dict[str, object]:
        return {
            "name": self.name,
            "shards_per_client": self.shards_per_client,
            "remainder": "dropped from the end of the label-sorted order",
            "per_task": False,
        }


class ClassShardPartitioner(Partitioner):
    """FedNTD's ``sharding`` split: every shard holds one class, each client s shards.

    With K clients, s shards per client and C classes there are K·s shards, K·s / C per class
    (so K·s must be a multiple of C). Each class's indices (ascending) are cut into that many
    contiguous shards whose sizes differ by at most one — nothing is dropped, unlike
    ``shards``, whose equal cuts of the label-sorted order can straddle two classes. The
    shards' class labels, C copies each of … K·s/C, are shuffled into a K × s table (client k
    gets the classes of row k, possibly one class twice, as in the authors' code), and each
    class's shards are handed out in a seeded random order. Drawn once for all tasks, like
    ``shards`` (the FL papers' static streams have one task).
    """

    name = "class-shards"

    def __init__(self, shards_per_client: int = 2) -> None:
        check_positive_int("shards_per_client", shards_per_client)
        self.shards_per_client = shards_per_client

    def split(
        self, labels: torch.Tensor, num_clients: int, *, task: int, seed: int
    ) -> list[torch.Tensor]:
        labels = check_labels(labels)
        check_positive_int("number of clients", num_clients)
        classes = torch.unique(labels)
        per_class = self._shards_per_class(num_clients, int(classes.numel()))
        rng = generator(seed, "partition", "class-shards")
        shards: list[list[torch.Tensor]] = []
        for c in classes.tolist():
            rows = torch.nonzero(labels == c).flatten()
            if rows.numel() < per_class:
                raise UserError(
                    f"the class-shards partition cuts every class into {per_class} shards but "
                    f"class {c} has {rows.numel()} training samples; use fewer clients or "
                    f"shards per client, or more data"
                )
            pieces = list(torch.tensor_split(rows, per_class))
            order = torch.randperm(per_class, generator=rng).tolist()
            shards.append([pieces[i] for i in order])
        table = torch.arange(classes.numel()).repeat(per_class)
        table = table[torch.randperm(table.numel(), generator=rng)]
        table = table.view(num_clients, self.shards_per_client)
        return [
            torch.sort(torch.cat([shards[c].pop() for c in row.tolist()])).values for row in table
        ]

    def _shards_per_class(self, num_clients: int, num_classes: int) -> int:
        total = num_clients * self.shards_per_client
        if total % num_classes:
            raise UserError(
                f"the class-shards partition gives every class the same number of shards, so "
                f"clients x shards_per_client ({num_clients} x {self.shards_per_client} = "
                f"{total}) must be a multiple of the {num_classes} classes; change --clients "
                f"or class-shards:shards_per_client"
            )
        return total // num_classes

    def describe(self) -> dict[str, object]:
        return {
            "name": self.name,
            "shards_per_client": self.shards_per_client,
            "shard": "one class; each class cut into equal contiguous shards (sizes differ <= 1)",
            "per_task": False,
        }


class IIDPartitioner(Partitioner):
    """A uniformly random split into K near-equal parts (sizes differ by at most one).

    The permutation is drawn once (independent of ``task``), like the shard split, so that
    IID baselines on domain-IL streams keep the same client/sample pairing across tasks.
    """

    name = "iid"

    def split(
        self, labels: torch.Tensor, num_clients: int, *, task: int, seed: int
    ) -> list[torch.Tensor]:
        labels = check_labels(labels)
        check_positive_int("number of clients", num_clients)
        total = labels.shape[0]
        if total < num_clients:
            raise UserError(
                f"the iid partition needs at least one training sample per client "
                f"({num_clients} clients), the task has {total}; use fewer clients"
            )
        perm = torch.randperm(total, generator=generator(seed, "partition", "iid"))
        return [torch.sort(part).values for part in torch.tensor_split(perm, num_clients)]

    def describe(self) -> dict[str, object]:
        return {"name": self.name, "per_task": False}


class DirichletPartitioner(Partitioner):
    """The common LDA (Dirichlet) label-skew split, as in the NIID-bench/FedDF/FedNTD code.

    For each class c of the task (ascending), draw client proportions p ~ Dir(alpha * 1_K),
    zero the share of every client that already holds >= N/K samples of the task (the
    balancing rule, N = task size), renormalise, shuffle the class's indices and cut them at
    ``floor(cumsum(p) * n_c)[:-1]``. Every index is assigned (nothing is dropped). If any
    client ends with fewer than ``min_size`` samples, the whole draw is repeated with the
    next ``attempt`` number, up to ``max_redraws`` draws.

    Why numpy: torch has no generator-seeded Gamma/Dirichlet sampler, so each attempt uses
    its own local ``numpy.random.Generator`` (never the global RNG), seeded by
    ``derive_seed(seed, "partition", "dirichlet", task, attempt)``; the same generator
    shuffles the class indices. Folding ``task`` in gives each class-IL task a fresh split.

    Two guards the reference code lacks, both for float corner cases only: the cumulative
    share is pinned to exactly 1 from the last client with a nonzero share on, so rounding
    (cumsum = 0.9999...) never hands a sample to a trailing capped client; and if every
    client below the cap drew a share that underflowed to exactly 0 (tiny alpha only), the
    class is spread uniformly over those clients instead of producing NaN cut points.

    Bound implied by the balancing rule: a client only receives class c while it holds
    fewer than N/K samples, and then at most n_c samples, so every client ends with fewer
    than ``N/K + max_c n_c`` samples.
    """

    name = "dirichlet"

    def __init__(self, alpha: float = 0.3, min_size: int = 10, max_redraws: int = 1000) -> None:
        if (
            isinstance(alpha, bool)
            or not isinstance(alpha, (int, float))
            or not math.isfinite(alpha)
            or alpha <= 0
        ):
            raise UserError(
                f"dirichlet alpha must be a finite number > 0, got {alpha!r}; use e.g. 0.3 "
                f"(smaller means more label skew)"
            )
        if isinstance(min_size, bool) or not isinstance(min_size, int) or min_size < 0:
            raise UserError(
                f"dirichlet min_size must be an integer >= 0, got {min_size!r}; use e.g. 10"
            )
        check_positive_int("dirichlet max_redraws", max_redraws)
        self.alpha = float(alpha)
        self.min_size = min_size
        self.max_redraws = max_redraws

    def split(
        self, labels: torch.Tensor, num_clients: int, *, task: int, seed: int
    ) -> list[torch.Tensor]:
        labels = check_labels(labels)
        check_positive_int("number of clients", num_clients)
        total = labels.shape[0]
        if total < num_clients * self.min_size:
            raise UserError(
                f"the dirichlet partition needs at least {num_clients * self.min_size} "
                f"training samples ({num_clients} clients x min_size {self.min_size}), the "
                f"task has {total}; use fewer clients or a smaller min_size "
                f"(e.g. --partition dirichlet:min_size={total // num_clients})"
            )
        # Indices grouped by class (ascending class, ascending index within a class).
        by_label = torch.sort(labels, stable=True).indices.numpy()
        class_sizes = torch.unique_consecutive(labels[by_label], return_counts=True)[1]
        class_groups = np.split(by_label, np.cumsum(class_sizes.numpy())[:-1])
        cap = total / num_clients
        for attempt in range(self.max_redraws):
            rng = np.random.Generator(
                np.random.PCG64(derive_seed(seed, "partition", "dirichlet", task, attempt))
            )
            owner, sizes = self._draw(rng, class_groups, total, num_clients, cap)
            if sizes.min() >= self.min_size:
                return _group_by_owner(owner, sizes)
        raise UserError(
            f"the dirichlet partition (alpha {self.alpha}, {num_clients} clients, min_size "
            f"{self.min_size}) left some client with fewer than {self.min_size} of the task's "
            f"{total} samples in all {self.max_redraws} draws; use a larger alpha, fewer "
            f"clients or a smaller min_size (e.g. --partition dirichlet:alpha=1,min_size=5)"
        )

    def _draw(
        self,
        rng: np.random.Generator,
        class_groups: list[np.ndarray],
        total: int,
        num_clients: int,
        cap: float,
    ) -> tuple[np.ndarray, np.ndarray]:
        """One LDA draw: the owning client of every index and the clients' sizes."""
        owner = np.empty(total, dtype=np.int64)
        sizes = np.zeros(num_clients, dtype=np.int64)
        clients = np.arange(num_clients)
        concentration = np.full(num_clients, self.alpha)
        for group in class_groups:
            n_c = group.shape[0]
            props = rng.dirichlet(concentration)
            # Balancing rule. Some client is always below the cap while classes remain
            # (they hold fewer than N samples together), so the sum stays positive...
            props = props * (sizes < cap)
            mass = props.sum()
            if mass <= 0:  # ...unless every open client drew an underflowed share of 0.
                props = (sizes < cap).astype(np.float64)
                mass = props.sum()
            props = props / mass
            cumulative = np.cumsum(props)
            # Rounding can leave the cumulative share at 0.9999... before trailing zero-share
            # (capped) clients, which would hand the last client a sample despite the cap.
            cumulative[np.flatnonzero(props)[-1] :] = 1.0
            cuts = np.minimum((cumulative * n_c).astype(np.int64)[:-1], n_c)
            counts = np.diff(cuts, prepend=0, append=n_c)
            owner[rng.permutation(group)] = np.repeat(clients, counts)
            sizes += counts
        return owner, sizes

    def describe(self) -> dict[str, object]:
        return {
            "name": self.name,
            "alpha": self.alpha,
            "min_size": self.min_size,
            "balance": "N/K cap while drawing",
            "per_task": True,
        }


class ClassSubsetPartitioner(Partitioner):
    """GLFC's split (conditionWang/FCIL, ``GLFC_model.beforeTrain``): every client holds
    **every** training example of ``classes_per_client`` classes of the task, drawn
    uniformly without replacement from the task's classes (code: ``random.sample`` of
    ``--iid_level`` 6 of a task's 10 classes). Clients drawing the same class share its
    examples, so parts overlap: a client's data does not shrink as clients are added, which
    is how GLFC keeps 30–120 clients busy on CIFAR-100.

    Drawn afresh per task (the code redraws at every task a client receives), one
    generator per task (run seed, task), clients in index order; the code uses Python's
    global ``random`` instead, so the classes drawn for one seed differ from its own.
    """

    name = "class-subsets"

    def __init__(self, classes_per_client: int = 6) -> None:
        check_positive_int("classes_per_client", classes_per_client)
        self.classes_per_client = classes_per_client

    def split(
        self, labels: torch.Tensor, num_clients: int, *, task: int, seed: int
    ) -> list[torch.Tensor]:
        per_client = (self.name, "classes_per_client", self.classes_per_client)
        labels, classes = task_classes(labels, num_clients, per_client, task)
        rng = generator(seed, "partition", "class-subsets", task)
        parts = []
        for _ in range(num_clients):
            drawn = classes[torch.randperm(classes.numel(), generator=rng)]
            chosen = drawn[: self.classes_per_client]
            parts.append(torch.nonzero(torch.isin(labels, chosen)).flatten())
        return parts

    def describe(self) -> dict[str, object]:
        return {
            "name": self.name,
            "classes_per_client": self.classes_per_client,
            "overlap": "every example of a client's classes; clients share examples",
            "per_task": True,
        }


_PARTITIONER_TYPES: dict[str, type[Partitioner]] = {
    ShardPartitioner.name: ShardPartitioner,
    ClassShardPartitioner.name: ClassShardPartitioner,
    IIDPartitioner.name: IIDPartitioner,
    DirichletPartitioner.name: DirichletPartitioner,
    ClassSubsetPartitioner.name: ClassSubsetPartitioner,
    LabelQuantityPartitioner.name: LabelQuantityPartitioner,
}


def build_partitioner(name: str, **options: object) -> Partitioner:
    """Construct a partitioner by name from already typed option values.

    Unknown names and keys are refused here, with the sentences ``--partition`` gives, rather
    than by the constructor's ``TypeError``: that would leak Python internals
    ("IIDPartitioner() takes no arguments") and name no fix. Values are checked by the
    constructors.
    """
    if name not in _PARTITIONER_TYPES:
        raise UserError(unknown_partition(name, has_colon=False))
    parsers = OPTION_PARSERS[name]
    for key in options:
        if not parsers:
            raise UserError(
                f"partition '{name}' takes no options, got {', '.join(map(quoted, options))}; "
                f"build it with no options."
            )
        if key not in parsers:
            raise UserError(unknown_option(name, key))
    return _PARTITIONER_TYPES[name](**options)


def partitioner_from_spec(spec: str) -> Partitioner:
    """The partitioner of a ``--partition`` value: ``name`` or ``name:key=value,key=value``.

    Grammar (as the strategy grammar in ``strategies.compose``): whitespace around the
    whole value and around every name, key and value is ignored; names and keys are lower
    case; numbers are plain ASCII decimals (``_finite_float``/``_strict_int``). Refused,
    each with one sentence naming the fix: unknown names and keys, options of a partition
    that takes none, empty pieces (``dirichlet:``, ``dirichlet:alpha=1,``), a second ``:``
    or ``=``, a key given twice and out-of-range values. Why so strict: the partition decides
    which data every client holds, so a silently dropped piece (an unset shell variable in
    ``dirichlet:alpha=1,$MORE``) or a duplicate whose last value silently wins would record
    a run under a protocol the user did not ask for.
    """
    name, options = parse_partition_spec(spec)
    return _PARTITIONER_TYPES[name](**options)


def client_class_counts(
    parts: list[torch.Tensor], labels: torch.Tensor, num_classes: int
) -> torch.Tensor:
    """K x C int64 table: how many samples of each class each client holds.

    Why: the per-client label mix is the one number that says how skewed a split is, so it
    is written to config.json next to the partition options.
    """
    labels = check_labels(labels)
    check_positive_int("number of classes", num_classes)
    if labels.numel() and (int(labels.min()) < 0 or int(labels.max()) >= num_classes):
        raise ValueError(
            f"labels must lie in [0, {num_classes}), got {int(labels.min())}..{int(labels.max())}"
        )
    sizes = torch.tensor([part.numel() for part in parts], dtype=torch.int64)
    owner = torch.repeat_interleave(torch.arange(len(parts)), sizes)
    joined = torch.cat(parts) if parts else torch.empty(0, dtype=torch.int64)
    flat = owner * num_classes + labels[joined.long()]
    return torch.bincount(flat, minlength=len(parts) * num_classes).view(len(parts), num_classes)


def _group_by_owner(owner: np.ndarray, sizes: np.ndarray) -> list[torch.Tensor]:
    """One ascending int64 index tensor per client from each index's owning client.

    A stable sort by owner keeps indices ascending within each client, so no per-client
    sort is needed.
    """
    order = torch.from_numpy(np.argsort(owner, kind="stable"))
    # Clone so each part owns its storage (saving one part must not serialise them all).
    return [part.clone() for part in torch.split(order, sizes.tolist())]
