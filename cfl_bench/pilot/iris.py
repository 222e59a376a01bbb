"""The boundary pilot's data: Iris in two PCA dimensions, a stream over it, its non-IID split.

Data — the 150 Iris flowers shipped with scikit-learn (``sklearn.datasets.load_iris``, no
download), each of the 4 measurements standardised to zero mean and unit variance, then
projected on the first two principal components (``PCA(svd_solver="full")``: exact and
deterministic). Two dimensions so a decision boundary is a picture; the first two components
keep about 96 % of the standardised variance.

Stream — one task with all three classes (scenario ``static``, as ``streams.static``), stored
as float32 features: the engine, strategies and objective see an ordinary classification
stream. Its test split is the same 150 points: the pilot measures where models disagree, not
how they generalise, and the global accuracy it reports is accuracy on the data.

Split — a fixed label skew, ``dominant-class``: client k holds ``share`` (default 80 %) of
class k, and the rest of each class is dealt evenly to the other clients, so every client is
dominated by one class yet sees a few points of the others (the regime where a client's local
optimum differs most from the global boundary). Within each class the points are shuffled by
a generator seeded from (seed, "partition", "dominant-class", class), as every partitioner
derives its seed. Before the split, a seeded 10 % of the points (15 of 150; the slice
``fedproj:public=holdout`` withholds by default) is withheld from every client as public
data, for *every* strategy, so all strategies train on identical client data.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch

from cfl_bench.core.errors import UserError
from cfl_bench.core.seeding import generator
from cfl_bench.engine.splits import TaskSplit, holdout_split
from cfl_bench.streams.class_il import ClassSplitStream
from cfl_bench.streams.partition import Partitioner
from cfl_bench.streams.static import STATIC

NUM_CLASSES = 3
DEFAULT_SHARE = 0.8
PUBLIC_FRACTION = 10  # one point in ten is public (fedproj's default holdout)


@dataclass(frozen=True)
class IrisPoints:
    """The projected points: ``x`` float32 (150, 2), ``y`` int64 (150,), the class names and
    the fraction of the standardised variance the two components keep."""

    x: torch.Tensor
    y: torch.Tensor
    class_names: tuple[str, ...]
    explained_variance: float


def load_iris_pca() -> IrisPoints:
    """Iris, standardised, on its first two principal components (no randomness)."""
    from sklearn.datasets import load_iris
    from sklearn.decomposition import PCA
    from sklearn.preprocessing import StandardScaler

    iris = load_iris()
    standard = StandardScaler().fit_transform(iris.data)
    pca = PCA(n_components=2, svd_solver="full")
    projected = pca.fit_transform(standard)
    return IrisPoints(
        x=torch.from_numpy(np.ascontiguousarray(projected, dtype=np.float32)),
        y=torch.from_numpy(iris.target.astype(np.int64)),
        class_names=tuple(str(n) for n in iris.target_names),
        explained_variance=float(pca.explained_variance_ratio_.sum()),
    )


class IrisPCAStream(ClassSplitStream):
    """One static task over the projected Iris points (train and test are the same points)."""

    scenario = STATIC

    def __init__(self, points: IrisPoints, device: torch.device) -> None:
        super().__init__(
            name="iris-pca",
            num_tasks=1,
            classes_per_task=NUM_CLASSES,
            num_classes=NUM_CLASSES,
            train_y=points.y,
            test_y=points.y,
            device=device,
        )
        self.input_shape = (int(points.x.shape[1]),)
        self._x = points.x.to(self.device)
        self._class_names = list(points.class_names)

    def describe(self) -> dict[str, object]:
        return {
            **self._base_description(),
            "base": "iris (scikit-learn)",
            "features": "standardised, first two principal components",
            "class_names": self._class_names,
            "test": "the training points themselves",
        }

    def _stored(self, split: str, rows: torch.Tensor) -> torch.Tensor:
        return self._x[rows]


class DominantClassPartitioner(Partitioner):
    """Client ``c mod K`` holds ``share`` of class c; the rest of class c is dealt evenly to
    the other clients (module docstring)."""

    name: ClassVar[str] = "dominant-class"

    def __init__(self, share: float = DEFAULT_SHARE) -> None:
        if not 0.0 < share <= 1.0:
            raise UserError(f"the dominant-class share must be in (0, 1], got {share!r}.")
        self.share = share

    def split(
        self, labels: torch.Tensor, num_clients: int, *, task: int, seed: int
    ) -> list[torch.Tensor]:
        if num_clients < 2:
            raise UserError(f"a label-skew split needs at least 2 clients, got {num_clients}.")
        owned: list[list[torch.Tensor]] = [[] for _ in range(num_clients)]
        for c in sorted(int(v) for v in labels.unique()):
            rows = torch.nonzero(labels == c).flatten()
            gen = generator(seed, "partition", self.name, task, c)
            rows = rows[torch.randperm(rows.numel(), generator=gen)]
            dominant = c % num_clients
            keep = round(self.share * rows.numel())
            owned[dominant].append(rows[:keep])
            others = [k for k in range(num_clients) if k != dominant]
            for k, part in zip(others, torch.tensor_split(rows[keep:], len(others)), strict=True):
                owned[k].append(part)
        return [torch.sort(torch.cat(parts)).values for parts in owned]

    def describe(self) -> dict[str, object]:
        return {"name": self.name, "share": self.share}


def public_count(total: int) -> int:
    """How many points are public: 10 %, as ``fedproj:public=holdout`` withholds by default."""
    return max(1, total // PUBLIC_FRACTION)


def plan_pilot_split(
    labels: torch.Tensor, partitioner: Partitioner, num_clients: int, seed: int
) -> TaskSplit:
    """The one task's split, identical for every strategy: the engine's seeded holdout draw
    (``engine.splits.holdout_split``) withholds the public points, the partitioner deals the
    rest."""
    total = labels.shape[0]
    held, kept = holdout_split(total, public_count(total), 0, seed, owner="fedproj")
    assert held is not None and kept is not None  # public_count is at least 1
    parts = partitioner.split(labels[kept], num_clients, task=0, seed=seed)
    return TaskSplit([kept[p] for p in parts], held)
