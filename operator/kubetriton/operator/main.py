"""`kubetriton operator`: run the PyTritonModel operator.

The operator watches every namespace unless it is given some (exact names or glob patterns), and
runs alone: kopf's peering, which needs its own CRDs and RBAC, is off unless a peering name is
given. The operator itself lives in `runtime`; this module parses its command line without
importing kopf, so that the operator's process can keep the kubernetes client out (see `run`).
"""

from __future__ import annotations

import argparse
import os
import sys

from kubetriton import podenv


def add_arguments(parser: argparse.ArgumentParser) -> None:
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument(
        "-n",
        "--namespace",
        action="append",
        dest="namespaces",
        metavar="NAMESPACE",
        help="watch only this namespace (repeatable; glob patterns allowed); default: every namespace",
    )
    scope.add_argument(
        "-A", "--all-namespaces", action="store_true", help="watch every namespace (the default)"
    )
    parser.add_argument(
        "--liveness",
        metavar="URL",
        default=None,
        help="serve the operator's health at this URL, e.g. http://0.0.0.0:8080/healthz: "
        "200 while it serves models, 503 while their CRD is missing",
    )
    parser.add_argument(
        "--peering",
        metavar="NAME",
        default=None,
        help="coordinate with other operator replicas through this kopf peering object",
    )
    parser.add_argument(
        "--worker-image",
        default=os.environ.get(podenv.ENV_WORKER_IMAGE),
        help="the kubetriton worker image, which runs the pods' init step where a model's "
        f"spec.bootstrap.image is unset (default: ${podenv.ENV_WORKER_IMAGE}; without either, the "
        "model's own worker image, which must then be built from the kubetriton worker image)",
    )
    parser.add_argument("--verbose", action="store_true", help="log kopf's debug messages")


def run(args: argparse.Namespace) -> int:
    # kopf imports the kubernetes client whenever it is installed, only to recognise the client's
    # model objects, which the operator never hands it; the import alone would cost the operator
    # 12 MiB. Only the operator's own process goes without it, so it is kept out here, not on import.
    sys.modules.setdefault("kubernetes", None)
    from kubetriton.operator import runtime

    runtime.run(args)
    return 0
