"""Static federated streams: one task holding every class (the FL papers' own setting).

FedNTD, FedProj and IFA evaluate plain non-IID federated learning: one dataset, all classes,
clients with skewed shards, accuracy of the global model after every round. Here that is a
stream with a single task, so the engine, records, metrics and leaderboard are the same as
for continual streams: the accuracy matrix is 1×1, forgetting is not defined, and the
per-round curve (``--eval-every-round``) is the headline; the final round's accuracy is
what the leaderboard reports, never the best round's.

Images stay uint8 on the device and are normalised one batch at a time (as the class-IL
streams do, ``streams.class_il.ClassILStream``, which this extends with one task and the
``static`` scenario). Colour 32×32 sets get the CIFAR protocol's crop + flip; the
28×28 grey sets get none (FedNTD's MNIST transform only normalises). ``--cutout N`` adds
FedNTD's Cutout to either.
"""

from __future__ import annotations

import torch

from cfl_bench.core.errors import UserError
from cfl_bench.streams.class_il import ClassILStream
from cfl_bench.streams.images import ImageSplits

STATIC = "static"

# Per-dataset normalisation (mean, std) of the static streams' bases. MNIST / Fashion-MNIST:
# the values torchvision's examples and FedNTD's loader use; CIFAR: Mammoth's (as the seq-
# streams); CINIC-10: its README's.
MNIST_STATS = ((0.1307,), (0.3081,))
FMNIST_STATS = ((0.2860,), (0.3530,))


def check_static_tasks(name: str, num_tasks: object) -> None:
    """A static stream is one task; refuse anything else before data is read."""
    if num_tasks != 1 or isinstance(num_tasks, bool):
        raise UserError(
            f"stream {name!r} is static (one task with all classes), so --tasks must be 1, "
            f"got {num_tasks!r}; for a continual stream use seq-cifar10, seq-cifar100, "
            "rot-mnist or perm-mnist"
        )


class StaticStream(ClassILStream):
    """One task with every class of ``images``; no task-IL view (there is one task)."""

    scenario = STATIC

    def __init__(
        self,
        images: ImageSplits,
        *,
        name: str,
        mean: tuple[float, ...],
        std: tuple[float, ...],
        device: torch.device,
        crop_flip: bool,
        cutout: int = 0,
    ) -> None:
        super().__init__(
            images,
            name=name,
            num_tasks=1,
            classes_per_task=images.num_classes,
            mean=mean,
            std=std,
            device=device,
            crop_flip=crop_flip,
            cutout=cutout,
        )
