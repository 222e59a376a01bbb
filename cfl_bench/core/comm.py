"""Communication accounting from the tensors actually exchanged.

Why a counter object: every payload (model, FedGP reference gradients, Fisher sums, logits)
passes through ``down``/``up`` with its real byte size, so the bytes column is measured, not
estimated from formulas that could drift from what the code sends.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class CommCounter:
    round_up: int = 0
    round_down: int = 0
    by_payload: dict[str, int] = field(default_factory=dict)

    def up(self, nbytes: int, payload: str) -> None:
        self.round_up += nbytes
        key = f"up:{payload}"
        self.by_payload[key] = self.by_payload.get(key, 0) + nbytes

    def down(self, nbytes: int, payload: str) -> None:
        self.round_down += nbytes
        key = f"down:{payload}"
        self.by_payload[key] = self.by_payload.get(key, 0) + nbytes

    def end_round(self) -> tuple[int, int]:
        """Bytes (up, down) of the round just finished; resets the per-round counters."""
        result = (self.round_up, self.round_down)
        self.round_up = 0
        self.round_down = 0
        return result
