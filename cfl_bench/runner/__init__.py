"""The run: configuration, the plan of a run, its execution, summary, costs, trackers and
the executor registry: what every command that runs something shares. It imports the
engine, streams, strategies and the core, never an application above it."""
