"""Leaderboard: aggregation of run directories into CSV and a static HTML report.

Not built yet (see the issue tracker); the run records it will read are defined in
``cfl_bench.records``.
"""
