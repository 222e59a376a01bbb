"""A detection objective under the vectorized executor: the CenterNet loss of each client's
padded batch (``Detection.masked_loss``), replayed targets and dense output maps, against
the sequential executor. Small synthetic frames, so it needs no shared data.

Why plain SGD and two rounds: the engine's runs of a detector use Adam from scratch, and
Adam turns a rounding-sized gradient (a parameter whose true gradient is ~0) into a full
step of random sign, so two correct executors drift apart over rounds; with SGD the first
rounds agree to float rounding (on the real CARLA frames: 8.7e-8 relative in the first
round's loss, measured with ``--optimizer sgd``).
"""

from __future__ import annotations

import pytest
import torch

from cfl_bench.carla_bridge.detection import Detection, pack_targets
from cfl_bench.carla_bridge.detector import build_detector
from cfl_bench.core.buffer import ReservoirBuffer
from cfl_bench.core.context import Broadcast, ClientState
from cfl_bench.core.flat import FlatModel
from cfl_bench.engine.buffer_stack import ReservoirStack
from cfl_bench.engine.client_update import ClientJob, ClientResult, LocalTrainer, StepSchedule
from cfl_bench.engine.executor import SequentialExecutor
from cfl_bench.engine.optim import FlatSGD
from cfl_bench.engine.vectorized import VectorizedExecutor
from cfl_bench.strategies.compose import build_strategy
from tests.helpers import env
from tests.test_vectorized import one_thread  # noqa: F401 - the fixture

CPU = torch.device("cpu")
SHAPE = (3, 32, 48)
CLASSES = 2
OBJECTIVE = Detection(num_classes=CLASSES)


def frames(count: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``count`` random frames, each with one to three random boxes of random classes."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(count, *SHAPE, generator=gen)
    boxes, labels = [], []
    for _ in range(count):
        n = int(torch.randint(1, 4, (1,), generator=gen))
        corner = torch.rand(n, 2, generator=gen) * torch.tensor([30.0, 18.0])
        size = 4 + torch.rand(n, 2, generator=gen) * 12
        boxes.append(torch.cat([corner, corner + size], dim=1))
        labels.append(torch.randint(0, CLASSES, (n,), generator=gen))
    return x, pack_targets(boxes, labels, max_boxes=4)


def clients(stacked: bool) -> list[ClientState]:
    """Two vehicles with unequal data (7 and 4 frames: padded last batches) and 6-frame
    buffers of dense output maps."""
    out_shape = OBJECTIVE.output_shape(SHAPE)
    made = []
    for k, count in enumerate((7, 4)):
        buffer = ReservoirBuffer(
            6,
            SHAPE,
            out_shape,
            device=CPU,
            generator=torch.Generator().manual_seed(100 + k),
            target_shape=OBJECTIVE.target_shape(4),
            target_dtype=torch.float32,
        )
        state = ClientState(k, torch.Generator().manual_seed(k), buffer)
        state.train_x, state.train_y = frames(count, seed=k)
        made.append(state)
    if stacked:
        ReservoirStack([c.buffer for c in made if c.buffer is not None])
    return made


def train(vectorized: bool, strategy_text: str) -> list[torch.Tensor]:
    """Two rounds of ``strategy_text`` on both vehicles; the uploaded parameters per round."""
    torch.manual_seed(0)
    model = FlatModel(build_detector(SHAPE, CLASSES))
    strategy = build_strategy(strategy_text)
    strategy.setup(env(batch_size=4, input_shape=SHAPE))
    for c in strategy.all:
        c.objective = OBJECTIVE
    optimizer = FlatSGD(model.params, model.grads, 0.05, 0.0, 0.0)
    steps = StepSchedule(epochs=2, batch_size=4, buffer_batch_size=3, buffer_offer="first_pass",
                         replay_augment=False)  # fmt: skip
    trainer = LocalTrainer(model, optimizer, strategy, steps, None, OBJECTIVE)
    executor = VectorizedExecutor(trainer) if vectorized else SequentialExecutor(trainer)
    vehicles = clients(stacked=vectorized)
    params, uploads = model.params.detach().clone(), []
    for r in (1, 2):
        sent = Broadcast(params, model.buffers.clone(), r, {}, r, 0, False, CPU)
        rows: list[torch.Tensor] = []

        def keep(result: ClientResult, rows: list[torch.Tensor] = rows) -> None:
            rows.append(result.upload.params.detach().clone())  # valid during the call only

        executor.train([ClientJob(c, sent) for c in vehicles], keep)
        uploads.append(torch.stack(rows))
        params = uploads[-1].mean(dim=0)
    return uploads


def gaps(strategy_text: str) -> list[float]:
    """Per round, the largest parameter difference between the executors, relative."""
    pairs = zip(train(False, strategy_text), train(True, strategy_text), strict=True)
    return [float((one - two).abs().max() / one.abs().max()) for one, two in pairs]


def test_a_detection_stream_trains_vectorized_as_sequentially() -> None:
    # ER replays stored targets: the objective's masked loss on the padded replay rows,
    # FedProx's penalty on top. Measured: ~1e-7.
    assert max(gaps("er+fedprox:mu=0.1")) < 1e-5


def test_der_on_dense_maps_runs_vectorized() -> None:
    # DER replays the dense maps a forward stored one step earlier, so the term's gradient
    # f(x) − z is a difference of near-equal maps, and the last bits of z (the vectorized
    # forward takes batch and replay rows in one convolution, the sequential one the batch
    # alone) are a large part of it: a step whose replay stored rows under the other
    # rounding moves θ apart by 3e-5 (measured; earlier steps agree to 5e-8), and the
    # rounds amplify it (round 1: 2.7e-4, round 2: 1.5e-2). Equal in law, not bit for bit.
    first, _ = gaps("der:alpha=0.5")
    assert first < 1e-3


def test_the_masked_detection_loss_ignores_padding_exactly() -> None:
    # The loss of 3 real frames padded with 2 rows of junk equals the loss of the 3 frames.
    torch.manual_seed(1)
    _, y = frames(5, seed=3)
    outputs = torch.randn(5, *OBJECTIVE.output_shape(SHAPE))
    mask = torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0])
    masked = OBJECTIVE.masked_loss(outputs, y, mask)
    assert masked.item() == pytest.approx(OBJECTIVE.loss(outputs[:3], y[:3]).item(), rel=1e-6)
    assert torch.equal(OBJECTIVE.masked_loss(outputs, y, None), OBJECTIVE.loss(outputs, y))
