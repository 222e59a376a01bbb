"""``flwr-clientapp`` for the nodes of ``cfl-bench flower node``: Flower's own ClientApp
process (``flwr.supernode.runtime.run_clientapp``, the same arguments, the same message
path), minus the import of Flower's SuperNode command-line package.

Why: the SuperNode's SuperExec starts one ``flwr-clientapp`` per message. Flower's script
imports ``flwr.supernode.cli``, whose ``__init__`` also imports the SuperNode server
(SQLAlchemy, Alembic, FastAPI): 1.9 s of CPU per message on this machine, against 1.0 s for
``run_clientapp`` alone. With ten nodes on two cores that is ~4.5 s of every message phase.
``cfl-bench flower node`` puts this script first on its SuperNode's ``PATH`` (where SuperExec
looks the command up), and only for the Flower version it mirrors (:data:`MIRRORED`): the
argument parser and the call are those of ``flwr.supernode.cli.flwr_clientapp``.
"""

from __future__ import annotations

import argparse

#: The Flower release whose ``flwr_clientapp`` this mirrors (major.minor).
MIRRORED = "1.42"


def mirrors_installed_flower() -> bool:
    """Whether the installed Flower is the release this script mirrors."""
    from importlib.metadata import version

    return ".".join(version("flwr").split(".")[:2]) == MIRRORED


def main() -> None:
    from flwr.common.args import add_args_flwr_app_common, try_obtain_flwr_app_token
    from flwr.supercore.tls import validate_and_resolve_root_certificates
    from flwr.supernode.runtime.run_clientapp import run_clientapp

    parser = argparse.ArgumentParser(description="Run a Flower ClientApp")
    parser.add_argument("--runtime-api-address", dest="runtime_api_address", required=True)
    add_args_flwr_app_common(parser=parser)
    args = parser.parse_args()
    run_clientapp(
        runtime_api_address=args.runtime_api_address,
        token=try_obtain_flwr_app_token(args),
        insecure=args.insecure,
        certificates=validate_and_resolve_root_certificates(args.root_certificates, args.insecure),
        parent_pid=args.parent_pid,
        runtime_dependency_install=args.runtime_dependency_install,
    )


if __name__ == "__main__":
    main()
