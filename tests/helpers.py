"""Small builders shared by the unit tests (tiny linear models, contexts, buffers)."""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from torch import nn

from cfl_bench.core.buffer import ReservoirBuffer
from cfl_bench.core.context import Broadcast, ClientState, LocalRound, ServerState, StepContext
from cfl_bench.core.flat import FlatModel
from cfl_bench.core.objective import Classification
from cfl_bench.engine.client_update import ClientJob, LocalTrainer, StepSchedule
from cfl_bench.engine.executor import SequentialExecutor
from cfl_bench.engine.loop import Federation, Schedule, new_server
from cfl_bench.engine.optim import FlatSGD
from cfl_bench.engine.round_server import RoundServer
from cfl_bench.runner.executors import executor_kind
from cfl_bench.runner.model_catalogue import model_capabilities, models_offering
from cfl_bench.runner.models import build_model
from cfl_bench.strategies.base import ClientInputs, Component, ModelFacts, StrategyEnv
from cfl_bench.strategies.compose import Strategy, build_strategy
from cfl_bench.streams.partition import Partitioner, ShardPartitioner
from cfl_bench.streams.public_data import public_images
from cfl_bench.streams.registry import build_stream

CPU = torch.device("cpu")


def env(
    stream: str = "rot-mnist",
    scenario: str = "domain-il",
    num_classes: int = 2,
    num_tasks: int = 5,
    *,
    seed: int = 0,
    batch_size: int = 4,
    input_shape: tuple[int, ...] = (3,),
    data_root: str | None = None,
) -> StrategyEnv:
    """A StrategyEnv for unit tests on tiny linear models."""
    return StrategyEnv(
        stream,
        scenario,
        num_classes,
        num_tasks,
        CPU,
        seed,
        batch_size,
        input_shape,
        data_root,
        public_images=functools.partial(public_images, data_root),
        objective=Classification(task_il=scenario == "class-il"),
    )


def linear_model(in_features: int = 3, classes: int = 2, seed: int = 0) -> FlatModel:
    torch.manual_seed(seed)
    return FlatModel(nn.Linear(in_features, classes, bias=False))


def buffer_with(
    x: torch.Tensor, y: torch.Tensor, logits: torch.Tensor, capacity: int = 8
) -> ReservoirBuffer:
    buf = ReservoirBuffer(
        capacity,
        tuple(x.shape[1:]),
        logits.shape[1],
        device=CPU,
        generator=torch.Generator().manual_seed(0),
    )
    buf.add(x, y, logits, task=0)
    return buf


def client(index: int, buffer: ReservoirBuffer | None) -> ClientState:
    return ClientState(index=index, generator=torch.Generator().manual_seed(index), buffer=buffer)


def server(model: FlatModel, clients: list[ClientState]) -> ServerState:
    """The engine's starting server (``loop.new_server``, one round per task) with every
    client taking part."""
    state = new_server(model, clients, CPU, rounds_per_task=1)
    state.participants = list(clients)
    return state


def broadcast(srv: ServerState, payloads: dict[str, torch.Tensor] | None = None) -> Broadcast:
    """What ``srv`` would send its participants now (θ_g, ``payloads``, the round facts)."""
    return Broadcast.of(srv, payloads or {})


def local_round(
    model: FlatModel, srv: ServerState, payloads: dict[str, torch.Tensor] | None = None
) -> LocalRound:
    """A client's side of the round ``srv`` is in, training ``model``."""
    return LocalRound(model, broadcast(srv, payloads))


def inputs_for(component: Component, cl: ClientState, local: LocalRound) -> ClientInputs | None:
    """``component``'s inputs for ``cl``'s round as ``LocalTrainer.start`` joins them: the
    round's, then the client's own (None: nothing on its steps this round)."""
    common = component.round_inputs(local.broadcast)
    return None if common is None else {**common, **component.client_inputs(cl, local)}


def sequential_term(
    component: Component, model: FlatModel, cl: ClientState, local: LocalRound, st: StepContext
) -> torch.Tensor | None:
    """``component``'s loss term on ``st`` (its outputs already computed) as the sequential
    executor computes it: its inputs for ``cl``'s round, its frozen forwards on a copy of
    ``model`` (``ClientStepFunctions.loss_term``)."""
    from cfl_bench.strategies.fedavg import FedAvg

    inputs = inputs_for(component, cl, local)
    st.inputs = {} if inputs is None else {component.name: inputs}
    optimizer = FlatSGD(model.params, model.grads, 0.1, 0.0, 0.0)
    steps = StepSchedule(1, 32, 32, "first_pass", False)
    strategy = Strategy(FedAvg(), [component])
    trainer = LocalTrainer(model, optimizer, strategy, steps, None, Classification())
    return trainer.backend.functions.loss_term(component, st)


def step(
    model: FlatModel,
    cl: ClientState,
    srv: ServerState,
    x: torch.Tensor,
    y: torch.Tensor,
    buffer_batch_size: int = 32,
) -> StepContext:
    return StepContext(
        model=model,
        client=cl,
        broadcast=broadcast(srv),
        x=x,
        y=y,
        task=0,
        epoch=0,
        offer_to_buffer=True,
        buffer_batch_size=buffer_batch_size,
    )


def digits_federation(
    strategy: str | Strategy,
    *,
    train_size: int | None = None,
    test_size: int | None = None,
    partitioner: Partitioner | None = None,
    model: str = "mlp",
    module_factory: Callable[[str, tuple[int, ...], int], nn.Module] | None = None,
    **overrides: object,
) -> Federation:
    """A small engine run on the embedded rot-digits stream with an MLP (CPU, seed 0);
    ``module_factory`` (called as ``build_model``) builds a test-only model instead of the
    catalogue's ``model`` (whose facts the strategy sees)."""
    values: dict[str, object] = dict(
        num_tasks=2,
        rounds_per_task=2,
        epochs=1,
        num_clients=4,
        participation=1.0,
        batch_size=32,
        buffer_batch_size=32,
        buffer_size=50,
        buffer_offer="first_pass",
        replay_augment=True,
        weighting="samples",
        lr=0.05,
        momentum=0.0,
        weight_decay=0.0,
        probe_size=50,
        eval_every_round=False,
        seed=0,
    )
    values.update(overrides)
    schedule = Schedule.of(**values)
    stream = build_stream(
        "rot-digits",
        num_tasks=schedule.num_tasks,
        seed=0,
        device=CPU,
        data_root=None,
        download=False,
        train_size=train_size,
        test_size=test_size,
    )
    strat = build_strategy(strategy) if isinstance(strategy, str) else strategy
    strat.setup(
        StrategyEnv(
            stream.name,
            stream.scenario,
            stream.num_classes,
            schedule.num_tasks,
            CPU,
            seed=0,
            batch_size=schedule.steps.batch_size,
            input_shape=tuple(stream.input_shape),
            data_root=None,
            public_images=functools.partial(public_images, None),
            objective=stream.objective,
            model=ModelFacts(model, model_capabilities(model), models_offering()),
            optimizer=schedule.optimizer,
            momentum=schedule.momentum,
        )
    )
    torch.manual_seed(0)
    build = build_model if module_factory is None else module_factory
    module = build(model, stream.input_shape, stream.num_classes)
    executor = executor_kind(schedule.executor).for_federation(schedule)
    return Federation(
        stream, partitioner or ShardPartitioner(), strat, module, schedule, CPU, executor=executor
    )


def enter_task(fed: Federation, t: int) -> None:
    """Move every client of a synchronous federation to task ``t`` (its first round)."""
    fed.enter_round(fed.clock.task_start(t))


def end_task(fed: Federation, t: int) -> None:
    """The learner's task-end work for every client, as after the last round of task ``t``."""
    fed.executor.end_tasks([(c, t) for c in fed.clients], fed.global_state)


def round_server(
    srv: ServerState, *components: Component, lr: float = 0.1
) -> tuple[RoundServer, SequentialExecutor]:
    """The engine's server unit and sequential executor over ``srv`` for a FedAvg learner
    plus ``components`` (already set up), so a test drives hooks the way a round does."""
    from cfl_bench.strategies.fedavg import FedAvg

    strategy = Strategy(FedAvg(), list(components))
    model = srv.model
    optimizer = FlatSGD(model.params, model.grads, lr, 0.0, 0.0)
    steps = StepSchedule(1, 32, 32, "first_pass", False)
    trainer = LocalTrainer(model, optimizer, strategy, steps, None, Classification())
    executor = SequentialExecutor(trainer)
    return RoundServer(srv, strategy, len(srv.clients), "samples", 0), executor


def first_update(fed: Federation, round_index: int) -> tuple[float, torch.Tensor]:
    """Client 0's update in run round ``round_index`` (1-based) from the federation's
    initial θ_g: the learning rate it trained with and how far its parameters moved."""
    fed.enter_round(0)
    trainer = fed.executor.trainer  # type: ignore[attr-defined]
    fed.server.round_index = round_index
    broadcast = fed.round_server.make_broadcast()
    before = broadcast.params.clone()
    trainer.update(ClientJob(fed.clients[0], broadcast))
    return trainer.optimizer.lr, trainer.model.params.detach() - before
