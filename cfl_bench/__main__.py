"""``python -m cfl_bench``: the ``cfl-bench`` command, for when the console script is not on
PATH (a virtual environment not activated, a checkout used without installing)."""

from cfl_bench.cli import main

if __name__ == "__main__":
    main()
