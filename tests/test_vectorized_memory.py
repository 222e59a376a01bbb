"""Automatic chunks of the vectorized executor (``engine.vectorized_memory``): sizes from
the measured peak per client and the available memory; chunks chosen that way equal
unchunked training. The device memory is a stand-in here (no CUDA device in CI): it reports
the numbers a CUDA allocator would, and ``CudaMemory`` beside it is the real path."""

from __future__ import annotations

import torch

from cfl_bench.engine.vectorized import VectorizedExecutor
from cfl_bench.engine.vectorized_memory import PROBE_CLIENTS, ChunkPlanner, planner_for
from cfl_bench.streams.partition import DirichletPartitioner
from tests.helpers import digits_federation
from tests.test_vectorized import assert_same, one_thread  # noqa: F401 - the fixture

MIB = 2**20


class StandInMemory:
    """A stand-in for ``CudaMemory``: each chunk peaks at ``per_client`` bytes per client
    trained (told by the test), and ``free`` bytes are available."""

    def __init__(self, per_client: int, free: int) -> None:
        self.per_client, self.free, self.clients = per_client, free, 0
        self.starts = 0

    def start(self) -> None:
        self.starts += 1

    def peak_since_start(self) -> int:
        return self.per_client * self.clients

    def available(self) -> int:
        return self.free


def test_first_chunk_probes_then_chunks_fit_the_headroom() -> None:
    memory = StandInMemory(per_client=10 * MIB, free=1000 * MIB)
    planner = ChunkPlanner(None, memory)
    assert planner.next_size(100) == PROBE_CLIENTS == 16  # nothing measured yet
    memory.clients = 16
    planner.record(16)
    assert planner.per_client_bytes == 10 * MIB
    assert planner.next_size(84) == 80  # floor(0.8 · 1000 MiB / 10 MiB) = 80 of 84 left
    assert planner.next_size(50) == 50
    memory.free = 5 * MIB
    assert planner.next_size(50) == 1  # never less than one client
    memory.per_client, memory.clients = 20 * MIB, 4
    planner.record(4)
    assert planner.per_client_bytes == 20 * MIB  # the largest peak seen is kept


def test_fixed_chunks_and_the_cpu_take_no_measurement() -> None:
    assert ChunkPlanner(7, None).next_size(20) == 7
    assert ChunkPlanner(7, None).next_size(3) == 3
    cpu = planner_for(torch.device("cpu"), None)
    assert cpu.memory is None and cpu.next_size(1000) == 1000  # all at once
    cpu.start()
    cpu.record(1000)
    assert cpu.per_client_bytes == 0


def test_memory_sized_chunks_equal_unchunked_training() -> None:
    # 5 clients, a planner that has already measured 1 MiB per client (a probe chunk of 16
    # would take all 5), 2.6 MiB free → floor(0.8 · 2.6) = 2: chunks of 2, 2 and 1 in every
    # round, and FedGP-free DER's buffers inserted chunk by chunk.
    kw = dict(partitioner=DirichletPartitioner(0.1, 2), num_clients=5, batch_size=16)
    whole = digits_federation("der", executor="vectorized", **kw)  # type: ignore[arg-type]
    fitted = digits_federation("der", executor="vectorized", **kw)  # type: ignore[arg-type]
    executor = fitted.executor
    assert isinstance(executor, VectorizedExecutor)
    memory = StandInMemory(per_client=MIB, free=int(2.6 * MIB))
    executor.chunks = ChunkPlanner(None, memory, per_client_bytes=MIB)
    sizes: list[int] = []
    train_chunk = executor._train_chunk

    def recording(jobs, sink):  # type: ignore[no-untyped-def]
        sizes.append(len(jobs))
        memory.clients = len(jobs)
        train_chunk(jobs, sink)

    executor._train_chunk = recording  # type: ignore[method-assign]
    assert_same(whole, whole.run(), fitted, fitted.run())
    assert sizes[:3] == [2, 2, 1] and set(sizes) == {1, 2}
    assert memory.starts == len(sizes)
