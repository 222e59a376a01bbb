"""The decision-boundary pilot of FedProj's Fig. 1 (Chunduru, Morafah et al. 2025, §3).

The paper's observation: with non-IID clients, local training makes each client forget the
global decision boundary it received and learn only its own — whatever the initial weights,
even when training starts from a centrally trained, near-optimal model — while FedProj's
gradient projection against the public-data ensemble keeps it. This pilot shows it on Iris in
two PCA dimensions (``cfl_bench.pilot.iris``) and measures it (``cfl_bench.pilot.measure``).

Every strategy runs through the suite itself: ``strategies.compose.build_strategy`` builds it,
and the engine's ``Federation`` (loop, round server, client updates, sequential executor)
trains it on an in-memory stream. The only addition is ``RecordingExecutor``, an executor (the
engine's own protocol) that wraps the sequential one and copies, for each client update, the
global model it started from and the local model it uploads — what the pictures and the
forgetting number need — without changing any result.

Set-up (our choices; the paper's pilot code is not public — the authors' repository holds
only the image and text benchmarks — and its text names Iris, three clients and the two
initialisations but not the following): 3 clients, each dominated by one class (80 % of it),
15 public points withheld from all clients for every strategy (``fedproj:public=holdout``
reads them); a 2→16→3 tanh MLP; plain SGD (lr 0.05, batch 16), 10 local epochs, 5 rounds, full
participation, sample-weighted FedAvg. ``random``: the model as seeded; ``pretrained``: the
same model first trained centrally on all 150 points (full-batch Adam, lr 0.05, 500 steps),
then federated training starts from it. Components keep their own defaults.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from cfl_bench.core.context import ClientState
from cfl_bench.core.errors import UserError
from cfl_bench.core.flat import FlatModel
from cfl_bench.core.payloads import ClientRequest
from cfl_bench.core.seeding import derive_seed
from cfl_bench.engine.client_update import ClientJob, ClientResult, StepSchedule
from cfl_bench.engine.executor import Executor, ResultSink
from cfl_bench.engine.loop import Federation, Schedule
from cfl_bench.engine.splits import TaskSplit
from cfl_bench.pilot.iris import (
    DominantClassPartitioner,
    IrisPCAStream,
    IrisPoints,
    load_iris_pca,
    plan_pilot_split,
)
from cfl_bench.pilot.measure import Box, disagreement, grid_points, plot_box, predict_labels
from cfl_bench.pilot.strategy_list import check_strategies
from cfl_bench.strategies.base import ModelFacts, StrategyEnv
from cfl_bench.strategies.compose import Strategy, build_strategy

CPU = torch.device("cpu")
INITS = ("random", "pretrained")
NUM_CLIENTS = 3


@dataclass(frozen=True)
class PilotConfig:
    """Everything that decides the pilot's numbers (written to pilot.json)."""

    strategies: tuple[str, ...]
    rounds: int = 5
    seed: int = 0
    epochs: int = 10
    batch_size: int = 16
    lr: float = 0.05
    hidden: int = 16
    share: float = 0.8
    grid: int = 200
    margin: float = 0.1
    pretrain_steps: int = 500
    pretrain_lr: float = 0.05
    # Replay learners' buffers and the memory batch of FedProj's projection (all 15 public
    # points fit in one batch of 32).
    buffer_size: int = 64
    buffer_batch_size: int = 32


class PilotMLP(nn.Module):
    """in → hidden (tanh) → classes; ``representation``/``classify`` as the suite's models
    have them, so components that need features (MOON) run too."""

    def __init__(self, in_features: int, hidden: int, num_classes: int) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(in_features, hidden), nn.Tanh())
        self.head = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))

    def representation(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)

    def classify(self, z: torch.Tensor) -> torch.Tensor:
        return self.head(z)


# -- strategies ----------------------------------------------------------------------------------
@dataclass
class Prepared:
    """One strategy, built and set up for the pilot's stream, with its schedule."""

    text: str
    strategy: Strategy
    schedule: Schedule


def prepare_strategies(
    texts: Sequence[str], stream: IrisPCAStream, split: TaskSplit, config: PilotConfig
) -> list[Prepared]:
    """Build and set up every strategy before anything trains, so any refusal comes first."""
    check_strategies(list(texts))
    prepared: list[Prepared] = []
    held = 0 if split.held is None else int(split.held.numel())
    total = int(stream.train_labels(0).numel())
    for text in texts:
        strategy = build_strategy(text)
        strategy.setup(strategy_env(stream, config))
        asked = strategy.holdout_per_task(total)
        if asked not in (0, held):
            raise UserError(
                f"strategy {text!r} withholds {asked} public points but the pilot withholds "
                f"{held} from every client for every strategy (so all train on the same "
                f"data); drop its public_size option."
            )
        prepared.append(Prepared(text, strategy, schedule_for(strategy, config)))
    return prepared


def strategy_env(stream: IrisPCAStream, config: PilotConfig) -> StrategyEnv:
    return StrategyEnv(
        stream_name=stream.name,
        scenario=stream.scenario,
        num_classes=stream.num_classes,
        num_tasks=1,
        device=CPU,
        seed=config.seed,
        batch_size=config.batch_size,
        input_shape=tuple(stream.input_shape),
        data_root=None,
        public_images=None,
        objective=stream.objective,
        model=ModelFacts("pilot-mlp", frozenset({"features"})),
    )


def schedule_for(strategy: Strategy, config: PilotConfig) -> Schedule:
    """The engine's schedule, after the components' own adjustments (as ``run.py`` does)."""
    rounds, epochs = config.rounds, config.epochs
    for component in strategy.all:
        rounds, epochs = component.adjust_schedule(rounds, epochs)
    steps = StepSchedule(
        epochs=epochs,
        batch_size=config.batch_size,
        buffer_batch_size=config.buffer_batch_size,
        buffer_offer="first_pass",
        replay_augment=False,
        seed=config.seed,
    )
    return Schedule(
        num_tasks=1,
        rounds_per_task=rounds,
        num_clients=NUM_CLIENTS,
        participation=1.0,
        buffer_size=config.buffer_size,
        weighting="samples",
        lr=config.lr,
        momentum=0.0,
        weight_decay=0.0,
        probe_size=50,
        eval_every_round=False,
        steps=steps,
    )


# -- the federation, recorded --------------------------------------------------------------------
@dataclass(frozen=True)
class LocalSnapshot:
    """One client update: the round (1-based), the client, the global state it started from
    and the local state it uploaded (flat parameters and buffers, copies)."""

    round: int
    client: int
    start: tuple[torch.Tensor, torch.Tensor]
    local: tuple[torch.Tensor, torch.Tensor]


class RecordingExecutor:
    """An ``Executor`` that runs another and keeps a ``LocalSnapshot`` of every client update
    (the upload's tensors are views of the working model, so they are copied at once)."""

    def __init__(self, inner: Executor, log: list[LocalSnapshot]) -> None:
        self.inner = inner
        self.log = log

    def train(self, jobs: Sequence[ClientJob], sink: ResultSink) -> None:
        started = {job.client.index: job.broadcast for job in jobs}

        def keep(result: ClientResult) -> None:
            sent = started[result.client.index]
            upload = result.upload
            self.log.append(
                LocalSnapshot(
                    sent.round_index,
                    result.client.index,
                    (sent.params.detach().clone(), sent.buffers.detach().clone()),
                    (upload.params.detach().clone(), upload.buffers.detach().clone()),
                )
            )
            sink(result)

        self.inner.train(jobs, keep)

    def answer(
        self,
        request: ClientRequest,
        global_state: tuple[torch.Tensor, torch.Tensor],
        sink: Callable[[ClientState, torch.Tensor], None],
    ) -> None:
        self.inner.answer(request, global_state, sink)

    def end_tasks(
        self, ending: list[tuple[ClientState, int]], global_state: tuple[torch.Tensor, torch.Tensor]
    ) -> None:
        self.inner.end_tasks(ending, global_state)


@dataclass
class Trace:
    """What one federated run left: every client update and the final global state."""

    snapshots: list[LocalSnapshot]
    final: tuple[torch.Tensor, torch.Tensor]
    status: str
    message: str


def run_federation(
    stream: IrisPCAStream,
    split: TaskSplit,
    prepared: Prepared,
    init: dict[str, torch.Tensor],
    config: PilotConfig,
) -> Trace:
    """One strategy from one initial model through the engine, every client update kept."""
    model = PilotMLP(stream.input_shape[0], config.hidden, stream.num_classes)
    model.load_state_dict(init)
    partitioner = DominantClassPartitioner(config.share)
    fed = Federation(
        stream, partitioner, prepared.strategy, model, prepared.schedule, CPU, {0: split}
    )
    log: list[LocalSnapshot] = []
    fed.executor = RecordingExecutor(fed.executor, log)
    outcome = fed.run()
    final = (fed.server.global_params.detach().clone(), fed.server.global_buffers.detach().clone())
    return Trace(log, final, outcome.status, outcome.message)


# -- initialisations -----------------------------------------------------------------------------
def initial_states(points: IrisPoints, config: PilotConfig) -> dict[str, dict[str, torch.Tensor]]:
    """``random``: the seeded model; ``pretrained``: that model trained centrally on every
    point to near-optimal (full-batch Adam on the cross-entropy; deterministic)."""
    torch.manual_seed(derive_seed(config.seed, "model-init"))
    model = PilotMLP(points.x.shape[1], config.hidden, int(points.y.max()) + 1)
    random_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    optimizer = torch.optim.Adam(model.parameters(), lr=config.pretrain_lr)
    for _ in range(config.pretrain_steps):
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(points.x), points.y).backward()
        optimizer.step()
    trained = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return {"random": random_state, "pretrained": trained}


# -- measurements --------------------------------------------------------------------------------
@dataclass
class Measured:
    """The pilot's measurements of one (init, strategy) run (see ``cfl_bench.pilot.measure``)."""

    init: str
    strategy: str
    status: str
    message: str
    area: list[list[float]]  # [round][client] disagreement on the grid
    points: list[list[float]]  # [round][client] disagreement on the 150 points
    final_accuracy: float
    # The last round's label maps (n × n): the global model the clients started from, then
    # each client's local model.
    last_global: torch.Tensor = field(repr=False)
    last_clients: list[torch.Tensor] = field(repr=False)

    @property
    def forgetting_area(self) -> float:
        return mean_of(self.area)

    @property
    def forgetting_points(self) -> float:
        return mean_of(self.points)


def mean_of(table: list[list[float]]) -> float:
    values = [v for row in table for v in row]
    return sum(values) / len(values) if values else float("nan")


def measure_trace(
    trace: Trace,
    init: str,
    strategy: str,
    points: IrisPoints,
    grid: torch.Tensor,
    n: int,
    model: FlatModel,
) -> Measured:
    """Disagreement of every client update with its starting global model, per round."""
    rounds = sorted({s.round for s in trace.snapshots})
    area: list[list[float]] = [[] for _ in rounds]
    on_data: list[list[float]] = [[] for _ in rounds]
    last_global = torch.zeros(n, n, dtype=torch.long)
    last_clients: list[torch.Tensor] = []
    for snap in sorted(trace.snapshots, key=lambda s: (s.round, s.client)):
        r = rounds.index(snap.round)
        start_grid = predict_labels(model, *snap.start, grid)
        local_grid = predict_labels(model, *snap.local, grid)
        area[r].append(disagreement(local_grid, start_grid))
        on_data[r].append(
            disagreement(
                predict_labels(model, *snap.local, points.x),
                predict_labels(model, *snap.start, points.x),
            )
        )
        if snap.round == rounds[-1]:
            last_global = start_grid.view(n, n)
            last_clients.append(local_grid.view(n, n))
    final = predict_labels(model, *trace.final, points.x)
    accuracy = float((final == points.y).double().mean())
    return Measured(
        init, strategy, trace.status, trace.message, area, on_data, accuracy,
        last_global, last_clients,
    )  # fmt: skip


# -- the pilot -----------------------------------------------------------------------------------
@dataclass
class PilotResult:
    """Everything the outputs show: the data, the split, the box and every run's measures."""

    config: PilotConfig
    points: IrisPoints
    split: TaskSplit
    box: Box
    runs: list[Measured]
    pretrained_accuracy: float
    seconds: float


def run_pilot(config: PilotConfig, on_run: Callable[[str, str], None] | None = None) -> PilotResult:
    """Every strategy of ``config`` from both initialisations; ``on_run(init, strategy)`` is
    called before each run (progress)."""
    started = time.perf_counter()
    points = load_iris_pca()
    stream = IrisPCAStream(points, CPU)
    split = plan_pilot_split(
        points.y, DominantClassPartitioner(config.share), NUM_CLIENTS, config.seed
    )
    box = plot_box(points.x, config.margin)
    grid = grid_points(box, config.grid)
    inits = initial_states(points, config)
    probe = FlatModel(PilotMLP(points.x.shape[1], config.hidden, stream.num_classes))
    pretrained = predict_labels(probe, *flat_state(probe, inits["pretrained"]), points.x)
    pretrained_accuracy = float((pretrained == points.y).double().mean())
    runs: list[Measured] = []
    for init in INITS:
        # Strategies hold run state (FedProj's ensemble), so each run gets fresh instances.
        for prepared in prepare_strategies(config.strategies, stream, split, config):
            if on_run is not None:
                on_run(init, prepared.text)
            trace = run_federation(stream, split, prepared, inits[init], config)
            runs.append(measure_trace(trace, init, prepared.text, points, grid, config.grid, probe))
    return PilotResult(
        config, points, split, box, runs, pretrained_accuracy, time.perf_counter() - started
    )


def flat_state(
    model: FlatModel, state: dict[str, torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor]:
    """A module ``state_dict`` as the flat (params, buffers) of ``model``'s layout."""
    model.module.load_state_dict(state)
    return model.params.detach().clone(), model.buffers.detach().clone()
