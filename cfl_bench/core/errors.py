"""The one exception type for bad user input.

Why a dedicated type: the CLI turns exactly these into one clear line and exit code 2, while
any other exception is a bug and keeps its traceback. Messages must name the problem *and*
the fix in one sentence.
"""


class UserError(Exception):
    """Bad input from the user (names, numbers, files); shown as one line, exit code 2."""


class RunInterruptedError(KeyboardInterrupt):
    """Ctrl-C or SIGTERM, with ``str()`` the one line saying what was kept and how to resume.

    Why a KeyboardInterrupt: code that cleans up on an interrupt (``finally``, a run
    directory's release) treats it like any Ctrl-C; the CLI prints the line and exits 130.
    """
