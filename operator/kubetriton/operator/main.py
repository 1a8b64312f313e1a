"""`kubetriton operator`: run the PyTritonModel operator.

The operator watches the namespaces it is given (or all of them) and runs alone: kopf's peering,
which needs its own CRDs and RBAC, is off unless a peering name is given. kopf's scanning (watching
namespaces and CRDs as they come and go) is on only when a namespace is a glob pattern: exact names
need no namespace list, and the PyTritonModel CRD is installed before the operator starts.
"""

from __future__ import annotations

import argparse
import asyncio

import kopf
from kubetriton.operator.reconciler import build_registry, operator_settings

GLOB_CHARACTERS = set("*?[")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    scope = parser.add_mutually_exclusive_group(required=True)
    scope.add_argument(
        "-n",
        "--namespace",
        action="append",
        dest="namespaces",
        metavar="NAMESPACE",
        help="watch this namespace (repeatable; glob patterns allowed)",
    )
    scope.add_argument("-A", "--all-namespaces", action="store_true", help="watch every namespace")
    parser.add_argument(
        "--liveness",
        metavar="URL",
        default=None,
        help="serve a liveness endpoint, e.g. http://0.0.0.0:8080/healthz",
    )
    parser.add_argument(
        "--peering",
        metavar="NAME",
        default=None,
        help="coordinate with other operator replicas through this kopf peering object",
    )
    parser.add_argument("--verbose", action="store_true", help="log kopf's debug messages")


def needs_scanning(namespaces: list[str]) -> bool:
    """Whether any namespace is a pattern that kopf must match against the namespaces that exist."""
    return any(set(namespace) & GLOB_CHARACTERS for namespace in namespaces)


def run(args: argparse.Namespace) -> int:
    kopf.configure(verbose=args.verbose)
    settings = operator_settings()
    settings.scanning.disabled = not needs_scanning(args.namespaces or [])
    asyncio.run(
        kopf.operator(
            registry=build_registry(),
            settings=settings,
            clusterwide=args.all_namespaces,
            namespaces=args.namespaces or (),
            standalone=args.peering is None,
            peering_name=args.peering,
            liveness_endpoint=args.liveness,
        )
    )
    return 0
