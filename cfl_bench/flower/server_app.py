"""The ServerApp: the engine's whole run (``run.execute``) with a ``FlowerExecutor`` bound
to this run's grid.

Why the engine's loop inside ``main`` rather than Flower's strategies: the round order,
the server hooks, the declared payloads, measurement and checkpoints are the engine's; only
the client side moves, exactly as with the other executors. The outcome (ok, or the error)
is written next to the configuration file for the launcher (``flower.launch``), because
``flwr run`` reports success even for a failed run. A deployment's app (``cfl-bench
flower app``) carries the configuration itself (``cfl-config-json``) and has no launcher
waiting: there a failed run raises, so that ``flwr ls`` lists it as failed, and the run
directory (``out``, on the SuperLink's machine) holds the records as with any executor.
"""

from __future__ import annotations

import json
import traceback
from pathlib import Path

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from cfl_bench.errors import UserError

app = ServerApp()
_GRID: list[Grid] = []


def bound_grid() -> Grid:
    """The grid of the ServerApp this process runs (``make_executor`` asks for it)."""
    if not _GRID:
        raise UserError(
            "--executor flower runs inside a Flower simulation; start it with "
            "cfl-bench run ... --executor flower."
        )
    return _GRID[-1]


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run the configured run with this grid; record the outcome for the launcher."""
    from cfl_bench.config import RunConfig
    from cfl_bench.progress import RoundLog
    from cfl_bench.run import execute

    if not str(context.run_config.get("cfl-config", "")):
        _GRID.append(grid)
        try:
            execute(RunConfig(**json.loads(str(context.run_config["cfl-config-json"]))))
        finally:
            _GRID.pop()
        return
    path = Path(str(context.run_config["cfl-config"]))
    outcome: dict[str, object] = {"ok": False}
    _GRID.append(grid)
    try:
        config = RunConfig(**json.loads(path.read_text()))
        # One line per round (and inside long rounds) in Flower's log, which the launcher
        # relays to the user (``flower.launch.relay``).
        result = execute(config, RoundLog(), notify=lambda text: print(text, flush=True))
        outcome = {"ok": True, "path": str(result.path)}
    except UserError as exc:
        outcome = {"ok": False, "error": str(exc)}
    except Exception:
        outcome = {"ok": False, "error": traceback.format_exc()}
    finally:
        _GRID.pop()
        path.with_name("outcome.json").write_text(json.dumps(outcome))
