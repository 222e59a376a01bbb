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
from collections.abc import Callable, Sequence

from cfl_bench.core.errors import UserError

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


# -- bounded values: each raises ValueError("must …"), which callers turn into one sentence --
def non_negative_float(raw: str) -> float:
    """A weight or tolerance: finite and ≥ 0 (0 switches the term off)."""
    must = "must be a finite number ≥ 0"
    value = finite_float(raw, must)
    if value < 0:
        raise ValueError(must)
    return value


def positive_float(raw: str) -> float:
    """A rate, temperature or concentration: finite and > 0 (0 would divide by zero or
    never move)."""
    must = "must be a finite number > 0"
    value = finite_float(raw, must)
    if value <= 0:
        raise ValueError(must)
    return value


def unit_fraction(raw: str) -> float:
    """A fraction of something that must not be empty: finite, in (0, 1]."""
    must = "must be a fraction in (0, 1]"
    value = finite_float(raw, must, bounded=True)
    if not 0 < value <= 1:
        raise ValueError(must)
    return value


def positive_int(raw: str) -> int:
    """A count (samples, epochs, rounds, shards): a plain decimal integer ≥ 1."""
    must = "must be a positive integer"
    value = strict_int(raw, must)
    if value <= 0:
        raise ValueError(must)
    return value


def non_negative_int(raw: str) -> int:
    """A lower bound that may be switched off: a plain decimal integer ≥ 0."""
    must = "must be an integer ≥ 0"
    value = strict_int(raw, must)
    if value < 0:
        raise ValueError(must)
    return value


def boolean(raw: str) -> bool:
    """Only ``true``/``false`` (any case): one spelling per value keeps canonical names,
    sweep directories and protocol hashes unambiguous."""
    lowered = raw.lower()
    if lowered == "true":
        return True
    if lowered == "false":
        return False
    raise ValueError("must be true or false")


# -- name:key=value,... ----------------------------------------------------------------------
def split_options(
    kind: str,
    name: str,
    opt_text: str,
    keys: Sequence[str],
    unknown: Callable[[str, bool], str],
) -> dict[str, str]:
    """The raw ``key=value`` pairs written after ``name:`` — the grammar strategy components
    and partitions share — with every malformed piece refused in one sentence.

    ``kind`` names what ``name`` is in messages ("component", "partition"); ``keys`` are
    its option names; ``unknown(key, has_value)`` words the refusal of a key that is not one
    of them (the caller knows the likely slip). Values are returned stripped, unconverted.
    """
    label = f"{kind} '{name}'"
    if not keys:
        raise UserError(f"{label} takes no options; drop {quoted(':' + opt_text)} after it.")
    example = f"{name}:{keys[0]}=VALUE"
    if not opt_text.strip():
        raise UserError(
            f"{label} has ':' but no options after it; drop the ':' or write options like "
            f"{example}."
        )
    if ":" in opt_text:
        raise UserError(
            f"{label} has more than one ':'; write all its options after a single ':', "
            f"separated by commas, e.g. {example}."
        )
    values: dict[str, str] = {}
    for item in (piece.strip() for piece in opt_text.split(",")):
        if not item:
            raise UserError(
                f"{label} has an empty option in {quoted(opt_text.strip())}; separate options "
                f"with single commas and drop leading or trailing ones."
            )
        key, eq, raw = (part.strip() for part in item.partition("="))
        if not key:
            raise UserError(
                f"option {quoted(item)} of {label} has no name before '='; name one of its "
                f"options ({', '.join(keys)}), e.g. {example}."
            )
        if key not in keys:
            raise UserError(unknown(key, bool(eq)))
        if not eq:
            raise UserError(f"option '{key}' of {label} needs a value; write {name}:{key}=VALUE.")
        if not raw:
            raise UserError(
                f"option {name}:{key} has no value after '='; write {name}:{key}=VALUE."
            )
        if "=" in raw:
            raise UserError(
                f"option {quoted(item)} of {label} has more than one '='; write one '=' between "
                f"each option's name and value and separate options with commas, e.g. {example}."
            )
        if key in values:
            raise UserError(f"option '{key}' of {label} is given twice; give it once.")
        values[key] = raw
    return values


def utf8_text(text: str) -> str:
    """``text`` safe to write as UTF-8 and print: bytes of a file name that are not UTF-8
    (which Python carries as surrogate escapes, e.g. a folder named b"\\xff") become the
    visible text ``\\xff`` instead of failing the write or the print."""
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
