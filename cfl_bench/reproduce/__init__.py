"""Reproducing the papers' tables: targets as data, table definitions, runs, verdicts.

- ``targets``    — the papers' printed cells (``reproductions/targets/*.csv``), loaded and checked;
- ``tables``     — a reproducible table: cells → run options and strategies, scales, claims;
- ``collect``    — which finished runs of a folder fill which cells, at which scale;
- ``verdict``    — within noise / same direction / differs, from numbers alone;
- ``outcome``    — a table's cells joined with runs and judged;
- ``report``     — CSV, Markdown, HTML and terminal output of an outcome;
- ``provenance`` — commit, torch build, machine and time of a table's runs; cost per scale;
- ``shipping``   — the reference results in ``reproductions/results/``;
- ``command``    — ``cfl-bench reproduce``.
"""
