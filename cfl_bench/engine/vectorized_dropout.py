"""Dropout under the vectorized executor: each client's masks drawn as the sequential
executor draws them, applied inside the vmapped forward.

The sequential executor reseeds torch's default generator per client update
(``seed_torch_default(seed, "dropout", round, client)`` in ``LocalTrainer.start``) and per
gradient request ("dropout-request"), and every training-mode forward draws its masks
from it, layer after layer. On CPU a dropout call in training is ATen's ``_dropout_impl``:

    noise = empty(shape of the input, or (N, C, 1, …) for feature dropout)
    noise.bernoulli_(1 − p);  noise.div_(1 − p);  output = input · noise

(p = 0 returns the input and p = 1 multiplies by 0, neither drawing). A mask drawn with the
same shape, dtype and generator state is therefore bit-identical, so the executor

- learns the model's dropout calls once per input shape (``probe``: a forward of one
  example under a ``TorchFunctionMode`` that records each call's kind, p and per-example
  noise shape and returns its input unchanged, drawing nothing);
- keeps each client's generator state (``ClientRngs``: captured after the client's
  ``LocalTrainer.start``, restored before and saved after each of its draws, client by
  client as the replay draws are);
- draws each stepping client's masks in the sequential order of its forwards (the batch,
  then each replay term, A-GEM's reference, FedProj's memory batch), each with the
  client's real row count, padded with zero rows (``draw_masks``);
- replaces every dropout call of the vmapped forward by ``input · mask_i``, the masks
  being vmapped inputs consumed in call order (``apply_masks``); a call with
  ``training=False`` (eval mode) consumes none.

On CUDA the sequential executor's dropout is the fused ``native_dropout`` kernel, whose
masks come from the same generator but not in ``bernoulli_``'s order: there the vectorized
masks are drawn the same way from the client's CUDA generator state, equal in distribution
to the sequential ones but not bit for bit (results differ as with two seeds).

Under ``--amp`` a mask is cast to its dropout input's autocast dtype, as the sequential
noise is drawn in it (the same 0/1 draws where ``bernoulli_`` fills every dtype alike, as
MKL's CPU kernel does; the --amp tolerance applies anyway).

Refused (``probe``): alpha dropout (a different affine formula) and feature dropout on an
input without a batch dimension (the noise shape would not be per example).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch
from torch.nn import functional as F
from torch.overrides import TorchFunctionMode

from cfl_bench.core.errors import UserError
from cfl_bench.engine.vectorized_replay import ReplayBatch

# Dropout entry points by kind, and the input rank feature dropout needs (batch, channels
# and the spatial dimensions; 0: any rank ≥ 2).
ELEMENTWISE = (F.dropout, torch.dropout)
FEATURE_RANK: dict[Callable[..., object], int] = {
    F.dropout1d: 3,
    F.dropout2d: 4,
    F.dropout3d: 5,
    torch.feature_dropout: 0,
}
ALPHA = (F.alpha_dropout, F.feature_alpha_dropout, torch.alpha_dropout)


@dataclass(frozen=True)
class DropoutLayer:
    """One dropout call of the model's forward: drop probability ``p`` and the noise shape
    of one example (the input's for elementwise dropout, (C, 1, …) for feature dropout)."""

    p: float
    shape: tuple[int, ...]

    def draw(self, rows: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """The noise of ``rows`` examples as ``_dropout_impl`` draws it from the default
        generator (p = 1: zeros, nothing drawn)."""
        if self.p >= 1:
            return torch.zeros((rows, *self.shape), dtype=dtype, device=device)
        noise = torch.empty((rows, *self.shape), dtype=dtype, device=device)
        noise.bernoulli_(1 - self.p)
        return noise.div_(1 - self.p)


@dataclass(frozen=True)
class DropoutCall:
    """A dropout call's input, p, whether it draws (training, 0 < p, non-empty) and its
    per-example noise shape."""

    input: torch.Tensor
    p: float
    active: bool
    shape: tuple[int, ...]


def dropout_call(func: Callable[..., object], args: tuple, kwargs: dict) -> DropoutCall | None:
    """``func(*args, **kwargs)`` read as a dropout call; None when ``func`` is no dropout."""
    if func in ALPHA:
        raise UserError(
            "the vectorized executor does not reproduce alpha dropout (its affine noise is "
            "not a multiplicative mask); use --executor sequential."
        )
    rank = FEATURE_RANK.get(func)
    if rank is None and func not in ELEMENTWISE:
        return None
    names = ("input", "p", "training")
    values = dict(zip(names, args, strict=False))
    values.update({k if k != "train" else "training": v for k, v in kwargs.items()})
    x = values["input"]
    p, training = float(values.get("p", 0.5)), bool(values.get("training", True))
    if rank is None:
        shape = tuple(x.shape[1:])
    else:
        if x.dim() < 2 or (rank and x.dim() != rank):
            raise UserError(
                "the vectorized executor reproduces feature dropout on batched inputs only "
                f"(a {x.dim()}-d input has no per-example channel mask); use --executor "
                "sequential."
            )
        shape = (int(x.shape[1]), *([1] * (x.dim() - 2)))
    return DropoutCall(x, p, training and p > 0 and x.numel() > 0, shape)


class _Recorder(TorchFunctionMode):
    """Records the active dropout calls of a forward of ``rows`` examples; every dropout
    returns its input."""

    def __init__(self, rows: int) -> None:
        super().__init__()
        self.rows = rows
        self.layers: list[DropoutLayer] = []
        self.seen = False

    def __torch_function__(self, func, types, args=(), kwargs=None):
        call = dropout_call(func, args, kwargs or {})
        if call is None:
            return func(*args, **(kwargs or {}))
        self.seen = True
        if call.active and (call.input.dim() == 0 or call.input.shape[0] != self.rows):
            raise UserError(
                "the vectorized executor reproduces dropout on per-example activations only "
                "(this model drops a tensor without the batch's rows, e.g. a weight); use "
                "--executor sequential."
            )
        if call.active:
            self.layers.append(DropoutLayer(call.p, call.shape))
        return call.input


def probe(
    forward: Callable[[torch.Tensor], object], example: torch.Tensor
) -> tuple[DropoutLayer, ...] | None:
    """The dropout calls ``forward`` makes on ``example`` (a batch of two: a dropped tensor
    whose first dimension is not the batch's is refused), in call order; None when it calls
    no dropout at all (then the vmapped forward needs no interception). Draws nothing from
    any generator."""
    recorder = _Recorder(int(example.shape[0]))
    with torch.no_grad(), recorder:
        forward(example)
    return tuple(recorder.layers) if recorder.seen else None


class _Masks(TorchFunctionMode):
    """Replaces each active dropout call by ``input · mask`` with the next of ``masks``."""

    def __init__(self, masks: Sequence[torch.Tensor]) -> None:
        super().__init__()
        self.masks = masks
        self.used = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        call = dropout_call(func, args, kwargs or {})
        if call is None:
            return func(*args, **(kwargs or {}))
        if not call.active:
            return call.input
        if self.used >= len(self.masks):
            raise RuntimeError("the forward made more dropout calls than its probe")
        mask = self.masks[self.used]
        self.used += 1
        if call.input.shape[0] != mask.shape[0]:
            raise RuntimeError("a dropout mask's rows differ from its forward's")
        return call.input * mask.to(call.input.dtype)  # under --amp: the autocast dtype


@contextlib.contextmanager
def apply_masks(masks: Sequence[torch.Tensor]) -> Iterator[None]:
    """Inside: every active dropout call multiplies by the next of ``masks`` (one per probed
    layer, rows matching the forward's); all must be used."""
    mode = _Masks(masks)
    with mode:
        yield
    if mode.used != len(masks):
        raise RuntimeError("the forward made fewer dropout calls than its probe")


def draw_masks(
    layers: Sequence[DropoutLayer],
    segments: Sequence[tuple[int, int]],
    dtype: torch.dtype,
    device: torch.device,
) -> list[torch.Tensor]:
    """One client's masks for one (concatenated) forward, per layer (Σ padded, *shape):
    ``segments`` are the (real, padded) row counts of the sequential forwards it joins, in
    their order; each segment's real rows are drawn layer by layer (as its own forward
    draws them), its padded rows are zero. A segment with no real rows draws nothing (the
    sequential step makes no such forward)."""
    per_segment = []
    for real, padded in segments:
        masks = []
        for layer in layers:
            mask = torch.zeros((padded, *layer.shape), dtype=dtype, device=device)
            if real:
                mask[:real] = layer.draw(real, dtype, device)
            masks.append(mask)
        per_segment.append(masks)
    return [torch.cat([seg[i] for seg in per_segment]) for i in range(len(layers))]


class ClientRngs:
    """Each client's torch default-generator state (CPU, plus the device's on CUDA),
    switched in around that client's draws."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device if device.type == "cuda" else None
        self.states: list[tuple[torch.Tensor, torch.Tensor | None]] = []

    def _current(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        cuda = None if self.cuda is None else torch.cuda.get_rng_state(self.cuda)
        return torch.get_rng_state(), cuda

    def capture(self) -> None:
        """Keep the current state as the next client's (after its ``LocalTrainer.start``)."""
        self.states.append(self._current())

    def restore(self, index: int) -> None:
        """Make client ``index``'s state the default generators' state."""
        cpu, cuda = self.states[index]
        torch.set_rng_state(cpu)
        if cuda is not None and self.cuda is not None:
            torch.cuda.set_rng_state(cuda, self.cuda)

    @contextlib.contextmanager
    def client(self, index: int) -> Iterator[None]:
        """Inside: the default generators hold client ``index``'s state; saved on exit."""
        self.restore(index)
        yield
        self.states[index] = self._current()


def stack_masks(
    layers: Sequence[DropoutLayer],
    per_client: Sequence[list[torch.Tensor] | None],
    rows: int,
    dtype: torch.dtype,
    device: torch.device,
) -> tuple[torch.Tensor, ...]:
    """Per layer, the clients' masks stacked (C, rows, *shape), each padded with zero rows
    to ``rows``; a client with None (no step, or nothing to forward) gets zeros."""
    stacked = []
    for i, layer in enumerate(layers):
        out = torch.zeros((len(per_client), rows, *layer.shape), dtype=dtype, device=device)
        for k, masks in enumerate(per_client):
            if masks is not None:
                out[k, : masks[i].shape[0]] = masks[i]
        stacked.append(out)
    return tuple(stacked)


# The dropout calls of one forward on inputs of a per-example shape (None: no dropout).
Layers = Callable[[Sequence[int]], "tuple[DropoutLayer, ...] | None"]


class ChunkDropout:
    """A chunk's dropout draws: each client's generator state (``rngs``, in chunk order)
    and the stacked masks of one vmapped forward."""

    def __init__(self, layers: Layers, dtype: torch.dtype, device: torch.device) -> None:
        self.layers, self.dtype, self.device = layers, dtype, device
        self.rngs = ClientRngs(device)

    def masks(
        self,
        shape: Sequence[int],
        layout: Sequence[int],
        real: Sequence[Sequence[int] | None],
    ) -> tuple[torch.Tensor, ...] | None:
        """The masks of one forward joining len(``layout``) sequential forwards of
        ``layout[j]`` padded rows each (inputs of per-example ``shape``): client k draws
        ``real[k][j]`` rows for forward j from its own state, in order (None: no step)."""
        layers = self.layers(shape)
        if layers is None:
            return None
        per_client: list[list[torch.Tensor] | None] = []
        for k, rows in enumerate(real):
            if rows is None or not any(rows):
                per_client.append(None)
                continue
            with self.rngs.client(k):
                segments = list(zip(rows, layout, strict=True))
                per_client.append(draw_masks(layers, segments, self.dtype, self.device))
        return stack_masks(layers, per_client, sum(layout), self.dtype, self.device)

    def step_masks(
        self, x: torch.Tensor, counts: Sequence[int | None], replay: ReplayBatch | None
    ) -> tuple[torch.Tensor, ...] | None:
        """The masks of a lock-step's forward (None: no dropout) of the padded batch ``x``
        (C, b, …), client k's ``counts[k]`` real rows (None: no step), then (``replay``)
        each term's real rows, as the sequential forwards of the batch and of each replay
        term draw them. Row counts come from the host: no device read."""
        if self.layers(x.shape[2:]) is None:
            return None
        layout = [x.shape[1]]
        real: list[list[int] | None] = [None if c is None else [c] for c in counts]
        if replay is not None:
            terms = replay.x.shape[1]
            layout += [replay.x.shape[2]] * terms
            real = [None if r is None else r + [replay.rows[k]] * terms for k, r in enumerate(real)]
        return self.masks(x.shape[2:], layout, real)

    def forward_masks(
        self, x: torch.Tensor, rows: Sequence[int]
    ) -> tuple[torch.Tensor, ...] | None:
        """The masks of one more forward of ``x`` (C, m, …) with ``rows[k]`` real rows of
        client k (0: it makes no forward and draws nothing; A-GEM's reference draw)."""
        if self.layers(x.shape[2:]) is None:
            return None
        return self.masks(x.shape[2:], [x.shape[1]], [[r] for r in rows])

    def with_masks(
        self, loss_gradients: Callable[..., torch.Tensor], stepping: Sequence[object | None]
    ) -> Callable[..., torch.Tensor]:
        """``loss_gradients`` (``ClientGradients.loss_gradients``) with the masks of its
        forward drawn for the ``stepping`` clients (None: no step), every row real
        (FedProj's memory batch)."""

        def gradients(
            loss: Callable[..., torch.Tensor], params: torch.Tensor, x: torch.Tensor, *rest: object
        ) -> torch.Tensor:
            real = [None if c is None else [x.shape[1]] for c in stepping]
            masks = self.masks(x.shape[2:], [x.shape[1]], real)
            return loss_gradients(loss, params, x, *rest, masks=masks)

        return gradients
