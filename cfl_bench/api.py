"""The Python API: ``cfl_bench.run`` and ``cfl_bench.sweep`` for scripts and notebooks, with
the results as pandas DataFrames.

Why a thin layer over the command line's own functions rather than a second way to run: a
run started here is the run `cfl-bench run` starts with the same options — the same checks
and one-line refusals (raised as ``UserError``, whose text is the command line's message),
the same run folder and name, the same resume of an interrupted run, the same records — so
a notebook's results and a shell's are interchangeable and `cfl-bench leaderboard` ranks
them together. Options are the `cfl-bench run` options with underscores
(``rounds_per_task=2``), typed Python values or the text the command line takes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd
    from rich.console import Console


@dataclass(frozen=True)
class RunOutcome:
    """A finished (or diverged) run: its folder, its summary and, read on first use, its
    records and configuration."""

    path: Path
    summary: dict[str, Any]

    @property
    def status(self) -> str:
        """``finished`` or ``diverged`` (a failed run raises instead)."""
        return str(self.summary.get("status"))

    @cached_property
    def records(self) -> pd.DataFrame:
        """records.csv: one row per evaluation (round, task, accuracies, bytes, …)."""
        import pandas as pd

        return pd.read_csv(self.path / "records.csv")

    @cached_property
    def config(self) -> dict[str, Any]:
        """config.json: every option, resolved, and the run's provenance."""
        loaded: dict[str, Any] = json.loads((self.path / "config.json").read_text("utf-8"))
        return loaded


@dataclass(frozen=True)
class SweepOutcome:
    """A sweep's folder, exit code (0: every point finished or diverged) and points."""

    out: Path
    exit_code: int

    @cached_property
    def points(self) -> pd.DataFrame:
        """sweep.json's points: name, folder, status, Acc_T, wall time and the values that
        vary across the grid (one column each)."""
        import pandas as pd

        manifest = json.loads((self.out / "sweep.json").read_text("utf-8"))
        rows = []
        for point in manifest["points"]:
            row = {k: point[k] for k in ("name", "status", "Acc_T", "wall_time_s")}
            rows.append({**row, **point["varying"], "path": str(self.out / point["dir"])})
        return pd.DataFrame(rows)

    @cached_property
    def records(self) -> pd.DataFrame:
        """Every finished or diverged point's records.csv, stacked, with the point's name
        and varying values as leading columns."""
        import pandas as pd

        frames = []
        for point in self.points.to_dict("records"):
            if point["status"] not in ("finished", "diverged"):
                continue
            frame = pd.read_csv(Path(point["path"]) / "records.csv")
            keys = {
                str(k): v for k, v in point.items() if k not in ("Acc_T", "wall_time_s", "path")
            }
            frames.append(frame.assign(**keys)[[*keys, *frame.columns]])
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()

    @cached_property
    def leaderboard(self) -> pd.DataFrame | None:
        """The sweep's leaderboard.csv (None when it wrote none: ``leaderboard=False``, or no
        run finished)."""
        import pandas as pd

        path = self.out / "leaderboard" / "leaderboard.csv"
        return pd.read_csv(path) if path.is_file() else None


def as_option_values(options: dict[str, Any]) -> dict[str, Any]:
    """Python values as the option checks take them: a ``Path`` as its text."""
    return {k: str(v) if isinstance(v, Path) else v for k, v in options.items()}


def run(
    stream: str | None = None,
    strategy: str | None = None,
    *,
    progress: bool = True,
    console: Console | None = None,
    **options: Any,
) -> RunOutcome:
    """Run one federated continual run, as `cfl-bench run` does, and return its outcome.

    ``strategy`` is a composition (``"der+fedgp"``); a method of your own is named by its
    import path (``"my_methods.WeightedER+fedgp"``) or its entry point (docs/plugins.md).
    ``options`` are the other `cfl-bench run` options (``seed=1``, ``rounds_per_task=2``,
    ``data_root="../data"``, ``out="runs/mine"``); without ``out`` the run goes to the folder
    the command line would name. A folder holding an unfinished run of the same options is
    resumed, a finished one refused (``overwrite=True`` replaces it). ``progress`` shows the
    rounds (a live bar in a terminal or notebook, a line per round otherwise).

    Raises ``UserError`` (its text the command line's one-line message) for a bad option,
    ``RunInterruptedError`` on Ctrl-C (the run keeps its checkpoint).
    """
    from rich.console import Console

    from cfl_bench.run_display import round_display
    from cfl_bench.runner.config import make_config
    from cfl_bench.runner.run import execute

    values = as_option_values(options)
    config = make_config({**values, "stream": stream, "strategy": strategy})  # None: default
    shown = console or Console(quiet=not progress)
    with round_display(shown, f"{config.stream} · {config.strategy}") as on_round:
        result = execute(
            config,
            on_round if progress else None,
            notify=lambda text: shown.print(text, highlight=False),
            started=lambda path: shown.print(f"run folder: {path}", highlight=False),
        )
    return RunOutcome(result.path, result.summary)


def sweep(
    out: str | Path,
    *,
    jobs: int | None = None,
    leaderboard: bool = True,
    console: Console | None = None,
    **options: Any,
) -> SweepOutcome:
    """Run (or resume) a grid of runs into ``out``, as `cfl-bench sweep` does, and return its
    outcome: a list or tuple is an axis (``strategy=["er", "der+fedgp"], seed=[0, 1, 2]``),
    any other value is fixed (``stream="rot-digits"``). ``jobs`` runs that many points at
    once (each in its own process). Finished points are skipped, interrupted ones resume,
    and with ``leaderboard`` the sweep ends by writing ``out/leaderboard/``.

    Raises ``UserError`` for a bad option or grid, before anything is written.
    """
    from rich.console import Console

    from cfl_bench.sweeps.command import sweep_spec
    from cfl_bench.sweeps.grid import spec_from_options

    values = as_option_values(options)
    spec = spec_from_options(str(out), jobs, values)
    code = sweep_spec(spec, console or Console(), leaderboard)
    return SweepOutcome(spec.out, code)
