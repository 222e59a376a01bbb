"""CIFAR ResNets: the ResNet-18 of the FedGP protocol, the ResNet-8 of FedDF / FedProj and the
ResNet-32 of PyCIL / TARGET (federated class-continual learning; ``CifarResNet32``).

ResNet-8 is He et al.'s CIFAR family (depth 6n + 2, n = 1): a 3×3 stem of 16 channels and
three stages of one basic block each (16, 32, 64 channels, strides 1, 2, 2), global average
pooling, one linear layer — 78,042 parameters for 10 classes, the model FedDF's and
FedProj's CIFAR tables use.

ResNet-18 (He et al. 2016, CIFAR variant):

Differences from the ImageNet ResNet-18 that matter for 32×32 inputs: a 3×3 stride-1 stem
convolution and no max-pool, so the four stages see 32, 16, 8 and 4 pixels; global average
pooling and one linear layer. BatchNorm running statistics are float buffers, which the
engine's flat-buffer view averages like weights. 11,173,962 parameters for 10 classes.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


class BasicBlock(nn.Module):
    """Two 3×3 conv-BN layers with an identity (or 1×1 conv-BN) shortcut."""

    def __init__(self, in_planes: int, planes: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_planes != planes:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_planes, planes, 1, stride=stride, bias=False),
                nn.BatchNorm2d(planes),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class CifarResNet18(nn.Module):
    def __init__(self, num_classes: int, in_channels: int = 3) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 64, 3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        stages: list[nn.Module] = []
        in_planes = 64
        for planes, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            stages.append(
                nn.Sequential(BasicBlock(in_planes, planes, stride), BasicBlock(planes, planes, 1))
            )
            in_planes = planes
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.linear = nn.Linear(512, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classify(self.representation(x))

    def representation(self, x: torch.Tensor) -> torch.Tensor:
        """The globally pooled 512 channels the linear layer reads."""
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.layer4(self.layer3(self.layer2(self.layer1(out))))
        return F.adaptive_avg_pool2d(out, 1).flatten(1)

    def classify(self, z: torch.Tensor) -> torch.Tensor:
        """Class logits of a representation: ``forward(x) == classify(representation(x))``."""
        return self.linear(z)


class CifarResNet8(nn.Module):
    """ResNet-8 for C×32×32 inputs (see the module docstring)."""

    def __init__(self, num_classes: int, in_channels: int = 3) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 16, 3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        self.layer1 = BasicBlock(16, 16, 1)
        self.layer2 = BasicBlock(16, 32, 2)
        self.layer3 = BasicBlock(32, 64, 2)
        self.linear = nn.Linear(64, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classify(self.representation(x))

    def representation(self, x: torch.Tensor) -> torch.Tensor:
        """The globally pooled 64 channels the linear layer reads."""
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.layer3(self.layer2(self.layer1(out)))
        return F.adaptive_avg_pool2d(out, 1).flatten(1)

    def classify(self, z: torch.Tensor) -> torch.Tensor:
        """Class logits of a representation: ``forward(x) == classify(representation(x))``."""
        return self.linear(z)


class ZeroPadShortcut(nn.Module):
    """He et al.'s option-A shortcut (PyCIL's ``DownsampleA``): keep every second pixel of
    each row and column and append as many zero channels, so a stage that halves the size
    and doubles the width adds no parameters. Parameter-free, unlike ``BasicBlock``'s 1×1
    conv-BN shortcut, which is why ResNet-32 has blocks of its own."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kept = x[:, :, ::2, ::2]  # AvgPool2d(kernel_size=1, stride=2) in the official code
        return torch.cat((kept, torch.zeros_like(kept)), dim=1)


class PlainBlock(nn.Module):
    """PyCIL's ``ResNetBasicblock``: conv3×3-BN-ReLU, conv3×3-BN, add the shortcut, ReLU."""

    def __init__(self, in_planes: int, planes: int, stride: int) -> None:
        super().__init__()
        self.conv_a = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn_a = nn.BatchNorm2d(planes)
        self.conv_b = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.bn_b = nn.BatchNorm2d(planes)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_planes != planes:
            self.shortcut = ZeroPadShortcut()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn_a(self.conv_a(x)))
        out = self.bn_b(self.conv_b(out))
        return F.relu(self.shortcut(x) + out)


class CifarResNet32(nn.Module):
    """ResNet-32 as PyCIL's ``convs/cifar_resnet.py`` builds it for TARGET's code base.

    Depth 6n + 2 with n = 5: a 3×3 stem of 16 channels (conv, BN, ReLU), three stages of five
    ``PlainBlock``s (16, 32, 64 channels; strides 1, 2, 2; option-A zero-padding shortcuts
    where the width doubles), an 8×8 average pool to 64 features and one linear layer. Every
    BatchNorm has torch's defaults (momentum 0.1, eps 1e-5), as in the official code.

    Why the initialisation is written out: the official code draws every conv weight from
    N(0, 2 / (k·k·out_channels)) (He et al.'s fan-out rule), BatchNorm weight 1 and bias 0,
    and builds its classifier as PyCIL's ``SimpleLinear`` (Kaiming-uniform with the linear
    gain, U(±√(3 / 64)), bias 0); torch's defaults differ for the convolutions (uniform,
    fan-in) and the classifier (uniform with a bias), so both are drawn here as the code does.

    One difference, on purpose: the official backbone also holds a ``Linear(64, 10)`` that
    its forward never uses (the classifier is a separate ``SimpleLinear`` grown per task).
    It is left out here, so the model has 463,504 backbone parameters plus 65 per class.
    """

    def __init__(self, num_classes: int, in_channels: int = 3) -> None:
        super().__init__()
        self.conv_1_3x3 = nn.Conv2d(in_channels, 16, 3, stride=1, padding=1, bias=False)
        self.bn_1 = nn.BatchNorm2d(16)
        stages: list[nn.Module] = []
        in_planes = 16
        for planes, stride in ((16, 1), (32, 2), (64, 2)):
            blocks = [PlainBlock(in_planes, planes, stride)]
            blocks += [PlainBlock(planes, planes, 1) for _ in range(4)]
            stages.append(nn.Sequential(*blocks))
            in_planes = planes
        self.stage_1, self.stage_2, self.stage_3 = stages
        self.fc = nn.Linear(64, num_classes)
        self._initialise()

    def _initialise(self) -> None:
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                fan_out = module.kernel_size[0] * module.kernel_size[1] * module.out_channels
                nn.init.normal_(module.weight, 0.0, (2.0 / fan_out) ** 0.5)
            elif isinstance(module, nn.BatchNorm2d):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)
        nn.init.kaiming_uniform_(self.fc.weight, nonlinearity="linear")
        nn.init.zeros_(self.fc.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classify(self.representation(x))

    def representation(self, x: torch.Tensor) -> torch.Tensor:
        """The 64 pooled channels the classifier reads (PyCIL's ``features``)."""
        out = F.relu(self.bn_1(self.conv_1_3x3(x)))
        out = self.stage_3(self.stage_2(self.stage_1(out)))
        return F.avg_pool2d(out, 8).flatten(1)

    def classify(self, z: torch.Tensor) -> torch.Tensor:
        """Class logits of a representation: ``forward(x) == classify(representation(x))``."""
        return self.fc(z)
