"""cfl-bench engine: configuration, the federated round loop, buffers, models, metrics,
run records and the command line. Importing this package has no side effects."""

__version__ = "0.1.0"
