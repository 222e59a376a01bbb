"""Typer apps whose ``--help`` shows ``[default: …]`` as written.

Why: with rich installed, typer (0.20) escapes the "[default: …]" it appends to an option's
help for rich markup even when the app renders plain Click help (``rich_markup_mode=None``,
which the CLI uses so long help wraps instead of being cut at 80 columns), so `--help`
printed ``\\[default: 4]``. Commands of a :class:`PlainTyper` take that escape back out of
the finished help text; with a typer that does not escape, nothing changes.
"""

from __future__ import annotations

from typing import Any

import click
import typer
from typer.core import TyperCommand


class PlainHelpCommand(TyperCommand):
    """A typer command whose plain help carries no rich escapes."""

    def format_help(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        super().format_help(ctx, formatter)
        formatter.buffer[:] = [part.replace("\\[", "[") for part in formatter.buffer]


class PlainTyper(typer.Typer):
    """``typer.Typer`` with plain Click help (no rich markup) for every command."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(rich_markup_mode=None, **kwargs)

    def command(self, *args: Any, cls: type[TyperCommand] | None = None, **kwargs: Any) -> Any:
        return super().command(*args, cls=cls or PlainHelpCommand, **kwargs)
