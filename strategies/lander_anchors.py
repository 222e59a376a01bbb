"""LANDER's label-text-embedding anchors: one vector per class, from the class's name.

LANDER's code (tmtuan1307/LANDER, ``methods/lander.py``:556–560) loads them from
``label_embedding/<dataset>_le.pickle``: a float16 tensor of 100 × 512 for CIFAR-100 with
row norms ≈ 10, most likely CLIP ViT-B/32 text features of the names in
``label_embedding/cifar100_label.txt`` (the standard CIFAR-100 fine label names, in label
order). That repository has no licence, so its vectors are not shipped here, and CLIP
cannot be fetched; two sources instead (the option ``anchors``):

- ``minilm`` (default): the suite's sentence encoder (all-MiniLM-L6-v2, 384-d, unit norm;
  ``streams.text.encode_texts``, bound by the runner as ``StrategyEnv.encode_texts``) on
  the stream's class names, underscores read as spaces;
- ``PATH`` (any other value: a file): a tensor of classes × dim saved with ``torch.save``
  (e.g. the code's CLIP vectors, which a user may hold), rows in the data's own label order
  (natural, also under ``--class-order``: the rows are then permuted as the labels are).
  Written as the path alone, not ``file:PATH``: the strategy grammar keeps ':' for the one
  between a component and its options (and a path must hold no ',', '=', ':' or '+').

The class names below are the datasets' own label names in label order (facts of the
datasets, the same as their ``batches.meta`` / ``meta`` files list).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from cfl_bench.core.errors import UserError

#: Texts → float32 (N, dim) unit vectors (``StrategyEnv.encode_texts``).
TextEncoder = Callable[[Sequence[str]], torch.Tensor]

CIFAR10_NAMES: tuple[str, ...] = (
    "airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck",
)  # fmt: skip

CIFAR100_NAMES: tuple[str, ...] = (
    "apple", "aquarium_fish", "baby", "bear", "beaver", "bed", "bee", "beetle",
    "bicycle", "bottle", "bowl", "boy", "bridge", "bus", "butterfly", "camel",
    "can", "castle", "caterpillar", "cattle", "chair", "chimpanzee", "clock", "cloud",
    "cockroach", "couch", "crab", "crocodile", "cup", "dinosaur", "dolphin", "elephant",
    "flatfish", "forest", "fox", "girl", "hamster", "house", "kangaroo", "keyboard",
    "lamp", "lawn_mower", "leopard", "lion", "lizard", "lobster", "man", "maple_tree",
    "motorcycle", "mountain", "mouse", "mushroom", "oak_tree", "orange", "orchid", "otter",
    "palm_tree", "pear", "pickup_truck", "pine_tree", "plain", "plate", "poppy", "porcupine",
    "possum", "rabbit", "raccoon", "ray", "road", "rocket", "rose", "sea",
    "seal", "shark", "shrew", "skunk", "skyscraper", "snail", "snake", "spider",
    "squirrel", "streetcar", "sunflower", "sweet_pepper", "table", "tank", "telephone",
    "television", "tiger", "tractor", "train", "trout", "tulip", "turtle", "wardrobe",
    "whale", "willow_tree", "wolf", "woman", "worm",
)  # fmt: skip

#: The streams whose class names are known here, by stream name.
STREAM_CLASS_NAMES: dict[str, tuple[str, ...]] = {
    "seq-cifar10": CIFAR10_NAMES,
    "seq-cifar100": CIFAR100_NAMES,
}


def class_names(stream_name: str) -> tuple[str, ...]:
    """The stream's class names in label order, or a refusal naming the other source."""
    names = STREAM_CLASS_NAMES.get(stream_name)
    if names is None:
        raise UserError(
            f"lander:anchors=minilm knows the class names of {', '.join(STREAM_CLASS_NAMES)} "
            f"only, not of {stream_name!r}; give lander:anchors=PATH, a torch.save'd tensor "
            "with one row per class"
        )
    return names


def minilm_anchors(names: tuple[str, ...], encode: TextEncoder | None) -> torch.Tensor:
    """The sentence encoder's unit vectors of the names (underscores read as spaces).
    ``encode`` is the run's (``StrategyEnv.encode_texts``: the runner binds
    ``streams.text.encode_texts``, so this layer imports no stream module)."""
    if encode is None:
        raise UserError(
            "lander:anchors=minilm needs the sentence encoder, which this run does not offer; "
            "give lander:anchors=PATH, a torch.save'd tensor with one row per class"
        )
    return encode([name.replace("_", " ") for name in names])


def file_anchors(path: str) -> torch.Tensor:
    """A user's tensor of classes × dim (any float dtype, returned as float32)."""
    file = Path(path)
    if not file.is_file():
        raise UserError(
            f"lander anchors file {path!r} does not exist; give anchors=minilm or the path "
            "of a torch.save'd tensor of classes × dim"
        )
    try:
        value = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as exc:  # any unreadable file is the user's to fix
        raise UserError(
            f"lander anchors file {path!r} is not a torch.save'd tensor ({exc}); save one "
            "with torch.save(tensor, path)"
        ) from exc
    if not isinstance(value, torch.Tensor) or value.dim() != 2 or not value.is_floating_point():
        raise UserError(
            f"lander anchors file {path!r} holds no 2-d float tensor; save classes × dim"
        )
    return value.float()


def load_anchors(
    source: str,
    stream_name: str,
    num_classes: int,
    encode: TextEncoder | None = None,
    class_order: tuple[int, ...] | None = None,
) -> torch.Tensor:
    """The anchors of ``source`` for the stream: one row per class, checked, row i for label
    i. Both sources are in the data's own label order; under a ``--class-order``
    (``StrategyEnv.class_order``: label i is original class ``class_order[i]``) the rows are
    taken in that order, as LANDER's code indexes its file (``label_emb[class_order]``)."""
    if source == "minilm":
        anchors = minilm_anchors(class_names(stream_name), encode)
    else:
        anchors = file_anchors(source)
    if anchors.shape[0] != num_classes:
        raise UserError(
            f"lander anchors have {anchors.shape[0]} rows but the stream has {num_classes} "
            "classes; give one anchor per class, in the data's label order"
        )
    if class_order is None:
        return anchors
    return anchors[torch.tensor(class_order)]
