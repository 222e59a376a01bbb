"""Reservoir buffer: exact algorithm R semantics, inclusion probability M/n, sampling."""

from __future__ import annotations

import torch

from cfl_bench.core.buffer import ReservoirBuffer


def make(capacity: int, seed: int = 0) -> ReservoirBuffer:
    return ReservoirBuffer(
        capacity, (1,), 2, device=torch.device("cpu"), generator=torch.Generator().manual_seed(seed)
    )


def offer(buffer: ReservoirBuffer, start: int, count: int) -> None:
    ids = torch.arange(start, start + count)
    buffer.add(ids.float().view(-1, 1), ids, torch.zeros(count, 2), task=0)


def test_fills_in_order_until_capacity() -> None:
    buf = make(5)
    offer(buf, 0, 3)
    assert buf.filled == 3 and buf.num_seen == 3
    assert buf.y[:3].tolist() == [0, 1, 2]
    offer(buf, 3, 2)
    assert buf.y[:5].tolist() == [0, 1, 2, 3, 4]


def test_batch_insert_equals_sequential_algorithm_r() -> None:
    """Replaying the same uniform draws one by one gives the same buffer contents."""
    capacity, total, batch = 7, 200, 16
    buf = make(capacity, seed=3)
    draws = torch.Generator().manual_seed(3)  # same stream as the buffer's generator
    reference = [-1] * capacity
    seen = 0
    for start in range(0, total, batch):
        count = min(batch, total - start)
        u = torch.rand(count, dtype=torch.float64, generator=draws)
        for k in range(count):
            n = seen + k
            if n < capacity:
                reference[n] = start + k
            else:
                j = int(u[k].item() * (n + 1))
                if j < capacity:
                    reference[j] = start + k
        seen += count
        offer(buf, start, count)
    assert buf.y[:capacity].tolist() == reference


def test_inclusion_probability_is_m_over_n() -> None:
    """Each of n offered examples survives with probability M/n (fixed seeds, 2000 trials)."""
    capacity, total, trials = 10, 100, 2000
    hits = torch.zeros(total)
    for trial in range(trials):
        buf = make(capacity, seed=trial)
        for start in range(0, total, 32):
            offer(buf, start, min(32, total - start))
        hits[buf.y[:capacity]] += 1
    freq = hits / trials
    expected = capacity / total  # 0.1
    # binomial std = sqrt(0.1*0.9/2000) ≈ 0.0067; 5 sigma per example
    assert torch.all((freq - expected).abs() < 5 * (expected * (1 - expected) / trials) ** 0.5)
    # early and late examples are equally likely (no positional bias)
    assert abs(freq[:50].mean().item() - freq[50:].mean().item()) < 0.01


def test_sample_distinct_and_within_filled() -> None:
    buf = make(50)
    offer(buf, 0, 20)
    draw = buf.sample(32)
    assert draw is not None
    assert draw.y.numel() == 20  # m = min(m, filled)
    assert len(set(draw.y.tolist())) == 20
    assert make(4).sample(3) is None


def test_logits_and_task_are_stored_with_examples() -> None:
    buf = make(4)
    x = torch.arange(3).float().view(3, 1)
    logits = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    buf.add(x, torch.tensor([0, 1, 0]), logits, task=2)
    draw = buf.all()
    assert draw is not None
    assert torch.equal(draw.logits, logits) and draw.task.tolist() == [2, 2, 2]
    assert buf.nbytes == 4 * (1 * 4 + 8 + 2 * 4 + 8)
