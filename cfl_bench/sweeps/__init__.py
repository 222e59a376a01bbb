"""``cfl-bench sweep``: many runs over a grid of options, resumable and parallel.

The package is split by concept so each piece can be read (and tested) alone:

- ``grid``      — which configurations a sweep covers, in which order, under which names;
- ``ledger``    — what the sweep keeps on disk (skip rule, failed summaries, manifest, log);
- ``worker``    — what runs inside one child process (one grid point);
- ``launcher``  — how children are started (preloaded fork server, threads per run);
- ``scheduler`` — the loop that keeps ``jobs`` children busy and records their outcome;
- ``ray_backend`` — the points as Ray tasks; ``slurm`` — the points as a Slurm job array
  script, written for the user to submit; ``point`` — one point in a fresh interpreter;
- ``display``   — the rich progress over the whole grid and the final table;
- ``command``   — the glue behind ``cfl-bench sweep``.

Nothing here imports torch at module level: the sweep process itself only reads YAML,
names directories and waits on children, so it starts in a fraction of a second; the
engine is imported once, by the fork server the run children are forked from.
"""
