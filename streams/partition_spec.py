"""The ``--partition`` grammar: partition names, their options, and the one-line refusals.

Why a module of its own, free of torch and numpy: the command line checks a
``--partition`` value (and lists the partitions) before it loads the engine, so a typo is
answered in a fraction of a second. ``streams.partition`` builds the partitioners from what
this module parses.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable

from cfl_bench.core.errors import UserError
from cfl_bench.core.text_values import (
    non_negative_int,
    positive_float,
    positive_int,
    quoted,
    split_options,
)

PARTITIONERS: dict[str, str] = {
    "shards": "sort by label, cut into equal shards, each client gets shards_per_client "
    "(default 2) at random; drawn once for all tasks (FedGP MNIST split)",
    "class-shards": "FedNTD sharding: every shard one class, shards_per_client (default 2) "
    "per client, K x s / C shards per class, nothing dropped; drawn once for all tasks",
    "iid": "uniformly random near-equal split; drawn once for all tasks",
    "dirichlet": "per-class Dir(alpha) label skew (default alpha 0.3), N/K balancing cap, "
    "redrawn until every client has min_size (default 10); drawn afresh per task",
    "class-subsets": "GLFC: every client holds all examples of classes_per_client (default "
    "6) random classes of the task, so clients share examples; drawn afresh per task",
    "label-quantity": "NIID-Bench's #C=k: every client holds labels_per_client (default 2) "
    "distinct classes of the task (client i class i mod C, then random), each class split "
    "evenly among its holders; drawn afresh per task",
}


def parse_partition_spec(spec: str) -> tuple[str, dict[str, object]]:
    """The partition's name and its converted option values; every refusal is one line."""
    text = spec.strip()
    if not text:
        raise UserError(
            "the partition is empty; give one like 'dirichlet' or 'dirichlet:alpha=1,min_size=5' "
            "(see `cfl-bench list partitions`)."
        )
    raw_name, colon, opt_text = text.partition(":")
    name = raw_name.strip()
    if not name:
        raise UserError(
            f"partition {quoted(text)} has no name before ':'; write the partition first, "
            f"e.g. dirichlet:alpha=1."
        )
    if name not in PARTITIONERS:
        raise UserError(unknown_partition(name, has_colon=bool(colon)))
    if not colon:
        return name, {}
    parsers = OPTION_PARSERS[name]
    raw_values = split_options(
        "partition", name, opt_text, list(parsers), lambda key, _: unknown_option(name, key)
    )
    values: dict[str, object] = {}
    for key, raw in raw_values.items():
        try:
            values[key] = parsers[key](raw)
        except ValueError as exc:
            raise UserError(f"option {name}:{key} {exc}, got {quoted(raw)}.") from None
    return name, values


# Other spellings users bring from papers and other code bases.
_ALIASES: dict[str, str] = {"lda": "dirichlet", "sharding": "class-shards"}


def unknown_partition(name: str, *, has_colon: bool) -> str:
    """The refusal for a name that is no partition, with the likely slip when there is one."""
    choose = f"choose one of: {', '.join(sorted(PARTITIONERS))}"
    lowered = name.lower()
    if lowered in PARTITIONERS:  # DIRICHLET: one spelling per partition
        return (
            f"unknown partition {quoted(name)}; partition names are lower case, write '{lowered}'."
        )
    if "=" in name and not has_colon:  # alpha=1 or dirichlet,alpha=1
        return (
            f"{quoted(name)} is not a partition; options follow the partition's name and a "
            f"':', e.g. dirichlet:alpha=1,min_size=5."
        )
    guess = _ALIASES.get(lowered) or next(
        iter(difflib.get_close_matches(lowered, list(PARTITIONERS), n=1)), None
    )
    hint = f" (did you mean '{guess}'?)" if guess else ""
    return f"unknown partition {quoted(name)}{hint}; {choose}."


def unknown_option(name: str, key: str) -> str:
    """The refusal for a key the partition lacks, with its valid keys and the likely slip."""
    parsers = OPTION_PARSERS[name]
    known = ", ".join(parsers)
    if key.lower() in parsers:
        hint = f" (option names are lower case: write '{key.lower()}')"
    elif guess := difflib.get_close_matches(key.lower(), list(parsers), n=1):
        hint = f" (did you mean '{guess[0]}'?)"
    elif owners := [n for n, p in OPTION_PARSERS.items() if n != name and key in p]:
        hint = f" ('{key}' is an option of {' and '.join(owners)})"
    else:
        hint = ""
    return f"unknown option {quoted(key)} for partition '{name}'{hint}; its options are: {known}."


# -- option values ---------------------------------------------------------------------------
# Option values follow the project's one rule for typed text (cfl_bench.core.text_values).


# Every partition's options, in the order messages list them; the keys are exactly the
# constructors' keyword arguments (a test pins this). Each parser raises
# ``ValueError("must …")`` for a bad value.
OPTION_PARSERS: dict[str, dict[str, Callable[[str], object]]] = {
    "shards": {"shards_per_client": positive_int},
    "class-shards": {"shards_per_client": positive_int},
    "iid": {},
    "dirichlet": {
        "alpha": positive_float,
        "min_size": non_negative_int,
        "max_redraws": positive_int,
    },
    "class-subsets": {"classes_per_client": positive_int},
    "label-quantity": {"labels_per_client": positive_int},
}
