"""Refusals of option combinations that no single option's range can express.

Torch-free, so the command line answers before the engine is imported; ``plan_run`` calls
the same checks again with what only the built stream knows.
"""

from __future__ import annotations

from cfl_bench.config import RunConfig
from cfl_bench.errors import UserError


def check_diagnostics(config: RunConfig, capabilities: frozenset[str] | None = None) -> None:
    """``--diagnostics`` reads the global model every round and class logits: refuse it
    without ``--eval-every-round`` and on streams whose models give no class logits."""
    if not config.diagnostics:
        return
    if not config.eval_every_round:
        raise UserError(
            "--diagnostics measures the global model after every round; add --eval-every-round"
        )
    if capabilities is not None and "class_logits" not in capabilities:
        raise UserError(
            "--diagnostics measures class accuracies, and this stream's model gives no class "
            "logits (a detection stream); drop --diagnostics"
        )
