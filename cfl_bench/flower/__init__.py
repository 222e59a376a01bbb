"""The Flower executor (``--executor flower``): the engine's server loop inside a Flower
ServerApp, client updates in ClientApps of a Flower simulation (docs/executors.md, "Flower").

Everything here imports ``flwr``; :func:`require_flwr` is the one place that refuses the
executor when it is not installed.
"""

from __future__ import annotations

from cfl_bench.core.errors import UserError

#: The file beside the run's configuration where the ServerApp writes the run's lines for
#: the user (round progress, notes), which the launcher passes on (``launch.relay``).
SAID_FILE = "said.txt"


def require_flwr() -> None:
    """Refuse ``--executor flower`` in one line when ``flwr`` cannot be imported."""
    try:
        import flwr  # noqa: F401
    except ImportError:
        raise UserError(
            "--executor flower needs Flower, which is not installed; run "
            "pip install 'cfl-bench[flower]' or choose another --executor."
        ) from None
