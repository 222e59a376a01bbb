"""One run from a validated ``RunConfig`` to a complete run directory.

Order matters for users: everything that can be refused from names and numbers alone
(strategy grammar, model and stream names) is checked before data is loaded, and the run
directory is prepared only once the configuration is known to be runnable.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import functools
import json
import math
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch

from cfl_bench import cost, provenance
from cfl_bench.atomic import atomic_write
from cfl_bench.config import RunConfig, canonical_hash
from cfl_bench.engine.loop import Federation, RunOutcome, Schedule
from cfl_bench.engine.splits import TaskSplit, plan_splits
from cfl_bench.errors import UserError
from cfl_bench.executors import PlannedRun, executor_kind
from cfl_bench.metrics import summarize
from cfl_bench.model_catalogue import DETECTION_MODELS, model_capabilities, models_offering
from cfl_bench.models import MODELS, build_model
from cfl_bench.progress import RoundReport
from cfl_bench.resources import cuda_peak_bytes, peak_rss_bytes
from cfl_bench.round_keeper import RoundKeeper, RunInterruptedError, interruption
from cfl_bench.run_checks import check_diagnostics, check_run_length
from cfl_bench.run_dir import RunDirectory, free_bytes, os_problem
from cfl_bench.seeding import derive_seed
from cfl_bench.threads import (
    ThreadsChoice,
    choose_threads,
    current_load,
    forward_flops,
    usable_cores,
)
from cfl_bench.trackers import Tracker, check_available, open_trackers, parse_trackers
from strategies.base import ModelFacts, StrategyEnv
from strategies.compose import Strategy, build_strategy
from streams.base import Stream
from streams.partition import Partitioner, client_class_counts, partitioner_from_spec
from streams.public_data import public_images
from streams.registry import build_stream, stream_info


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
    ``cfl_bench.threads`` (1 thread for small models or a busy machine — torch's default of
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
    from cfl_bench.sweep.grid import point_name, point_request

    request = point_request(config)
    return Path("runs") / point_name(request, {}, canonical_hash(request))


@dataclass
class RunResult:
    path: Path
    summary: dict[str, object]


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
        executor built by the registry (``cfl_bench.executors``); ``host``: what a hosted
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
        tasks=config.tasks or info.default_tasks,
        partition=config.partition or info.default_partition,
        rounds_per_task=config.rounds_per_task or info.default_rounds_per_task,
        epochs=config.epochs or info.default_epochs,
        lr=config.lr or info.default_lr,
        optimizer=config.optimizer or info.default_optimizer,
        buffer_batch_size=config.buffer_batch_size or config.batch_size,
    )


def make_schedule(config: RunConfig, strategy: Strategy, num_tasks: int) -> Schedule:
    rounds, epochs = resolved_int(config.rounds_per_task), resolved_int(config.epochs)
    for component in strategy.all:
        rounds, epochs = component.adjust_schedule(rounds, epochs)
    return Schedule(
        num_tasks=num_tasks,
        rounds_per_task=rounds,
        epochs=epochs,
        num_clients=config.clients,
        participation=config.participation,
        batch_size=config.batch_size,
        buffer_batch_size=resolved_int(config.buffer_batch_size),
        buffer_size=config.buffer_size,
        buffer_offer=config.buffer_offer,
        replay_augment=bool(config.replay_augment),
        weighting=config.weighting,
        lr=float(config.lr or 0.0),
        optimizer=str(config.optimizer),
        momentum=config.momentum,
        weight_decay=config.weight_decay,
        probe_size=config.probe_size,
        eval_every_round=config.eval_every_round,
        seed=config.seed,
        async_shift=config.async_shift,
        lead_rounds=config.lead_rounds,
        lr_decay=config.lr_decay,
        diagnostics=config.diagnostics,
        amp=config.amp,
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
    check_run_length(config, stream.num_tasks)
    check_stream_fits(stream, model_name, asked_partition)
    check_diagnostics(config, stream.objective.capabilities)
    num_tasks = resolved_int(config.tasks)
    strategy.setup(strategy_env(config, stream, device))
    schedule = make_schedule(config, strategy, num_tasks)
    torch.manual_seed(derive_seed(config.seed, "model-init"))
    model = build_model(model_name, stream.input_shape, stream.num_classes)
    executor_kind(config.executor).check(PlannedRun(config, stream, strategy, model))
    check_amp(config, device, stream.objective)
    threads = configure_cpu(device, config.threads, model, tuple(stream.input_shape))
    # Dropout draws from torch's default generator; seed it explicitly for this run.
    torch.manual_seed(derive_seed(config.seed, "dropout"))
    splits = plan_splits(stream, strategy, partitioner, config.clients, num_tasks, config.seed)
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


def execute_in_flower(
    plan: RunPlan, annotations: Mapping[str, object] | None, say: Callable[[str], None]
) -> RunResult:
    """Launch a Flower simulation that runs ``plan`` (``flower.launch``); the ServerApp
    executes the same configuration, with ``out`` fixed to this plan's directory."""
    from cfl_bench.flower.launch import run_in_flower

    if annotations:
        raise UserError("--executor flower cannot run inside a sweep yet; use another executor.")
    config = dataclasses.replace(plan.config, out=str(plan.out.resolve()))
    say("starting a Flower simulation (Flower and Ray take about a minute to start)")
    try:
        path = run_in_flower(config, plan.device, say)
    except KeyboardInterrupt:
        raise RunInterruptedError(
            f"interrupted during the Flower simulation; '{plan.out}' keeps the rounds written "
            "so far, but --executor flower cannot resume a run: rerun the same command with "
            "--restart, or resume it with another --executor"
        ) from None
    summary = json.loads((path / "summary.json").read_text())
    return RunResult(path, summary)


def check_amp(config: RunConfig, device: torch.device, objective: object) -> None:
    """Refuse the ``--amp`` settings whose local step is not safe or not useful
    (``engine.amp``)."""
    from cfl_bench.objective import Classification

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
        "schedule": {"rounds_per_task": schedule.rounds_per_task, "epochs": schedule.epochs},
        "task_clock": schedule.clock().describe(),
        "client_class_counts": class_count_tables(stream, splits),
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
    )
    if num_tasks == 0:  # the stream's own count (all of an Avalanche benchmark's experiences)
        config = dataclasses.replace(config, tasks=stream.num_tasks)
    if config.replay_augment is None:
        config = dataclasses.replace(config, replay_augment=stream.augments)
    return stream, config


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
    )


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


def execute(
    config: RunConfig,
    on_round: Callable[[RoundReport], None] | None = None,
    annotations: Mapping[str, object] | None = None,
    notify: Callable[[str], None] | None = None,
    host: object = None,
) -> RunResult:
    """Run ``config`` into its run directory, resuming it from its checkpoint when the
    directory holds an unfinished run of the same configuration.

    ``annotations``: caller keys added to summary.json (the run's own keys win), so a
    caller such as ``cfl-bench sweep`` can recognise its finished runs in one read.
    ``notify`` receives one-line messages for the user (resuming, notes).
    ``host``: what a hosted executor's client side runs in, passed by that host (Flower's
    ServerApp passes its grid); without one, such a run starts its host (``flower.launch``).
    """
    say = notify or (lambda _text: None)
    plan = plan_run(config)
    if executor_kind(plan.config.executor).hosted and host is None:
        return execute_in_flower(plan, annotations, say)
    check_memory(plan)
    if plan.config.log:
        check_available(parse_trackers(plan.config.log))
    note_threads(plan.config, say)
    run_dir = RunDirectory(plan.out)
    resume = run_dir.claim(
        plan.config_hash,
        overwrite=plan.config.overwrite,
        restart=plan.config.restart,
        preflight=lambda path: check_disk(plan, path),
    )
    with run_dir:
        try:
            ran = run_in(run_dir, plan, resume, on_round, say, host)
            summary = {**(annotations or {}), **ran}
            run_dir.write_summary(summary)
            run_dir.commit()  # a replacement takes the old run's place only now, complete
        except OSError as exc:
            if exc.errno == errno.EPIPE:
                raise  # the terminal's output closed (`| head`): not the run directory's fault
            raise UserError(
                f"writing the run into '{plan.out}' failed ({os_problem(exc)}); fix that and "
                f"rerun the same command to resume."
            ) from None
    return RunResult(plan.out, summary)


def run_in(
    run_dir: RunDirectory,
    plan: RunPlan,
    resume: bool,
    on_round: Callable[[RoundReport], None] | None,
    say: Callable[[str], None],
    host: object = None,
) -> dict[str, object]:
    """The federated run itself, with records appended and checkpoints written as it goes.

    A fresh run first says its size and estimated duration (``cost.announce``, before the
    federation touches the model; recorded as config.json's ``cost_estimate``); a resumed
    one says where it resumes instead.
    """
    config = plan.config
    check_resumable(plan, resume)
    if resume and not executor_kind(config.executor).resumable:
        raise UserError(
            f"'{plan.out}' holds an unfinished run, and --executor flower cannot resume one "
            "(the clients' states live in the simulation); pass --restart or resume it with "
            "another --executor."
        )
    total = plan.schedule.clock().total_rounds
    trackers: list[Tracker] = []
    try:
        with interrupts_before_rounds(total, resume):
            if not resume:  # before the federation touches the model
                plan.resolved["cost_estimate"] = cost.announce(plan, say)
            federation = plan.federation(host)
            trackers = open_run_trackers(plan, run_dir)
            keeper = start_keeper(run_dir, plan, federation, trackers, resume, say)
        # A display may also follow the clients inside a round (``RoundLog.clients_done``).
        federation.on_client = getattr(on_round, "clients_done", None)
        outcome = federation.run(on_round, keeper.round_end)
        keeper.finish(outcome)
        if config.save_model:
            save_global_model(federation, run_dir.path / "model.pt")
    except RunInterruptedError:
        raise
    except KeyboardInterrupt:
        raise keeper.interrupted(total) from None
    finally:
        for tracker in trackers:
            tracker.close()
        plan.stream.close()
    return run_summary(keeper, outcome, plan)


def start_keeper(
    run_dir: RunDirectory,
    plan: RunPlan,
    federation: Federation,
    trackers: list[Tracker],
    resume: bool,
    say: Callable[[str], None],
) -> RoundKeeper:
    """The round keeper of a fresh run (config.json written) or of a resumed one (its
    checkpoint loaded)."""
    config = plan.config
    keeper = RoundKeeper(
        run_dir,
        federation,
        every=config.checkpoint_every,
        fingerprint=fingerprint(plan),
        keep_last=config.keep_checkpoint,
        observers=[tracker.log for tracker in trackers],
    )
    if resume:
        try:
            keeper.resume(plan.device, say, adopt_threads=config.threads is None)
        except ValueError as exc:
            raise UserError(
                f"cannot resume the run in '{plan.out}': {exc}; pass --restart to start it over."
            ) from None
        say(f"resuming from round {keeper.saved_round} of {plan.schedule.clock().total_rounds}")
    else:
        run_dir.write_config(plan.resolved)
        keeper.start_fresh()
    return keeper


@contextlib.contextmanager
def interrupts_before_rounds(total: int, resuming: bool) -> Iterator[None]:
    """Ctrl-C or SIGTERM before this process's first round (the cost probe, loading the
    checkpoint): one line saying what is kept — a resumed run's checkpoint, else nothing."""
    try:
        yield
    except KeyboardInterrupt:
        if resuming:
            raise RunInterruptedError(
                f"interrupted while resuming (before its next round of {total}); kept the "
                "checkpoint; rerun the same command to resume"
            ) from None
        raise interruption(total, 0, 0) from None


def check_resumable(plan: RunPlan, resume: bool) -> None:
    """Refuse to resume a run whose stream cannot be rewound (live CARLA frames)."""
    if resume and not plan.stream.resumable:
        raise UserError(
            f"the unfinished run in '{plan.out}' streamed live frames, which cannot be replayed "
            "from its checkpoint; pass --restart to start it over."
        )


def save_global_model(federation: Federation, path: Path) -> None:
    """θ_g as the module's ``state_dict`` (atomically), loadable into ``build_model``."""
    federation.model.load(*federation.global_state)
    state = {k: v.detach().cpu() for k, v in federation.model.module.state_dict().items()}
    atomic_write(path, lambda fh: torch.save(state, fh))


def open_run_trackers(plan: RunPlan, run_dir: RunDirectory) -> list[Tracker]:
    """The trackers --log asks for, given the run's protocol, strategy and seed as params."""
    if not plan.config.log:
        return []
    params = {
        **plan.resolved["protocol"],  # type: ignore[dict-item]
        "strategy": plan.strategy.name,
        "seed": plan.config.seed,
        "protocol_hash": plan.protocol_hash,
    }
    return open_trackers(parse_trackers(plan.config.log), run_dir.path, params)


def fingerprint(plan: RunPlan) -> dict[str, object]:
    """What must match for a checkpoint to be resumed (threads only draw a note)."""
    return {
        "config_hash": plan.config_hash,
        "git_commit": plan.resolved["git_commit"],
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
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


def checkpoint_estimate(plan: RunPlan) -> int:
    """An upper estimate of one checkpoint's size: buffers, a few models per client."""
    stream, config = plan.stream, plan.config
    model_bytes = 4 * sum(p.numel() for p in plan.model.parameters())
    buffer = 0
    if plan.strategy.needs_buffer:
        row = 4 * math.prod(stream.input_shape) + 4 * stream.num_classes + 16
        buffer = (config.buffer_size + 1) * row
    return config.clients * (buffer + 2 * model_bytes) + 8 * model_bytes + 2**20


def check_disk(plan: RunPlan, folder: Path) -> None:
    """Refuse an --out whose disk cannot hold the run's files (checkpoints are written next
    to the previous one before it is replaced, hence twice the estimate)."""
    need = 2**20 if plan.config.checkpoint_every == 0 else 2 * checkpoint_estimate(plan)
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


def cost_mean(costs: pd.DataFrame, metric: str) -> float | None:
    values = costs.loc[costs["metric"] == metric, "value"]
    return float(values.mean()) if len(values) else None


def cost_total(costs: pd.DataFrame, metric: str) -> float | None:
    values = costs.loc[costs["metric"] == metric, "value"]
    return float(values.sum()) if len(values) else None


def run_summary(keeper: RoundKeeper, outcome: RunOutcome, plan: RunPlan) -> dict[str, object]:
    """summary.json, computed from the record files (the whole run, resumed or not)."""
    records = keeper.log.read()
    costs = keeper.log.read("costs.csv")
    num_tasks = plan.schedule.num_tasks
    return {
        "status": outcome.status,
        "message": outcome.message,
        **summarize(records, num_tasks),
        "wall_time_s": keeper.elapsed(),
        "round_time_s_mean": cost_mean(costs, "round_time_s"),
        "train_time_s_total": cost_total(costs, "train_time_s"),
        "peak_rss_bytes": peak_rss_bytes(),
        "cuda_peak_bytes": cuda_peak_bytes(plan.device),
        "buffer_bytes_per_client": outcome.buffer_bytes_per_client,
        "num_params": outcome.num_params,
        "bytes_by_payload": outcome.comm_by_payload,
        "checkpoint": {
            "written": keeper.checkpoints_written,
            "seconds": keeper.checkpoint_seconds,
            "bytes": keeper.checkpoint_bytes,
        },
        "stream": plan.config.stream,
        "strategy": plan.strategy.name,
        "seed": plan.config.seed,
        "protocol_hash": plan.protocol_hash,
        "config_hash": plan.config_hash,
    }
