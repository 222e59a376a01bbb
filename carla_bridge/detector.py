"""A small CenterNet-style detector that trains from scratch on a CPU in minutes.

Why this shape: the benchmark's detection stream has ~100 frames per town and clients train
on laptops, so a pretrained backbone is out and the model must stay in the 150k–300k
parameter range. CenterNet suits that: one dense output map, no anchors and no NMS, so the
loss, the replay buffer (DER stores the dense map) and evaluation all see one tensor.

Why GroupNorm and not BatchNorm: the federated engine averages parameters across clients
and a vectorized executor runs many clients' models as one; running statistics would be
state outside the parameters that neither can average or vectorize.

Output layout, for an input of ``H×W`` (both multiples of :data:`STRIDE`): one tensor
``(B, C + 4, H/4, W/4)`` — ``C`` class heat-map logits, then the 2 sub-pixel offsets of an
object's centre inside its cell (x, y, in output cells), then ``log w`` and ``log h`` of its
box in input pixels.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from cfl_bench.core.errors import UserError

#: Input pixels per output cell.
STRIDE = 4
#: Channels after the class heat maps: offset x, offset y, log w, log h.
REGRESSION_CHANNELS = 4
#: CenterNet's heat-map bias: sigmoid(-2.19) ≈ 0.1, so the untrained focal loss starts small.
HEATMAP_PRIOR_BIAS = -math.log((1 - 0.1) / 0.1)


def _conv_gn(c_in: int, c_out: int, stride: int = 1, dilation: int = 1) -> nn.Sequential:
    """3×3 conv → GroupNorm → ReLU; 8 groups keeps every block's groups ≥ 2 channels."""
    return nn.Sequential(
        nn.Conv2d(c_in, c_out, 3, stride, padding=dilation, dilation=dilation, bias=False),
        nn.GroupNorm(8, c_out),
        nn.ReLU(inplace=True),
    )


class CenterNetDetector(nn.Module):
    """A four-stage encoder (strides 2–16) with a top-down merge back to stride 4, then a
    heat-map head and a regression head; ~270k parameters for 5 classes.

    Why the top-down merge: cars fill a third of the frame but traffic lights are a few
    pixels wide, so the stride-4 map needs both the stride-16 context and stride-4 detail.
    """

    def __init__(self, num_classes: int, in_channels: int = 3, width: int = 48) -> None:
        super().__init__()
        self.num_classes = num_classes
        self.stem = nn.Sequential(_conv_gn(in_channels, 16, 2), _conv_gn(16, 32, 2))
        self.stage4 = _conv_gn(32, 32)
        self.stage8 = nn.Sequential(_conv_gn(32, 64, 2), _conv_gn(64, 64))
        self.stage16 = nn.Sequential(_conv_gn(64, 96, 2), _conv_gn(96, 96, dilation=2))
        self.lateral16 = nn.Conv2d(96, width, 1)
        self.lateral8 = nn.Conv2d(64, width, 1)
        self.lateral4 = nn.Conv2d(32, width, 1)
        self.merge = _conv_gn(width, width)
        self.heatmap = self._head(width, num_classes)
        self.regression = self._head(width, REGRESSION_CHANNELS)
        self._init_heads()

    @staticmethod
    def _head(width: int, c_out: int) -> nn.Sequential:
        return nn.Sequential(
            nn.Conv2d(width, 32, 3, padding=1), nn.ReLU(inplace=True), nn.Conv2d(32, c_out, 1)
        )

    def _init_heads(self) -> None:
        """Heat-map bias at the 0.1 prior (CenterNet); small regression weights so early
        log-sizes start near 0 instead of exploding through ``exp`` at decode time."""
        last_hm, last_reg = self.heatmap[-1], self.regression[-1]
        assert isinstance(last_hm, nn.Conv2d) and isinstance(last_reg, nn.Conv2d)
        assert last_hm.bias is not None and last_reg.bias is not None  # built with bias=True
        nn.init.constant_(last_hm.bias, HEATMAP_PRIOR_BIAS)
        nn.init.normal_(last_reg.weight, std=0.001)
        nn.init.zeros_(last_reg.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        f4 = self.stage4(self.stem(x))
        f8 = self.stage8(f4)
        f16 = self.stage16(f8)
        top = self.lateral16(f16)
        top = self.lateral8(f8) + F.interpolate(top, size=f8.shape[-2:], mode="nearest")
        top = self.lateral4(f4) + F.interpolate(top, size=f4.shape[-2:], mode="nearest")
        features = self.merge(top)
        return torch.cat([self.heatmap(features), self.regression(features)], dim=1)


def build_detector(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """The model catalogue's builder: ``input_shape`` is (C, H, W) of one model input.

    H and W must be multiples of :data:`STRIDE` so every output cell covers exactly
    ``STRIDE×STRIDE`` input pixels, which the target builder and the decoder assume.
    """
    if len(input_shape) != 3 or any(int(d) % STRIDE for d in input_shape[1:]):
        raise UserError(
            f"the CenterNet detector needs C×H×W inputs with H and W multiples of {STRIDE}, "
            f"but the stream gives {'×'.join(map(str, input_shape))}; resize the frames "
            f"(e.g. to 3×192×320)."
        )
    return CenterNetDetector(num_classes, in_channels=int(input_shape[0]))
