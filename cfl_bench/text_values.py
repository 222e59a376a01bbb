"""Values typed as text (command line, ``--set``, strategy and partition options), parsed
by one strict rule everywhere.

Why not bare ``float()``/``int()``: they accept "inf", "nan", "infinity", "1_0", " 1 " and
Unicode digits (``int("٣") == 3``), and turn "1e400" into inf and "1e-400" into 0 — an option
such as ``fedprox:mu=inf`` or ``--lr 1e400`` would then poison every weight instead of being
refused. Here numbers are plain ASCII decimal or scientific numbers, finite, and integers
are plain decimal integers. Part of the core: it imports nothing else of the project, so
streams, strategies and the configuration share it.
"""

from __future__ import annotations

import math
import re
import sys

FLOAT_TEXT = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?", re.ASCII)
INT_TEXT = re.compile(r"[+-]?[0-9]+", re.ASCII)
_NONZERO_MANTISSA = re.compile(r"[1-9]")


def quoted(raw: str, limit: int = 40) -> str:
    """User text as it appears in an error message: quoted, cut after ``limit`` characters
    and with control characters escaped, so every refusal stays one short line however long
    the input is or whatever newlines or escape codes it carries."""
    cut = raw if len(raw) <= limit else raw[: limit - 1] + "…"
    return repr(cut)


def finite_float(raw: str, must: str, *, bounded: bool = False) -> float:
    """``raw`` as a float if it is a plain finite decimal number; else ``ValueError(must)``.

    A number too small for a float (``1e-400``) is refused too, rather than silently becoming
    0. ``bounded``: the caller's rule has an upper bound that already refuses any overflow,
    so ``must`` alone explains it.
    """
    if not FLOAT_TEXT.fullmatch(raw):
        raise ValueError(must)
    value = float(raw)
    if not math.isfinite(value):
        raise ValueError(must if bounded else f"{must} (at most about 1.8e308 in size)")
    mantissa = re.split(r"[eE]", raw)[0]
    if value == 0 and _NONZERO_MANTISSA.search(mantissa):
        raise ValueError(f"{must} that does not round to 0 as a float (at least about 5e-324)")
    return value + 0.0  # -0.0 → 0.0, so names and hashes never show "-0.0"


def strict_int(raw: str, must: str) -> int:
    """``raw`` as an int if it is a plain decimal integer (optional sign); else
    ``ValueError(must)``. "1.5", "1e3", "0x10" and "true" are refused rather than guessed."""
    if not INT_TEXT.fullmatch(raw):
        raise ValueError(must)
    try:
        return int(raw)
    except ValueError:  # longer than Python's int parsing limit (4300 digits by default)
        limit = getattr(sys, "get_int_max_str_digits", lambda: 4300)()
        raise ValueError(f"{must} of at most {limit} digits") from None
