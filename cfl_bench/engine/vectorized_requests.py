"""Gradient requests under the vectorized executor: FedGP's reference gradients g_ref_k of
every requested client in one vmapped backward per chunk.

A request that declares ``gradient_data`` (``core.payloads.ClientRequest``: the examples
whose mean-loss gradient it asks for, FedGP's buffer draws) is answered by drawing each
requested client's examples in request order (its own generators, as sequentially),
padding them with a row mask (``gref_samples=all`` on unequal buffers) and taking every
gradient at θ_g at once, in the request's model mode; other requests go to the sequential
executor.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from cfl_bench.core.context import ClientState
from cfl_bench.core.payloads import ClientRequest
from cfl_bench.core.seeding import seed_torch_default
from cfl_bench.engine.client_update import LocalTrainer
from cfl_bench.engine.executor import AnswerSink, SequentialExecutor
from cfl_bench.engine.vectorized_dropout import draw_masks, stack_masks
from cfl_bench.engine.vectorized_grad import ClientGradients
from cfl_bench.engine.vectorized_memory import ChunkPlanner


def pad_examples(
    examples: Sequence[tuple[torch.Tensor, torch.Tensor]],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Clients' (inputs, labels) padded to the longest: (C, m, …), (C, m) and the row mask."""
    x0, y0 = examples[0]
    count, rows = len(examples), max(y.shape[0] for _, y in examples)
    x = x0.new_zeros((count, rows, *x0.shape[1:]))
    y = y0.new_zeros((count, rows, *y0.shape[1:]))
    mask = torch.zeros(count, rows, dtype=x0.dtype, device=x0.device)
    for i, (xi, yi) in enumerate(examples):
        x[i, : yi.shape[0]], y[i, : yi.shape[0]], mask[i, : yi.shape[0]] = xi, yi, 1
    return x, y, mask


class BatchedRequests:
    """The vectorized executor's answers to the server's client requests."""

    def __init__(
        self,
        trainer: LocalTrainer,
        grads: ClientGradients,
        chunks: ChunkPlanner,
        sequential: SequentialExecutor,
    ) -> None:
        self.trainer, self.grads, self.chunks, self.sequential = trainer, grads, chunks, sequential

    def answer(
        self,
        request: ClientRequest,
        global_state: tuple[torch.Tensor, torch.Tensor],
        sink: AnswerSink,
    ) -> None:
        """A gradient request (``ClientRequest.gradient_data``: FedGP's g_ref_k) in one
        vmapped backward per chunk: each client's examples drawn in request order (its own
        generators, as sequentially), padded with a row mask, every gradient taken at θ_g
        in the request's model mode; in training mode each client's dropout masks are
        drawn right after its examples from the default generator reseeded for it
        ("dropout-request"), as its sequential forward draws them. Any other request is
        the sequential executor's."""
        if request.gradient_data is None:
            self.sequential.answer(request, global_state, sink)
            return
        module = self.trainer.model.module
        module.train(request.train_mode)
        first = 0
        while first < len(request.clients):
            chunk = request.clients[
                first : first + self.chunks.next_size(len(request.clients) - first)
            ]
            first += len(chunk)
            x, y, mask, masks = self._request_examples(request, chunk)
            params = global_state[0].expand(len(chunk), -1)
            grads, _, _ = self.grads.gradients(params, x, y, mask, masks=masks)
            for client, row in zip(chunk, grads, strict=True):
                sink(client, row)
        module.train(True)
        self.trainer.model.load(*global_state)  # where the sequential answer leaves it

    def _request_examples(
        self, request: ClientRequest, chunk: Sequence[ClientState]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, tuple[torch.Tensor, ...] | None]:
        """The chunk's examples of ``request`` padded (inputs, labels, row mask) and their
        dropout masks (None: no dropout in the module's mode), each client's drawn after
        reseeding torch's default generator for it (which is left as sequentially)."""
        assert request.gradient_data is not None
        params = self.trainer.model.params
        examples, drawn = [], []
        layers = None
        for client in chunk:
            seed = self.trainer.steps.seed
            seed_torch_default(seed, "dropout-request", request.round_index, client.index)
            xk, yk = request.gradient_data(client)
            examples.append((xk, yk))
            layers = self.grads.dropout_layers(xk.shape[1:])
            if layers is not None:
                segment = [(yk.shape[0], yk.shape[0])]
                drawn.append(draw_masks(layers, segment, params.dtype, params.device))
        x, y, mask = pad_examples(examples)
        if layers is None:
            return x, y, mask, None
        return x, y, mask, stack_masks(layers, drawn, x.shape[1], params.dtype, params.device)
