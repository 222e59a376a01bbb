"""`cfl-bench pilot boundary`: FedProj's decision-boundary pilot on Iris (docs/pilot.md).

Why a module apart from ``cfl_bench.cli``: the pilot has its own options and pulls in torch,
scikit-learn and matplotlib only when it runs; ``cli`` installs the ``pilot`` group with its
own ``UserError`` guard (one line, exit code 2), passed in so this module never imports the
command line it is part of.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from cfl_bench.core.errors import UserError
from cfl_bench.runner.plain_help import PlainTyper

DEFAULT_OUT = "runs/pilot-boundary"
DEFAULT_ROUNDS = 5

Guard = Callable[[Callable[..., Any]], Callable[..., Any]]


def install(parent: typer.Typer, guard: Guard) -> None:
    """Add the ``pilot`` group, its commands wrapped by ``guard``, to ``parent``."""
    pilot_app = PlainTyper(
        no_args_is_help=True,
        help="Small experiments that reproduce a paper's motivating figure.",
    )
    pilot_app.command("boundary")(guard(boundary_cmd))
    parent.add_typer(pilot_app, name="pilot")


def boundary_cmd(
    out: Annotated[str, typer.Option(help="folder for the four files")] = DEFAULT_OUT,
    strategies: Annotated[
        str | None,
        typer.Option(
            help="comma-separated strategies; a key=value after a comma continues the previous "
            "strategy's options (fedavg,fedavg+fedproj:temperature=2,gamma=0.1) [default: "
            "fedavg,fedavg+feddf,fedavg+fedproj, those this build has]",
            show_default=False,
        ),
    ] = None,
    rounds: Annotated[int, typer.Option(help="federated rounds")] = DEFAULT_ROUNDS,
    seed: Annotated[int, typer.Option(help="seed (initial model, split, batches)")] = 0,
    threads: Annotated[int, typer.Option(help="torch CPU threads")] = 1,
) -> None:
    """Decision boundaries of the global model and of each client after local training, on
    Iris (2-D PCA) with 3 non-IID clients, from a random and a pretrained model; writes
    boundary.png/.svg, pilot.json and index.html with the forgetting numbers."""
    from cfl_bench.core.run_dir import refuse_run_directory

    refuse_run_directory(Path(out), "--out", "the pilot's figure, pilot.json and index.html")
    if rounds < 1:
        raise UserError(f"--rounds must be a positive integer, got {rounds}.")
    if threads < 1:
        raise UserError(f"--threads must be a positive integer, got {threads}.")
    check_pilot_out(out)
    from cfl_bench.pilot.strategy_list import (
        check_strategies,
        default_strategies,
        split_strategy_list,
    )

    if strategies is None:
        texts, unavailable = default_strategies()
    else:
        texts, unavailable = split_strategy_list(strategies), []
    check_strategies(texts)  # before torch: a misspelled name is refused in milliseconds
    console = Console()
    for missing in unavailable:
        console.print(
            f"note: default strategy {missing['strategy']} is not run: {missing['reason']}.",
            highlight=False,
        )
    import torch

    from cfl_bench.pilot.boundary import PilotConfig, run_pilot
    from cfl_bench.pilot.plot import draw_figure, figure_files
    from cfl_bench.pilot.report import pilot_record, write_outputs

    torch.set_num_threads(threads)
    torch.set_flush_denormal(True)  # as every run: denormal arithmetic is many times slower
    result = run_pilot(
        PilotConfig(tuple(texts), rounds=rounds, seed=seed),
        on_run=lambda init, text: console.print(f"running {init} · {text}", highlight=False),
    )
    png, svg = figure_files(draw_figure(result))
    record = pilot_record(result, None if strategies is None else texts, unavailable, threads)
    paths = write_outputs(Path(out), record, png, svg)
    console.print(forgetting_table(record))
    console.print(f"wrote {', '.join(p.name for p in paths)} into {out} ({result.seconds:.1f} s)")


def check_pilot_out(out: str) -> None:
    """Refuse an --out the four files cannot go into, before the pilot trains for minutes."""
    from cfl_bench.core.run_dir import check_out_path
    from cfl_bench.runner.config import check_folder_text

    check_folder_text("--out", out, "the pilot's files")
    check_out_path(Path(out))


def forgetting_table(record: dict[str, Any]) -> Table:
    """The forgetting numbers, one row per (init, strategy)."""
    table = Table(title="forgetting: client vs. the global model it started from")
    for header in ("init", "strategy", "area", "data", "final acc", "status"):
        table.add_column(header, justify="left" if header in ("init", "strategy") else "right")
    for r in record["results"]:
        table.add_row(
            r["init"],
            r["strategy"],
            percent(r["forgetting_area"]),
            percent(r["forgetting_data"]),
            percent(r["final_global_accuracy"]),
            r["status"],
        )
    return table


def percent(value: object) -> str:
    return "–" if not isinstance(value, float) else f"{100 * value:.1f}%"
