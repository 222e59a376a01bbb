"""`cfl-bench carla demo`: vehicles stream frames to federated clients while rounds run.

Why a command of its own: the demo is the FedGP paper's CARLA experiment as one line —
urban driving for S rounds, then one vehicle enters the highway until round R — with a live
terminal view and a page of mAP per domain over rounds and of predicted vs true boxes. Under
the hood it is an ordinary run of the ``carla-highway`` stream (``carla-live`` for a CARLA
server) whose urban phase is ``--lead-rounds`` longer than the shift phase, so its run
directory, summary and leaderboard are those of any run, and ``cfl-bench sweep`` compares
strategies on the same protocol.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

from cfl_bench.core.errors import RunInterruptedError, UserError
from cfl_bench.engine.progress import RoundLog

#: Demo defaults, sized to finish within 15 minutes on 2 CPU cores (docs/carla.md).
DEMO_CLIENTS = 4
# The paper's 70 rounds with the highway shift at round 60; 4 vehicles, buffer 200.
DEMO_ROUNDS = 70
DEMO_SHIFT_ROUND = 60
DEMO_BUFFER = 200
# A round brings 22-23 frames per vehicle: batches of 4 give the detector ~12 steps a round.
DEMO_BATCH = 4
DEMO_EPOCHS = 2


@dataclass(frozen=True)
class DemoOptions:
    """What `cfl-bench carla demo` was asked for."""

    source: str
    data_root: str | None
    host: str
    port: int
    timeout: float
    clients: int
    rounds: int
    shift_round: int
    strategy: str
    seed: int
    out: str | None
    threads: int | None
    epochs: int
    batch_size: int
    lr: float | None
    buffer_size: int
    overwrite: bool = False


def phase_rounds(rounds: int, shift_round: int) -> tuple[int, int]:
    """(rounds per task, lead rounds) for S urban rounds then R − S shifted ones.

    The engine's tasks are equally long plus a lead for the first one, so the urban phase
    must not be the shorter one: S ≥ R − S.
    """
    if not 0 < shift_round < rounds:
        raise UserError(
            f"--shift-round must lie between 1 and --rounds - 1 ({rounds - 1}), got {shift_round}"
        )
    after = rounds - shift_round
    if shift_round < after:
        raise UserError(
            f"the highway phase ({after} rounds) may not be longer than the urban phase "
            f"({shift_round}); use --shift-round >= {(rounds + 1) // 2}"
        )
    return after, shift_round - after


def demo_config(options: DemoOptions) -> Any:
    """The run configuration behind the demo (a ``carla-highway`` / ``carla-live`` run)."""
    from cfl_bench.runner.config import make_config

    per_task, lead = phase_rounds(options.rounds, options.shift_round)
    live = options.source == "carla"
    values: dict[str, Any] = dict(
        stream="carla-live" if live else "carla-highway",
        strategy=options.strategy,
        tasks=2,
        rounds_per_task=per_task,
        lead_rounds=lead,
        clients=options.clients,
        epochs=options.epochs,
        batch_size=options.batch_size,
        lr=options.lr,
        buffer_size=options.buffer_size,
        seed=options.seed,
        data_root=f"carla://{options.host}:{options.port}" if live else options.data_root,
        eval_every_round=True,
        save_model=True,
        out=options.out,
        overwrite=options.overwrite,
        threads=options.threads,
        # Live frames cannot be replayed, so a live demo cannot resume. A replay's checkpoint
        # holds every buffer (uint8 frames, ~0.2 GB for 4 × 200): the automatic policy writes
        # it every round while that costs under ~5 % of the run, so Ctrl-C loses little.
        checkpoint_every=0 if live else None,
    )
    return make_config(values)


def run_demo(options: DemoOptions, console: Console) -> Path:
    """Run the demo; returns the run directory (with ``carla_demo.html``)."""
    if options.source not in ("replay", "carla"):
        raise UserError(f"--source must be replay or carla, got {options.source!r}")
    if options.source == "carla":
        from cfl_bench.carla_bridge.live import LiveConfig, connect

        # Fail fast, before any data is read: no server → one line, exit 2.
        console.print(
            f"connecting to {options.host}:{options.port} (the CARLA server; up to "
            f"{options.timeout:g} s)",
            highlight=False,
        )
        connect(LiveConfig(host=options.host, port=options.port, timeout=options.timeout))
    elif options.data_root is None:
        raise UserError(
            "--source replay needs --data-root pointing at a folder that holds "
            "carla-object-detection/ (the shared frames)"
        )
    config = demo_config(options)
    if options.source == "replay":
        console.print(
            f"replaying the recorded frames under {options.data_root}/carla-object-detection",
            highlight=False,
        )
    try:
        from cfl_bench.runner.run import execute

        with live_view(console, options) as on_round:
            result = execute(config, on_round, notify=lambda text: console.print(text))
    except RunInterruptedError:
        raise
    except KeyboardInterrupt:
        raise RunInterruptedError(
            "interrupted before round 1 (loading the frames and the detector); nothing was "
            "written; rerun the same command to start (or resume) the demo"
        ) from None
    from cfl_bench.carla_bridge.demo_page import write_demo_page

    page = write_demo_page(result.path)
    console.print(f"demo page: [bold]{page}[/]")
    return result.path


def view_table(report: Any, options: DemoOptions, timing: str = "") -> Table:
    """The live view: round, phase, frames and buffer fill per client, latest mAP, and
    the elapsed time and ETA (``timing``)."""
    phase = "urban" if report.round_index <= options.shift_round else "highway shift"
    table = Table(title=f"round {report.round_index}/{report.total_rounds} · {phase}")
    table.add_column("client")
    table.add_column("frames this round", justify="right")
    table.add_column("buffer", justify="right")
    for k, frames in enumerate(report.client_examples):
        fill = report.buffer_fill[k] if k < len(report.buffer_fill) else 0
        table.add_row(f"vehicle {k}", str(frames), f"{fill}/{options.buffer_size}")
    lines = [score_line(report) or "mAP@0.5: not evaluated yet", timing]
    table.caption = "\n".join(line for line in (*lines, no_detection_note(report)) if line)
    return table


def score_line(report: Any) -> str:
    names = {"task 1": "urban", "task 2": "highway", "test": "Town05 (test)"}
    scores = " · ".join(f"{names.get(k, k)} {v:.1f}" for k, v in report.latest_scores)
    return f"mAP@0.5 %: {scores}" if scores else ""


def no_detection_note(report: Any) -> str:
    """Why every mAP is 0: no predicted box matches a true one yet — the detector's scores
    start near 0 and the first rounds find nothing (tens of rounds in the paper's setting)."""
    if report.latest_scores and all(v == 0 for _, v in report.latest_scores):
        return "no box detected correctly yet: usual in the first rounds"
    return ""


@contextlib.contextmanager
def live_view(console: Console, options: DemoOptions) -> Iterator[Callable[[Any], None]]:
    """A live table on a terminal; one plain line per round otherwise. Both say the time
    elapsed and an ETA, and why every mAP is still 0."""
    log = RoundLog()
    if not console.is_terminal:

        def on_line(report: Any) -> None:
            scores = ", ".join(f"{k} {v:.1f}" for k, v in report.latest_scores)
            frames = "/".join(str(n) for n in report.client_examples)
            note = no_detection_note(report)
            console.print(
                f"round {report.round_index}/{report.total_rounds} frames {frames} "
                f"buffer {'/'.join(str(n) for n in report.buffer_fill)} mAP50 {scores} · "
                f"{log.timing(report)}{f' ({note})' if note else ''}",
                highlight=False,
            )

        yield on_line
        return
    with Live(console=console, refresh_per_second=4) as live:

        def on_round(report: Any) -> None:
            live.update(view_table(report, options, log.timing(report)))

        yield on_round
