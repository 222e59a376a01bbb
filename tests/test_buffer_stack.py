"""The stacked reservoir (``cfl_bench.engine.buffer_stack``): one batched insert over clients equals
each client's own ``ReservoirBuffer.add`` on the same generator draws; batched draws equal
``ReservoirBuffer.sample``; the per-client buffers stay usable as views."""

from __future__ import annotations

import torch

from cfl_bench.core.buffer import ReservoirBuffer
from cfl_bench.engine.buffer_stack import ReservoirStack
from cfl_bench.engine.checkpoint import pack


def buffers(count: int, capacity: int) -> list[ReservoirBuffer]:
    """``count`` empty buffers of 2×3 inputs and 4 outputs, buffer k seeded 100 + k."""
    made = []
    for k in range(count):
        gen = torch.Generator().manual_seed(100 + k)
        made.append(ReservoirBuffer(capacity, (2, 3), 4, device=torch.device("cpu"), generator=gen))
    return made


def batch(seed: int, clients: int, width: int) -> tuple[torch.Tensor, ...]:
    """Random (x, y, logits) for ``clients`` × ``width`` examples."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(clients, width, 2, 3, generator=gen)
    y = torch.randint(0, 10, (clients, width), generator=gen)
    return x, y, torch.randn(clients, width, 4, generator=gen)


def test_batched_insert_equals_per_client_inserts_on_the_same_draws() -> None:
    # Capacity 5, offers of unequal sizes (client 2 offers nothing at some steps): the first
    # offers fill the buffers, later ones go through algorithm R; batches of 7 > capacity
    # make two examples of one batch pick the same slot (the later one must win) often.
    alone, stacked = buffers(4, 5), buffers(4, 5)
    stack = ReservoirStack(stacked)
    plans = [[3, 7, 0, 2], [7, 1, 7, 7], [2, 7, 0, 5], [7, 7, 7, 1], [1, 0, 7, 7]]
    for step, counts in enumerate(plans):
        x, y, logits = batch(step, 4, 7)
        tasks = [step % 2] * 4
        for k, n in enumerate(counts):
            if n:
                alone[k].add(x[k, :n], y[k, :n], logits[k, :n], tasks[k])
        chosen = [k for k, n in enumerate(counts) if n]
        stack.add(
            [stacked[k] for k in chosen],
            [counts[k] for k in chosen],
            x[chosen],
            y[chosen],
            logits[chosen],
            [tasks[k] for k in chosen],
        )
    for one, two in zip(alone, stacked, strict=True):
        assert one.num_seen == two.num_seen
        m = one.capacity
        for name in ("x", "y", "logits", "task"):
            assert torch.equal(getattr(one, name)[:m], getattr(two, name)[:m]), name
        assert torch.equal(one.generator.get_state(), two.generator.get_state())
    assert stacked[1].num_seen == 22 and set(stacked[1].task.tolist()) == {0, 1}


def test_draws_equal_sample_and_the_views_share_the_storage() -> None:
    alone, stacked = buffers(3, 4), buffers(3, 4)
    x, y, logits = batch(0, 3, 6)
    for k, n in enumerate([6, 2, 0]):  # full (replaced), half full, empty
        if n:
            alone[k].add(x[k, :n], y[k, :n], logits[k, :n], 1)
            stacked[k].add(x[k, :n], y[k, :n], logits[k, :n], 1)  # before stacking: adopted
    stack = ReservoirStack(stacked)
    index, mask = stack.draw_index([*stacked, None], draws=2, size=3)
    assert mask.sum(dim=2).tolist() == [[3, 3], [2, 2], [0, 0], [0, 0]]
    for k in (0, 1):
        for d in range(2):
            reference = alone[k].sample(3)
            assert reference is not None
            rows = reference.y.shape[0]
            assert torch.equal(stack.gather("x", index[k, d, :rows]), reference.x)
            assert torch.equal(stack.gather("y", index[k, d, :rows]), reference.y)
    # The buffers are views of the stack: a write through one is seen in the stack.
    stacked[2].append(x[2, :1], y[2, :1], logits[2, :1], 3)
    assert stack.task[2, 0].item() == 3 and stack.x.data_ptr() == stacked[0].x.data_ptr()


def test_a_checkpoint_of_a_stacked_buffer_holds_its_row_only() -> None:
    stacked = buffers(50, 4)
    ReservoirStack(stacked)
    packed = pack(stacked[7].state_dict())
    saved = packed["x"]
    assert isinstance(saved, torch.Tensor)
    assert saved.untyped_storage().nbytes() == 5 * 2 * 3 * 4  # 5 rows of 2×3 float32


def test_host_values_become_device_tensors_of_the_asked_type() -> None:
    from cfl_bench.engine.host_values import device_tensor

    ints = device_tensor([3, 1, 2], torch.device("cpu"))
    assert ints.dtype == torch.long and ints.tolist() == [3, 1, 2]
    flags = device_tensor([True, False], torch.device("cpu"))
    assert flags.dtype == torch.bool
    halves = device_tensor([1, 2], torch.device("cpu"), torch.float64)
    assert halves.dtype == torch.float64 and halves.tolist() == [1.0, 2.0]
