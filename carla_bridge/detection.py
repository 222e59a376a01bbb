"""The detection objective: CenterNet loss, box decoding and COCO mAP for the CARLA stream.

Why an :class:`~cfl_bench.core.objective.Objective`: learners, replay buffers and evaluation take
their loss, stored outputs and metric from the stream's objective, so a detection stream
plugs into the same engine as the classification streams once this class exists.

Target format (what the engine stores per example): a float32 row block ``(M, 5)`` =
``[label, x1, y1, x2, y2]`` in model-input pixels, rows with label ``-1`` are padding; a
batch is ``(N, M, 5)``. :func:`pack_targets` and :func:`unpack_targets` convert from and to
per-image box lists.

Model outputs are the detector's one dense map ``(N, C + 4, H/4, W/4)``, see
:mod:`carla_bridge.detector`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from cfl_bench.carla_bridge.detector import REGRESSION_CHANNELS, STRIDE
from cfl_bench.carla_bridge.frames import CLASSES
from cfl_bench.core.errors import UserError
from cfl_bench.core.objective import Decode

#: Fields of one target row: label, then the xyxy box.
TARGET_FIELDS = 5
#: Label of a padding row.
PADDING_LABEL = -1.0
#: CenterNet's minimum IoU a box shifted within the Gaussian's radius keeps with its truth.
MIN_OVERLAP = 0.7
#: Upper bound of a decoded log-size: keeps ``exp`` finite for an untrained model.
MAX_LOG_SIZE = 20.0

BoxList = tuple[torch.Tensor, torch.Tensor]  # (n×4 xyxy float32, n int64 labels)


def pack_targets(
    boxes_list: Sequence[torch.Tensor | np.ndarray],
    labels_list: Sequence[torch.Tensor | np.ndarray],
    max_boxes: int,
) -> torch.Tensor:
    """Per-image boxes and labels → one padded ``(N, max_boxes, 5)`` float32 tensor.

    Why refuse instead of truncating: a dropped box silently becomes a false positive for
    the model at training time and a missed object at evaluation, so the caller must pick a
    ``max_boxes`` that fits its data.
    """
    if len(boxes_list) != len(labels_list):
        raise ValueError(f"{len(boxes_list)} box sets but {len(labels_list)} label sets")
    packed = torch.full((len(boxes_list), max_boxes, TARGET_FIELDS), PADDING_LABEL)
    packed[:, :, 1:] = 0.0
    for i, (boxes, labels) in enumerate(zip(boxes_list, labels_list, strict=True)):
        b = torch.as_tensor(boxes, dtype=torch.float32).reshape(-1, 4)
        lab = torch.as_tensor(labels, dtype=torch.float32).reshape(-1)
        if b.shape[0] != lab.shape[0]:
            raise ValueError(f"image {i}: {b.shape[0]} boxes but {lab.shape[0]} labels")
        if b.shape[0] > max_boxes:
            raise ValueError(f"image {i} has {b.shape[0]} boxes, more than max_boxes={max_boxes}")
        packed[i, : b.shape[0], 0] = lab
        packed[i, : b.shape[0], 1:] = b
    return packed


def unpack_targets(targets: torch.Tensor) -> list[BoxList]:
    """``(N, M, 5)`` padded targets → per image (boxes n×4 float32, labels n int64)."""
    out: list[BoxList] = []
    for rows in targets:
        real = rows[rows[:, 0] >= 0]
        out.append((real[:, 1:].float(), real[:, 0].long()))
    return out


def gaussian_radius(w: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """CenterNet's radius rule (as its reference code computes it), elementwise: the
    smallest of three quadratic roots bounding how far a corner may shift before the IoU
    with the true box drops below :data:`MIN_OVERLAP`. Sizes in output cells."""
    m = MIN_OVERLAP
    b1, c1 = h + w, w * h * (1 - m) / (1 + m)
    r1 = (b1 + torch.sqrt((b1**2 - 4 * c1).clamp_min(0))) / 2
    b2, c2 = 2 * (h + w), (1 - m) * w * h
    r2 = (b2 + torch.sqrt((b2**2 - 16 * c2).clamp_min(0))) / 2
    b3, c3 = -2 * m * (h + w), (m - 1) * w * h
    r3 = (b3 + torch.sqrt((b3**2 - 16 * m * c3).clamp_min(0))) / 2
    return torch.minimum(torch.minimum(r1, r2), r3)


class CenterTargets(NamedTuple):
    """Dense training targets of one batch (all on the batch's device)."""

    heatmap: torch.Tensor  # (B, C, Ho, Wo): per class, max over its boxes' Gaussians
    cells: torch.Tensor  # (B, M) int64: flat index (y·Wo + x) of each box's centre cell
    offsets: torch.Tensor  # (B, M, 2): centre minus its cell, in output cells
    log_sizes: torch.Tensor  # (B, M, 2): log w, log h in input pixels
    valid: torch.Tensor  # (B, M) bool: not a padding row


def build_targets(
    targets: torch.Tensor, num_classes: int, out_h: int, out_w: int, stride: int = STRIDE
) -> CenterTargets:
    """CenterNet targets from padded boxes, fully batched (no loop over boxes or images).

    Each box puts an unnormalised Gaussian (peak exactly 1 at its centre cell, σ = (2r+1)/6,
    cut at the radius r of :func:`gaussian_radius`) on its class's map; where boxes of one
    class overlap, a cell keeps the largest value (``scatter_reduce`` with ``amax``). The
    Gaussian is built as an outer product of its x and y factors (it is separable), so the
    only (B, M, Ho, Wo) tensor is the product itself. Sizes are clamped to ≥ 1 px so a
    degenerate box still has a finite log-size; centres outside the map use the edge cell.
    """
    B, M = targets.shape[:2]
    labels, boxes = targets[..., 0], targets[..., 1:]
    valid = labels >= 0
    centre = (boxes[..., :2] + boxes[..., 2:]) / (2 * stride)  # (B, M, 2) output cells
    size = (boxes[..., 2:] - boxes[..., :2]).clamp_min(1.0)  # input pixels
    limit = torch.tensor([out_w - 1, out_h - 1], device=targets.device)
    cell_xy = centre.floor().long().clamp(min=torch.zeros_like(limit), max=limit)
    radius = gaussian_radius(size[..., 0] / stride, size[..., 1] / stride).floor().clamp_min(0)
    sigma = (2 * radius + 1) / 6
    xs = torch.arange(out_w, device=targets.device)
    ys = torch.arange(out_h, device=targets.device)
    dx = (xs.view(1, 1, -1) - cell_xy[..., :1]).float()  # (B, M, Wo)
    dy = (ys.view(1, 1, -1) - cell_xy[..., 1:]).float()  # (B, M, Ho)
    s2 = (2 * sigma**2).unsqueeze(-1)
    gx = torch.exp(-(dx**2) / s2) * (dx.abs() <= radius.unsqueeze(-1))
    gy = torch.exp(-(dy**2) / s2) * (dy.abs() <= radius.unsqueeze(-1))
    gauss = gy.unsqueeze(-1) * gx.unsqueeze(-2) * valid.view(B, M, 1, 1)  # (B, M, Ho, Wo)
    cells_per_map = out_h * out_w
    flat_pos = torch.arange(cells_per_map, device=targets.device)
    index = labels.clamp_min(0).long().unsqueeze(-1) * cells_per_map + flat_pos
    heat = torch.zeros(B, num_classes * cells_per_map, device=targets.device)
    heat = heat.scatter_reduce(
        1, index.reshape(B, -1), gauss.reshape(B, -1), reduce="amax", include_self=True
    )
    return CenterTargets(
        heatmap=heat.view(B, num_classes, out_h, out_w),
        cells=cell_xy[..., 1] * out_w + cell_xy[..., 0],
        offsets=centre - cell_xy.float(),
        log_sizes=size.log(),
        valid=valid,
    )


def focal_loss(
    logits: torch.Tensor,
    heatmap: torch.Tensor,
    num_objects: torch.Tensor,
    rows: torch.Tensor | None = None,
) -> torch.Tensor:
    """CenterNet's penalty-reduced pixel focal loss (α=2, β=4), summed and divided by the
    number of objects: positives are the cells where the target is exactly 1; the other
    cells are down-weighted by ``(1 - target)^4`` near an object. ``logsigmoid`` keeps the
    logs finite without CenterNet's probability clamp. ``rows`` (B,): 1 for the images that
    count, 0 for a padded batch's padding (None: all count)."""
    p = torch.sigmoid(logits)
    pos = heatmap.eq(1.0)
    pos_term = F.logsigmoid(logits) * (1 - p) ** 2
    neg_term = F.logsigmoid(-logits) * p**2 * (1 - heatmap) ** 4
    cells = torch.where(pos, pos_term, neg_term)
    if rows is not None:
        cells = cells * rows.view(-1, 1, 1, 1)
    return -cells.sum() / num_objects


def decode_boxes(
    outputs: torch.Tensor, top_k: int = 100, score_threshold: float = 0.0
) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Dense outputs → per image (boxes xyxy in input pixels, scores, labels), batched.

    Peaks are cells equal to their 3×3 max-pooled neighbourhood (CenterNet's NMS
    substitute); the ``top_k`` best over all classes are kept, then those scoring at least
    ``score_threshold``. Boxes are clipped to the input image.
    """
    B, channels, out_h, out_w = outputs.shape
    num_classes = channels - REGRESSION_CHANNELS
    heat = torch.sigmoid(outputs[:, :num_classes].float())
    peaks = heat * (F.max_pool2d(heat, 3, stride=1, padding=1) == heat)
    cells_per_map = out_h * out_w
    k = min(top_k, num_classes * cells_per_map)
    scores, index = peaks.reshape(B, -1).topk(k, dim=1)
    labels, cell = index // cells_per_map, index % cells_per_map
    reg = outputs[:, num_classes:].float().reshape(B, REGRESSION_CHANNELS, -1)
    reg = reg.gather(2, cell.unsqueeze(1).expand(-1, REGRESSION_CHANNELS, -1))  # (B, 4, k)
    cx = ((cell % out_w).float() + reg[:, 0]) * STRIDE
    cy = ((cell // out_w).float() + reg[:, 1]) * STRIDE
    half_w = reg[:, 2].clamp(max=MAX_LOG_SIZE).exp() / 2
    half_h = reg[:, 3].clamp(max=MAX_LOG_SIZE).exp() / 2
    boxes = torch.stack([cx - half_w, cy - half_h, cx + half_w, cy + half_h], dim=-1)
    bounds = torch.tensor([out_w, out_h, out_w, out_h], device=outputs.device) * STRIDE
    boxes = boxes.clamp(min=torch.zeros_like(bounds), max=bounds)
    keep = scores >= score_threshold
    return [(boxes[i][keep[i]], scores[i][keep[i]], labels[i][keep[i]]) for i in range(B)]


def mean_average_precision(
    detections: Sequence[tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
    truths: Sequence[BoxList],
) -> tuple[float, float]:
    """COCO mAP@0.5 and mAP@[.5:.95] as fractions, by torchmetrics (faster-coco-eval).

    COCO averages over the classes present in the ground truth (a class with no true box is
    left out, whatever was predicted for it). With no true box at all COCO reports -1
    (undefined); we return 0.0 there, so a set of empty frames never lifts an average.
    """
    from torchmetrics.detection import MeanAveragePrecision

    metric = MeanAveragePrecision(box_format="xyxy", iou_type="bbox", backend="faster_coco_eval")
    preds = [{"boxes": b.cpu(), "scores": s.cpu(), "labels": lab.cpu()} for b, s, lab in detections]
    target = [{"boxes": b.cpu(), "labels": lab.cpu()} for b, lab in truths]
    metric.update(preds, target)
    result = metric.compute()
    return max(float(result["map_50"]), 0.0), max(float(result["map"]), 0.0)


@dataclass(frozen=True)
class Detection:
    """CenterNet training loss, dense-map predictions and COCO mAP (in percent).

    Loss = focal + ``offset_weight`` · L1(offset) + ``size_weight`` · L1(log-size), each
    divided by the batch's object count (at least 1), the L1 terms also by their 2
    coordinates (CenterNet's normalisation). CenterNet weighs its pixel-size L1 by 0.1
    because pixel errors are ~10× offset errors; a log-size error is on the offset's scale,
    hence 1.0. Frames without boxes add only the negative focal term.
    """

    num_classes: int = len(CLASSES)
    offset_weight: float = 1.0
    size_weight: float = 1.0
    top_k: int = 100
    eval_batch: int = 16  # frames per predict chunk: 16 frames at 192×320 stay in cache
    capabilities: frozenset[str] = frozenset({"dense_outputs"})
    metrics: tuple[str, ...] = ("map50", "map")

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The batch's CenterNet loss (a differentiable scalar); see the class docstring."""
        return self.masked_loss(outputs, targets, None)

    def masked_loss(
        self, outputs: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor | None
    ) -> torch.Tensor:
        """The CenterNet loss of the real images (mask 1) of a padded batch: padding adds
        no focal term and no object (None: every image is real, the loss itself)."""
        num_classes = outputs.shape[1] - REGRESSION_CHANNELS
        t = build_targets(targets.to(outputs.device), num_classes, *outputs.shape[-2:])
        valid = t.valid if mask is None else t.valid & (mask.unsqueeze(-1) > 0)
        num_objects = valid.sum().clamp_min(1)
        total = focal_loss(outputs[:, :num_classes], t.heatmap, num_objects, mask)
        reg = outputs[:, num_classes:].flatten(2)  # (B, 4, Ho·Wo)
        at_centres = reg.gather(2, t.cells.unsqueeze(1).expand(-1, REGRESSION_CHANNELS, -1))
        at_centres = at_centres.transpose(1, 2)  # (B, M, 4)
        kept = valid.unsqueeze(-1)
        offset_l1 = ((at_centres[..., :2] - t.offsets).abs() * kept).sum() / (2 * num_objects)
        size_l1 = ((at_centres[..., 2:] - t.log_sizes).abs() * kept).sum() / (2 * num_objects)
        return total + self.offset_weight * offset_l1 + self.size_weight * size_l1

    def predict(
        self, module: nn.Module, x: torch.Tensor, decode: Decode | None = None
    ) -> torch.Tensor:
        """Raw dense outputs of ``x`` in eval mode, chunk by chunk so stored uint8 frames
        are decoded to floats one chunk at a time, never whole."""
        was_training = module.training
        module.eval()
        try:
            with torch.inference_mode():
                chunks = (x[i : i + self.eval_batch] for i in range(0, x.shape[0], self.eval_batch))
                return torch.cat([module(c if decode is None else decode(c)) for c in chunks])
        finally:
            module.train(was_training)

    def score(
        self, outputs: torch.Tensor, targets: torch.Tensor, classes: tuple[int, ...]
    ) -> dict[str, torch.Tensor]:
        """mAP@0.5 and mAP@[.5:.95] in percent (0.0 when the frames hold no true box).

        ``classes`` is unused: a detection task is a driving domain, not a class subset, so
        there is no task-IL masking; COCO already averages over the classes present.
        """
        del classes
        detections = decode_boxes(outputs, top_k=self.top_k)
        map50, map_all = mean_average_precision(detections, unpack_targets(targets))
        return {
            "map50": torch.tensor(map50 * 100.0, device=outputs.device),
            "map": torch.tensor(map_all * 100.0, device=outputs.device),
        }

    def log_probs(self, outputs: torch.Tensor) -> torch.Tensor:
        """Refused: memory drift is a KL between categorical predictions, and a detector's
        per-cell class scores are independent sigmoids (a cell may hold no object or two
        classes), so no categorical distribution exists to compare."""
        raise UserError(
            "memory and buffer drift (KL of class distributions) are not defined for the "
            "detection objective; run detection streams with drift measurement off."
        )

    def buffer_outputs(self, outputs: torch.Tensor) -> torch.Tensor:
        """DER's replay target: the whole dense map, detached (same shape)."""
        return outputs.detach()

    def output_shape(self, input_shape: tuple[int, ...]) -> tuple[int, ...]:
        """The dense map's per-example shape for a (C, H, W) input, for buffer allocation."""
        _, h, w = input_shape
        return (self.num_classes + REGRESSION_CHANNELS, h // STRIDE, w // STRIDE)

    @staticmethod
    def target_shape(max_boxes: int) -> tuple[int, ...]:
        """The per-example target shape: ``max_boxes`` rows of [label, x1, y1, x2, y2]."""
        return (max_boxes, TARGET_FIELDS)
