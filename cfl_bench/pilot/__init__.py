"""Pilot studies: small, fast experiments that reproduce a paper's motivating figure with the
suite's real engine and components (``cfl-bench pilot …``; docs/pilot.md).

Nothing is imported here: the command line registers ``cfl_bench.pilot.cli`` at start-up, and
the pilots themselves (torch, scikit-learn, matplotlib) load only when a pilot command runs.
"""
