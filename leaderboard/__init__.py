"""The leaderboard: a pure function of many run directories → ``leaderboard.csv`` + ``.html``.

Why a package of its own: aggregation, the CSV, the HTML report, its plots and the
reproduction check each read the same run records but change for different reasons, so each
lives in its own module (docs/architecture.md, "Layers": one concept per module):

* :mod:`leaderboard.runs`      find and validate run directories → one row per run (a
  damaged record makes its run ``damaged``: listed and counted, never averaged);
* :mod:`leaderboard.aggregate` group by (protocol hash, strategy) → mean ± std (sample by
  default, population with ``--std population``; the board says which);
* :mod:`leaderboard.protocol`  one-line protocol summaries;
* :mod:`leaderboard.table`     the CSV (fixed column schema, atomic write);
* :mod:`leaderboard.plots`     matplotlib figures as deterministic inline SVG;
* :mod:`leaderboard.html`      the self-contained, offline HTML report;
* :mod:`leaderboard.page`      its template, CSS and table-sorting script;
* :mod:`leaderboard.check`     compare leaderboard cells with a targets CSV;
* :mod:`leaderboard.output`    checks on ``--out`` and writing both files all-or-nothing;
* :mod:`leaderboard.build`     the whole pipeline (what ``cfl-bench leaderboard`` calls);
* :mod:`leaderboard.command`   the terminal side of the CLI command (rich tables, exit code);
* :mod:`leaderboard.report`    ``cfl-bench report``: the same kind of page for one run, from
  :mod:`leaderboard.run_data` (one run directory read and checked, unfinished runs too),
  :mod:`leaderboard.report_plots` (per-round, per-client and client × class figures) and
  :mod:`leaderboard.report_page` (its template).

Importing this package imports nothing heavy: pandas and matplotlib are loaded by the
modules that need them, so ``cfl-bench --help`` stays fast.
"""
