"""Which strategies a pilot runs: the ``--strategies`` list and the default list.

Torch-free (the grammar in ``strategies.compose`` is too), so a misspelled strategy is refused
before the pilot pays for importing torch, scikit-learn and matplotlib.
"""

from __future__ import annotations

from cfl_bench.core.errors import UserError
from cfl_bench.strategies.compose import build_strategy
from cfl_bench.strategies.registry import component_classes

#: FedProj's Fig. 1 compares FedAvg, FedDF and FedProj (each on the FedAvg learner).
DEFAULT_STRATEGIES = ("fedavg", "fedavg+feddf", "fedavg+fedproj")


def split_strategy_list(text: str) -> list[str]:
    """``--strategies`` as a list: commas separate strategies, except that a piece of the form
    ``key=value`` (no ':' or '+' before its '=') continues the options of the strategy before
    it, so ``fedavg,fedavg+fedproj:temperature=2,gamma=0.1`` is two strategies.

    Why not a repeated option: the component grammar itself separates options with commas,
    and a piece such as ``gamma=0.1`` can never start a strategy (it names no component)."""
    strategies: list[str] = []
    for piece in (p.strip() for p in text.split(",")):
        if not piece:
            raise UserError(
                f"--strategies {text!r} has an empty entry; separate strategies with single "
                "commas, e.g. fedavg,fedavg+fedproj."
            )
        head = piece.split("=", 1)[0]
        if strategies and "=" in piece and ":" not in head and "+" not in head:
            strategies[-1] += "," + piece
        else:
            strategies.append(piece)
    return strategies


def check_strategies(texts: list[str]) -> None:
    """Refuse what the grammar refuses (unknown names and options, two learners, …) and a
    strategy listed twice, before anything heavy is imported. Refusals that depend on the
    stream or the model come later, still before any training."""
    seen: dict[str, str] = {}
    for text in texts:
        name = build_strategy(text).name
        if name in seen:
            raise UserError(
                f"strategies {seen[name]!r} and {text!r} are the same strategy ({name}); "
                "list it once."
            )
        seen[name] = text


def default_strategies() -> tuple[list[str], list[dict[str, str]]]:
    """The default list, split into the strategies this build can run and those it cannot
    (a component not registered here), each with the reason — dropped visibly, never
    silently."""
    known = component_classes()
    available, unavailable = [], []
    for text in DEFAULT_STRATEGIES:
        absent = [name for name in text.split("+") if name not in known]
        if absent:
            reason = f"component {', '.join(absent)} is not registered in this build"
            unavailable.append({"strategy": text, "reason": reason})
        else:
            available.append(text)
    return available, unavailable
