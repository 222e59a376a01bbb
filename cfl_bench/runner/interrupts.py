"""Ctrl-C and SIGTERM: one line saying what was kept and how to go on, exit code 130.

Why a module of its own: `cfl-bench run`, `sweep` and `carla demo` all end an interrupt the
same way, and the CARLA commands live apart from ``cfl_bench.cli``. Typer turns a bare
KeyboardInterrupt inside a command into a silent exit 130, so each command catches
:class:`RunInterruptedError` (whose text is that line) itself, through :func:`says_what_it_kept`.
SIGTERM — a batch scheduler's stop, ``kill`` — is made a KeyboardInterrupt for the whole
command, so both signals take the same path.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import ParamSpec, TypeVar

import typer
from rich.console import Console
from rich.markup import escape

from cfl_bench.core.errors import RunInterruptedError

P = ParamSpec("P")
R = TypeVar("R")
EXIT_INTERRUPTED = 130


@contextlib.contextmanager
def stop_on_sigterm() -> Iterator[None]:
    """SIGTERM (a batch scheduler's stop) ends a command like Ctrl-C: at once, resumable."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread may install signal handlers
        return

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def print_interrupt(message: str) -> None:
    """The one line an interrupt ends with (what was kept, how to resume), on stderr."""
    Console(stderr=True).print(f"[yellow]{escape(message)}[/]", highlight=False, soft_wrap=True)


def says_what_it_kept(fn: Callable[P, R]) -> Callable[P, R]:
    """A command whose interrupt prints its RunInterruptedError's line and exits 130."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            with stop_on_sigterm():
                return fn(*args, **kwargs)
        except RunInterruptedError as exc:
            print_interrupt(str(exc))
            raise typer.Exit(EXIT_INTERRUPTED) from None

    return wrapper
