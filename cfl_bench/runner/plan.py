"""A run planned: everything resolved and refused before anything is written.

Order matters for users: everything that can be refused from names and numbers alone
(strategy grammar, model and stream names) is checked before data is loaded, every task's
split is drawn before the run directory exists, and the checks that need the plan (memory,
disk) run before the run directory is claimed (``cfl_bench.runner.run``). Why a module of its
own: the Flower ClientApp and the deployment app plan the run too, and so must be able to
import the plan without the code that executes it (which launches Flower).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from cfl_bench.core.errors import UserError
from cfl_bench.core.run_dir import free_bytes
from cfl_bench.core.seeding import derive_seed
from cfl_bench.engine.arrivals import ARRIVALS_PARTITION, parse_arrivals
from cfl_bench.engine.client_update import StepSchedule
from cfl_bench.engine.loop import Federation, Schedule
from cfl_bench.engine.lr_schedule import TaskLR
from cfl_bench.engine.splits import TaskSplit, plan_splits
from cfl_bench.engine.task_clock import TaskClock
from cfl_bench.engine.task_order import parse_task_order
from cfl_bench.runner import provenance
from cfl_bench.runner.config import RunConfig, canonical_hash
from cfl_bench.runner.executors import PlannedRun, executor_kind
from cfl_bench.runner.model_catalogue import (
    CHANNELS_LAST_ON_CPU,
    DETECTION_MODELS,
    PER_EXAMPLE_MODELS,
    model_capabilities,
    models_offering,
)
from cfl_bench.runner.models import MODELS, build_model, use_channels_last
from cfl_bench.runner.run_checks import (
    check_arrivals,
    check_components_follow_orders,
    check_diagnostics,
    check_lr_schedule,
    check_run_length,
    check_task_order,
)
from cfl_bench.runner.threads import (
    ThreadsChoice,
    choose_threads,
    current_load,
    forward_flops,
    usable_cores,
)
from cfl_bench.strategies.base import ModelFacts, StrategyEnv
from cfl_bench.strategies.compose import Strategy, build_strategy
from cfl_bench.streams.base import Stream
from cfl_bench.streams.catalogue import default_task_count
from cfl_bench.streams.partition import Partitioner, client_class_counts, partitioner_from_spec
from cfl_bench.streams.public_data import public_images
from cfl_bench.streams.registry import build_stream, stream_info
from cfl_bench.streams.task_heads import with_heads


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda was requested but no CUDA GPU is visible; use --device cpu.")
    return torch.device(name)


def configure_cpu(
    device: torch.device,
    threads: int | None,
    model: torch.nn.Module | None = None,
    input_shape: tuple[int, ...] | None = None,
) -> ThreadsChoice | None:
    """Process-wide CPU settings for a run; returns the thread choice when one was made.

    Flush-to-zero: non-IID clients push the logits of absent classes far down, their softmax
    underflows into denormal floats, and denormal arithmetic is ~10-100× slower on x86.
    Values below 1.2e-38 become 0 — far below any quantity the metrics can see. This only
    reaches the calling thread; torch's OpenMP workers keep denormals.

    Threads: ``threads`` when given; otherwise, with the model known, the measured rule of
    ``cfl_bench.runner.threads`` (1 thread for small models or a busy machine — torch's default of
    one per core made small runs several times slower; bench/threads.py). Without a model
    torch's default is left alone (benchmarks that set their own).
    """
    if device.type == "cpu":
        torch.set_flush_denormal(True)
    if threads is None and model is None:
        return None
    flops = None
    if threads is None and model is not None and input_shape is not None:
        flops = model_flops(model, input_shape)
    choice = choose_threads(threads, flops, usable_cores(), current_load())
    torch.set_num_threads(choice.threads)
    return choice


def model_flops(model: torch.nn.Module, input_shape: tuple[int, ...]) -> int | None:
    """Forward FLOPs a sample, or None for a model the counter cannot run (then the rule
    treats it as small: one thread is never several times slower)."""
    try:
        return forward_flops(model, input_shape)
    except Exception:  # any model: a failed count must never stop the run
        return None


def resolved_int(value: int | None) -> int:
    """A config value that defaults have already filled in."""
    if value is None:
        raise ValueError("configuration value was not resolved")
    return int(value)


def default_out(config: RunConfig) -> Path:
    """``runs/<stream>_<strategy>_s<seed>-<hash8>``: named exactly as `cfl-bench sweep` names
    the folder of the same request (its grid point), so a run and its sweep twin are found
    under the same name; the hash is of the options as asked, before the stream's defaults."""
    from cfl_bench.runner.run_names import point_name, point_request

    request = point_request(config)
    return Path("runs") / point_name(request, {}, canonical_hash(request))


@dataclass
class RunPlan:
    """A run as resolved before anything is written: what `execute` will run, and where."""

    config: RunConfig
    stream: Stream
    strategy: Strategy
    partitioner: Partitioner
    device: torch.device
    schedule: Schedule
    model: torch.nn.Module
    splits: dict[int, TaskSplit]
    protocol_hash: str
    config_hash: str
    out: Path
    resolved: dict[str, object]  # config.json

    def federation(self, host: object = None) -> Federation:
        """The engine's federation for this plan (clients, data, executor, server), its
        executor built by the registry (``cfl_bench.runner.executors``); ``host``: what a hosted
        executor runs in (Flower's grid)."""
        kind = executor_kind(self.schedule.executor)
        return Federation(
            self.stream,
            self.partitioner,
            self.strategy,
            self.model,
            self.schedule,
            self.device,
            self.splits,
            executor=kind.for_federation(self.schedule, host),
        )


def resolve_defaults(config: RunConfig) -> RunConfig:
    """Fill the options the stream decides (model, tasks, partition, rounds, epochs, lr)."""
    info = stream_info(config.stream)
    return dataclasses.replace(
        config,
        model=config.model or info.default_model,
        tasks=config.tasks or default_task_count(info, config.classes_per_task),
        partition=config.partition or default_partition(config, info.default_partition),
        rounds_per_task=config.rounds_per_task or info.default_rounds_per_task,
        epochs=config.epochs or info.default_epochs,
        lr=config.lr or info.default_lr,
        optimizer=config.optimizer or info.default_optimizer,
        buffer_batch_size=config.buffer_batch_size or config.batch_size,
    )


def default_partition(config: RunConfig, streams: str) -> str:
    """The partition when ``--partition`` is not given: the stream's, or under
    ``--arrivals`` GLFC's own split (``class-subsets``: every receiver holds all examples of
    6 of the task's classes), so the preset is the official code's protocol as a whole."""
    return ARRIVALS_PARTITION if config.arrivals is not None else streams


def task_lr(config: RunConfig, num_tasks: int, rounds: int) -> TaskLR | None:
    """``--lr-schedule task-*`` over the run's synchronous tasks (the first one longer by
    ``--lead-rounds``; ``check_lr_schedule`` refuses asynchronous boundaries)."""
    if config.lr_schedule == "run":
        return None
    assert config.lr_end is not None and config.async_shift == 0  # check_lr_schedule
    clock = TaskClock(num_tasks, rounds, (config.lead_rounds,))
    starts = tuple(clock.task_start(t) for t in range(num_tasks))
    lengths = tuple(clock.task_rounds(t) for t in range(num_tasks))
    return TaskLR(config.lr_schedule, config.lr_end, starts, lengths)


def make_schedule(
    config: RunConfig, strategy: Strategy, num_tasks: int, device: torch.device
) -> Schedule:
    rounds, epochs = resolved_int(config.rounds_per_task), resolved_int(config.epochs)
    for component in strategy.all:
        rounds, epochs = component.adjust_schedule(rounds, epochs)
    steps = StepSchedule(
        epochs=epochs,
        batch_size=config.batch_size,
        buffer_batch_size=resolved_int(config.buffer_batch_size),
        buffer_offer=config.buffer_offer,
        replay_augment=bool(config.replay_augment),
        lr_decay=config.lr_decay,
        task_lr=task_lr(config, num_tasks, rounds),
        seed=config.seed,
        amp=config.amp,
        fused_forwards=fuses_forwards(config, device),
    )
    return Schedule(
        num_tasks=num_tasks,
        rounds_per_task=rounds,
        num_clients=config.clients,
        participation=config.participation,
        buffer_size=config.buffer_size,
        weighting=config.weighting,
        lr=float(config.lr or 0.0),
        optimizer=str(config.optimizer),
        momentum=config.momentum,
        weight_decay=config.weight_decay,
        probe_size=config.probe_size,
        eval_every_round=config.eval_every_round,
        steps=steps,
        async_shift=config.async_shift,
        lead_rounds=config.lead_rounds,
        arrivals=None if config.arrivals is None else parse_arrivals(config.arrivals),
        task_order=parse_task_order(config.task_order),
        diagnostics=config.diagnostics,
        executor=config.executor,
        clients_per_chunk=config.clients_per_chunk,
        compile_step=config.compile,
    )


def run_identity(
    config: RunConfig, stream: Stream, strategy: Strategy, partitioner: Partitioner
) -> tuple[dict[str, object], str, str]:
    """The protocol (what makes runs comparable), its hash, and the hash of protocol +
    strategy + seed (what makes a run the same run)."""
    protocol = {
        **config.protocol(),
        **arrivals_protocol(config),
        "partition": partitioner.describe(),
        **stream.protocol_fields(),
        **strategy.protocol_changes(),
    }
    config_hash = canonical_hash(
        {"protocol": protocol, "strategy": strategy.describe(), "seed": config.seed}
    )
    return protocol, canonical_hash(protocol), config_hash


def checked_model_name(config: RunConfig) -> str:
    model_name = str(config.model)
    if model_name not in MODELS:
        raise UserError(
            f"unknown model '{model_name}'; choose one of: {', '.join(sorted(MODELS))}."
        )
    return model_name


def run_device(config: RunConfig) -> torch.device:
    """The run's device (``--device``, auto: CUDA when available)."""
    return resolve_device(config.device)


def plan_run(config: RunConfig) -> RunPlan:
    """Everything that can be refused from names, numbers and data, with nothing written.

    Order matters for users: the strategy grammar, model and stream names are checked
    before any data is loaded, and every task's split is drawn before the run directory
    exists, so an impossible split is refused without writing anything.
    """
    strategy = build_strategy(config.strategy)
    asked, asked_partition = config, config.partition
    config = resolve_defaults(config)
    model_name = checked_model_name(config)
    partitioner = partitioner_from_spec(str(config.partition))
    device = run_device(config)
    check_run_length(config)
    stream, config = load_stream(config, device)
    num_tasks = check_loaded_stream(config, stream, model_name, asked_partition)
    strategy.setup(strategy_env(config, stream, device))
    check_components_follow_orders(config, strategy)
    schedule = make_schedule(config, strategy, num_tasks, device)
    model, config = initial_model(config, stream, device, model_name, strategy)
    executor_kind(config.executor).check(PlannedRun(config, stream, strategy, model))
    check_amp(config, device, stream.objective)
    threads = configure_cpu(device, config.threads, model, tuple(stream.input_shape))
    # Dropout draws from torch's default generator; seed it explicitly for this run.
    torch.manual_seed(derive_seed(config.seed, "dropout"))
    splits = plan_splits(
        stream,
        strategy,
        partitioner,
        config.clients,
        num_tasks,
        config.seed,
        schedule.arrival_plan(),
    )
    protocol, protocol_hash, config_hash = run_identity(config, stream, strategy, partitioner)
    out = Path(config.out) if config.out else default_out(asked)
    resolved = {
        "config": config.to_dict(),
        "protocol": protocol,
        "protocol_hash": protocol_hash,
        "config_hash": config_hash,
        **run_record(stream, strategy, schedule, splits),
        **provenance_record(device, threads),
    }
    return RunPlan(
        config,
        stream,
        strategy,
        partitioner,
        device,
        schedule,
        model,
        splits,
        protocol_hash,
        config_hash,
        out,
        resolved,
    )


def check_loaded_stream(
    config: RunConfig, stream: Stream, model_name: str, asked_partition: str | None
) -> int:
    """The refusals that need the loaded stream (its task count, input shape, objective,
    per-round data), in the order users meet them; returns the run's number of tasks."""
    check_run_length(config, stream.num_tasks)
    check_stream_fits(stream, model_name, asked_partition)
    check_diagnostics(config, stream.objective.capabilities)
    num_tasks = resolved_int(config.tasks)
    check_arrivals(config, num_tasks, per_round_stream=stream.per_round)
    check_task_order(config, per_round_stream=stream.per_round)
    check_lr_schedule(config)
    return num_tasks


def initial_model(
    config: RunConfig, stream: Stream, device: torch.device, model_name: str, strategy: Strategy
) -> tuple[torch.nn.Module, RunConfig]:
    """The run's model from its own seed (``model-init``, so that the initial weights do
    not depend on what drew before), with the layers its components add
    (``Component.wrap_model``), in channels-last layout where that was resolved on;
    returns the config with ``channels_last`` resolved."""
    torch.manual_seed(derive_seed(config.seed, "model-init"))
    model = build_model(model_name, stream.input_shape, stream.num_classes)
    for component in strategy.all:
        model = component.wrap_model(model)
    config = resolve_channels_last(config, device, model_name)
    if config.channels_last:
        use_channels_last(model, model_name)
    return model, config


def check_amp(config: RunConfig, device: torch.device, objective: object) -> None:
    """Refuse the ``--amp`` settings whose local step is not safe or not useful
    (``engine.amp``)."""
    from cfl_bench.core.objective import Classification

    if config.amp == "off":
        return
    if not isinstance(objective, Classification):
        raise UserError(
            f"--amp {config.amp} covers classification streams only (the detection and "
            "other losses have not been checked in reduced precision); drop --amp."
        )
    if config.compile:
        raise UserError(
            f"--amp {config.amp} has not been checked under --compile (the compiled step "
            "would have to trace the autocast and the loss scales); drop one of them."
        )
    if config.amp == "fp16" and device.type == "cpu":
        raise UserError(
            "--amp fp16 needs a CUDA device (CPU fp16 autocast is emulated and slower than "
            "fp32); use --amp bf16 or --device cuda."
        )
    if config.amp == "fp16" and config.optimizer == "adam":
        raise UserError(
            "--amp fp16 with --optimizer adam is not supported (a skipped fp16 step would "
            "need a per-client Adam step count); use --amp bf16 or --optimizer sgd."
        )
    if config.amp == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise UserError(
            "--amp bf16 needs a GPU with bfloat16 support and this one has none; use --amp fp16."
        )


def run_record(
    stream: Stream, strategy: Strategy, schedule: Schedule, splits: dict[int, TaskSplit]
) -> dict[str, object]:
    """What config.json says about the strategy, stream, schedule, clock and client data."""
    return {
        "strategy": strategy.describe(),
        "stream": stream.describe(),
        "schedule": {"rounds_per_task": schedule.rounds_per_task, "epochs": schedule.steps.epochs},
        "task_clock": schedule.clock().describe(),
        "client_class_counts": class_count_tables(stream, splits),
        **arrivals_record(schedule),
        **task_order_record(schedule),
        # A reader of an unfinished run (no summary.json yet) must know it without building
        # the strategy (the leaderboard imports no strategy).
        **({"global_not_scored": strategy.scored_by_clients} if strategy.scored_by_clients else {}),
    }


def check_stream_fits(stream: Stream, model_name: str, asked_partition: str | None) -> None:
    """Refuse a detector on a classification stream and a classifier on a detection stream
    (the objective would read outputs of the wrong shape and meaning), and a partition on a
    stream whose clients bring their own data every round (it would be ignored)."""
    if stream.per_round and asked_partition is not None:
        raise UserError(
            f"stream {stream.name!r} gives each client (vehicle) its own frames every round, so "
            "--partition does not apply; drop it."
        )
    detects = "dense_outputs" in stream.objective.capabilities
    if detects and model_name not in DETECTION_MODELS:
        raise UserError(
            f"stream {stream.name!r} is a detection stream and model '{model_name}' a "
            f"classifier; use --model {' or '.join(sorted(DETECTION_MODELS))}."
        )
    if not detects and model_name in DETECTION_MODELS:
        raise UserError(
            f"model '{model_name}' is a detector and stream {stream.name!r} a classification "
            "stream; use the stream's default model (omit --model) or another classifier."
        )


def load_stream(config: RunConfig, device: torch.device) -> tuple[Stream, RunConfig]:
    """The stream, and the config with what only the stream knows filled in (the task count
    of an Avalanche benchmark, whether replays are augmented) so the protocol records it."""
    num_tasks = resolved_int(config.tasks)
    stream = build_stream(
        config.stream,
        num_tasks=num_tasks,
        seed=config.seed,
        device=device,
        data_root=config.data_root,
        download=config.download,
        train_size=config.train_size,
        test_size=config.test_size,
        num_clients=config.clients,
        cutout=config.cutout,
        classes_per_task=config.classes_per_task,
        class_order=config.class_order,
    )
    stream = with_heads(stream, config.heads)
    if num_tasks == 0:  # the stream's own count (all of an Avalanche benchmark's experiences)
        config = dataclasses.replace(config, tasks=stream.num_tasks)
    if config.replay_augment is None:
        config = dataclasses.replace(config, replay_augment=stream.augments)
    return stream, config


def fuses_forwards(config: RunConfig, device: torch.device) -> bool:
    """Whether a step forwards its batch and replay draws as one (``engine.fused_forward``):
    for the models that never mix examples (``PER_EXAMPLE_MODELS``), on CPU (where the
    joined forward's dropout masks are the separate forwards' bit for bit), without --amp.
    Always on where it applies: it changes records in float rounding only, as
    ``--channels-last`` does."""
    per_example = str(config.model) in PER_EXAMPLE_MODELS
    return per_example and device.type == "cpu" and config.amp == "off"


def resolve_channels_last(config: RunConfig, device: torch.device, model_name: str) -> RunConfig:
    """``--channels-last``'s default (None): on where it was measured cheaper — a model of
    ``CHANNELS_LAST_ON_CPU``, on CPU, with an executor that can feed it (not vectorized).

    Why not on CUDA: cuDNN's choice depends on the GPU and precision and nobody has
    measured it here; there the flag stays the user's. The resolved value is what config.json
    records; the configuration hash leaves it out (it changes records at most in rounding).
    """
    if config.channels_last is not None:
        return config
    usable = executor_kind(config.executor).channels_last
    on = device.type == "cpu" and model_name in CHANNELS_LAST_ON_CPU and usable
    return dataclasses.replace(config, channels_last=on)


def strategy_env(config: RunConfig, stream: Stream, device: torch.device) -> StrategyEnv:
    return StrategyEnv(
        stream_name=stream.name,
        scenario=stream.scenario,
        num_classes=stream.num_classes,
        num_tasks=resolved_int(config.tasks),
        device=device,
        seed=config.seed,
        batch_size=config.batch_size,
        input_shape=tuple(stream.input_shape),
        data_root=config.data_root,
        public_images=functools.partial(public_images, config.data_root),
        public_inputs=stream.as_model_input,
        objective=stream.objective,
        model=ModelFacts(
            str(config.model), model_capabilities(str(config.model)), models_offering()
        ),
        optimizer=str(config.optimizer or "sgd"),
        momentum=float(config.momentum),
        classes_per_task=int(getattr(stream, "classes_per_task", 0)),
        num_clients=int(config.clients),
        encode_texts=encode_texts,
        class_order=stream.class_order,
    )


def encode_texts(texts: Sequence[str]) -> torch.Tensor:
    """The suite's sentence encoder (``streams.text.encode_texts``, all-MiniLM-L6-v2), for
    components that embed text (LANDER's class names); imported on use, as it loads a model."""
    from cfl_bench.streams.text import encode_texts as encode

    return encode(list(texts))


def provenance_record(device: torch.device, threads: ThreadsChoice | None) -> dict[str, object]:
    """Packages, git commit and machine (with the thread choice) for config.json."""
    environment = provenance.environment(device)
    if threads is not None:
        environment["threads_choice"] = threads.record()
    return {
        "packages": provenance.package_versions(),
        "git_commit": provenance.git_commit(),
        "environment": environment,
    }


def check_memory(plan: RunPlan) -> None:
    """Refuse replay buffers that cannot fit before allocating them (estimated bytes)."""
    if not plan.strategy.needs_buffer:
        return
    stream, config = plan.stream, plan.config
    row = 4 * math.prod(stream.input_shape) + 4 * stream.num_classes + 16
    need = config.clients * (config.buffer_size + 1) * row
    if plan.device.type == "cuda":
        free = torch.cuda.mem_get_info(plan.device)[0]
    else:
        import psutil

        free = psutil.virtual_memory().available
    if need > 0.8 * free:
        raise UserError(
            f"the replay buffers need {gigabytes(need)} ({config.clients} clients × "
            f"{config.buffer_size} examples × {row} bytes) but only {gigabytes(free)} of "
            f"{'GPU ' if plan.device.type == 'cuda' else ''}memory is free; lower "
            f"--buffer-size or --clients."
        )


def client_estimate(plan: RunPlan) -> int:
    """An upper estimate of one client's share of a checkpoint: its buffer, two models."""
    stream, config = plan.stream, plan.config
    model_bytes = 4 * sum(p.numel() for p in plan.model.parameters())
    buffer = 0
    if plan.strategy.needs_buffer:
        row = 4 * math.prod(stream.input_shape) + 4 * stream.num_classes + 16
        buffer = (config.buffer_size + 1) * row
    return buffer + 2 * model_bytes


def checkpoint_estimate(plan: RunPlan) -> int:
    """An upper estimate of one checkpoint's size: buffers, a few models per client."""
    model_bytes = 4 * sum(p.numel() for p in plan.model.parameters())
    return plan.config.clients * client_estimate(plan) + 8 * model_bytes + 2**20


def check_disk(plan: RunPlan, folder: Path) -> None:
    """Refuse an --out whose disk cannot hold the run's files (checkpoints are written next
    to the previous one before it is replaced, hence twice the estimate; beside them, the
    finished clients of a long round: an upload and a client state each)."""
    need = 2**20 if plan.config.checkpoint_every == 0 else 2 * checkpoint_estimate(plan)
    if plan.config.checkpoint_every != 0 and executor_kind(plan.config.executor).keeps_clients:
        schedule = plan.schedule
        need += min(schedule.clients_per_round, schedule.num_clients) * client_estimate(plan)
    free = free_bytes(folder)
    if free < need:
        raise UserError(
            f"--out '{plan.out}' is on a disk with {megabytes(free)} free but the run needs "
            f"about {megabytes(need)} for its files and checkpoints; free space, choose "
            f"another --out or pass --checkpoint-every 0."
        )


def note_threads(config: RunConfig, say: Callable[[str], None]) -> None:
    """More torch threads than cores makes OpenMP threads wait on each other: several times
    slower, never faster (measured: 15× with 2000 threads on 2 cores)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    if config.threads is not None and cores and config.threads > cores:
        say(
            f"note: --threads {config.threads} is more than the {cores} usable cores; "
            f"this only slows the run down (try --threads {cores})."
        )


def gigabytes(n: float) -> str:
    return f"{n / 1e9:.1f} GB"


def megabytes(n: float) -> str:
    return f"{n / 1e6:.1f} MB"


def class_count_tables(stream: Stream, splits: dict[int, TaskSplit]) -> dict[str, object]:
    """Per task (1-based keys): the K × C table of samples each client holds of each class."""
    return {
        str(t + 1): client_class_counts(
            split.parts, stream.train_labels(t), stream.num_classes
        ).tolist()
        for t, split in splits.items()
    }


def arrivals_protocol(config: RunConfig) -> dict[str, object]:
    """``--arrivals`` in the protocol by its resolved options (``glfc`` and
    ``glfc:initial=30`` are one protocol); absent without it, so older hashes hold."""
    if config.arrivals is None:
        return {}
    return {"arrivals": parse_arrivals(config.arrivals).describe()}


def arrivals_record(schedule: Schedule) -> dict[str, object]:
    """config.json → ``arrivals``: per task who is there, who receives, who keeps."""
    plan = schedule.arrival_plan()
    return {} if plan is None else {"arrivals": plan.describe()}


def task_order_record(schedule: Schedule) -> dict[str, object]:
    """config.json → ``task_orders``: per client, its tasks (1-based) in the order it
    trains them, under ``--task-order per-client``."""
    orders = schedule.task_orders()
    return {} if orders is None else {"task_orders": [[t + 1 for t in o] for o in orders]}
