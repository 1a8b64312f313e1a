"""`kubetriton operator`: run the PyTritonModel operator.

The operator watches every namespace unless it is given some (exact names or glob patterns). With
`--leader-elect`, replicas share a Lease and only its holder reconciles (see `leader`). The
operator itself lives in `runtime`; this module parses its command line without importing kopf, so
that the operator's process can keep the kubernetes client out (see `run`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from kubetriton import podenv
from kubetriton.operator import router


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
        "200 while it serves models, 503 while their CRD is missing; its Prometheus metrics at /metrics "
        "on the same port",
    )
    election = parser.add_argument_group(
        "leader election (several replicas; only the Lease's holder reconciles)"
    )
    election.add_argument(
        "--leader-elect", action="store_true", help="reconcile only while holding the Lease"
    )
    election.add_argument("--lease-name", default="kubetriton-operator", help="default: %(default)s")
    election.add_argument(
        "--lease-namespace",
        default=None,
        help="default: the pod's namespace (from its service account), else the kubeconfig's",
    )
    for flag, default, meaning in (
        ("--lease-duration", 15.0, "how long a Lease lasts unrenewed before a standby takes it"),
        ("--renew-deadline", 10.0, "how long the leader tries to renew before it stops writing"),
        ("--retry-period", 2.0, "how often candidates and the leader try"),
    ):
        election.add_argument(
            flag, type=float, default=default, metavar="SECONDS", help=f"{meaning} (%(default)g)"
        )
    parser.add_argument(
        "--max-concurrent-rollouts",
        type=int,
        default=3,
        metavar="N",
        help="at most N serving models roll their pods at once for a change of the operator's own "
        "pod template (an upgrade); spec changes are never held back (%(default)d)",
    )
    parser.add_argument(
        "--autoscale-interval",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="how often the leader reads the pods of the models it scales on their own signals "
        "(autoscaling.targetQueueMilliseconds or targetInFlightPerPod) and decides (%(default)g)",
    )
    parser.add_argument(
        "--worker-image",
        default=os.environ.get(podenv.ENV_WORKER_IMAGE),
        help="the kubetriton worker image, which runs the pods' init step where a model's "
        f"spec.bootstrap.image is unset (default: ${podenv.ENV_WORKER_IMAGE}; without either, the "
        "model's own worker image, which must then be built from the kubetriton worker image)",
    )
    routers = parser.add_argument_group("routers (HAProxy in front of a model's pods, see spec.router)")
    routers.add_argument(
        "--router-by-default",
        action="store_true",
        help="give a router to every model whose spec.router is unset (default: only to those that ask)",
    )
    routers.add_argument("--router-image", default=router.DEFAULT_IMAGE, help="HAProxy's image (%(default)s)")
    routers.add_argument(
        "--router-resources",
        type=_resources,
        default=router.DEFAULT_RESOURCES,
        metavar="JSON",
        help=f"the router container's resources, as JSON (default: {json.dumps(router.DEFAULT_RESOURCES)})",
    )
    routers.add_argument(
        "--router-image-pull-secrets",
        type=_pull_secrets,
        default=(),
        metavar="JSON",
        help="secrets in each model's namespace for pulling the router image, as a JSON list: "
        '[{"name": "regcred"}] (default: none)',
    )
    routers.add_argument(
        "--router-node-selector",
        type=_node_selector,
        default={},
        metavar="JSON",
        help="the router pods' nodeSelector, as a JSON object of labels (default: any node)",
    )
    routers.add_argument(
        "--router-tolerations",
        type=_tolerations,
        default=(),
        metavar="JSON",
        help="the router pods' tolerations, as a JSON list of Kubernetes tolerations (default: none)",
    )
    routers.add_argument(
        "--cluster-domain",
        default=router.DEFAULT_CLUSTER_DOMAIN,
        help="the cluster's DNS domain, in the name by which a router finds the pods (%(default)s)",
    )
    parser.add_argument("--verbose", action="store_true", help="log kopf's debug messages")


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise argparse.ArgumentTypeError(f"not JSON: {error}") from error


def _resources(text: str) -> dict[str, Any]:
    resources = _json(text)
    if not isinstance(resources, dict):
        raise argparse.ArgumentTypeError("a JSON object of requests and limits is expected")
    return resources


def _pull_secrets(text: str) -> list[dict[str, str]]:
    secrets = _json(text)
    if not isinstance(secrets, list) or not all(
        isinstance(secret, dict)
        and secret.keys() == {"name"}
        and isinstance(secret["name"], str)
        and secret["name"]
        for secret in secrets
    ):
        raise argparse.ArgumentTypeError('a JSON list of {"name": SECRET} objects is expected')
    return secrets


def _node_selector(text: str) -> dict[str, str]:
    selector = _json(text)
    if not isinstance(selector, dict) or not all(isinstance(value, str) for value in selector.values()):
        raise argparse.ArgumentTypeError(
            "a JSON object of node labels and their values (strings) is expected"
        )
    return selector


TOLERATION_FIELDS = {"key", "operator", "value", "effect", "tolerationSeconds"}


def _tolerations(text: str) -> list[dict[str, Any]]:
    tolerations = _json(text)
    if not isinstance(tolerations, list) or not all(
        isinstance(toleration, dict) and toleration.keys() <= TOLERATION_FIELDS for toleration in tolerations
    ):
        raise argparse.ArgumentTypeError(
            f"a JSON list of tolerations is expected, each with some of {sorted(TOLERATION_FIELDS)}"
        )
    return tolerations


def router_settings(args: argparse.Namespace) -> router.RouterSettings:
    return router.RouterSettings(
        image=args.router_image,
        resources=args.router_resources,
        enabled_by_default=args.router_by_default,
        cluster_domain=args.cluster_domain,
        image_pull_secrets=args.router_image_pull_secrets,
        node_selector=args.router_node_selector,
        tolerations=args.router_tolerations,
    )


def run(args: argparse.Namespace) -> int:
    # kopf imports the kubernetes client whenever it is installed, only to recognise the client's
    # model objects, which the operator never hands it; the import alone would cost the operator
    # 12 MiB. Only the operator's own process goes without it, so it is kept out here, not on import.
    sys.modules.setdefault("kubernetes", None)
    from kubetriton.operator import runtime

    runtime.run(args)
    return 0
