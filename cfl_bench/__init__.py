"""cfl-bench engine: configuration, the federated round loop, buffers, models, metrics,
run records and the command line. Importing this package has no side effects.

For scripts and notebooks: ``cfl_bench.run(...)`` and ``cfl_bench.sweep(...)``
(``cfl_bench.api``; docs/python-api.md); a method of your own: ``cfl_bench.plugin``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pathlib import Path

    from cfl_bench.api import RunOutcome, SweepOutcome

__version__ = "0.1.0"


def run(stream: str | None = None, strategy: str | None = None, **options: Any) -> RunOutcome:
    """One run, as `cfl-bench run` does it; see ``cfl_bench.api.run`` (imported on call, so
    ``import cfl_bench`` stays free of torch)."""
    from cfl_bench import api

    return api.run(stream, strategy, **options)


def sweep(out: str | Path, **options: Any) -> SweepOutcome:
    """A grid of runs, as `cfl-bench sweep` does it; see ``cfl_bench.api.sweep``."""
    from cfl_bench import api

    return api.sweep(out, **options)
