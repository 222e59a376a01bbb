"""The ``cfl-bench`` command line (typer + rich).

Bad input never shows a traceback: ``UserError`` becomes one red line on stderr and exit
code 2. Every ``run`` option defaults to "not given" so a YAML file (``--config``) can set
it and an explicit flag still wins.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import inspect
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any, ParamSpec, TypeVar, cast

import typer
from rich.console import Console
from rich.table import Table

from cfl_bench.core.errors import RunInterruptedError, UserError
from cfl_bench.run_display import round_display
from cfl_bench.runner.interrupts import print_interrupt, stop_on_sigterm
from cfl_bench.runner.plain_help import PlainTyper

if TYPE_CHECKING:
    from cfl_bench.core.metric_registry import MetricSpec
    from cfl_bench.runner.config import RunConfig

app = PlainTyper(
    add_completion=False,
    pretty_exceptions_enable=False,
    no_args_is_help=True,
    # Click's plain help (PlainTyper) wraps long help text instead of cutting it at 80 columns.
    help="cfl-bench: continual federated learning benchmarks.",
)

P = ParamSpec("P")
R = TypeVar("R")

#: The exit code when stdout closed under a command (``cfl-bench run … | head``): 128 +
#: SIGPIPE, what a shell reports for ``yes | head``, so scripts with ``set -o pipefail`` read
#: it as the usual "the reader stopped early" and not as a failed run (1) or bad input (2).
OUTPUT_CLOSED = 141


class OutputClosedError(Exception):
    """stdout closed under a command (its pipe's reader exited); ``str()`` says what the
    command kept and how to go on."""


def user_errors(fn: Callable[P, R]) -> Callable[P, R]:
    """Turn UserError into one clear line and exit code 2, an interrupt that says what it
    kept into that line and exit code 130, a closed stdout into a line on stderr and exit
    code 141 (``OUTPUT_CLOSED``; Click would exit 1 in silence)."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except UserError as exc:
            print_error(str(exc))
            raise typer.Exit(2) from None
        except RunInterruptedError as exc:
            print_interrupt(str(exc))
            raise typer.Exit(130) from None
        except OutputClosedError as exc:
            output_closed(str(exc))
            raise typer.Exit(OUTPUT_CLOSED) from None
        except (BrokenPipeError, SystemExit) as exc:
            if not is_closed_output(exc):
                raise
            output_closed(CLOSED_LINES.get(fn.__name__, CLOSED_LINES[""]))
            raise typer.Exit(OUTPUT_CLOSED) from None

    return wrapper


def is_closed_output(exc: BaseException) -> bool:
    """``exc`` is stdout closing: a BrokenPipeError, or the SystemExit(1) that Click or rich
    raise while handling one (rich's ``Console.on_broken_pipe`` has already pointed stdout
    at /dev/null) — and stdout is indeed gone. Why check: a BrokenPipeError can also come
    from a pipe to a child process, and that is not the user's ``| head``."""
    if isinstance(exc, SystemExit):
        if exc.code != 1 or not isinstance(exc.__context__, BrokenPipeError):
            return False
    elif not isinstance(exc, BrokenPipeError):
        return False
    return stdout_is_gone()


def stdout_is_gone() -> bool:
    """Whether stdout is a pipe whose reader exited (poll reports an error on its write
    end), or /dev/null put there by rich after one."""
    import select

    try:
        fd = sys.__stdout__.fileno() if sys.__stdout__ is not None else 1
        if os.path.samestat(os.fstat(fd), os.stat(os.devnull)):
            return True
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))
    except (OSError, ValueError, AttributeError):
        return False


#: What a command whose stdout closed says it did, by the command's function name.
CLOSED_LINES = {
    "sweep": "the sweep stopped (a running point keeps its last checkpoint); rerun the same "
    "command to resume it (finished points are skipped), with its output to a file "
    "(> sweep.txt) to see all of it",
    "": "the command stopped; rerun it with its output to a file (> out.txt) to see all of it",
}


def output_closed(what: str) -> None:
    """Say on stderr that stdout closed and ``what`` follows, in one line, and send what is
    left of stdout to /dev/null: Python's own flush at exit would otherwise print a
    BrokenPipeError of its own. When stderr is closed too, nothing can be said."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    with contextlib.suppress(OSError, ValueError):
        print_error(f"stdout closed (the pipe's reader exited, e.g. `| head`): {what}.")


def run_parameters() -> list[inspect.Parameter]:
    """The options of `cfl-bench run`, generated from the RunConfig declarations.

    Every option defaults to "not given" (None) so a YAML file (``--config``) can set it and
    an explicit flag still wins; ``--help`` shows the real default. Values arrive as text and
    are parsed by ``cfl_bench.runner.config.parse_text`` — the same strict parser the sweep uses —
    so ``--lr inf`` and ``--clients 2.5`` get the same sentence everywhere.
    """
    from cfl_bench.runner.config import RunConfig, flag_name, option_kind, option_specs

    defaults = RunConfig()
    params = []
    for name, spec in option_specs().items():
        kind, _ = option_kind(name)
        default = getattr(defaults, name)
        shown = spec.default_text or (
            str(default).lower() if isinstance(default, bool) else str(default)
        )
        text = f"{spec.help} [default: {shown}]"
        if kind is bool:
            off = spec.flag_off or f"no-{name.replace('_', '-')}"
            info = typer.Option(f"{flag_name(name)}/--{off}", help=text, show_default=False)
            annotation: Any = Annotated[bool | None, info]
        else:
            metavar = "|".join(spec.choices) if spec.choices else METAVARS.get(kind, "TEXT")
            info = typer.Option(flag_name(name), help=text, show_default=False, metavar=metavar)
            annotation = Annotated[str | None, info]
        params.append(inspect.Parameter(name, KEYWORD, default=None, annotation=annotation))
    config_info = typer.Option(
        "--config", help="YAML file with any of these options", metavar="FILE"
    )
    params.append(
        inspect.Parameter(
            "config", KEYWORD, default=None, annotation=Annotated[str | None, config_info]
        )
    )
    return params


KEYWORD = inspect.Parameter.KEYWORD_ONLY
METAVARS: dict[type, str] = {int: "INTEGER", float: "NUMBER", str: "TEXT"}


def run(**values: Any) -> None:
    """Run one (protocol, strategy, seed) and print its results.

    Rerunning the same command into an unfinished run directory resumes it from its last
    checkpoint (--restart starts over); Ctrl-C stops it with exit code 130.
    """
    from cfl_bench.runner.config import make_config

    yaml_path = values.pop("config")
    cfg = make_config(values, yaml_path)
    check_names(cfg)
    if cfg.out:
        from cfl_bench.core.run_dir import RunDirectory

        RunDirectory(cfg.out).precheck_owner()  # before torch: a refusal in a fraction of a second
    console = Console()
    try:
        with stop_on_sigterm():
            # The engine (torch, pandas) only once every name and number is known to be good.
            from cfl_bench.runner.run import execute

            with round_display(console, f"{cfg.stream} · {cfg.strategy}") as on_round:
                result = execute(
                    cfg,
                    on_round,
                    notify=lambda text: console.print(text, highlight=False),
                    started=lambda path: console.print(f"run folder: {path}", highlight=False),
                )
    except RunInterruptedError:
        raise
    except KeyboardInterrupt:
        # Before the run directory was claimed: loading torch, the data or the model.
        raise RunInterruptedError(BEFORE_ROUND_ONE) from None
    except (BrokenPipeError, SystemExit) as exc:
        if not is_closed_output(exc):
            raise
        raise OutputClosedError(stopped_run_line(run_folder(cfg))) from None
    try:
        print_run_result(console, result, cfg)
    except (BrokenPipeError, SystemExit) as exc:
        if not is_closed_output(exc):
            raise
        raise OutputClosedError(
            f"the run finished; its results are in '{run_folder(cfg)}'"
        ) from None


def run_folder(cfg: RunConfig) -> str:
    """The run's directory: ``--out``, else the default name the run plan gives it (without
    --out, ``cfg.out`` is None)."""
    from cfl_bench.runner.plan import default_out

    return cfg.out or str(default_out(cfg))


def print_run_result(console: Console, result: Any, cfg: RunConfig) -> None:
    """The finished run's results table and where its files are."""
    strategy = str(result.summary.get("strategy", cfg.strategy))
    console.print(results_table(result.summary, cfg.stream, strategy))
    not_scored = result.summary.get("global_not_scored")
    if not_scored:
        console.print(
            f"accuracies are the mean over clients of each client's own model on its own "
            f"tasks, not the global model's: {not_scored}",
            highlight=False,
        )
    status = result.summary.get("status")
    if status != "finished":
        console.print(f"[yellow]run {status}:[/] {result.summary.get('message', '')}")
    console.print(f"results in [bold]{result.path}[/] (config.json, records.csv, summary.json)")


def stopped_run_line(out: str) -> str:
    """What a run whose stdout closed kept, and how to go on: the run stops at the first
    line it cannot print (it cannot tell that nobody reads), keeping its last checkpoint as
    after Ctrl-C, so the same command resumes it."""
    from pathlib import Path

    from cfl_bench.core.run_dir import CHECKPOINT

    if (Path(out) / CHECKPOINT).is_file():
        kept = f"the run stopped and keeps its last checkpoint in '{out}'"
        again = "rerun the same command to resume it"
    else:
        kept, again = "the run stopped before its first checkpoint", "rerun the same command"
    return f"{kept}; {again}, with its output to a file (> run.txt) or a terminal"


BEFORE_ROUND_ONE = (
    "interrupted before round 1 (loading the data and the model); nothing was written; rerun "
    "the same command to start (or resume) the run"
)


def check_names(config: RunConfig) -> None:
    """Refuse what ``cfl_bench.runner.plan.plan_run`` would refuse from names alone: the strategy,
    stream and model names in its order, a stream's missing ``--data-root``, the partition.

    Why here: the engine imports torch, which takes seconds, and a misspelled name or a
    forgotten --data-root should be answered at once. Every check here is torch-free.
    """
    from cfl_bench.runner.model_catalogue import check_model_name
    from cfl_bench.runner.run_checks import check_diagnostics, check_option_pairs
    from cfl_bench.strategies.compose import validate_strategy
    from cfl_bench.streams.catalogue import require_data_root, stream_info
    from cfl_bench.streams.partition_spec import parse_partition_spec

    validate_strategy(config.strategy)
    check_diagnostics(config)
    info = stream_info(config.stream)
    check_option_pairs(config)
    check_model_name(config.model or info.default_model)
    require_data_root(config.stream, config.data_root, bool(config.download))
    parse_partition_spec(config.partition or info.default_partition)


def _install_run_command() -> None:
    params = run_parameters()
    # typer reads the signature inspect reports; functions do not declare __signature__
    run.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    run.__annotations__ = {p.name: p.annotation for p in params}
    app.command("run")(user_errors(run))


_install_run_command()

flower_app = PlainTyper(
    no_args_is_help=True,
    help="Flower deployment: the app for SuperNodes.",
)


def flower_app_cmd(app_dir: str, **values: Any) -> None:
    """Write the Flower app folder that runs this run on a Flower deployment.

    Takes every `cfl-bench run` option (--executor is flower). Then start one
    flower-superlink, one flower-supernode per client with --node-config partition-id=K
    (K = 0..clients-1), and `flwr run APP_DIR <connection>`; the records are written to
    --out on the SuperLink's machine (docs/executors.md, "Flower deployment").
    """
    from pathlib import Path

    from cfl_bench.runner.config import make_config

    check_app_dir(app_dir)
    yaml_path = values.pop("config")
    cfg = make_config(values, yaml_path)
    check_names(cfg)
    from cfl_bench.flower import require_flwr
    from cfl_bench.flower.launch import write_deploy_app

    require_flwr()
    folder = write_deploy_app(cfg, Path(app_dir))
    print(f"Flower app in {folder} ({cfg.clients} clients: partition-id=0..{cfg.clients - 1})")


def check_app_dir(app_dir: str) -> None:
    """Refuse an --app-dir that cannot become the app folder: empty (it would mean the
    current folder), not a folder, not UTF-8 text without control characters, or a
    cfl-bench run directory or a folder inside one (only `cfl-bench run` writes there)."""
    from pathlib import Path

    from cfl_bench.core.atomic import path_kind
    from cfl_bench.runner.config import check_folder_text

    check_folder_text("--app-dir", app_dir, "the Flower app (a new one)")
    from cfl_bench.core.run_dir import refuse_run_directory

    path = Path(app_dir)
    if path.exists() and not path.is_dir():
        raise UserError(
            f"--app-dir '{app_dir}' is {path_kind(path)}, not a folder; give a new folder for "
            f"the Flower app."
        )
    refuse_run_directory(path, "--app-dir", "the Flower app's files")


def _install_flower_commands() -> None:
    """`cfl-bench flower app --app-dir DIR <run options>`."""
    info = typer.Option("--app-dir", help="folder to write the Flower app into (new or empty)")
    app_param = inspect.Parameter("app_dir", KEYWORD, annotation=Annotated[str, info])
    params = [app_param, *run_parameters()]
    # typer reads the signature inspect reports; functions do not declare __signature__
    flower_app_cmd.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    flower_app_cmd.__annotations__ = {p.name: p.annotation for p in params}
    flower_app.command("app")(user_errors(flower_app_cmd))
    flower_app.command("node")(user_errors(flower_node_cmd))
    app.add_typer(flower_app, name="flower")


def flower_node_cmd(
    superlink: Annotated[str, typer.Option(help="the SuperLink's address, HOST:PORT")],
    partition_id: Annotated[int, typer.Option(help="the client this node plays, 0..clients-1")],
    socket: Annotated[
        str | None, typer.Option(help="the worker's local socket (default: a private temp file)")
    ] = None,
    port: Annotated[
        int | None, typer.Option(help="the SuperNode's runtime API port (default: a free one)")
    ] = None,
    root_certificates: Annotated[
        str | None, typer.Option(help="TLS root certificates of the SuperLink (default: insecure)")
    ] = None,
) -> None:
    """Run one Flower SuperNode with its long-lived worker (torch, the node's data and its
    client's state stay loaded across messages), for a deployment of `cfl-bench flower app`.

    Start one per client (--partition-id K for K = 0..clients-1); a worker that dies is
    restarted; Ctrl-C stops both (docs/executors.md, "Flower deployment")."""
    from cfl_bench.flower import require_flwr
    from cfl_bench.flower.node import run_node

    require_flwr()
    code = run_node(superlink, partition_id, socket, port, root_certificates)
    raise typer.Exit(code)


_install_flower_commands()


def _fmt(value: object, spec: str = ".2f") -> str:
    return "—" if value is None else format(value, spec)


def human_bytes(n: float | None) -> str:
    if n is None:
        return "—"
    size = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{size:.1f} {unit}"
        size /= 1000
    return f"{size:.1f} GB"


def cli_value(spec: MetricSpec, summary: dict[str, Any]) -> str:
    """One value as the CLI table shows it, by the metric's unit and format.

    A run always writes its wall time; a summary without the key shows 0.0 s as the table
    always did (a None shows "—")."""
    if spec.unit == "seconds":
        value = summary.get(spec.key, 0.0)
        return "—" if value is None else f"{format(value, spec.fmt)} s"
    if spec.unit == "bytes":
        return human_bytes(summary.get(spec.key))
    return _fmt(summary.get(spec.key), spec.fmt)


def results_table(summary: dict[str, Any], stream: str, strategy: str) -> Table:
    """The headline metrics of one run, one metric per line (the registry's ``cli`` view).

    Why stacked: one row of eight metrics needed more than 80 columns and rich cut the
    numbers (``-10.…``); a line per metric is about 40 columns wide whatever the values, so
    nothing is ever cut. On class-IL streams the accuracy metrics have a second value
    column, task-IL (logits masked to the task's classes) beside class-IL (argmax over all
    classes); memory drift, bytes and time belong to the run and fill the first column only.
    """
    from cfl_bench.core.metric_registry import TASK_IL_MARKER, task_il_twin, view

    task_il = summary.get(TASK_IL_MARKER) is not None
    table = Table(title=f"{stream} · {strategy}")
    table.add_column("metric", overflow="fold")
    for name in ("class-IL", "task-IL") if task_il else ("value",):
        table.add_column(name, justify="right", overflow="fold")
    for spec in view("cli"):
        if spec.scenarios is not None and summary.get(spec.key) is None:
            continue  # a scenario's own metric (the test town's mAP) on another stream
        cells = [cli_value(spec, summary)]
        if task_il:
            twin = task_il_twin(spec.key)
            cells.append("" if twin is None else cli_value(twin, summary))
        table.add_row(spec.narrow_label, *cells)
    if summary.get("map50_T") is not None:  # a detection stream: the headline is mAP@0.5
        table.add_row("mAP@[.5:.95] %", _fmt(summary.get("map_T")))
        table.caption = "detection stream: Acc, Fgt, BWT and FWT are of mAP@0.5 (%)"
    return table


# Where a sweep's points run (`cfl-bench sweep`): declared apart so the command reads in
# one screen.
BackendOption = Annotated[
    str,
    typer.Option(
        help="where the points run: local (this machine, --jobs at a time) or ray (one "
        "Ray task per point; the sweep folder on a file system all nodes share; see "
        "the README's Sweeps section)"
    ),
]
AddressOption = Annotated[
    str | None,
    typer.Option(help="--backend ray: the cluster (default: RAY_ADDRESS, else a local one)"),
]
CpusPerRunOption = Annotated[
    int | None,
    typer.Option(
        help="--backend ray or --slurm-script: CPUs per point, also its torch threads (default 1)"
    ),
]
GpusPerRunOption = Annotated[
    float | None, typer.Option(help="--backend ray: GPUs per point, may be a fraction")
]
SlurmScriptOption = Annotated[
    str | None,
    typer.Option(
        help="write the pending points as a Slurm job array script (submit it with "
        "sbatch; --jobs caps the tasks at once) instead of running them; the sweep "
        "folder on a file system all nodes share; see the README's Sweeps section"
    ),
]


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
            help="end by writing <out>/leaderboard/ (leaderboard.csv + leaderboard.html) "
            "[default: --leaderboard]",
            show_default=False,
        ),
    ] = True,
    backend: BackendOption = "local",
    address: AddressOption = None,
    cpus_per_run: CpusPerRunOption = None,
    gpus_per_run: GpusPerRunOption = None,
    slurm_script: SlurmScriptOption = None,
) -> None:
    """Run a grid of runs, then write their leaderboard.

    Any `cfl-bench run` option may be repeated to add grid values
    (--strategy der --strategy fedavg --seed 0 --seed 1), --set KEY=V1,V2 adds several.
    Finished runs are skipped, interrupted ones resume from their last checkpoint, failed
    ones run again; exit 1 if any failed.
    Ends with the leaderboard of the sweep's runs in <out>/leaderboard/.
    With --slurm-script FILE, writes a Slurm job array of the points still to run instead;
    after it ran, the same command without --slurm-script skips them and writes the
    summary."""
    from cfl_bench.sweeps.command import Placement
    from cfl_bench.sweeps.command import sweep as run_sweep

    placement = Placement(backend, address, cpus_per_run, gpus_per_run, slurm_script)
    code = run_sweep(
        config, list(ctx.args), out, jobs, leaderboard=leaderboard, placement=placement
    )
    if code:
        raise typer.Exit(code)


@app.command("clients")
@user_errors
def clients_cmd(
    run_dir: Annotated[str, typer.Argument(help="a run directory (holds config.json)")],
    task: Annotated[int, typer.Option(help="task number, 1-based")] = 1,
) -> None:
    """Print a run's samples per client and class in one task.

    How many samples of each class every client holds in that task (and each client's
    delay under --async-shift; under --arrivals, which task's data it trains on; under
    --task-order per-client, the task each client trains at that step)."""
    tables, offsets, arrivals, orders = read_class_tables(run_dir)
    if str(task) not in tables:
        raise UserError(f"the run has no task {task}; choose one of {', '.join(tables) or 'none'}.")
    counts = tables[str(task)]
    extra: tuple[str, list[str]] | None = None
    if any(offsets):  # only shown for asynchronous boundaries
        extra = ("delay", [str(o) for o in offsets])
    if arrivals:
        counts, holds = arrival_holdings(tables, arrivals, task)
        extra = ("holds", holds)
    if orders:  # step ``task``: each client's row of its own task then
        counts = [tables[str(o[task - 1])][k] for k, o in enumerate(orders)]
        extra = ("trains", [f"task {o[task - 1]}" for o in orders])
    classes = [c for c in range(len(counts[0])) if any(row[c] for row in counts)]
    console = Console()
    blocks = class_blocks(console, classes, counts, extra)
    for block in blocks:
        part = f" (classes {block[0]}-{block[-1]})" if len(blocks) > 1 else ""
        what = f"step {task}" if orders else f"task {task}"
        title = f"{what}: samples per client and class{part}"
        console.print(class_table(title, block, counts, extra))


def arrival_holdings(
    tables: dict[str, list[list[int]]], arrivals: list[list[int]], task: int
) -> tuple[list[list[int]], list[str]]:
    """Under --arrivals, what each client trains on during ``task`` (1-based): its row of
    the last task it received (a keeper's older part), and which task that is — "task s
    (kept)" for a keeper, "not there" before it joins. ``arrivals``: each task's receivers.

    Why not the task's own table: it shows a keeper as holding nothing, while it trains."""
    width = len(tables[str(task)][0])
    counts, holds = [], []
    for k in range(len(tables[str(task)])):
        held = next((t for t in range(task - 1, -1, -1) if k in arrivals[t]), None)
        if held is None:
            counts.append([0] * width)
            holds.append("not there")
            continue
        counts.append(tables[str(held + 1)][k])
        holds.append(f"task {held + 1}" + (" (kept)" if held != task - 1 else ""))
    return counts, holds


def class_blocks(
    console: Console,
    classes: list[int],
    counts: list[list[int]],
    extra: tuple[str, list[str]] | None,
) -> list[list[int]]:
    """``classes`` in consecutive blocks whose tables fit the console's width, so no count
    is ever cut (at 80 columns the ten MNIST classes fit one table; CIFAR-100's take
    several); the client, delay and total columns repeat in every block."""
    from rich.measure import Measurement

    unbounded = console.options.update(width=1_000_000)  # measure, do not clamp to the width

    def fits(block: list[int]) -> bool:
        table = class_table("", block, counts, extra)
        return Measurement.get(console, unbounded, table).maximum <= console.width

    blocks: list[list[int]] = [[]]
    for c in classes:
        if blocks[-1] and not fits([*blocks[-1], c]):
            blocks.append([])
        blocks[-1].append(c)
    return blocks


def class_table(
    title: str,
    classes: list[int],
    counts: list[list[int]],
    extra: tuple[str, list[str]] | None,
) -> Table:
    """One block of the clients × classes table: borderless, one space between columns,
    numbers never wrapped or cut; ``extra``: a column after the client's (its delay under
    --async-shift, the task it trains on under --arrivals)."""
    from rich import box

    table = Table(
        title=title,
        show_footer=True,
        box=box.SIMPLE_HEAD,
        padding=(0, 0, 0, 1),
        pad_edge=False,
        show_edge=False,
    )
    table.add_column("client", footer="total", no_wrap=True)
    if extra is not None:
        table.add_column(extra[0], justify="right", no_wrap=True)
    for c in classes:
        total = str(sum(row[c] for row in counts))
        table.add_column(str(c), justify="right", footer=total, no_wrap=True)
    table.add_column("total", justify="right", footer=str(sum(map(sum, counts))), no_wrap=True)
    for k, row in enumerate(counts):
        shown = [extra[1][k]] if extra is not None else []
        table.add_row(str(k), *shown, *(str(row[c]) for c in classes), str(sum(row)))
    return table


def read_class_tables(
    run_dir: str,
) -> tuple[dict[str, list[list[int]]], list[int], list[list[int]], list[list[int]]]:
    """The per-task client × class tables, the clients' task offsets, (under --arrivals)
    each task's receivers and (under --task-order per-client) each client's tasks (1-based)
    in its order, of a run's config.json, checked: a damaged directory gets one sentence,
    not a traceback."""
    import json
    import os
    from pathlib import Path

    folder = Path(run_dir)
    path = folder / "config.json"
    if folder.exists() and not folder.is_dir():
        raise UserError(f"'{folder}' is a file; pass a run directory written by `cfl-bench run`.")
    if folder.is_dir() and any(
        os.path.lexists(folder / n) for n in ("config.json", "summary.json")
    ):
        refuse_damaged(run_dir)  # first, so a damaged run gets the reason every command gives
    if path.exists() and not path.is_file():
        raise UserError(f"{path} is not a file; the run directory is damaged, so rerun that run.")
    if not path.is_file():
        raise UserError(f"{path} does not exist; pass a run directory written by `cfl-bench run`.")
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise UserError(
            f"{path} cannot be read as JSON ({type(exc).__name__}); the run directory is damaged, "
            f"so rerun that run."
        ) from None
    damaged = UserError(
        f"{path} has no valid client × class table; it was not written by this version of "
        f"`cfl-bench run` or is damaged, so rerun that run."
    )
    tables = record.get("client_class_counts") if isinstance(record, dict) else None
    if not isinstance(tables, dict) or not all(is_count_table(t) for t in tables.values()):
        raise damaged
    clock = record.get("task_clock") or {}
    offsets = clock.get("offsets") if isinstance(clock, dict) else None
    offsets = offsets or []
    if not isinstance(offsets, list) or not all(type(o) is int for o in offsets):
        raise damaged
    sizes = {len(t) for t in tables.values()}
    if offsets and sizes != {len(offsets)}:
        raise damaged
    arrivals = arrival_receivers(record.get("arrivals"), len(tables))
    if arrivals is None:
        raise damaged
    orders = record.get("task_orders") or []
    permutation = sorted(int(t) for t in tables)
    if not isinstance(orders, list) or not all(
        isinstance(o, list) and all(type(t) is int for t in o) and sorted(o) == permutation
        for o in orders
    ):
        raise damaged
    if orders and sizes != {len(orders)}:
        raise damaged
    refuse_damaged(run_dir)
    return tables, offsets, arrivals, orders


def arrival_receivers(entry: object, num_tasks: int) -> list[list[int]] | None:
    """Each task's receivers from config.json → ``arrivals`` ([] for a run without
    --arrivals), or None when the entry is not what `cfl-bench run` writes."""
    if entry is None:
        return []
    if not isinstance(entry, list) or len(entry) != num_tasks:
        return None
    receivers = [e.get("receivers") if isinstance(e, dict) else None for e in entry]
    if not all(isinstance(r, list) and all(type(k) is int for k in r) for r in receivers):
        return None
    return receivers  # type: ignore[return-value]


def refuse_damaged(run_dir: str) -> None:
    """Refuse a run that the reader of run directories finds damaged (a records.csv with
    garbage, a NaN, a line cut in half ...), in the words ``report`` uses: every command
    gives one verdict on a run (:mod:`cfl_bench.core.run_reader`)."""
    from pathlib import Path

    from cfl_bench.core.run_reader import DAMAGED, read_run

    reading = read_run(Path(run_dir))
    if reading.status == DAMAGED:
        raise UserError(
            f"run directory '{run_dir}' is damaged: {reading.reason}; re-run that run or pass "
            f"another run directory."
        )


def is_count_table(table: object) -> bool:
    """A non-empty K × C list of lists of non-negative ints with equal row lengths."""
    if not isinstance(table, list) or not table:
        return False
    widths = {len(row) if isinstance(row, list) else -1 for row in table}
    if len(widths) != 1 or widths == {-1} or widths == {0}:
        return False
    return all(type(v) is int and v >= 0 for row in table for v in row)


@app.command("leaderboard")
@user_errors
def leaderboard_cmd(
    run_dirs: Annotated[
        list[str], typer.Argument(help="run directories, or folders holding them at any depth")
    ],
    out: Annotated[
        str | None,
        typer.Option(
            help="folder for leaderboard.csv and leaderboard.html "
            "[default: <first RUN_DIR>/leaderboard]"
        ),
    ] = None,
    check: Annotated[
        str | None,
        typer.Option(help="targets CSV: metric, target, tolerance, selectors; exit 1 on a miss"),
    ] = None,
    std: Annotated[
        str,
        typer.Option(
            help="std shown after ±: sample (ddof=1) or population (ddof=0, np.std as in FedGP)"
        ),
    ] = "sample",
    target: Annotated[
        float | None,
        typer.Option(
            help="accuracy in % (0-100]: add the rounds and bytes each run needed to reach it "
            "(average accuracy over the tasks seen so far, evaluated rounds only)"
        ),
    ] = None,
) -> None:
    """Aggregate runs into leaderboard.csv and leaderboard.html.

    One row per (protocol, strategy): mean ± std over seeds (sample by default, --std
    population for ddof=0), a 95 % confidence interval, and which rows are statistically
    indistinguishable from the best (t-test by seed, Holm-corrected). Without --out the
    files go to <first RUN_DIR>/leaderboard/."""
    from cfl_bench.leaderboard.command import leaderboard_command

    code = leaderboard_command(run_dirs, out, check, std=std, target=target)
    if code:
        raise typer.Exit(code)


@app.command("report")
@user_errors
def report_cmd(
    run_dir: Annotated[
        str, typer.Argument(help="a run directory (holds config.json and records.csv)")
    ],
    out: Annotated[
        str | None,
        typer.Option(help="the HTML file to write [default: RUN_DIR/report.html]"),
    ] = None,
) -> None:
    """Write one run's self-contained HTML report.

    For a single run, finished or not: curves, accuracy matrix, memory drift, per-round loss
    and bytes, clients, configuration."""
    from cfl_bench.leaderboard.report import report_command

    report_command(run_dir, out)


@app.command("reproduce")
@user_errors
def reproduce_cmd(
    name: Annotated[str, typer.Argument(help="a table (see `cfl-bench reproduce list`), or list")],
    scale: Annotated[
        str | None, typer.Option(help="smoke | cpu | paper (with --shipped: default cpu)")
    ] = None,
    data_root: Annotated[str | None, typer.Option(help="folder holding the datasets")] = None,
    jobs: Annotated[int, typer.Option(min=1, help="runs in parallel")] = 1,
    device: Annotated[str | None, typer.Option(help="cpu | cuda | auto (the runs' device)")] = None,
    executor: Annotated[
        str | None, typer.Option(help="sequential | vectorized (the runs' executor)")
    ] = None,
    out: Annotated[
        str | None,
        typer.Option(
            help="run folder [default: runs/reproduce/NAME/SCALE]; with --shipped or "
            "--compare: the report's folder"
        ),
    ] = None,
    compare: Annotated[
        str | None, typer.Option(help="judge your runs in this folder (no runs are started)")
    ] = None,
    shipped: Annotated[
        bool, typer.Option("--shipped", help="report the results shipped in the repository")
    ] = False,
    ship: Annotated[
        bool, typer.Option("--ship", help="copy the finished runs into reproductions/results/")
    ] = False,
    row: Annotated[
        list[str] | None, typer.Option(help="run only this row (its label; repeatable)")
    ] = None,
    column: Annotated[
        list[str] | None, typer.Option(help="run only this column (its label; repeatable)")
    ] = None,
    seed: Annotated[
        list[int] | None, typer.Option(help="run only this seed of the scale (repeatable)")
    ] = None,
) -> None:
    """Rerun a paper's table and judge each cell against the paper.

    `reproduce list` shows the tables and their cost at each scale. `reproduce NAME --scale
    cpu --data-root DATA --jobs 2` runs the table (resumable like a sweep) and writes
    report.html/.csv/.md in <out>/reproduction/NAME/: per cell the paper's value, ours over the
    seeds, and a verdict (within noise, same direction, differs). --row, --column and --seed
    run part of the table (e.g. one column on a GPU); the report still lists every cell."""
    from cfl_bench.reproduce.command import Request, reproduce

    request = Request(
        name, scale, data_root, jobs, device, executor, out, compare, shipped, ship,
        rows=tuple(row or ()), columns=tuple(column or ()), seeds=tuple(seed or ()),
    )  # fmt: skip
    code = reproduce(request)
    if code:
        raise typer.Exit(code)


def _install_carla_commands() -> None:
    """`cfl-bench carla demo|record` (their module imports the bridge only when called)."""
    from cfl_bench.carla_cli import carla_app

    app.add_typer(carla_app, name="carla")


_install_carla_commands()


def _install_pilot_commands() -> None:
    """`cfl-bench pilot boundary` (torch, scikit-learn and matplotlib load only when called)."""
    from cfl_bench.pilot.cli import install

    install(app, user_errors)


_install_pilot_commands()


@app.command("list")
@user_errors
def list_cmd(
    what: Annotated[str, typer.Argument(help="streams | strategies | models | partitions")],
) -> None:
    """List streams, strategy components, models or partitions."""
    console = Console()
    if what == "streams":
        print_streams(console)
        return
    if what == "strategies":
        print_components(console)
        return
    if what == "models":
        from cfl_bench.runner.model_catalogue import MODEL_DESCRIPTIONS

        table = listing_table("model", "description")
        for name, description in MODEL_DESCRIPTIONS.items():
            table.add_row(name, description)
    elif what == "partitions":
        from cfl_bench.streams.partition_spec import PARTITIONERS

        table = listing_table("partition", "description")
        for name, text in PARTITIONERS.items():
            table.add_row(name, text)
    else:
        raise UserError(f"cannot list '{what}'; choose streams, strategies, models or partitions.")
    console.print(table)


def listing_table(*headers: str) -> Table:
    """A listing whose cells wrap, and fold a word longer than their column, instead of
    ending in "…": a listing is read for its text, at any terminal width."""
    table = Table()
    for header in headers:
        table.add_column(header, overflow="fold")
    return table


def print_streams(console: Console) -> None:
    """One block per stream: name and description, its defaults, and the data it needs and
    where it goes under --data-root. Blocks rather than a table: six columns at 80 columns
    left the descriptions a word per line."""
    from rich.markup import escape
    from rich.padding import Padding

    from cfl_bench.streams.catalogue import AVALANCHE_FORM, AVALANCHE_STREAM_HELP, STREAMS

    def block(name: str, description: str, defaults: str, data: str) -> None:
        console.print(f"[bold]{escape(name)}[/]", highlight=False)
        for line in (description, f"defaults: {defaults}", f"data: {data}"):
            console.print(Padding(escape(line), (0, 0, 0, 4), expand=False), highlight=False)

    for info in STREAMS.values():
        block(
            info.name,
            info.description,
            f"model {info.default_model}, {info.default_tasks} tasks, "
            f"partition {info.default_partition}",
            info.data_line(),
        )
    block(
        AVALANCHE_FORM,
        AVALANCHE_STREAM_HELP,
        "model mlp, all its experiences, partition dirichlet",
        "the benchmark's own (--data-root is its dataset_root when the factory takes one)",
    )


def print_components(console: Console) -> None:
    """One block per component: name, roles, paper, what it does, every option with its
    default and help — a table would truncate the help text that explains the defaults.

    Why grids: at 80 columns the option help wraps, and a wrapped line that starts at
    column 0 reads as a new entry; in a grid the wrapped text stays in its column under the
    help it continues (a hanging indent).
    """
    from rich.markup import escape
    from rich.padding import Padding

    from cfl_bench.strategies.registry import describe_components

    for row in describe_components():
        # describe_components() types its rows dict[str, object]; these two fields are a
        # list of role names and a list of option rows (strategies/registry.py)
        roles = ", ".join(cast("list[str]", row["roles"]))
        head = Table.grid(padding=(0, 2))
        head.add_column(no_wrap=True)
        head.add_column(overflow="fold")
        origin = f" · plugin {row['plugin']}" if row["plugin"] else ""
        paper = escape(f"{row['paper'] or 'no paper given'}{origin}")
        head.add_row(f"[bold]{row['name']}[/]  [cyan]{roles}[/]", f"— {paper}")
        console.print(head)
        console.print(
            Padding(escape(str(row["summary"])), (0, 0, 0, 4), expand=False), highlight=False
        )
        options = Table.grid(padding=(0, 2))
        options.add_column(no_wrap=True)
        options.add_column(overflow="fold")
        for o in cast("list[dict[str, Any]]", row["options"]):
            default = "auto" if o["default"] is None else o["default"]
            choices = f" (one of {'|'.join(o['choices'])})" if o["choices"] else ""
            options.add_row(
                f"[green]{o['name']}[/]={escape(str(default))}", escape(o["help"] + choices)
            )
        if options.row_count:
            console.print(Padding(options, (0, 0, 0, 4), expand=False), highlight=False)
    console.print(
        "compose with '+', exactly one learner (default fedavg), at most one aggregator: "
        "der+fedgp, der:alpha=0.5+fedgp:gref_samples=all+ifa:mode=random",
        highlight=False,
    )


def click_exceptions() -> tuple[type[Exception], type[Exception] | None, type[Exception]]:
    """(UsageError, NoArgsIsHelpError, Abort) of the Click that typer runs on: recent typer
    vendors Click as ``typer._click``, older ones use the ``click`` package. Imported by
    name: which of the two exists depends on the installed typer, so neither is typed here."""
    import importlib

    try:
        exceptions = importlib.import_module("typer._click.exceptions")
        abort = importlib.import_module("typer.exceptions").Abort
    except ImportError:  # an older typer (the locked 0.20.1): the click package
        exceptions = importlib.import_module("click.exceptions")
        abort = exceptions.Abort
    return exceptions.UsageError, getattr(exceptions, "NoArgsIsHelpError", None), abort


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point: Click's usage errors become one line and exit code 2,
    like every other bad input; Ctrl-C exits 130; a closed stdout, one line and 141."""
    usage_error, no_args, abort = click_exceptions()
    args = sys.argv[1:] if argv is None else argv
    command = typer.main.get_command(app)
    try:
        refuse_repeated_options(args)
        with stop_on_sigterm():
            code = command.main(args=args, prog_name="cfl-bench", standalone_mode=False)
    except UserError as exc:
        print_error(str(exc))
        code = 2
    except usage_error as exc:
        if no_args is not None and isinstance(exc, no_args):
            ctx = getattr(exc, "ctx", None)  # a Click NoArgsIsHelpError has one
            print(ctx.get_help() if ctx else "")
            code = 0
        else:
            print_error(usage_sentence(exc, args))
            code = 2
    except RunInterruptedError as exc:
        print_interrupt(str(exc))
        code = 130
    except (KeyboardInterrupt, abort):
        print_interrupt("interrupted")
        code = 130
    except SystemExit as exc:  # Click's or rich's exit on a closed stdout, in any command
        if not is_closed_output(exc):
            raise
        output_closed(CLOSED_LINES[""])
        code = OUTPUT_CLOSED
    except OSError as exc:
        if exc.errno not in (errno.EPIPE, errno.ENOSPC):
            raise
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - nothing more can be written
        with contextlib.suppress(OSError):
            print_error(f"cannot write the output ({exc.strerror}).")
        code = 1
    sys.exit(code or 0)


def usage_sentence(exc: Exception, args: list[str]) -> str:
    """Click's usage error as one sentence with the command's help to read. Click's own
    "Possible options" guess is replaced by a close match only (it suggested --out for
    --bogus)."""
    import difflib

    ctx = getattr(exc, "ctx", None)
    where = ctx.command_path if ctx is not None else "cfl-bench"
    if where == "cfl-bench" and args and args[0] in COMMANDS:
        where = f"cfl-bench {args[0]}"
    name = getattr(exc, "option_name", None)
    if name is not None and hasattr(exc, "possibilities"):
        close = difflib.get_close_matches(name, list(exc.possibilities or []), n=1, cutoff=0.7)
        hint = f" (did you mean {close[0]}?)" if close else ""
        return f"no such option {name}{hint}; see `{where} --help`."
    # ``exc`` is click's UsageError or typer's vendored copy, picked at run time
    # (click_exceptions), so the type checker knows it only as an Exception
    message = " ".join(exc.format_message().split()).rstrip(".")  # type: ignore[attr-defined]
    return f"{message}; see `{where} --help`."


COMMANDS = ("run", "sweep", "clients", "leaderboard", "report", "list")


def print_error(message: str) -> None:
    Console(stderr=True).print(
        f"[bold red]error:[/] {escape_markup(message)}",
        highlight=False,
        soft_wrap=True,
        emoji=False,  # an address a:b:c is not the emoji :b:
    )


def refuse_repeated_options(args: list[str]) -> None:
    """`cfl-bench run --lr 0.1 --lr 0.2` would silently keep the last value: refuse it. The
    sweep's own options likewise (its grid options are meant to repeat)."""
    if not args or args[0] not in ("run", "sweep"):
        return
    names = run_flag_fields() if args[0] == "run" else SWEEP_OWN_FLAGS
    seen: set[str] = set()
    for token in args[1:]:
        if token == "--":
            break
        field = names.get(token.split("=", 1)[0])
        if field is None:
            continue
        if field in seen:
            raise UserError(f"{token.split('=', 1)[0]} is given twice; give it once.")
        seen.add(field)


SWEEP_OWN_FLAGS = {
    "--out": "out",
    "--jobs": "jobs",
    "--config": "config",
    "--leaderboard": "leaderboard",
    "--no-leaderboard": "leaderboard",
    "--slurm-script": "slurm_script",
}


def run_flag_fields() -> dict[str, str]:
    """Every flag of `cfl-bench run` (both forms of booleans) → the option it sets."""
    from cfl_bench.runner.config import flag_name, option_kind, option_specs

    flags = {"--config": "config"}
    for name, spec in option_specs().items():
        flags[flag_name(name)] = name
        if option_kind(name)[0] is bool:
            flags["--" + (spec.flag_off or "no-" + name.replace("_", "-"))] = name
    return flags


def escape_markup(text: str) -> str:
    from rich.markup import escape

    return escape(text)


if __name__ == "__main__":
    main()
