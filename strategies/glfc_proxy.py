"""GLFC's proxy server, its building blocks: the LeNet encoder, the label a gradient gives
away, and the sample rebuilt from the gradient.

Dong et al., CVPR 2022, official code conditionWang/FCIL: ``src/myNetwork.py`` (``LeNet``,
``weights_init``), ``src/GLFC.py`` (``prototype_mask``: the gradient a client sends) and
``src/ProxyServer.py`` (``gradient2label``, ``reconstruction``, ``dataloader``). The
``glfc`` component (``strategies.glfc``, ``proxy=code``) runs them: the functions here are
the pure pieces, its hooks the wiring (docs/methods.md, section ``glfc``).

- The encoder: three 5×5 convolutions of 12 channels (strides 2, 2, 1, padding 2), each
  followed by a sigmoid, then one linear layer to the classes; every weight and bias drawn
  uniformly from [−0.5, 0.5] (``weights_init``). The code builds it for 32×32 RGB inputs
  (768 = 12·8·8 features) and 100 classes; here the feature count follows the input shape.
- A client sends ∇_φ CE(encoder_φ(x), y) for one sample x of each new class: the row
  nearest its class mean of normalised features (``prototype_index``) after 50 SGD steps
  on the sample itself (lr / 10, weight decay 1e-5) through the client's model, on the
  BCE of its outputs over the classes seen (``refine_prototype``).
- The label: the class whose row of the last layer's weight gradient sums lowest (for one
  sample that row is (p_y − 1)·h with h > 0 after the sigmoid, the only negative one).
- The reconstruction: x̂ from N(0, 1), minimising Σ_layers ‖∇_φ CE(encoder(x̂), ŷ) − g‖²
  by L-BFGS (lr 0.1, torch's defaults otherwise: up to 20 inner iterations per step) for
  ``iterations`` steps (code: 250); the iterates of the last ``keep`` steps (code: 20) are
  the augmented samples. The code stores each iterate as an 8-bit image (``ToPILImage``);
  here they stay float tensors.
- The score (``monitor``): ⌊100·correct / total⌋ on the rebuilt samples (integer tensors
  divide under the code's torch 1.2); a model is kept when it scores at least the best
  score so far, which is never reset (``keep_best``).
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

# ProxyServer.py: self.Iteration = 250, self.num_image = 20; optim.LBFGS(lr=0.1).
ITERATIONS = 250
KEEP = 20
LBFGS_LR = 0.1
# torch's L-BFGS default max_iter: up to 20 closure evaluations a step (max_eval 25).
LBFGS_EVALUATIONS = 20
# GLFC.py prototype_mask: iters = 50, optim.SGD(lr=learning_rate / 10, weight_decay=0.00001).
PROTO_STEPS = 50
PROTO_LR_DIVISOR = 10
PROTO_WEIGHT_DECAY = 1e-5


class LeNetEncoder(nn.Module):
    """The code's ``LeNet`` for inputs of ``shape`` (channels, height, width)."""

    def __init__(self, shape: tuple[int, int, int], num_classes: int) -> None:
        super().__init__()
        channels, height, width = shape
        self.body = nn.Sequential(
            nn.Conv2d(channels, 12, kernel_size=5, padding=2, stride=2),
            nn.Sigmoid(),
            nn.Conv2d(12, 12, kernel_size=5, padding=2, stride=2),
            nn.Sigmoid(),
            nn.Conv2d(12, 12, kernel_size=5, padding=2, stride=1),
            nn.Sigmoid(),
        )
        h, w = math.ceil(height / 4), math.ceil(width / 4)
        self.fc = nn.Linear(12 * h * w, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.body(x).flatten(1))


def encoder(shape: tuple[int, int, int], num_classes: int, gen: torch.Generator) -> LeNetEncoder:
    """A LeNet whose every weight and bias is uniform on [−0.5, 0.5] (``weights_init``),
    drawn from ``gen`` so that every client and the server hold the same one."""
    model = LeNetEncoder(shape, num_classes)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.rand(p.shape, generator=gen) - 0.5)
    return model


def sample_gradient(model: nn.Module, x: torch.Tensor, y: int) -> list[torch.Tensor]:
    """∇ of CE(model(x), y) for one sample ``x`` (C, H, W) w.r.t. every parameter: what a
    client sends the proxy server."""
    loss = F.cross_entropy(model(x.unsqueeze(0)), torch.tensor([y], device=x.device))
    return [g.detach() for g in torch.autograd.grad(loss, list(model.parameters()))]


def gradient_label(gradient: list[torch.Tensor]) -> int:
    """The label a one-sample gradient gives away: the row of the last layer's weight
    gradient (``gradient[-2]``) with the lowest sum (``gradient2label``)."""
    return int(gradient[-2].sum(dim=-1).argmin())


def reconstruct(
    model: nn.Module,
    gradient: list[torch.Tensor],
    shape: tuple[int, int, int],
    gen: torch.Generator,
    iterations: int = ITERATIONS,
    keep: int = KEEP,
) -> torch.Tensor:
    """The last ``keep`` of ``iterations`` L-BFGS iterates (keep, C, H, W) of the sample
    whose gradient matches ``gradient``, labelled ``gradient_label(gradient)``."""
    device = gradient[0].device
    label = torch.tensor([gradient_label(gradient)], device=device)
    dummy = torch.randn((1, *shape), generator=gen).to(device).requires_grad_(True)
    optimizer = torch.optim.LBFGS([dummy], lr=LBFGS_LR)
    params = list(model.parameters())

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        grads = torch.autograd.grad(F.cross_entropy(model(dummy), label), params, create_graph=True)
        gap = sum(((g - t) ** 2).sum() for g, t in zip(grads, gradient, strict=True))
        assert isinstance(gap, torch.Tensor)
        gap.backward()
        return gap

    kept: list[torch.Tensor] = []
    for step in range(iterations):
        optimizer.step(closure)
        if step >= iterations - keep:
            kept.append(dummy.detach().clone().squeeze(0))
    return torch.stack(kept)


def inversion_gap(model: nn.Module, gradient: list[torch.Tensor], x: torch.Tensor) -> float:
    """Σ ‖∇(x) − gradient‖² at a candidate ``x`` (C, H, W), under the gradient's label."""
    grads = sample_gradient(model, x, gradient_label(gradient))
    return float(sum(((g - t) ** 2).sum() for g, t in zip(grads, gradient, strict=True)))


def best_model(accuracies: list[float]) -> int:
    """The index of the model the proxy server keeps: the highest accuracy on the rebuilt
    samples, the latest one on a tie (``cur_perf >= self.best_perf``)."""
    best = 0
    for i, acc in enumerate(accuracies):
        if acc >= accuracies[best]:
            best = i
    return best


def prototype_index(features: torch.Tensor) -> int:
    """The row of normalised ``features`` (n, d) nearest (Euclidean) to their mean: the
    class's prototype (``prototype_mask``: ``argmin ‖class_mean − f_i‖``; ties: the first)."""
    return int((features.mean(dim=0) - features).norm(dim=1).argmin())


def refine_prototype(
    model: nn.Module, x: torch.Tensor, label: int, classes: int, lr: float
) -> torch.Tensor:
    """``x`` (C, H, W) after ``PROTO_STEPS`` SGD steps (``lr``, weight decay 1e-5) on the
    mean BCE of the model's first ``classes`` outputs against the one-hot ``label``: the
    code moves the prototype (not the model) before its gradient is taken."""
    data = x.detach().clone().unsqueeze(0).requires_grad_(True)
    target = F.one_hot(torch.tensor([label], device=x.device), classes).to(x.dtype)
    with torch.enable_grad():
        for _ in range(PROTO_STEPS):
            loss = F.binary_cross_entropy_with_logits(model(data)[:, :classes], target)
            (grad,) = torch.autograd.grad(loss, [data])
            with torch.no_grad():
                data -= lr * (grad + PROTO_WEIGHT_DECAY * data)
    return data.detach().squeeze(0)


def flat_gradient(gradient: list[torch.Tensor]) -> torch.Tensor:
    """One vector of a gradient's tensors, in the encoder's parameter order (what travels)."""
    return torch.cat([g.reshape(-1) for g in gradient])


def split_gradient(flat: torch.Tensor, model: nn.Module) -> list[torch.Tensor]:
    """A travelled vector back into tensors shaped as the encoder's parameters."""
    shapes = [p.shape for p in model.parameters()]
    sizes = [math.prod(shape) for shape in shapes]
    return [part.reshape(shape) for part, shape in zip(flat.split(sizes), shapes, strict=True)]


def monitor_accuracy(outputs: torch.Tensor, y: torch.Tensor, classes: int) -> int:
    """The proxy server's score of a model on the rebuilt samples: the integer percent
    ⌊100·correct / total⌋ of argmax over the first ``classes`` outputs (the code's model has
    only those; its ``100 * correct / total`` divides integer tensors under torch 1.2)."""
    correct = int((outputs[:, :classes].argmax(dim=1) == y).sum())
    return (100 * correct) // int(y.shape[0])


def keep_best(best_perf: int, accuracy: int) -> bool:
    """Whether the model scored ``accuracy`` replaces best_2 (``cur_perf >= best_perf``:
    on a tie the latest; ``best_perf`` is never reset, not even for a new evaluation set)."""
    return accuracy >= best_perf


def one_closure(model: nn.Module, shape: tuple[int, int, int]) -> None:
    """One evaluation of the inversion's objective and its gradient in x̂ (what L-BFGS
    repeats up to 20 times a step), at a fixed sample: the unit the cost probe times."""
    device = next(model.parameters()).device
    x = torch.rand(shape, generator=torch.Generator().manual_seed(0)).to(device)
    target = sample_gradient(model, x, 0)
    dummy = x.unsqueeze(0).requires_grad_(True)
    label = torch.tensor([0], device=device)
    with torch.enable_grad():
        loss = F.cross_entropy(model(dummy), label)
        grads = torch.autograd.grad(loss, list(model.parameters()), create_graph=True)
        gap = sum(((g - t) ** 2).sum() for g, t in zip(grads, target, strict=True))
        assert isinstance(gap, torch.Tensor)
        torch.autograd.grad(gap, [dummy])
