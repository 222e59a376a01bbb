"""CIFAR ResNets: the ResNet-18 of the FedGP protocol and the ResNet-8 of FedDF / FedProj.

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
