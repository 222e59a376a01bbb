"""The model names and what each one is, without the models.

Why apart from ``cfl_bench.runner.models``: `cfl-bench list models` and the refusal of a
misspelled ``--model`` must answer at once, and the builders import torch. The builders in
``cfl_bench.runner.models`` take their names and descriptions from here (a test pins the two).
"""

from __future__ import annotations

import difflib

from cfl_bench.core.errors import UserError

MODEL_DESCRIPTIONS: dict[str, str] = {
    "mnist-cnn": "FedGP MNIST CNN: 2 conv + 2 fc, ~22k params (1×28×28 inputs)",
    "mlp": "MLP with two hidden layers of 100 units (any input size)",
    "linear": "one linear layer (a head on frozen embeddings)",
    "fot-mlp": "FOT's permuted-MNIST MLP: 3 hidden layers of 400 ReLU units, dropout 0.2 "
    "after the first and 0.5 after the others, 638,810 params on 784 inputs and 10 classes",
    "fot-alexnet": "FOT's Split-CIFAR-100 AlexNet: 3 conv (64, 128, 256; k4, k3, k2) + "
    "2 fc of 2048, dropout, no biases, no BatchNorm, 6,704,128 params on 3×32×32 and 100 "
    "classes (one 10-class head per task with --heads per-task)",
    "cifar-cnn": "small CNN: 3 conv-BN-pool blocks, global pool + linear, ~95k params on 10 "
    "classes, 106k on 100 (C×32×32)",
    "resnet18": "CIFAR ResNet-18 (3×3 stem, no max-pool, BN), 11.2M params (C×32×32)",
    "resnet8": "CIFAR ResNet-8 (FedDF / FedProj): 16-32-64 channels, one block per stage, "
    "78k params (C×32×32)",
    "resnet32": "CIFAR ResNet-32 of PyCIL / TARGET (FCL): 16-32-64 channels, five blocks per "
    "stage, zero-padding shortcuts, BN, 64 features, 470k params on 100 classes (C×32×32)",
    "fedavg-cnn": "FedAvg / FedNTD CNN: 2 conv5×5 (32, 64) + max-pool, fc 512, 2.16M params "
    "on 3×32×32 (any C×H×W)",
    "fedweit-lenet": "FedWeIT's LeNet: decomposed conv 5×5 (20, 50) + LRN + max-pool, "
    "decomposed fc 800, 500 (θ = B ⊙ σ(m) + A + Σ α·kb), a private head; θ holds the bases "
    "B only, 2,986,500 on 3×32×32 (--strategy fedavg+fedweit)",
    "centernet": "CenterNet-style detector from scratch: stride-4 heat map + offset + log-size "
    "heads, GroupNorm (detection streams: carla-det, carla-highway)",
}
#: Models whose outputs are dense detection maps; every other model gives class logits.
DETECTION_MODELS: frozenset[str] = frozenset({"centernet"})
#: What each model offers strategy components beyond its outputs. ``features``: the model has
#: ``representation(x)`` (the features its last layer reads) and ``classify(z)``, with
#: ``forward(x) == classify(representation(x))`` (MOON requires it; a test pins both).
MODEL_CAPABILITIES: dict[str, frozenset[str]] = {
    name: frozenset({"features"})
    for name in ("mnist-cnn", "mlp", "cifar-cnn", "resnet18", "resnet8", "resnet32", "fedavg-cnn")
}

#: The convolutional models whose one-thread CPU step channels-last inputs made at least
#: 10 % cheaper on both an AVX2 and an AVX-512 CPU (``bench/memory_format.py``; the table in
#: docs/executors.md): ``--channels-last``'s default turns it on for these on CPU. Not
#: ResNet-18 (0.95x on AVX2, 1.04x on AVX-512) nor the CARLA detector (0.94x, 0.92x; its
#: first rounds' mAP moves by a sixth under other rounding, which would leave the shipped
#: CARLA figure without a numeric check, ``tests/test_shipped_prefix.py``).
CHANNELS_LAST_ON_CPU: frozenset[str] = frozenset(
    {"mnist-cnn", "fedavg-cnn", "cifar-cnn", "resnet8"}
)

#: The models whose layers treat each example alone in training mode (no BatchNorm): a
#: step may forward its batch and replay draws as one (``engine.fused_forward``).
PER_EXAMPLE_MODELS: frozenset[str] = frozenset(
    {
        "mnist-cnn",
        "mlp",
        "linear",
        "fedavg-cnn",
        "centernet",
        "fot-mlp",
        "fot-alexnet",
        "fedweit-lenet",  # its LRN normalises across one example's channels
    }
)


def model_capabilities(name: str) -> frozenset[str]:
    """The capabilities of model ``name`` (none for a model the table does not list)."""
    return MODEL_CAPABILITIES.get(name, frozenset())


def models_offering() -> tuple[tuple[str, tuple[str, ...]], ...]:
    """Each capability with the models that offer it (sorted), for refusals' hints."""
    capabilities = sorted(set().union(*MODEL_CAPABILITIES.values()))
    return tuple(
        (cap, tuple(sorted(m for m, caps in MODEL_CAPABILITIES.items() if cap in caps)))
        for cap in capabilities
    )


def check_model_name(name: str) -> None:
    """Refuse a name that is no model, with the closest one when a slip is likely."""
    if name in MODEL_DESCRIPTIONS:
        return
    guess = difflib.get_close_matches(name.lower(), list(MODEL_DESCRIPTIONS), n=1)
    hint = f" (did you mean '{guess[0]}'?)" if guess else ""
    raise UserError(
        f"unknown model '{name}'{hint}; choose one of: {', '.join(sorted(MODEL_DESCRIPTIONS))}."
    )
