"""`cfl-bench carla …`: the live-streaming demo and the frame recorder.

Why a module apart from ``cfl_bench.cli``: the CARLA commands have their own options (a
server address, a frame source) and pull in the bridge only when called; ``cli`` registers
this group. Bad input raises :class:`UserError`, which ``cli.main`` turns into one line and
exit code 2.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from cfl_bench import carla_demo as demo
from cfl_bench.core.errors import UserError
from cfl_bench.core.run_dir import refuse_run_directory
from cfl_bench.runner.interrupts import says_what_it_kept
from cfl_bench.runner.plain_help import PlainTyper

carla_app = PlainTyper(
    no_args_is_help=True,
    help="CARLA driving frames: live demo, recorder.",
)

Source = Annotated[
    str,
    typer.Option(
        help="where frames come from: replay (the shared "
        "dataset under --data-root) or carla (a live server)"
    ),
]
Host = Annotated[str, typer.Option(help="CARLA server host (--source carla)")]
Port = Annotated[int, typer.Option(help="CARLA server RPC port (--source carla)")]
Timeout = Annotated[float, typer.Option(help="seconds to wait for the CARLA server")]
DataRoot = Annotated[
    str | None, typer.Option(help="folder holding carla-object-detection/ (--source replay)")
]


# Bounds of the CARLA commands' own options: a TCP port, the vehicles a live world
# spawns (``carla_bridge.live.MAX_CLIENTS``), a day of simulated driving (200 frames per
# vehicle per 1800 s: --seconds inf would loop forever planning time windows).
MAX_PORT = 65_535
MAX_VEHICLES = 16
MAX_SECONDS = 86_400.0


def check_carla_options(port: int, timeout: float, clients: int) -> None:
    """Refuse a port, timeout or vehicle count the bridge cannot use, by the option's name."""
    if not 1 <= port <= MAX_PORT:
        raise UserError(f"--port must be an integer in [1, {MAX_PORT}], got {port}.")
    if not (math.isfinite(timeout) and timeout > 0):
        raise UserError(f"--timeout must be a positive finite number of seconds, got {timeout}.")
    if not 1 <= clients <= MAX_VEHICLES:
        raise UserError(f"--clients must be an integer in [1, {MAX_VEHICLES}], got {clients}.")


#: Options that only one frame source reads: passing one with the other source would be
#: silently ignored (a --host given with --source replay connects to nothing).
SOURCE_ONLY: dict[str, tuple[str, ...]] = {
    "carla": ("data_root",),
    "replay": ("host", "port", "timeout"),
}


def refuse_unused_options(ctx: typer.Context, source: str) -> None:
    """Refuse an option the chosen --source never reads, rather than ignore it in silence."""
    from click.core import ParameterSource

    for name in SOURCE_ONLY.get(source, ()):
        if ctx.get_parameter_source(name) == ParameterSource.COMMANDLINE:
            flag = "--" + name.replace("_", "-")
            other = "replay" if source == "carla" else "carla"
            raise UserError(
                f"{flag} has no effect with --source {source} (only --source {other} reads "
                f"it); drop {flag} or pass --source {other}."
            )


@carla_app.command("demo")
@says_what_it_kept
def demo_cmd(
    ctx: typer.Context,
    source: Source = "replay",
    data_root: DataRoot = None,
    host: Host = "127.0.0.1",
    port: Port = 2000,
    timeout: Timeout = 10.0,
    clients: Annotated[int, typer.Option(help="vehicle clients")] = demo.DEMO_CLIENTS,
    rounds: Annotated[int, typer.Option(help="rounds in all")] = demo.DEMO_ROUNDS,
    shift_round: Annotated[
        int, typer.Option(help="urban rounds before vehicle 0 enters the highway")
    ] = demo.DEMO_SHIFT_ROUND,
    strategy: Annotated[str, typer.Option(help="composition, e.g. der+fedgp")] = "der+fedgp",
    seed: Annotated[int, typer.Option(help="seed")] = 0,
    out: Annotated[str | None, typer.Option(help="run directory")] = None,
    threads: Annotated[int | None, typer.Option(help="torch CPU threads")] = None,
    epochs: Annotated[int, typer.Option(help="local epochs per round")] = demo.DEMO_EPOCHS,
    batch_size: Annotated[int, typer.Option(help="local batch size")] = demo.DEMO_BATCH,
    lr: Annotated[
        float | None, typer.Option(help="local learning rate (default: the stream's, Adam 0.005)")
    ] = None,
    buffer_size: Annotated[
        int, typer.Option(help="replay buffer per client (frames)")
    ] = demo.DEMO_BUFFER,
    overwrite: Annotated[
        bool, typer.Option(help="replace a finished demo run (or another one) in --out")
    ] = False,
) -> None:
    """Stream frames to vehicle clients while rounds run: urban driving, then vehicle 0
    drives onto the highway at --shift-round; live view, run directory, demo page."""
    check_carla_options(port, timeout, clients)
    refuse_unused_options(ctx, source)
    options = demo.DemoOptions(
        source=source,
        data_root=data_root,
        host=host,
        port=port,
        timeout=timeout,
        clients=clients,
        rounds=rounds,
        shift_round=shift_round,
        strategy=strategy,
        seed=seed,
        out=out,
        threads=threads,
        epochs=epochs,
        batch_size=batch_size,
        lr=lr,
        buffer_size=buffer_size,
        overwrite=overwrite,
    )
    demo.run_demo(options, Console())


@carla_app.command("record")
def record_cmd(
    ctx: typer.Context,
    out: Annotated[str, typer.Option(help="folder to write (the shared dataset's layout)")],
    source: Source = "replay",
    data_root: DataRoot = None,
    host: Host = "127.0.0.1",
    port: Port = 2000,
    timeout: Timeout = 10.0,
    town: Annotated[str, typer.Option(help="town to drive (a replay: the first client's)")] = (
        "Town01"
    ),
    clients: Annotated[int, typer.Option(help="vehicles recording")] = 2,
    seconds: Annotated[float, typer.Option(help="simulated seconds to record")] = 200.0,
    seed: Annotated[int, typer.Option(help="seed (live traffic and spawn points)")] = 0,
    append: Annotated[
        bool,
        typer.Option(
            help="add the frames to an earlier recording in --out (without it --out must be a "
            "new or empty folder; never one inside the replay source)"
        ),
    ] = False,
) -> None:
    """Write any source's frames (images + VOC + YOLO) into --out, atomically, so a live
    drive becomes a replayable stream (read it back with --data-root). --out must be new or
    empty, or an earlier recording with --append."""
    from cfl_bench.carla_bridge.frames import TimeWindow
    from cfl_bench.carla_bridge.recorder import FrameRecorder, check_recording_folder
    from cfl_bench.carla_bridge.stream import FRAME_PERIOD_S, ROUND_SECONDS

    if not 0 < seconds <= MAX_SECONDS:
        raise UserError(
            f"--seconds must be a number of simulated seconds in (0, {MAX_SECONDS:g}], got "
            f"{seconds:g}."
        )
    check_carla_options(port, timeout, clients)
    refuse_unused_options(ctx, source)
    refuse_run_directory(Path(out), "--out", "a recording's frames")
    check_recording_folder(Path(out), replay_root(source, data_root), append)
    frame_source = open_source(source, data_root, host, port, timeout, town, clients, seed)
    windows, start = [], 0.0
    while start < seconds:
        windows.append(TimeWindow(start, min(seconds, start + ROUND_SECONDS)))
        start += ROUND_SECONDS
    try:
        count = FrameRecorder(out, split="train").record(frame_source, windows)
    finally:
        frame_source.close()
    Console().print(
        f"recorded {count} frames ({clients} vehicles, {seconds:g} simulated s, one frame per "
        f"{FRAME_PERIOD_S:g} s) into [bold]{out}[/]"
    )


def replay_root(source: str, data_root: str | None) -> Path | None:
    """The folder a replay source reads its frames from (None for a live source); the
    source's own refusals (an unknown source, no --data-root) come first."""
    from cfl_bench.carla_bridge.stream import carla_root

    if source not in ("replay", "carla"):
        raise UserError(f"--source must be replay or carla, got {source!r}")
    if source == "carla":
        return None
    if data_root is None:
        raise UserError("--source replay needs --data-root (the folder with the shared frames)")
    return carla_root(data_root)


def open_source(
    source: str,
    data_root: str | None,
    host: str,
    port: int,
    timeout: float,
    town: str,
    clients: int,
    seed: int,
) -> Any:
    """The frame source `record` pulls from: the shared frames or a live CARLA drive."""
    from cfl_bench.carla_bridge.stream import FRAME_PERIOD_S, URBAN_TOWNS, carla_root

    if source == "carla":
        from cfl_bench.carla_bridge.live import LiveConfig, LiveSource

        config = LiveConfig(
            host=host, port=port, timeout=timeout, town=town, num_clients=clients,
            capture_period=FRAME_PERIOD_S, seed=seed,
        )  # fmt: skip
        return LiveSource(config)
    if source != "replay":
        raise UserError(f"--source must be replay or carla, got {source!r}")
    if data_root is None:
        raise UserError("--source replay needs --data-root (the folder with the shared frames)")
    from cfl_bench.carla_bridge.replay import ReplaySource, scan_split

    root = carla_root(data_root)
    present = sorted(scan_split(root, "train", "voc"))  # the towns these frames hold
    if town not in present:
        raise UserError(
            f"--town {town!r} is not a town of the recorded frames in '{root}'; use one of "
            f"{', '.join(present)}."
        )
    # The first vehicle drives --town, the others the other urban towns present, in turn.
    cycle = [town, *(t for t in URBAN_TOWNS if t != town and t in present)]
    towns = tuple(cycle[k % len(cycle)] for k in range(clients))
    return ReplaySource(
        root=root,
        split="train",
        num_clients=clients,
        client_towns=towns,
        frame_period=FRAME_PERIOD_S,
    )
