"""summary.json: what a finished (or diverged) run says about itself, computed from its
record files, so a resumed run's summary covers the whole run, not the last process.

Why a module of its own: the summary is a pure function of the records, the outcome and
the plan — the third seam of a run, after planning (``cfl_bench.runner.plan``) and executing
(``cfl_bench.runner.run``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd

from cfl_bench.core.metrics import summarize
from cfl_bench.engine.loop import RunOutcome
from cfl_bench.runner.resources import cuda_peak_bytes, peak_rss_bytes
from cfl_bench.runner.round_keeper import RoundKeeper

if TYPE_CHECKING:
    from cfl_bench.runner.plan import RunPlan


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
        **summarize(records, num_tasks, plan.strategy.scored_by_clients),
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
