"""The ServerApp: the engine's whole run (``run.execute``) with its grid passed as the run's
host, so the executor registry builds a ``FlowerExecutor`` on it (``cfl_bench.runner.executors``).

Why the engine's loop inside ``main`` rather than Flower's strategies: the round order,
the server hooks, the declared payloads, measurement and checkpoints are the engine's; only
the client side moves, exactly as with the other executors. The outcome (ok, or the error)
is written next to the configuration file for the launcher (``flower.launch``; the
summary's annotations, a sweep's request hash, come from beside it too), because
``flwr run`` reports success even for a failed run. The run directory is the launcher's:
it claimed it before Flower started and hands its lock over (``flower.handover``); a
ServerApp whose launcher is gone gets no lock and writes nothing. A deployment's app (``cfl-bench
flower app``) carries the configuration itself (``cfl-config-json``) and has no launcher
waiting: there a failed run raises, so that ``flwr ls`` lists it as failed, and the run
directory (``out``, on the SuperLink's machine) holds the records as with any executor.

The grid travels as an argument, never through module state: a process running two apps
(or a test) cannot hand one run another run's grid.
"""

from __future__ import annotations

import contextlib
import json
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from cfl_bench.core.errors import UserError
from cfl_bench.core.run_dir import RunDirectory
from cfl_bench.flower import SAID_FILE, handover

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run the configured run with this grid; record the outcome for the launcher."""
    from cfl_bench.engine.progress import RoundLog
    from cfl_bench.runner.config import RunConfig
    from cfl_bench.runner.run import execute

    if not str(context.run_config.get("cfl-config", "")):
        config = RunConfig(**json.loads(str(context.run_config["cfl-config-json"])))
        execute(config, host=grid)
        return
    path = Path(str(context.run_config["cfl-config"]))
    outcome: dict[str, object] = {"ok": False}
    claimed: tuple[RunDirectory, bool] | None = None
    try:
        config = RunConfig(**json.loads(path.read_text()))
        annotations = json.loads(path.with_name("annotations.json").read_text())
        claimed = launchers_claim(path.parent)
        # One line per round (and inside long rounds), and the notes, go to a file the
        # launcher passes on (``flower.launch.relay``), not through Flower's log stream,
        # which may drop the last lines: it stops once the run is marked finished, and a
        # busy machine can mark it so before the final log upload arrives (CI lost a
        # resumed run's lines that way).
        with path.with_name(SAID_FILE).open("a", encoding="utf-8", buffering=1) as said:
            result = execute(
                config, RoundLog(said), annotations, line_to(said), host=grid, claimed=claimed
            )
        outcome = {"ok": True, "path": str(result.path)}
    except UserError as exc:
        outcome = {"ok": False, "error": str(exc)}
    except Exception:
        outcome = {"ok": False, "error": traceback.format_exc()}
    finally:
        if claimed is not None:
            claimed[0].release()  # if execute did not (it failed before taking the directory)
        with contextlib.suppress(OSError):  # a launcher that is gone took its folder along
            path.with_name("outcome.json").write_text(json.dumps(outcome))


def launchers_claim(folder: Path) -> tuple[RunDirectory, bool]:
    """The run directory as the launcher claimed it, with its lock (``flower.handover``);
    refused when the launcher is gone: then nothing may touch the directory."""
    claim = handover.receive(folder)
    if claim is None:
        raise UserError(
            "the launcher of this Flower simulation is gone (its run directory's lock with "
            "it); nothing was written."
        )
    run_dir = RunDirectory.adopt(Path(claim.out), Path(claim.path), claim.fd)
    return run_dir, claim.resume


def line_to(said: TextIO) -> Callable[[str], None]:
    """``say`` for the run: each message one flushed line of ``said``."""

    def say(text: str) -> None:
        print(text, file=said, flush=True)

    return say
