"""Reference (b) of bench/throughput.py: the bare compute loop.

The same model, batch size and number of forward/backward passes per step on tensors already
in memory — nothing else: no partitioning, no buffer bookkeeping, no projection, no
aggregation, no evaluation. On CPU this is the ceiling the engine is measured against.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


def run_bare_loop(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    client_sizes: list[int],
    rounds: int,
    batch_size: int,
    lr: float,
    replay_forward: bool,
    seed: int,
) -> int:
    """Same step count as the engine (per client, per round, one epoch); returns samples."""
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    replay_x = x[:batch_size]
    replay_z = torch.zeros(batch_size, 10)
    model.train()
    processed = 0
    for _ in range(rounds):
        offset = 0
        for n in client_sizes:
            order = torch.randperm(n, generator=gen) + offset
            for start in range(0, n, batch_size):
                batch = order[start : start + batch_size]
                opt.zero_grad()
                loss = F.cross_entropy(model(x[batch]), y[batch])
                if replay_forward:
                    loss = loss + F.mse_loss(model(replay_x), replay_z)
                loss.backward()
                opt.step()
                processed += batch.numel()
            offset += n
    return processed
