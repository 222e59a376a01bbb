"""The ``cfl-bench`` command line (typer + rich).

Bad input never shows a traceback: ``UserError`` becomes one red line on stderr and exit
code 2. Every ``run`` option defaults to "not given" so a YAML file (``--config``) can set
it and an explicit flag still wins.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from cfl_bench.errors import UserError

app = typer.Typer(
    add_completion=False,
    pretty_exceptions_enable=False,
    no_args_is_help=True,
    help="cfl-bench: continual federated learning benchmarks.",
)

F = TypeVar("F", bound=Callable[..., Any])


def user_errors(fn: F) -> F:
    """Turn UserError into one clear line and exit code 2."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except UserError as exc:
            Console(stderr=True).print(
                f"[bold red]error:[/] {exc}", highlight=False, soft_wrap=True
            )
            raise typer.Exit(2) from None

    return wrapper  # type: ignore[return-value]


@app.command()
@user_errors
def run(
    stream: Annotated[
        str | None,
        typer.Option(
            help="stream name (see `cfl-bench list streams`), or "
            "avalanche:package.module:factory for any Avalanche benchmark"
        ),
    ] = None,
    strategy: Annotated[
        str | None, typer.Option(help="composition, e.g. der:alpha=0.5+fedgp:gref_samples=all")
    ] = None,
    model: Annotated[str | None, typer.Option(help="model name (default: the stream's)")] = None,
    tasks: Annotated[int | None, typer.Option(help="number of tasks")] = None,
    rounds_per_task: Annotated[
        int | None, typer.Option(help="communication rounds per task")
    ] = None,
    clients: Annotated[int | None, typer.Option(help="number of clients K")] = None,
    participation: Annotated[
        float | None, typer.Option(help="fraction of clients per round, in (0, 1]")
    ] = None,
    async_shift: Annotated[
        int | None,
        typer.Option(
            help="asynchronous task boundaries: each client's are delayed by its own seeded "
            "offset in [0, S] rounds; task t is evaluated when the last client has finished it"
        ),
    ] = None,
    epochs: Annotated[int | None, typer.Option(help="local epochs per round")] = None,
    batch_size: Annotated[int | None, typer.Option(help="local batch size")] = None,
    buffer_batch_size: Annotated[
        int | None, typer.Option(help="buffer draw size (default: batch size)")
    ] = None,
    lr: Annotated[float | None, typer.Option(help="local SGD learning rate")] = None,
    momentum: Annotated[float | None, typer.Option(help="local SGD momentum")] = None,
    weight_decay: Annotated[float | None, typer.Option(help="local SGD weight decay")] = None,
    buffer_size: Annotated[int | None, typer.Option(help="reservoir capacity M per client")] = None,
    buffer_offer: Annotated[str | None, typer.Option(help="first_pass | every_step")] = None,
    replay_augment: Annotated[
        bool | None,
        typer.Option(
            "--replay-augment/--no-replay-augment",
            help="re-apply train augmentation to replays (default: if the stream augments)",
        ),
    ] = None,
    partition: Annotated[
        str | None,
        typer.Option(
            help="shards | dirichlet | iid, options as name:key=value,... "
            "(e.g. dirichlet:alpha=1,min_size=5; default: the stream's)"
        ),
    ] = None,
    weighting: Annotated[
        str | None, typer.Option(help="aggregation weights: samples | uniform")
    ] = None,
    train_size: Annotated[
        int | None, typer.Option(help="use the first N training examples")
    ] = None,
    test_size: Annotated[int | None, typer.Option(help="use the first N test examples")] = None,
    probe_size: Annotated[
        int | None, typer.Option(help="probe examples per task for memory drift")
    ] = None,
    eval_every_round: Annotated[
        bool | None, typer.Option("--eval-every-round/--eval-task-end", help="evaluation frequency")
    ] = None,
    seed: Annotated[int | None, typer.Option(help="run seed (explicit; default 0)")] = None,
    device: Annotated[str | None, typer.Option(help="auto | cpu | cuda")] = None,
    threads: Annotated[
        int | None, typer.Option(help="CPU threads for torch (default: torch's)")
    ] = None,
    data_root: Annotated[
        str | None, typer.Option(help="folder holding MNIST/raw (torchvision layout)")
    ] = None,
    download: Annotated[
        bool | None, typer.Option("--download/--no-download", help="fetch data with torchvision")
    ] = None,
    out: Annotated[str | None, typer.Option(help="run directory (default: runs/<slug>)")] = None,
    overwrite: Annotated[
        bool | None,
        typer.Option("--overwrite/--no-overwrite", help="replace a finished run in --out"),
    ] = None,
    config: Annotated[str | None, typer.Option(help="YAML file with any of these options")] = None,
) -> None:
    """Run one (protocol, strategy, seed) and print its results table."""
    values = dict(locals())  # first statement: exactly the options
    from cfl_bench.config import make_config
    from cfl_bench.run import execute

    yaml_path = values.pop("config")
    cfg = make_config(values, yaml_path)
    console = Console()
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("rounds"),
        TimeElapsedColumn(),
        TextColumn("{task.fields[acc]}"),
        console=console,
        transient=False,
        disable=not console.is_terminal,
    ) as progress:
        bar = progress.add_task(f"{cfg.stream} · {cfg.strategy}", total=None, acc="")

        def on_round(report: Any) -> None:
            acc = "" if report.latest_acc is None else f"Acc {report.latest_acc:.2f}%"
            progress.update(
                bar,
                total=report.total_rounds,
                completed=report.round_index,
                description=f"task {report.task + 1}",
                acc=acc,
            )

        result = execute(cfg, on_round)
    console.print(
        results_table(result.summary, cfg.stream, str(result.summary.get("strategy", cfg.strategy)))
    )
    status = result.summary.get("status")
    if status != "finished":
        console.print(f"[yellow]run {status}:[/] {result.summary.get('message', '')}")
    console.print(f"results in [bold]{result.path}[/] (config.json, records.csv, summary.json)")


def _fmt(value: object, spec: str = ".2f") -> str:
    return "—" if value is None else format(value, spec)


def human_bytes(n: object) -> str:
    if n is None:
        return "—"
    size = float(n)  # type: ignore[arg-type]
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{size:.1f} {unit}"
        size /= 1000
    return f"{size:.1f} GB"


def results_table(summary: dict[str, Any], stream: str, strategy: str) -> Table:
    """The headline metrics; for class-IL streams one row per accuracy kind — class-IL
    (argmax over all classes) and task-IL (logits masked to the task's classes), one run."""
    table = Table(title=f"{stream} · {strategy}")
    task_il = summary.get("acc_task_il_T") is not None
    if task_il:
        table.add_column("", no_wrap=True)
    for col in ("Acc_T %", "Fgt_T %", "BWT %", "FWT %", "MD_T", "bytes up", "bytes down", "time"):
        table.add_column(col, justify="right")
    label = ["class-IL"] if task_il else []
    table.add_row(
        *label,
        _fmt(summary.get("Acc_T")),
        _fmt(summary.get("Fgt_T")),
        _fmt(summary.get("BWT")),
        _fmt(summary.get("FWT")),
        _fmt(summary.get("MD_T"), ".4f"),
        human_bytes(summary.get("bytes_up_total")),
        human_bytes(summary.get("bytes_down_total")),
        f"{summary.get('wall_time_s', 0.0):.1f} s",
    )
    if task_il:
        table.add_row(
            "task-IL",
            _fmt(summary.get("acc_task_il_T")),
            _fmt(summary.get("fgt_acc_task_il_T")),
            _fmt(summary.get("bwt_acc_task_il")),
            _fmt(summary.get("fwt_acc_task_il")),
            *([""] * 4),
        )
    return table


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
@user_errors
def sweep(
    ctx: typer.Context,
    config: Annotated[
        str | None, typer.Option(help="sweep YAML: out, jobs, base: {...}, grid: {key: [...]}")
    ] = None,
    out: Annotated[str | None, typer.Option(help="sweep folder (one folder per run)")] = None,
    jobs: Annotated[int | None, typer.Option(help="runs in parallel (default 1)")] = None,
    leaderboard: Annotated[
        bool,
        typer.Option(
            "--leaderboard/--no-leaderboard",
            help="end by writing <out>/leaderboard/ (leaderboard.csv + leaderboard.html)",
        ),
    ] = True,
) -> None:
    """Run a grid of runs; any `cfl-bench run` option may be repeated to add grid values
    (--strategy der --strategy fedavg --seed 0 --seed 1), --set KEY=V1,V2 adds several.
    Finished runs are skipped, interrupted or failed ones restarted; exit 1 if any failed.
    Ends with the leaderboard of the sweep's runs in <out>/leaderboard/."""
    from cfl_bench.sweep.command import sweep as run_sweep

    code = run_sweep(config, list(ctx.args), out, jobs, leaderboard=leaderboard)
    if code:
        raise typer.Exit(code)


@app.command("clients")
@user_errors
def clients_cmd(
    run_dir: Annotated[str, typer.Argument(help="a run directory (holds config.json)")],
    task: Annotated[int, typer.Option(help="task number, 1-based")] = 1,
) -> None:
    """Print how many samples of each class every client holds in one task of a run."""
    import json
    from pathlib import Path

    path = Path(run_dir) / "config.json"
    if not path.is_file():
        raise UserError(f"{path} does not exist; pass a run directory written by `cfl-bench run`.")
    record = json.loads(path.read_text())
    tables = record.get("client_class_counts") or {}
    if str(task) not in tables:
        raise UserError(f"the run has no task {task}; choose one of {', '.join(tables) or 'none'}.")
    counts: list[list[int]] = tables[str(task)]
    offsets: list[int] = (record.get("task_clock") or {}).get("offsets") or []
    delays = offsets if any(offsets) else []  # only shown for asynchronous boundaries
    classes = [c for c in range(len(counts[0])) if any(row[c] for row in counts)]
    table = Table(title=f"task {task}: samples per client and class", show_footer=True)
    table.add_column("client", footer="total")
    if delays:
        table.add_column("delay (rounds)", justify="right")
    for c in classes:
        table.add_column(str(c), justify="right", footer=str(sum(row[c] for row in counts)))
    table.add_column("total", justify="right", footer=str(sum(map(sum, counts))))
    for k, row in enumerate(counts):
        delay = [str(delays[k])] if delays else []
        table.add_row(str(k), *delay, *(str(row[c]) for c in classes), str(sum(row)))
    Console().print(table)


@app.command("leaderboard")
@user_errors
def leaderboard_cmd(
    run_dirs: Annotated[
        list[str], typer.Argument(help="run directories, or folders holding them at any depth")
    ],
    out: Annotated[str, typer.Option(help="folder for leaderboard.csv and leaderboard.html")],
    check: Annotated[
        str | None,
        typer.Option(help="targets CSV: metric, target, tolerance, selectors; exit 1 on a miss"),
    ] = None,
) -> None:
    """Aggregate runs into leaderboard.csv + leaderboard.html (mean ± sample std over seeds)."""
    from leaderboard.command import leaderboard_command

    code = leaderboard_command(run_dirs, out, check)
    if code:
        raise typer.Exit(code)


@app.command("list")
@user_errors
def list_cmd(
    what: Annotated[str, typer.Argument(help="streams | strategies | models | partitions")],
) -> None:
    """List streams, strategy components (roles, options, papers), models or partitions."""
    console = Console()
    if what == "streams":
        from streams.registry import AVALANCHE_STREAM_HELP, STREAMS

        table = Table("stream", "default model", "tasks", "partition", "description")
        for info in STREAMS.values():
            table.add_row(
                info.name,
                info.default_model,
                str(info.default_tasks),
                info.default_partition,
                info.description,
            )
        table.add_row(
            "avalanche:package.module:factory", "mlp", "all", "dirichlet", AVALANCHE_STREAM_HELP
        )
    elif what == "strategies":
        print_components(console)
        return
    elif what == "models":
        from cfl_bench.models import MODELS

        table = Table("model", "description")
        for info in MODELS.values():
            table.add_row(info.name, info.description)
    elif what == "partitions":
        from streams.partition import PARTITIONERS

        table = Table("partition", "description")
        for name, text in PARTITIONERS.items():
            table.add_row(name, text)
    else:
        raise UserError(f"cannot list '{what}'; choose streams, strategies, models or partitions.")
    console.print(table)


def print_components(console: Console) -> None:
    """One block per component: name, roles, paper, what it does, every option with its
    default and help — a table would truncate the help text that explains the defaults."""
    from rich.markup import escape

    from strategies.registry import describe_components

    for row in describe_components():
        roles = ", ".join(row["roles"])  # type: ignore[arg-type]
        console.print(f"[bold]{row['name']}[/]  [cyan]{roles}[/]  — {escape(str(row['paper']))}")
        console.print(f"    {escape(str(row['summary']))}")
        for o in row["options"]:  # type: ignore[union-attr]
            default = "auto" if o["default"] is None else o["default"]
            choices = f" (one of {'|'.join(o['choices'])})" if o["choices"] else ""
            console.print(
                f"    [green]{o['name']}[/]={escape(str(default))}  {escape(o['help'])}{choices}"
            )
    console.print(
        "compose with '+', exactly one learner (default fedavg), at most one aggregator: "
        "der+fedgp, der:alpha=0.5+fedgp:gref_samples=all+ifa:mode=random"
    )


def main() -> None:
    """Console-script entry point."""
    try:
        app()
    except KeyboardInterrupt:
        Console(stderr=True).print("[yellow]interrupted[/]")
        sys.exit(130)


if __name__ == "__main__":
    main()
