"""The run's model with LANDER's embedding head: features → a Linear into the anchors' space.

LANDER's backbones (tmtuan1307/LANDER, ``convs/resnet.py``:177 and 233, ``convs/cresnet.py``:
239 and 340) end in ``mapping = nn.Linear(out_dim, 512)``: the pooled features the
classifier reads are also mapped to the 512-d label-text-embedding space (``att``), which
the bounding loss pulls toward the anchors. The layer is part of the network, so clients
train it and FedAvg averages it like any weight. Here the head's output has the anchors'
width (384 for MiniLM, 512 for the code's CLIP vectors), and it is added to the run's model
by :class:`EmbeddingModel` before training starts (``Component.wrap_model``).

Why the representation carries both: the suite's loss terms read a model's
``representation`` (``features`` capability), so the wrapper's representation is
[features, att] side by side and its ``classify`` reads the features part: ``forward(x) ==
classify(representation(x))`` still holds, and a term splits the embedding off the columns
from ``feature_width`` on.
"""

from __future__ import annotations

from typing import Protocol, cast

import torch
from torch import nn

from cfl_bench.strategies.synthesis_parts import torch_default_init


class FeatureModule(Protocol):
    """A model with the ``features`` capability."""

    def representation(self, x: torch.Tensor) -> torch.Tensor: ...

    def classify(self, z: torch.Tensor) -> torch.Tensor: ...


class EmbeddingModel(nn.Module):
    """``base`` with a Linear ``mapping`` (feature_width → embed_dim) beside its classifier;
    the mapping's initial weights are torch's default initialisation drawn from ``gen``."""

    def __init__(
        self, base: nn.Module, feature_width: int, embed_dim: int, gen: torch.Generator
    ) -> None:
        super().__init__()
        self.base = base
        self.feature_width = feature_width
        self.mapping = nn.Linear(feature_width, embed_dim)
        torch_default_init(self.mapping, gen)

    def representation(self, x: torch.Tensor) -> torch.Tensor:
        """[features, mapping(features)]: what the classifier reads, then the embedding."""
        z = cast(FeatureModule, self.base).representation(x)
        return torch.cat([z, self.mapping(z)], dim=1)

    def classify(self, z: torch.Tensor) -> torch.Tensor:
        return cast(FeatureModule, self.base).classify(z[:, : self.feature_width])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classify(self.representation(x))

    def outputs_and_embedding(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The class outputs and the embedding of one forward (the code's logits and att)."""
        z = self.representation(x)
        return self.classify(z), z[:, self.feature_width :]


def outputs_and_embedding(module: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """:meth:`EmbeddingModel.outputs_and_embedding` of a module that is one (or a copy)."""
    assert isinstance(module, EmbeddingModel), "LANDER's model carries its embedding head"
    return module.outputs_and_embedding(x)


def feature_width(model: nn.Module) -> int:
    """The width of the features the model's classifier (its last Linear) reads."""
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    assert linears, "a model with the features capability ends in a Linear classifier"
    return int(linears[-1].in_features)
