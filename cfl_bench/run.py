"""One run from a validated ``RunConfig`` to a complete run directory.

Order matters for users: everything that can be refused from names and numbers alone
(strategy grammar, model and stream names) is checked before data is loaded, and the run
directory is prepared only once the configuration is known to be runnable.
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch

from cfl_bench import provenance
from cfl_bench.config import RunConfig, canonical_hash
from cfl_bench.engine.loop import (
    Federation,
    Record,
    RoundReport,
    RunOutcome,
    Schedule,
)
from cfl_bench.engine.splits import TaskSplit, plan_splits
from cfl_bench.errors import UserError
from cfl_bench.metrics import summarize
from cfl_bench.models import MODELS, build_model
from cfl_bench.records import COLUMNS, RunDirectory
from cfl_bench.resources import cuda_peak_bytes, peak_rss_bytes
from cfl_bench.seeding import derive_seed
from strategies.base import StrategyEnv
from strategies.compose import build_strategy
from streams.base import Stream
from streams.partition import client_class_counts, partitioner_from_spec
from streams.registry import build_stream, stream_info


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda was requested but no CUDA GPU is visible; use --device cpu.")
    return torch.device(name)


def configure_cpu(device: torch.device, threads: int | None) -> None:
    """Process-wide CPU settings for a run.

    Flush-to-zero: non-IID clients push the logits of absent classes far down, their softmax
    underflows into denormal floats, and denormal arithmetic is ~10-100× slower on x86.
    Values below 1.2e-38 become 0 — far below any quantity the metrics can see. This only
    reaches the calling thread; torch's OpenMP workers keep denormals, which is why
    ``--threads 1`` can be faster for small models (measured in bench/throughput.py).
    """
    if device.type == "cpu":
        torch.set_flush_denormal(True)
    if threads is not None:
        torch.set_num_threads(threads)


def resolved_int(value: int | None) -> int:
    """A config value that defaults have already filled in."""
    if value is None:
        raise ValueError("configuration value was not resolved")
    return int(value)


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-")[:60] or "run"


@dataclass
class RunResult:
    path: Path
    summary: dict[str, object]


def materialise(rows: list[Record]) -> pd.DataFrame:
    """Records with tensor values turned into floats in one device→host transfer."""
    tensor_pos = [i for i, r in enumerate(rows) if isinstance(r[5], torch.Tensor)]
    values: list[object] = [r[5] for r in rows]
    if tensor_pos:
        stacked = torch.stack([rows[i][5].detach().float().cpu() for i in tensor_pos])  # type: ignore[union-attr]
        for i, v in zip(tensor_pos, stacked.tolist(), strict=True):
            values[i] = v
    plain = [(*r[:5], v) for r, v in zip(rows, values, strict=True)]
    return pd.DataFrame(plain, columns=list(COLUMNS))


def execute(
    config: RunConfig,
    on_round: Callable[[RoundReport], None] | None = None,
    annotations: Mapping[str, object] | None = None,
) -> RunResult:
    """``annotations``: caller keys added to summary.json (the run's own keys win), so a
    caller such as ``cfl-bench sweep`` can recognise its finished runs in one read."""
    strategy = build_strategy(config.strategy)
    info = stream_info(config.stream)
    config = dataclasses.replace(
        config,
        model=config.model or info.default_model,
        tasks=config.tasks or info.default_tasks,
        partition=config.partition or info.default_partition,
        rounds_per_task=config.rounds_per_task or info.default_rounds_per_task,
        epochs=config.epochs or info.default_epochs,
        lr=config.lr or info.default_lr,
        buffer_batch_size=config.buffer_batch_size or config.batch_size,
    )
    model_name = str(config.model)
    if model_name not in MODELS:
        raise UserError(
            f"unknown model '{model_name}'; choose one of: {', '.join(sorted(MODELS))}."
        )
    partitioner = partitioner_from_spec(str(config.partition))
    device = resolve_device(config.device)
    configure_cpu(device, config.threads)
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
    )
    if num_tasks == 0:  # the stream's own count (all of an Avalanche benchmark's experiences)
        num_tasks = stream.num_tasks
        config = dataclasses.replace(config, tasks=num_tasks)
    if config.replay_augment is None:  # resolved here so the protocol records the value
        config = dataclasses.replace(config, replay_augment=stream.augments)
    strategy.setup(
        StrategyEnv(
            stream_name=stream.name,
            scenario=stream.scenario,
            num_classes=stream.num_classes,
            num_tasks=num_tasks,
            device=device,
            seed=config.seed,
            batch_size=config.batch_size,
            input_shape=tuple(stream.input_shape),
            data_root=config.data_root,
        )
    )
    rounds, epochs = resolved_int(config.rounds_per_task), resolved_int(config.epochs)
    for component in strategy.all:
        rounds, epochs = component.adjust_schedule(rounds, epochs)
    schedule = Schedule(
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
        momentum=config.momentum,
        weight_decay=config.weight_decay,
        probe_size=config.probe_size,
        eval_every_round=config.eval_every_round,
        seed=config.seed,
        async_shift=config.async_shift,
    )
    torch.manual_seed(derive_seed(config.seed, "model-init"))
    model = build_model(model_name, stream.input_shape, stream.num_classes)
    # Dropout draws from torch's default generator; seed it explicitly for this run.
    torch.manual_seed(derive_seed(config.seed, "dropout"))

    # Every task's split is drawn before the run directory exists: an impossible split is
    # refused without writing anything, and config.json can show what each client holds.
    splits = plan_splits(stream, strategy, partitioner, config.clients, num_tasks, config.seed)
    protocol = {
        **config.protocol(),
        "partition": partitioner.describe(),
        **stream.protocol_fields(),
        **strategy.protocol_changes(),
    }
    protocol_hash = canonical_hash(protocol)
    config_hash = canonical_hash(
        {"protocol": protocol, "strategy": strategy.describe(), "seed": config.seed}
    )
    out = (
        Path(config.out)
        if config.out
        else Path("runs")
        / slug(f"{config.stream}_{strategy.name}_s{config.seed}_{config_hash[:8]}")
    )
    run_dir = RunDirectory(out)
    run_dir.prepare(config_hash, config.overwrite)
    resolved = {
        "config": config.to_dict(),
        "protocol": protocol,
        "protocol_hash": protocol_hash,
        "config_hash": config_hash,
        "strategy": strategy.describe(),
        "stream": stream.describe(),
        "schedule": {"rounds_per_task": rounds, "epochs": epochs},
        "task_clock": schedule.clock().describe(),
        "client_class_counts": class_count_tables(stream, splits),
        "packages": provenance.package_versions(),
        "git_commit": provenance.git_commit(),
        "environment": provenance.environment(device),
    }
    run_dir.write_config(resolved)

    started = time.perf_counter()
    federation = Federation(stream, partitioner, strategy, model, schedule, device, splits)
    outcome = federation.run(on_round)
    wall = time.perf_counter() - started
    summary = write_results(run_dir, outcome, num_tasks, wall, device)
    summary.update(
        {
            "stream": config.stream,
            "strategy": strategy.name,
            "seed": config.seed,
            "protocol_hash": protocol_hash,
            "config_hash": config_hash,
        }
    )
    summary = {**(annotations or {}), **summary}
    run_dir.write_summary(summary)
    return RunResult(out, summary)


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


def write_results(
    run_dir: RunDirectory, outcome: RunOutcome, num_tasks: int, wall: float, device: torch.device
) -> dict[str, object]:
    records = materialise(outcome.records)
    costs = materialise(outcome.costs)
    run_dir.write_records(records.itertuples(index=False, name=None))
    run_dir.write_records(costs.itertuples(index=False, name=None), name="costs.csv")
    summary: dict[str, object] = {
        "status": outcome.status,
        "message": outcome.message,
        **summarize(records, num_tasks),
        "wall_time_s": wall,
        "round_time_s_mean": cost_mean(costs, "round_time_s"),
        "train_time_s_total": cost_total(costs, "train_time_s"),
        "peak_rss_bytes": peak_rss_bytes(),
        "cuda_peak_bytes": cuda_peak_bytes(device),
        "buffer_bytes_per_client": outcome.buffer_bytes_per_client,
        "num_params": outcome.num_params,
        "bytes_by_payload": outcome.comm_by_payload,
    }
    return summary
