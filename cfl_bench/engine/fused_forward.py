"""One forward for a local step's batch and its replay draws: the sequential executor's
fast path for models whose layers never mix examples.

Why: a replay learner's step forwards the batch, then each replay term's draw (Mammoth's
order, ``engine.one_client.plan_loss``), so DER on the FedGP MNIST CNN makes two forwards
of 32 rows and backs through both. On one CPU core a forward of the 64 rows together costs
less than the two (``bench/official_speed.py``; the numbers are in docs/executors.md). The
vectorized executor joins the same forwards for its own reasons (``engine.vectorized_grad``).

The joined forward must give what the separate ones give:

- **the same random draws, in the same order.** Each part's dropout masks are drawn from
  torch's default generator part by part and, within a part, layer by layer — exactly the
  draws the part's own forward makes — then applied in the joined forward
  (``engine.vectorized_dropout``: ``probe`` learns the model's dropout calls once,
  ``DropoutLayer.draw`` draws, ``apply_masks`` multiplies). The masks are bit-identical on
  CPU, where dropout is ATen's ``_dropout_impl``; CUDA's fused dropout kernel draws in
  another order, so the plan fuses on CPU only.
- **rows that do not see each other.** Only models whose layers treat each example alone
  in training mode may fuse (no BatchNorm): ``PER_EXAMPLE_MODELS`` in the model catalogue,
  decided by the run's plan (``StepSchedule.fused_forwards``).

Each part's outputs are then those of its own forward to rounding: bit for bit where the
kernels sum a row the same way whatever the row count (two parts of 32 through the MNIST CNN
here), otherwise within float rounding; the gradient's sums over the rows run in one
reduction instead of one per part (``tests/test_fused_forward.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from cfl_bench.core.errors import UserError
from cfl_bench.engine.vectorized_dropout import DropoutLayer, apply_masks, probe


def separate_forwards(module: nn.Module, parts: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """The parts' outputs, one forward each, in order (what fusing must equal)."""
    return [module(part) for part in parts]


@dataclass
class FusedForward:
    """``module``'s outputs on several parts from one forward of their rows joined, with
    each part's dropout masks drawn as its own forward would draw them."""

    module: nn.Module
    # The model's dropout calls, learned on first use (None: it calls no dropout).
    layers: tuple[DropoutLayer, ...] | None = field(default=None, init=False)
    probed: bool = field(default=False, init=False)
    # False once the probe found dropout it cannot reproduce: then parts go one by one.
    usable: bool = field(default=True, init=False)

    def __call__(self, parts: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        if len(parts) < 2 or not self.module.training or not self.ready(parts[0]):
            return separate_forwards(self.module, parts)
        rows = [int(part.shape[0]) for part in parts]
        joined = torch.cat(list(parts))
        if self.layers is None:
            return list(self.module(joined).split(rows))
        with apply_masks(self.draw(rows, joined)):
            outputs = self.module(joined)
        return list(outputs.split(rows))

    def draw(self, rows: list[int], joined: torch.Tensor) -> list[torch.Tensor]:
        """Per dropout layer, the parts' masks joined: part by part, layer by layer, as
        the parts' own forwards draw them (``DropoutLayer.draw``), in the activations'
        dtype (float32: fusing runs without --amp) whatever the inputs are."""
        assert self.layers is not None
        dtype = joined.dtype if joined.is_floating_point() else torch.get_default_dtype()
        drawn = [[layer.draw(r, dtype, joined.device) for layer in self.layers] for r in rows]
        return [torch.cat([part[i] for part in drawn]) for i in range(len(self.layers))]

    def ready(self, example: torch.Tensor) -> bool:
        """Probe the model's dropout calls once (drawing nothing); whether fusing is usable."""
        if not self.probed:
            self.probed = True
            try:
                self.layers = probe(self.module, example[:2])
            except UserError:  # dropout on something other than the rows (or alpha dropout)
                self.usable = False
        return self.usable
