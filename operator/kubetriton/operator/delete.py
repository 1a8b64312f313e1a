"""`kubetriton delete NAME`: remove a model, and with it everything made for it.

Only the PyTritonModel is deleted here: its Deployment, Service and the rest, and the script
ConfigMaps that `kubetriton deploy` made, are owned by it, so Kubernetes' garbage collector
removes them. With --wait the model is deleted in the foreground (it goes only after what it owns)
and the command returns once it is gone.
"""

from __future__ import annotations

import argparse
import time

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubetriton.operator import connection
from kubetriton.operator.connection import Cluster, CommandError
from kubetriton.operator.deploy import DEFAULT_TIMEOUT, duration
from kubetriton.operator.spec import GROUP, PLURAL, VERSION

POLL_SECONDS = 1.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", help="the PyTritonModel to delete")
    connection.add_arguments(parser)
    parser.add_argument(
        "--wait",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="return only once the model and what it owns are gone (default: do not wait)",
    )
    parser.add_argument(
        "--timeout",
        type=duration,
        default=duration(DEFAULT_TIMEOUT),
        help=f"with --wait: how long to wait, e.g. 90s, 5m (default: {DEFAULT_TIMEOUT})",
    )


def _delete(cluster: Cluster, name: str, wait: bool, timeout: float) -> int:
    try:
        cluster.custom.delete_namespaced_custom_object(
            GROUP,
            VERSION,
            cluster.namespace,
            PLURAL,
            name,
            body=client.V1DeleteOptions(propagation_policy="Foreground" if wait else "Background"),
            _request_timeout=connection.REQUEST_TIMEOUT_SECONDS,
        )
    except ApiException as error:
        if error.status == 404:
            raise connection.model_not_found(name) from error
        raise
    deadline = time.monotonic() + timeout
    while wait and cluster.get_model(name) is not None:
        if time.monotonic() >= deadline:
            raise CommandError(
                f"timed out after {timeout:g}s waiting for {name} and what it owns to be deleted"
            )
        time.sleep(POLL_SECONDS)
    print(f'{connection.MODEL_RESOURCE} "{name}" deleted')
    return 0


def run(args: argparse.Namespace) -> int:
    return connection.run_reporting_failures(
        lambda: _delete(connection.connect(args), args.name, args.wait, args.timeout)
    )
