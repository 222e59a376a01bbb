"""The class order of a class-split stream (``--class-order``): which original class each
new label stands for.

Why: TARGET's and LANDER's official codes build their tasks with PyCIL's ``DataManager``
(``utils/data_manager.py``, ``_setup_data``), which, with ``shuffle`` on, seeds numpy's
global generator (their ``main.py``: seed 2023) and takes ``np.random.permutation(C)`` as
the class order; every label y then becomes its position in that order
(``_map_new_class_index``), so task t holds the new labels [t·c, (t+1)·c), the original
classes ``order[t·c:(t+1)·c]``. The suite's class splits take the natural order unless
this option asks for the codes' one.

``numpy:seed=N`` is the order numpy's legacy generator gives after ``np.random.seed(N)``:
``np.random.RandomState(N).permutation(C)`` draws the same sequence without touching the
global generator. ``natural`` (the default) is the identity and is recorded as the word
``natural``, so the descriptions and hashes of runs made before the option stay the same.

Parsed without numpy or torch (a typo is answered at once); the order is a pure function
of (seed, classes), so a resumed run rebuilds it.
"""

from __future__ import annotations

from cfl_bench.core.errors import UserError
from cfl_bench.core.text_values import non_negative_int, quoted

NATURAL = "natural"
NUMPY = "numpy"
MAX_NUMPY_SEED = 2**32 - 1
FORMS = "natural (the labels as the data has them) or numpy:seed=N (np.random.seed(N)'s order)"


def parse_class_order(spec: str) -> int | None:
    """The numpy seed of ``numpy:seed=N``, or None for ``natural``; anything else is
    refused in one sentence naming the two forms."""
    text = spec.strip()
    if text == NATURAL:
        return None
    name, _, options = text.partition(":")
    key, equals, value = options.partition("=")
    if name.strip() != NUMPY or key.strip() != "seed" or not equals:
        raise UserError(f"unknown --class-order {quoted(text or spec)}; write {FORMS}.")
    try:
        seed = non_negative_int(value.strip())
    except ValueError as exc:
        raise UserError(
            f"--class-order numpy:seed= {exc}, got {quoted(value.strip())}; write e.g. "
            "numpy:seed=2023."
        ) from None
    if seed > MAX_NUMPY_SEED:  # np.random.seed refuses larger seeds
        raise UserError(
            f"--class-order numpy:seed={seed} is larger than numpy's largest seed "
            f"{MAX_NUMPY_SEED}; give a seed from 0 to {MAX_NUMPY_SEED}."
        )
    return seed


def check_class_order_text(spec: str) -> str:
    """The option's grammar for ``RunConfig`` (ValueError("must …"), as every option's)."""
    try:
        parse_class_order(spec)
    except UserError:
        raise ValueError("must be natural or numpy:seed=N (N from 0 to 2**32 - 1)") from None
    return spec


def class_order(spec: str, num_classes: int) -> tuple[int, ...] | None:
    """``order[i]`` = the original class that new label i stands for; None for ``natural``
    (the identity: callers then change nothing). numpy is imported here, on use."""
    seed = parse_class_order(spec)
    if seed is None:
        return None
    import numpy as np

    return tuple(int(c) for c in np.random.RandomState(seed).permutation(num_classes))
