"""The router of a model: HAProxy in front of the model's pods, choosing a pod for each request.

A model's Service balances connections, and a client keeps its connection, so every request of a
client goes to the pod its connection went to. ModelClient balances each request itself; other clients
(curl, tritonclient, perf_analyzer, other languages) get the router, when the model's spec asks for it
(`spec.router`) or the operator's default does: two HAProxy pods behind a Service `<model>-router`, on
the model's HTTP and gRPC ports. HAProxy sends each HTTP/1.1 request and each HTTP/2 (gRPC) stream to
the pod with the fewest requests in flight (`balance leastconn` counts requests, not connections), and
finds the pods by the name of the model's headless Service, which resolves to each Ready pod: a pod
that joins gets requests within a few seconds, one that leaves gets no new ones, and no config
changes, so the router does not restart when the model scales or rolls. A request that reached no
pod, or whose pod closed the connection without answering (a stopping pod's keep-alive connection), is
sent to another one.

HAProxy because clusters already run it, it is packaged by Debian (the real-cluster kit builds its
image from there), it follows a DNS name at run time without a reload, and it exports Prometheus
metrics itself; NGINX's open-source build resolves its upstreams only at start (until recent
versions), and Envoy needs a control plane or a longer configuration for the same.

Pure functions: the HAProxy configuration and the router's pod template and ports. `children` makes
the model's children of them; the operator's settings (image, resources, the cluster's DNS domain)
come from its command line, which the chart's `router` values set.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kubetriton import podenv
from kubetriton.operator import naming
from kubetriton.operator.spec import PyTritonModel

DEFAULT_IMAGE = "docker.io/library/haproxy:2.8"
"""The official image of HAProxy's 2.8 long-term-support branch; the configuration also runs on 2.6."""
DEFAULT_RESOURCES: Mapping[str, Any] = {
    "requests": {"cpu": "100m", "memory": "64Mi"},
    "limits": {"memory": "256Mi"},
}
DEFAULT_CLUSTER_DOMAIN = "cluster.local"
REPLICAS = 2
CONTAINER = "haproxy"
HTTP_PORT = podenv.HTTP_PORT
GRPC_PORT = podenv.GRPC_PORT
METRICS_PORT = 8404
"""The router's Prometheus metrics (/metrics), liveness (/healthz) and readiness (/readyz)."""
LIVE_PATH = "/healthz"
"""Answers while HAProxy runs: a router whose model has no pod up is not restarted for it."""
READY_PATH = "/readyz"
"""Answers 200 while both backends have a usable pod (one the name resolves to, not marked down by its
checks; HAProxy counts a pod usable from its first address, before its first check), 503 while either
has none: a router joins its Service only when a request sent to it over either protocol finds a pod."""
CONFIG_VOLUME = "config"
CONFIG_DIR = "/usr/local/etc/haproxy"
CONFIG_FILE = "haproxy.cfg"
CONFIG_CHECKSUM_ANNOTATION = "kubetriton.dev/router-config"
"""A digest of the configuration in the pod template: a changed configuration rolls the router."""
MIN_SLOTS = 64
"""Pods the router can send to, at least: one slot per address the pods' name resolves to. More slots
than a model's most replicas would only be needed after a scale beyond them, which changes the
configuration and rolls the router."""
PRESTOP_SECONDS = 5
"""How long a stopping router keeps serving so that its Service stops sending it new connections."""
MAX_CONNECTIONS = 4096
"""Connections one router pod holds at once, clients' and pods' together."""
SHUTDOWN_SLACK_SECONDS = 5


@dataclass(frozen=True)
class RouterSettings:
    """The operator's settings for every model's router."""

    image: str = DEFAULT_IMAGE
    resources: Mapping[str, Any] = field(default_factory=lambda: DEFAULT_RESOURCES)
    enabled_by_default: bool = False
    """Whether a model whose spec does not set `router` gets one."""
    cluster_domain: str = DEFAULT_CLUSTER_DOMAIN
    """HAProxy's resolver applies no search domains: it looks up the pods' fully qualified name."""
    image_pull_secrets: Sequence[Mapping[str, str]] = ()
    """Secrets in each model's namespace for pulling `image` (a mirror in a private registry)."""
    node_selector: Mapping[str, str] = field(default_factory=dict)
    """Where router pods may run, beside a model's pods or elsewhere; a model's own placement is its
    spec's."""
    tolerations: Sequence[Mapping[str, Any]] = ()
    """Taints router pods tolerate: on clusters whose every node is tainted, they schedule nowhere
    without."""


DEFAULT_SETTINGS = RouterSettings()


@dataclass(frozen=True)
class Ports:
    """Where HAProxy listens, and the pods' ports it sends to."""

    http: int = HTTP_PORT
    grpc: int = GRPC_PORT
    metrics: int = METRICS_PORT
    pod_http: int = podenv.HTTP_PORT
    pod_grpc: int = podenv.GRPC_PORT


def pods_fqdn(model: PyTritonModel, cluster_domain: str) -> str:
    """The fully qualified name of the model's headless Service, which resolves to each Ready pod."""
    return f"{naming.pods_host(model.metadata.name, model.metadata.namespace or 'default')}.{cluster_domain}"


def slots(model: PyTritonModel) -> int:
    """How many pods the router can send to: MIN_SLOTS, or the model's most replicas when more."""
    spec = model.spec
    most = spec.autoscaling.max_replicas if spec.autoscaling is not None else spec.fixed_replicas or 0
    return max(MIN_SLOTS, most)


def haproxy_config(
    pods: str,
    *,
    slots: int = MIN_SLOTS,
    stop_seconds: int = podenv.DEFAULT_DRAIN_SECONDS,
    ports: Ports = Ports(),
    nameserver: str | None = None,
) -> str:
    """HAProxy's configuration: HTTP and gRPC frontends that send each request to the pod of `pods`
    (a name that resolves to each pod) with the fewest in flight, and a frontend for health and metrics.

    `nameserver` (host:port) replaces the pod's resolv.conf. A stopping router finishes its requests in
    flight for up to `stop_seconds`.
    """
    resolver = f"nameserver dns {nameserver}" if nameserver else "parse-resolv-conf"
    return f"""\
# The router of a PyTritonModel, written by kubetriton's operator: a change here is overwritten.
global
    log stdout format raw local0 notice
    maxconn {MAX_CONNECTIONS}
    hard-stop-after {stop_seconds}s

# The pods' addresses: the name is looked up every second; a pod that leaves the answer gets no new
# request, and an answer that fails keeps the pods known for a few seconds.
resolvers cluster
    {resolver}
    accepted_payload_size 8192
    resolve_retries 3
    timeout resolve 1s
    timeout retry 1s
    hold nx 3s
    hold other 3s
    hold refused 3s
    hold timeout 30s
    hold obsolete 0s

defaults
    mode http
    log global
    option httplog
    option dontlog-normal
    timeout connect 3s
    timeout client 1h
    timeout server 1h
    timeout http-request 60s
    timeout http-keep-alive 1h
    timeout tunnel 1h
    timeout queue 30s
    timeout check 2s
    # a request that reached no pod, or whose pod closed the connection without answering, goes to another
    retries 3
    option redispatch 1
    retry-on conn-failure empty-response
    default-server init-addr none resolvers cluster resolve-prefer ipv4 check inter 1s fall 2 rise 1

frontend http
    bind :{ports.http}
    default_backend pods-http

frontend grpc
    bind :{ports.grpc} proto h2
    default_backend pods-grpc

# ready while each backend has a pod to send to, alive while HAProxy runs
frontend router
    bind :{ports.metrics}
    monitor-uri {READY_PATH}
    monitor fail if {{ nbsrv(pods-http) lt 1 }} || {{ nbsrv(pods-grpc) lt 1 }}
    http-request return status 200 if {{ path {LIVE_PATH} }}
    http-request use-service prometheus-exporter if {{ path /metrics }}

backend pods-http
    balance leastconn
    option httpchk GET /v2/health/ready
    server-template pod 1-{slots} {pods}:{ports.pod_http}

# checked by a connection to the gRPC port: a check of another port than the server's (Triton's HTTP
# health) would keep the address the server had at start, none for a pod found later (HAProxy 2.6)
backend pods-grpc
    balance leastconn
    server-template pod 1-{slots} {pods}:{ports.pod_grpc} proto h2
"""


def config(model: PyTritonModel, settings: RouterSettings) -> str:
    """The configuration of the model's router."""
    return haproxy_config(
        pods_fqdn(model, settings.cluster_domain), slots=slots(model), stop_seconds=model.spec.drain_seconds
    )


def checksum(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _http_probe(path: str, period: int, failures: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": "metrics"},
        "periodSeconds": period,
        "timeoutSeconds": 2,
        "failureThreshold": failures,
    }


def pod_template(
    model: PyTritonModel, settings: RouterSettings, config_map: str, config_text: str
) -> dict[str, Any]:
    """HAProxy, non-root on a read-only root filesystem, reading the configuration from `config_map`.

    The pods carry labels of their own, which the model's selector does not match: they are not the
    model's pods (the operator's label, which they carry too, lets it read their states). A stopping
    pod pauses, so that its Service stops sending it new connections; then the image's stop signal
    (SIGUSR1 in the official image and the kit's) makes HAProxy close its listeners and finish the
    requests in flight.
    """
    labels = naming.router_selector_labels(model.metadata.name)
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": settings.image,
        "command": ["haproxy", "-db", "-f", f"{CONFIG_DIR}/{CONFIG_FILE}"],
        "ports": [
            {"name": "http", "containerPort": HTTP_PORT, "protocol": "TCP"},
            {"name": "grpc", "containerPort": GRPC_PORT, "protocol": "TCP"},
            {"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"},
        ],
        "readinessProbe": _http_probe(READY_PATH, period=2, failures=2),
        "livenessProbe": _http_probe(LIVE_PATH, period=10, failures=3),
        "lifecycle": {"preStop": {"sleep": {"seconds": PRESTOP_SECONDS}}},
        "volumeMounts": [{"name": CONFIG_VOLUME, "mountPath": CONFIG_DIR, "readOnly": True}],
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
    }
    if settings.resources:
        container["resources"] = dict(settings.resources)
    placement = {
        "imagePullSecrets": [dict(secret) for secret in settings.image_pull_secrets],
        "nodeSelector": dict(settings.node_selector),
        "tolerations": [dict(toleration) for toleration in settings.tolerations],
    }
    return {
        "metadata": {
            "labels": naming.router_pod_labels(model.metadata.name),
            "annotations": {CONFIG_CHECKSUM_ANNOTATION: checksum(config_text)},
        },
        "spec": {
            "containers": [container],
            "volumes": [{"name": CONFIG_VOLUME, "configMap": {"name": config_map}}],
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": podenv.RUN_AS_UID,
                "runAsGroup": podenv.RUN_AS_UID,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "terminationGracePeriodSeconds": PRESTOP_SECONDS
            + model.spec.drain_seconds
            + SHUTDOWN_SLACK_SECONDS,
            "affinity": {
                "podAntiAffinity": {
                    "preferredDuringSchedulingIgnoredDuringExecution": [
                        {
                            "weight": 100,
                            "podAffinityTerm": {
                                "topologyKey": "kubernetes.io/hostname",
                                "labelSelector": {"matchLabels": labels},
                            },
                        }
                    ]
                }
            },
            **{key: value for key, value in placement.items() if value},
        },
    }


def service_ports(model: PyTritonModel) -> list[dict[str, Any]]:
    """The model's HTTP and gRPC Service ports, and the router's metrics."""
    ports = model.spec.service.ports
    return [
        {"name": "http", "port": ports.http, "targetPort": "http", "protocol": "TCP"},
        {"name": "grpc", "port": ports.grpc, "targetPort": "grpc", "protocol": "TCP", "appProtocol": "grpc"},
        {"name": "metrics", "port": METRICS_PORT, "targetPort": "metrics", "protocol": "TCP"},
    ]
