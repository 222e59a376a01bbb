"""The core: errors, parsing of user numbers, seeding, atomic writes, the flat model,
the replay buffer, the objective, the metric definitions, the records and run-directory
format the leaderboard reads, and the state types components see (context, payloads,
communication, evaluation). It imports nothing of the project outside itself."""
