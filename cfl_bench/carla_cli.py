"""`cfl-bench carla …`: the live-streaming demo and the frame recorder.

Why a module apart from ``cfl_bench.cli``: the CARLA commands have their own options (a
server address, a frame source) and pull in the bridge only when called; ``cli`` registers
this group. Bad input raises :class:`UserError`, which ``cli.main`` turns into one line and
exit code 2.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.console import Console

from cfl_bench import carla_demo as demo
from cfl_bench.errors import UserError
from cfl_bench.interrupts import says_what_it_kept
from cfl_bench.plain_help import PlainTyper

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


@carla_app.command("demo")
@says_what_it_kept
def demo_cmd(
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
) -> None:
    """Stream frames to vehicle clients while rounds run: urban driving, then vehicle 0
    drives onto the highway at --shift-round; live view, run directory, demo page."""
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
    )
    demo.run_demo(options, Console())


@carla_app.command("record")
def record_cmd(
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
) -> None:
    """Write any source's frames (images + VOC + YOLO) into --out, atomically, so a live
    drive becomes a replayable stream (read it back with --data-root)."""
    from carla_bridge.frames import TimeWindow
    from carla_bridge.recorder import FrameRecorder
    from carla_bridge.stream import FRAME_PERIOD_S, ROUND_SECONDS

    if not seconds > 0:
        raise UserError(f"--seconds must be positive, got {seconds}")
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
    from carla_bridge.stream import FRAME_PERIOD_S, URBAN_TOWNS, carla_root

    if source == "carla":
        from carla_bridge.live import LiveConfig, LiveSource

        config = LiveConfig(
            host=host, port=port, timeout=timeout, town=town, num_clients=clients,
            capture_period=FRAME_PERIOD_S, seed=seed,
        )  # fmt: skip
        return LiveSource(config)
    if source != "replay":
        raise UserError(f"--source must be replay or carla, got {source!r}")
    if data_root is None:
        raise UserError("--source replay needs --data-root (the folder with the shared frames)")
    from carla_bridge.replay import ReplaySource

    # The first vehicle drives --town, the others the other urban towns in turn.
    cycle = [town, *(t for t in URBAN_TOWNS if t != town)]
    towns = tuple(cycle[k % len(cycle)] for k in range(clients))
    return ReplaySource(
        root=carla_root(data_root),
        split="train",
        num_clients=clients,
        client_towns=towns,
        frame_period=FRAME_PERIOD_S,
    )
