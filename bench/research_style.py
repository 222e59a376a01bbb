"""Reference (a) of bench/throughput.py: the same DER / FedGP work, written the way common
research code for continual federated learning does it.

What makes it "research style", each taken from the usual Mammoth/FedGP-derived code:
a torch ``Dataset`` that builds a PIL image and rotates it per sample per epoch, a
``DataLoader`` per client, a ``copy.deepcopy`` of the global model for every client in every
round, a reservoir buffer filled by a Python loop over examples, gradients gathered with
``torch.cat`` and written back parameter by parameter, and ``if dot.item() < 0`` before
projecting. The algorithm is the same as the engine's (same protocol, same passes), so the
ratio measures implementation cost only. This file is a benchmark reference, not product code.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset
from torchvision.transforms import functional as TF


class RotatedMNIST(Dataset):
    """MNIST images as PIL, rotated by one angle on every access (per sample, per epoch)."""

    def __init__(self, images: np.ndarray, labels: np.ndarray, angle: float) -> None:
        self.images = images
        self.labels = labels
        self.angle = angle

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        img = Image.fromarray(self.images[i], mode="L")
        img = TF.rotate(img, self.angle)
        return TF.to_tensor(img), int(self.labels[i])


class PythonReservoir:
    """Reservoir buffer with Mammoth's per-example Python loop."""

    def __init__(self, size: int, rng: np.random.Generator) -> None:
        self.size = size
        self.rng = rng
        self.num_seen = 0
        self.examples: torch.Tensor | None = None
        self.labels: torch.Tensor | None = None
        self.logits: torch.Tensor | None = None

    def add(self, x: torch.Tensor, y: torch.Tensor, logits: torch.Tensor) -> None:
        if self.examples is None:
            self.examples = torch.zeros((self.size, *x.shape[1:]))
            self.labels = torch.zeros(self.size, dtype=torch.long)
            self.logits = torch.zeros((self.size, logits.shape[1]))
        for i in range(x.shape[0]):
            if self.num_seen < self.size:
                j = self.num_seen
            else:
                j = int(self.rng.integers(0, self.num_seen + 1))
            self.num_seen += 1
            if j < self.size:
                self.examples[j] = x[i]
                self.labels[j] = y[i]
                self.logits[j] = logits[i]

    def get(self, m: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        filled = min(self.num_seen, self.size)
        if filled == 0 or self.examples is None:
            return None
        idx = self.rng.choice(filled, size=min(m, filled), replace=False)
        return self.examples[idx], self.labels[idx], self.logits[idx]  # type: ignore[index]


@dataclass
class ResearchConfig:
    use_der: bool
    use_fedgp: bool
    alpha: float = 1.0
    lr: float = 0.01
    batch_size: int = 32
    buffer_size: int = 200


def flat_grad(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.grad.view(-1) for p in model.parameters()])


def write_grad(model: nn.Module, g: torch.Tensor) -> None:
    offset = 0
    for p in model.parameters():
        n = p.numel()
        p.grad.copy_(g[offset : offset + n].view_as(p))
        offset += n


def run_research_style(
    global_model: nn.Module,
    images: np.ndarray,
    labels: np.ndarray,
    test_images: np.ndarray,
    test_labels: np.ndarray,
    client_indices: list[np.ndarray],
    angles: list[float],
    rounds_per_task: int,
    cfg: ResearchConfig,
    seed: int,
) -> int:
    """Train the protocol; returns the number of local training samples processed."""
    rng = np.random.default_rng(seed)
    buffers = [PythonReservoir(cfg.buffer_size, rng) for _ in client_indices]
    gref: torch.Tensor | None = None
    processed = 0
    for t, angle in enumerate(angles):
        train = RotatedMNIST(images, labels, angle)
        for r in range(rounds_per_task):
            states = []
            sizes = []
            for k, idx in enumerate(client_indices):
                local = copy.deepcopy(global_model)
                local.train()
                opt = torch.optim.SGD(local.parameters(), lr=cfg.lr)
                loader = DataLoader(
                    torch.utils.data.Subset(train, idx.tolist()),
                    batch_size=cfg.batch_size,
                    shuffle=True,
                    num_workers=0,
                )
                for x, y in loader:
                    opt.zero_grad()
                    out = local(x)
                    loss = F.cross_entropy(out, y)
                    if cfg.use_der:
                        draw = buffers[k].get(cfg.batch_size)
                        if draw is not None:
                            loss = loss + cfg.alpha * F.mse_loss(local(draw[0]), draw[2])
                    loss.backward()
                    if cfg.use_fedgp and gref is not None:
                        g = flat_grad(local)
                        dot = torch.dot(g, gref)
                        if dot.item() < 0:
                            g = g - dot / torch.dot(gref, gref) * gref
                            write_grad(local, g)
                    opt.step()
                    if r == 0:
                        buffers[k].add(x, y, out.detach())
                    processed += x.shape[0]
                states.append(copy.deepcopy(local.state_dict()))
                sizes.append(len(idx))
            total = float(sum(sizes))
            avg = {
                key: sum(s[key] * (n / total) for s, n in zip(states, sizes, strict=True))
                for key in states[0]
            }
            global_model.load_state_dict(avg)
            if cfg.use_fedgp:
                grads = []
                for buf in buffers:
                    draw = buf.get(32)
                    if draw is None:
                        continue
                    probe = copy.deepcopy(global_model)
                    probe.train()
                    probe.zero_grad()
                    F.cross_entropy(probe(draw[0]), draw[1]).backward()
                    grads.append(flat_grad(probe))
                gref = torch.stack(grads).mean(0) if grads else None
        # like the engine: every seen task plus the next one (for forward transfer)
        evaluate_research_style(global_model, test_images, test_labels, angles[: t + 2])
    return processed


def evaluate_research_style(
    model: nn.Module, images: np.ndarray, labels: np.ndarray, angles: list[float]
) -> list[float]:
    model.eval()
    accs = []
    with torch.no_grad():
        for angle in angles:
            loader = DataLoader(RotatedMNIST(images, labels, angle), batch_size=256)
            correct = 0
            for x, y in loader:
                correct += (model(x).argmax(1) == y).sum().item()
            accs.append(100.0 * correct / len(labels))
    model.train()
    return accs
