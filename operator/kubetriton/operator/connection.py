"""How the cluster commands (`deploy`, `delete`, `status`) reach a cluster: the way kubectl does.

The kubeconfig is --kubeconfig, else $KUBECONFIG (files separated by ':', merged), else
~/.kube/config; in a pod with none of them, the pod's service account. The context is --context,
else the kubeconfig's current one; the namespace -n, else the context's, else "default".

These commands use the kubernetes client, which the operator's own process keeps out (see
`main`). A failure becomes one line on stderr in kubectl's words: `Error from server (Reason):
message` for the API server's refusal, `error: ...` for anything else, and exit status 1.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import urllib3
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException
from kubetriton.operator import naming
from kubetriton.operator.spec import GROUP, PLURAL, VERSION

SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
REQUEST_TIMEOUT_SECONDS = 30
MODEL_RESOURCE = f"{PLURAL}.{GROUP}"
"""How kubectl names the resource in its messages: pytritonmodels.kubetriton.dev."""


class CommandError(Exception):
    """A failure already worded for the user, printed as `error: <message>`."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """kubectl's flags for choosing the cluster and namespace."""
    parser.add_argument(
        "-n", "--namespace", default=None, help="namespace (default: the context's, else default)"
    )
    parser.add_argument(
        "--context", default=None, help="the kubeconfig context to use (default: its current one)"
    )
    parser.add_argument(
        "--kubeconfig", default=None, help="the kubeconfig file (default: $KUBECONFIG, else ~/.kube/config)"
    )


def kubeconfig_path(explicit: str | None) -> str | None:
    """The kubeconfig to read, or None when there is none (in a pod, say)."""
    if explicit:
        if not Path(explicit).expanduser().is_file():
            raise CommandError(f"kubeconfig {explicit}: no such file")
        return explicit
    listed = os.environ.get("KUBECONFIG", "")
    if any(Path(part).expanduser().is_file() for part in listed.split(os.pathsep) if part):
        return listed
    default = Path("~/.kube/config").expanduser()
    return str(default) if default.is_file() else None


def _context_namespace(path: str | None, context: str | None) -> str | None:
    if path is None:
        return SERVICE_ACCOUNT_NAMESPACE.read_text().strip() if SERVICE_ACCOUNT_NAMESPACE.is_file() else None
    contexts, current = config.list_kube_config_contexts(config_file=path)
    chosen = next((entry for entry in contexts if entry["name"] == context), None) if context else current
    if chosen is None:
        raise CommandError(f'context "{context}" does not exist')
    return (chosen.get("context") or {}).get("namespace")


def namespace_of(args: argparse.Namespace) -> str:
    """The namespace a command works in: -n, else the context's, else default. Reads no cluster."""
    if args.namespace:
        return args.namespace
    try:
        return _context_namespace(kubeconfig_path(args.kubeconfig), args.context) or "default"
    except ConfigException as error:
        raise CommandError(str(error)) from error


@dataclass
class Cluster:
    """The APIs of one cluster, and the namespace the command works in."""

    core: client.CoreV1Api
    custom: client.CustomObjectsApi
    namespace: str

    def get_model(self, name: str) -> dict[str, Any] | None:
        """The PyTritonModel, or None when there is none of that name."""
        try:
            return self.custom.get_namespaced_custom_object(
                GROUP, VERSION, self.namespace, PLURAL, name, _request_timeout=REQUEST_TIMEOUT_SECONDS
            )
        except ApiException as error:
            if error.status == 404:
                return None
            raise

    def require_model(self, name: str) -> dict[str, Any]:
        """The PyTritonModel; raises the API server's NotFound when there is none."""
        found = self.get_model(name)
        if found is None:
            raise model_not_found(name)
        return found

    def pod_metrics(self, pod: str, port: int) -> str | None:
        """A pod's Prometheus page on `port`, through the API server's pod proxy; None when it cannot be
        read (the pod does not answer, or the user may not use the proxy)."""
        try:
            return self.core.connect_get_namespaced_pod_proxy_with_path(
                f"{pod}:{port}", self.namespace, "metrics", _request_timeout=REQUEST_TIMEOUT_SECONDS
            )
        except (ApiException, OSError, urllib3.exceptions.HTTPError):
            return None

    def pods(self, name: str) -> list[dict[str, Any]]:
        """The model's pods, as plain dicts in the API's spelling."""
        listing = self.core.list_namespaced_pod(
            self.namespace,
            label_selector=naming.selector_string(name),
            _request_timeout=REQUEST_TIMEOUT_SECONDS,
            _preload_content=False,
        )
        return answer(listing)["items"]


def model_not_found(name: str) -> ApiException:
    """The API server's answer for a model that does not exist, as kubectl prints it."""
    refusal = {"reason": "NotFound", "message": f'{MODEL_RESOURCE} "{name}" not found'}
    return ApiException(status=404, reason="Not Found", body=json.dumps(refusal))


def answer(response: Any) -> dict[str, Any]:
    """The API server's answer as it wrote it, from a call made with `_preload_content=False`: the
    client's own models refuse objects that lack fields they expect, and read no answer with a status
    they do not expect (201 to a PATCH that creates)."""
    return json.loads(response.data)


def connect(args: argparse.Namespace) -> Cluster:
    """A client for the chosen cluster, context and namespace."""
    path = kubeconfig_path(args.kubeconfig)
    try:
        if path is None:
            configuration = client.Configuration()
            config.load_incluster_config(client_configuration=configuration)
            api_client = client.ApiClient(configuration)
        else:
            api_client = config.new_client_from_config(config_file=path, context=args.context)
    except ConfigException as error:
        if path is None:
            raise CommandError(
                "no kubeconfig found (--kubeconfig, $KUBECONFIG, ~/.kube/config) and not running in a pod"
            ) from error
        raise CommandError(str(error)) from error
    return Cluster(
        core=client.CoreV1Api(api_client),
        custom=client.CustomObjectsApi(api_client),
        namespace=namespace_of(args),
    )


def server_error(error: ApiException) -> str:
    """kubectl's line for a refusal: `Error from server (Reason): message`."""
    try:
        answer = json.loads(error.body or "")
    except ValueError:
        answer = {}
    if not isinstance(answer, dict):
        answer = {}
    reason = answer.get("reason") or error.reason or f"HTTP {error.status}"
    message = answer.get("message") or error.body or ""
    return f"Error from server ({reason}): {message}"


def run_reporting_failures(command: Callable[[], int]) -> int:
    """Run a command; a failure becomes one line on stderr and exit status 1."""
    try:
        return command()
    except CommandError as error:
        print(f"error: {error}", file=sys.stderr)
    except ApiException as error:
        print(server_error(error), file=sys.stderr)
    except urllib3.exceptions.HTTPError as error:
        print(f"error: cannot reach the Kubernetes API server: {error}", file=sys.stderr)
    return 1


def age(timestamp: str | None, now: datetime.datetime | None = None) -> str:
    """How long ago an RFC 3339 time was, as kubectl shows ages: 45s, 12m, 5h, 3d."""
    if not timestamp:
        return "<unknown>"
    then = datetime.datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
    seconds = int(((now or datetime.datetime.now(datetime.timezone.utc)) - then).total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= 2 * size:
            return f"{seconds // size}{unit}"
    return f"{max(seconds, 0)}s"
