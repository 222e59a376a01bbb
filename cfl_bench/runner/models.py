"""Model zoo, selectable by name.

Why a registry of builders rather than classes in the config: the stream decides the input
shape and number of outputs, the user only picks the architecture, and a model that cannot
take the stream's inputs is refused before any training starts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from cfl_bench.core.errors import UserError
from cfl_bench.runner.model_catalogue import MODEL_DESCRIPTIONS, check_model_name


class MnistCNN(nn.Module):
    """The FedGP MNIST CNN (21,840 parameters with 10 classes), as in the authors' code; not
    the 1.66 M-parameter MNIST CNN of McMahan et al. (2017).

    conv 1→10 k5, max-pool 2, ReLU; conv 10→20 k5, dropout2d, max-pool 2, ReLU;
    fc 320→50, ReLU, dropout; fc 50→classes.
    """

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 10, kernel_size=5)
        self.conv2 = nn.Conv2d(10, 20, kernel_size=5)
        self.conv2_drop = nn.Dropout2d()
        self.fc1 = nn.Linear(320, 50)
        self.fc2 = nn.Linear(50, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classify(self.representation(x))

    def representation(self, x: torch.Tensor) -> torch.Tensor:
        """The 50 features the last layer reads (after fc1, ReLU and dropout)."""
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2_drop(self.conv2(x)), 2))
        x = x.flatten(1)
        return F.dropout(F.relu(self.fc1(x)), training=self.training)

    def classify(self, z: torch.Tensor) -> torch.Tensor:
        """Class logits of a representation: ``forward(x) == classify(representation(x))``."""
        return self.fc2(z)


class MLP(nn.Module):
    """Two hidden layers of 100 ReLU units (Mammoth's MNIST MLP), any input size."""

    def __init__(self, in_features: int, num_classes: int, hidden: int = 100) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Flatten(),
            nn.Linear(in_features, hidden),
            nn.ReLU(),
            nn.Linear(hidden, hidden),
            nn.ReLU(),
            nn.Linear(hidden, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def representation(self, x: torch.Tensor) -> torch.Tensor:
        """The second hidden layer's activations (what the output layer reads)."""
        return self.net[:-1](x)

    def classify(self, z: torch.Tensor) -> torch.Tensor:
        """Class logits of a representation: ``forward(x) == classify(representation(x))``."""
        return self.net[-1](z)


class FOTMLP(nn.Module):
    """The MLP of FOT's official code (``model/mlp.py``) for permuted MNIST: Linear(in, 400),
    ReLU, dropout 0.2; two × [Linear(400, 400), ReLU, dropout 0.5]; Linear(400, classes).
    Its four Linear layers (with biases) are the layers FOT projects."""

    def __init__(self, in_features: int, num_classes: int, hidden: int = 400) -> None:
        super().__init__()
        self.layers = nn.Sequential(
            nn.Flatten(),
            nn.Linear(in_features, hidden),
            nn.ReLU(),
            nn.Dropout(0.2),
            nn.Linear(hidden, hidden),
            nn.ReLU(),
            nn.Dropout(0.5),
            nn.Linear(hidden, hidden),
            nn.ReLU(),
            nn.Dropout(0.5),
            nn.Linear(hidden, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


class CifarCNN(nn.Module):
    """A small CNN for 3×32×32 inputs that trains in minutes on 2 CPU cores.

    Three conv3×3-BN-ReLU-maxpool blocks (32, 64, 128 channels), global average pooling and
    one linear layer: 94,762 parameters on 10 classes (106,372 on CIFAR-100: the head
    grows by 129 per class) and ~10 M multiply-adds per image, against ResNet-18's
    11.2 M parameters and ~0.56 G multiply-adds. BatchNorm keeps it comparable with the
    ResNet (its statistics are aggregated like weights). The pooling matters: a linear head
    on the flattened 128×4×4 features moved the logits by ~100 in one SGD step at the CIFAR
    protocol's lr 0.1, and DER's logit replay then diverged within a few steps.
    """

    def __init__(self, num_classes: int, in_channels: int = 3) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        channels = in_channels
        for width in (32, 64, 128):
            layers += [
                nn.Conv2d(channels, width, 3, padding=1, bias=False),
                nn.BatchNorm2d(width),
                nn.ReLU(),
                nn.MaxPool2d(2),
            ]
            channels = width
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(128, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classify(self.representation(x))

    def representation(self, x: torch.Tensor) -> torch.Tensor:
        """The globally pooled 128 channels the linear head reads."""
        return F.adaptive_avg_pool2d(self.features(x), 1).flatten(1)

    def classify(self, z: torch.Tensor) -> torch.Tensor:
        """Class logits of a representation: ``forward(x) == classify(representation(x))``."""
        return self.head(z)


class FedAvgCNN(nn.Module):
    """The CNN of McMahan et al. (2017) as FedNTD's code builds it for CIFAR-10 and MNIST.

    conv5×5(32, padding 2) → ReLU → max-pool 2 → conv5×5(64, padding 2) → ReLU → max-pool 2
    → linear(64·H/4·W/4 → 512) → ReLU → linear(512 → C). No BatchNorm. On 3×32×32 inputs:
    2,156,490 parameters, ~17.6 M multiply-adds per image (the FC layer holds 98 % of the
    weights but the convolutions do most of the work). The same layers on 1×28×28 are
    FedNTD's MNIST model.
    """

    def __init__(self, input_shape: tuple[int, ...], num_classes: int) -> None:
        super().__init__()
        channels, height, width = (int(d) for d in input_shape)
        self.conv1 = nn.Conv2d(channels, 32, 5, padding=2)
        self.conv2 = nn.Conv2d(32, 64, 5, padding=2)
        self.fc = nn.Linear(64 * (height // 4) * (width // 4), 512)
        self.classifier = nn.Linear(512, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classify(self.representation(x))

    def representation(self, x: torch.Tensor) -> torch.Tensor:
        """The 512 ReLU features the classifier reads (MOON's z in FedNTD's code)."""
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return F.relu(self.fc(x.flatten(1)))

    def classify(self, z: torch.Tensor) -> torch.Tensor:
        """Class logits of a representation: ``forward(x) == classify(representation(x))``."""
        return self.classifier(z)


def _require_cifar_shape(name: str, input_shape: tuple[int, ...]) -> None:
    if tuple(input_shape[1:]) != (32, 32):
        raise UserError(
            f"model '{name}' needs C×32×32 inputs but the stream gives "
            f"{'×'.join(map(str, input_shape))}; use --model mlp for this stream."
        )


def _cifar_cnn(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    _require_cifar_shape("cifar-cnn", input_shape)
    return CifarCNN(num_classes, in_channels=int(input_shape[0]))


def _resnet18(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    from cfl_bench.runner.resnet import CifarResNet18

    _require_cifar_shape("resnet18", input_shape)
    return CifarResNet18(num_classes, in_channels=int(input_shape[0]))


def _resnet8(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    from cfl_bench.runner.resnet import CifarResNet8

    _require_cifar_shape("resnet8", input_shape)
    return CifarResNet8(num_classes, in_channels=int(input_shape[0]))


def _resnet32(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    from cfl_bench.runner.resnet import CifarResNet32

    _require_cifar_shape("resnet32", input_shape)
    return CifarResNet32(num_classes, in_channels=int(input_shape[0]))


def _fedavg_cnn(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    if len(input_shape) != 3 or input_shape[1] < 4 or input_shape[2] < 4:
        raise UserError(
            f"model 'fedavg-cnn' needs C×H×W image inputs of at least 4×4 but the stream gives "
            f"{'×'.join(map(str, input_shape))}; use --model mlp for this stream."
        )
    return FedAvgCNN(tuple(input_shape), num_classes)


def _mnist_cnn(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    if tuple(input_shape) != (1, 28, 28):
        raise UserError(
            f"model 'mnist-cnn' needs 1×28×28 inputs but the stream gives "
            f"{'×'.join(map(str, input_shape))}; use --model mlp for this stream."
        )
    return MnistCNN(num_classes)


def _linear(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    in_features = 1
    for d in input_shape:
        in_features *= int(d)
    return nn.Sequential(nn.Flatten(), nn.Linear(in_features, num_classes))


def pooled_size(size: int, kernel: int) -> int:
    """The side of a valid (unpadded, stride-1) convolution's output after a 2×2 max-pool."""
    return (size - kernel + 1) // 2


class FOTAlexNet(nn.Module):
    """The AlexNet of FOT's official code (``model/alexnet.py``) for Split-CIFAR-100:
    conv 3→64 k4, conv 64→128 k3, conv 128→256 k2 (each: ReLU, dropout, 2×2 max-pool;
    dropout 0.2, 0.2, 0.5), fc 256·s²→2048 and 2048→2048 (ReLU, dropout 0.5), no biases and
    no BatchNorm anywhere. The code's ``last`` (one 2048→10 head per task, no bias) is one
    2048→classes layer here: with ``--heads per-task`` each task's block of rows is that
    task's head (the rows of other heads get no gradient, as in the code)."""

    def __init__(self, input_shape: tuple[int, int, int], num_classes: int) -> None:
        super().__init__()
        channels, side = input_shape[0], input_shape[1]
        for kernel in (4, 3, 2):
            side = pooled_size(side, kernel)
        self.conv1 = nn.Conv2d(channels, 64, 4, bias=False)
        self.conv2 = nn.Conv2d(64, 128, 3, bias=False)
        self.conv3 = nn.Conv2d(128, 256, 2, bias=False)
        self.fc1 = nn.Linear(256 * side * side, 2048, bias=False)
        self.fc2 = nn.Linear(2048, 2048, bias=False)
        self.last = nn.Linear(2048, num_classes, bias=False)
        self.drop1 = nn.Dropout(0.2)
        self.drop2 = nn.Dropout(0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(self.drop1(F.relu(self.conv1(x))), 2)
        x = F.max_pool2d(self.drop1(F.relu(self.conv2(x))), 2)
        x = F.max_pool2d(self.drop2(F.relu(self.conv3(x))), 2)
        x = self.drop2(F.relu(self.fc1(x.flatten(1))))
        return self.last(self.drop2(F.relu(self.fc2(x))))


def _mlp(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    in_features = 1
    for d in input_shape:
        in_features *= int(d)
    return MLP(in_features, num_classes)


def _fot_mlp(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    in_features = 1
    for d in input_shape:
        in_features *= int(d)
    return FOTMLP(in_features, num_classes)


def _fot_alexnet(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    shape = tuple(int(d) for d in input_shape)
    if len(shape) != 3 or shape[1] != shape[2] or shape[1] < 19:
        raise UserError(
            f"model 'fot-alexnet' needs square C×H×W inputs of at least 19×19 (its three "
            f"conv + max-pool stages) but the stream gives {'×'.join(map(str, shape))}; use "
            f"a 32×32 stream such as seq-cifar100, or --model fot-mlp."
        )
    return FOTAlexNet((shape[0], shape[1], shape[2]), num_classes)


def _fedweit_lenet(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    from cfl_bench.strategies.decomposed import build_fedweit_lenet

    return build_fedweit_lenet(input_shape, num_classes)


def _centernet(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    from cfl_bench.carla_bridge.detector import build_detector  # only detection runs pay for it

    return build_detector(tuple(input_shape), num_classes)


@dataclass(frozen=True)
class ModelInfo:
    name: str
    description: str
    build: Callable[[tuple[int, ...], int], nn.Module]


_BUILDERS: dict[str, Callable[[tuple[int, ...], int], nn.Module]] = {
    "mnist-cnn": _mnist_cnn,
    "mlp": _mlp,
    "linear": _linear,
    "cifar-cnn": _cifar_cnn,
    "resnet18": _resnet18,
    "resnet8": _resnet8,
    "resnet32": _resnet32,
    "fedavg-cnn": _fedavg_cnn,
    "centernet": _centernet,
    "fot-mlp": _fot_mlp,
    "fot-alexnet": _fot_alexnet,
    "fedweit-lenet": _fedweit_lenet,
}
# Names and descriptions come from the torch-free catalogue; a test pins that both list
# the same models.
MODELS: dict[str, ModelInfo] = {
    name: ModelInfo(name, description, _BUILDERS[name])
    for name, description in MODEL_DESCRIPTIONS.items()
}


def use_channels_last(model: nn.Module, name: str) -> None:
    """Make every ``nn.Conv2d`` of ``model`` take its input in channels-last memory format
    (``--channels-last``).

    Why the input and not the weights: the parameters are views into one flat vector
    (``cfl_bench.core.flat``) and must stay contiguous; oneDNN and cuDNN pick their channels-last
    kernels when the input is channels-last, the output stays channels-last through ReLU,
    pooling and dropout, and ``flatten`` reads it back in logical order. On a single CPU
    thread those kernels (the max-pool's above all) took the FedGP MNIST-CNN protocol
    1.48x less CPU (``bench/official_speed.py``, docs/executors.md). The convolutions then
    sum in another order, so the records match a default run's only to rounding. A model
    without 2-d convolutions is refused: the flag would do nothing.
    """
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    if not convs:
        raise UserError(
            f"--channels-last speeds up 2-d convolutions but model '{name}' has none; "
            "drop --channels-last."
        )
    for conv in convs:
        conv.register_forward_pre_hook(_channels_last_input)


def _channels_last_input(module: nn.Module, args: tuple[torch.Tensor, ...]) -> tuple:
    """Forward pre-hook: the conv's 4-d input, channels-last.

    ``to`` and not ``contiguous``: a one-channel image counts as contiguous in both formats,
    so ``contiguous`` would keep its NCHW strides and the kernels would stay NCHW.
    """
    x = args[0]
    if x.dim() != 4:
        return args
    return (x.to(memory_format=torch.channels_last), *args[1:])


def build_model(name: str, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """Instantiate model ``name`` for the given input shape (C, H, W) and class count."""
    check_model_name(name)
    return MODELS[name].build(tuple(input_shape), num_classes)
