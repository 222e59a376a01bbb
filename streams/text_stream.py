"""Class-incremental text streams on frozen sentence embeddings (seq-agnews, seq-dbpedia,
seq-yahooqa).

Why embeddings: the FedGP text protocol trains a linear head on a frozen encoder, so every
text is encoded exactly once (cached on disk by ``streams.text.EmbeddingCache``) and the
federation trains a linear model on 384-dim vectors — fast on CPU and identical for every
strategy. Tasks are natural-order pairs of classes, as for Seq-CIFAR (or pairs of the permuted order
under ``--class-order``; ``class_names`` in the description stay in the dataset's label
order, and ``class_order`` maps new labels to them).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from cfl_bench.streams.base import data_identity
from cfl_bench.streams.class_il import (
    ClassSplitStream,
    check_class_tasks,
    check_tasks_have_data,
    relabelled,
)
from cfl_bench.streams.text import DEFAULT_ENCODER, TextSplits, embedded_splits

CLASSES_PER_TASK = 2


def embedding_cache_dir() -> Path:
    """``$CFL_BENCH_CACHE`` or ``~/.cache/cfl-bench``: never inside the (shared) data folder."""
    root = os.environ.get("CFL_BENCH_CACHE")
    if root:
        return Path(root) / "embeddings"
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "cfl-bench" / "embeddings"


class EmbeddedTextStream(ClassSplitStream):
    def __init__(
        self,
        splits: TextSplits,
        *,
        name: str,
        num_tasks: int,
        device: torch.device,
        encoder: str = DEFAULT_ENCODER,
        class_order: tuple[int, ...] | None = None,
    ) -> None:
        # Before encoding: a task count the classes cannot fill must not cost an encoder run.
        check_class_tasks(name, num_tasks, CLASSES_PER_TASK, splits.num_classes)
        check_tasks_have_data(
            name,
            num_tasks,
            CLASSES_PER_TASK,
            relabelled(splits.train_y, class_order),
            relabelled(splits.test_y, class_order),
        )
        train_x, train_y, test_x, test_y = embedded_splits(
            splits, encoder=encoder, cache_dir=embedding_cache_dir(), device="cpu"
        )
        super().__init__(
            name=name,
            num_tasks=num_tasks,
            classes_per_task=CLASSES_PER_TASK,
            num_classes=splits.num_classes,
            train_y=train_y,
            test_y=test_y,
            device=device,
            class_order=class_order,
        )
        self.encoder = encoder
        # The texts, not their embeddings: floats may differ in the last bit between
        # machines, the texts (and the encoder, in describe()) decide the data.
        self._identity = data_identity(
            splits.name,
            train=(splits.train_texts, splits.train_y),
            test=(splits.test_texts, splits.test_y),
        )
        self.input_shape = (int(train_x.shape[1]),)
        self._base_name = splits.name
        self._class_names = list(splits.class_names)
        self._train_x = train_x.to(self.device)
        self._test_x = test_x.to(self.device)

    def protocol_fields(self) -> dict[str, object]:
        return {"data": {**self._identity, "encoder": self.encoder}}

    def describe(self) -> dict[str, object]:
        return {
            **self._base_description(),
            "base": self._base_name,
            "encoder": self.encoder,
            "class_names": self._class_names,
        }

    def _stored(self, split: str, rows: torch.Tensor) -> torch.Tensor:
        return (self._train_x if split == "train" else self._test_x)[rows]
