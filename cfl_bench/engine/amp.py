"""Mixed precision for the local step (``--amp off|bf16|fp16``), both executors.

What runs in which dtype, and why:

- **Autocast**: the forwards of a local step's loss (the learner's batch and replay
  forwards, the output terms' frozen forwards: FedNTD's teacher, MOON's global and previous
  models) run under ``torch.autocast(device_type, dtype)``: the matmuls and convolutions
  take bf16/fp16 inputs, which is where the time goes.
- **fp32 everywhere else**: the model's outputs (and MOON's representations) are cast back
  with ``.float()`` before any loss, so CE, MSE and KL are computed in fp32 (a bf16 softmax
  over many classes loses the small probabilities the gradient is made of). Parameters,
  flat gradients, optimizer state, penalties, projections (FedGP, A-GEM, FedProj: their
  reference gradients are separate backward passes, outside autocast, whose dot products
  decide a sign), aggregation and evaluation stay fp32. Evaluation is not autocast, so a
  run's accuracy is measured the same way whatever ``--amp`` it trained with.
- **fp16 loss scaling** (``LossScaler``): fp16's 5-bit exponent flushes small gradients to
  zero, so the loss is multiplied by a scale s before the backward and the flat gradient
  divided by s after it; a client whose unscaled gradient is not finite skips its optimizer
  step and halves s, and s doubles after 2000 consecutive good steps (the defaults of
  ``torch.amp.GradScaler``: init 2^16, growth 2, backoff 0.5, interval 2000). Written by
  hand because the clients' optimizers are flat-vector updates (``engine.optim``), not
  ``torch.optim`` optimizers, and because the vectorized executor keeps one scale per
  client, updated with ``torch.where`` without reading a value on the host. A client's
  scale and good-step count persist across rounds in its state (``client.extras["amp"]``,
  checkpointed with it), as one GradScaler per client would. bf16 has fp32's exponent
  range and needs no scaling.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

if TYPE_CHECKING:
    from cfl_bench.core.context import ClientState

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
# torch.amp.GradScaler's defaults.
INIT_SCALE = 2.0**16
GROWTH_FACTOR = 2.0
BACKOFF_FACTOR = 0.5
GROWTH_INTERVAL = 2000
STATE_KEY = "amp"  # a client's scaler state in ``ClientState.extras``


@dataclass(frozen=True)
class Precision:
    """The local step's precision: ``mode`` (``config.AMP_MODES``) on a device of
    ``device_type`` (what ``torch.autocast`` is told)."""

    mode: str = "off"
    device_type: str = "cpu"

    @property
    def enabled(self) -> bool:
        return self.mode != "off"

    @property
    def scaled(self) -> bool:
        """Whether the loss is scaled (fp16 only)."""
        return self.mode == "fp16"

    @contextlib.contextmanager
    def autocast(self) -> Iterator[None]:
        """Autocast to the mode's dtype (nothing at all when off)."""
        if not self.enabled:
            yield
            return
        with torch.autocast(self.device_type, dtype=DTYPES[self.mode]):
            yield


def float_outputs(module: nn.Module, args: object, output: object) -> object:
    """Forward hook: a tensor output cast to fp32 (the identity on fp32 outputs), so every
    ``module(x)`` of a local step hands its loss fp32 logits."""
    return output.float() if isinstance(output, torch.Tensor) else output


def install(module: nn.Module, precision: Precision) -> None:
    """Cast ``module``'s outputs to fp32 when ``precision`` autocasts (nothing when off, so
    runs without ``--amp`` execute exactly the code they always did). Copies of the module
    (FedNTD's teacher, MOON's frozen models) inherit the hook."""
    if precision.enabled:
        module.register_forward_hook(float_outputs)


class LossScaler:
    """Dynamic loss scales of C clients: ``scale`` (C,) fp32 and ``good`` (C,), the
    consecutive finite steps since the last change (``torch.amp.GradScaler``'s growth
    tracker), one per client."""

    def __init__(self, scale: torch.Tensor, good: torch.Tensor) -> None:
        self.scale, self.good = scale, good

    @classmethod
    def of(cls, clients: Sequence[ClientState], device: torch.device) -> LossScaler:
        """The clients' saved scales (``INIT_SCALE`` and 0 good steps for a new client)."""
        scales, goods = [], []
        for client in clients:
            state = client.extras.get(STATE_KEY, {})
            scale, good = (
                state.get("scale", torch.tensor(INIT_SCALE)),
                state.get("good", torch.tensor(0)),
            )
            assert isinstance(scale, torch.Tensor) and isinstance(good, torch.Tensor)  # ``save``'s
            scales.append(scale)
            goods.append(good)
        scale = torch.stack(scales).to(device=device, dtype=torch.float32)
        return cls(scale, torch.stack(goods).to(device=device, dtype=torch.int64))

    def save(self, clients: Sequence[ClientState], trained: Sequence[bool] | None = None) -> None:
        """Write each client's scale and good-step count back into its state (only those of
        the ``trained`` clients: one without data keeps no state, as sequentially)."""
        for i, client in enumerate(clients):
            if trained is not None and not trained[i]:
                continue
            state = client.state_for(STATE_KEY)
            state["scale"], state["good"] = self.scale[i].clone(), self.good[i].clone()

    def unscale(self, grads: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows of ``grads`` (C, P) divided by their scale (exact: scales are powers of 2),
        and which are finite (C,); a non-finite row is zeroed so that nothing downstream
        (penalties, projections) reads its inf/nan."""
        unscaled = grads / self.scale[:, None]
        finite = torch.isfinite(unscaled).all(dim=1)
        return torch.where(finite[:, None], unscaled, 0.0), finite

    def update(self, finite: torch.Tensor, stepped: torch.Tensor | None = None) -> None:
        """After a step: halve the scale of a client with a non-finite gradient (and restart
        its count), double it after ``GROWTH_INTERVAL`` finite steps in a row; clients that
        took no step (``stepped`` False) keep theirs."""
        count = self.good + 1
        grow = count >= GROWTH_INTERVAL
        grown = torch.where(grow, self.scale * GROWTH_FACTOR, self.scale)
        scale = torch.where(finite, grown, self.scale * BACKOFF_FACTOR)
        good = torch.where(finite & ~grow, count, torch.zeros_like(count))
        if stepped is not None:
            scale = torch.where(stepped, scale, self.scale)
            good = torch.where(stepped, good, self.good)
        self.scale, self.good = scale, good
