"""The desired child objects of a model: one pure builder per kind, and the set the model needs.

Builders take the validated model and return plain dicts. The reconciler applies what `desired`
returns and deletes the children listed by `unwanted`; `kubetriton render` prints the same list.

A model has at most one child of each `Child`: its kind and the suffix its name adds to the model's
(the model's Service is named after the model, the Service that lists its pods one by one after the
model and `-pods`, the router's children after the model and `-router`). Those suffixes are reserved:
no model's name ends with one (`spec`). The router's objects come from `router`, with the operator's
settings for it; a model has a router when its spec asks for one (the reconciler fills in the operator's
default where the spec does not say).

Each applied child carries the fingerprint of what was applied, so that the reconciler can tell from
the objects it watches, without a request, whether a child is already as the model wants it.
"""

from __future__ import annotations

import copy
import hashlib
import json
from dataclasses import dataclass
from typing import Any

from kubetriton.operator import naming, router
from kubetriton.operator.pod import pod_template
from kubetriton.operator.router import DEFAULT_SETTINGS, RouterSettings
from kubetriton.operator.spec import GROUP, PyTritonModel

DEFAULT_TARGET_CPU_UTILIZATION = 80


@dataclass(frozen=True)
class ChildKind:
    """A kind of child object and where it lives in the API."""

    api_version: str
    kind: str
    plural: str

    @property
    def group(self) -> str:
        return self.api_version.rpartition("/")[0]

    @property
    def resource(self) -> tuple[str, ...]:
        """How kopf names the resource: group, version and plural (no group for the core API)."""
        group, _, version = self.api_version.rpartition("/")
        return (group, version, self.plural) if group else (version, self.plural)


DEPLOYMENT = ChildKind("apps/v1", "Deployment", "deployments")
SERVICE = ChildKind("v1", "Service", "services")
POD_DISRUPTION_BUDGET = ChildKind("policy/v1", "PodDisruptionBudget", "poddisruptionbudgets")
HORIZONTAL_POD_AUTOSCALER = ChildKind("autoscaling/v2", "HorizontalPodAutoscaler", "horizontalpodautoscalers")
SERVICE_MONITOR = ChildKind("monitoring.coreos.com/v1", "ServiceMonitor", "servicemonitors")
CONFIG_MAP = ChildKind("v1", "ConfigMap", "configmaps")
CHILD_KINDS = (
    DEPLOYMENT,
    SERVICE,
    POD_DISRUPTION_BUDGET,
    HORIZONTAL_POD_AUTOSCALER,
    SERVICE_MONITOR,
    CONFIG_MAP,
)


@dataclass(frozen=True)
class Child:
    """One child of a model: its kind, and what its name adds to the model's name."""

    kind: ChildKind
    suffix: str = ""

    def name(self, model_name: str) -> str:
        return naming.child_name(model_name, self.suffix)

    def describe(self, model_name: str) -> str:
        """The kind, and the name where it is not the model's."""
        return f"{self.kind.kind} {self.name(model_name)}" if self.suffix else self.kind.kind


MODEL_DEPLOYMENT = Child(DEPLOYMENT)
MODEL_SERVICE = Child(SERVICE)
PODS_SERVICE = Child(SERVICE, naming.PODS_SUFFIX)
DISRUPTION_BUDGET = Child(POD_DISRUPTION_BUDGET)
AUTOSCALER = Child(HORIZONTAL_POD_AUTOSCALER)
MONITOR = Child(SERVICE_MONITOR)
ROUTER_CONFIG = Child(CONFIG_MAP, naming.ROUTER_SUFFIX)
ROUTER_DEPLOYMENT = Child(DEPLOYMENT, naming.ROUTER_SUFFIX)
ROUTER_SERVICE = Child(SERVICE, naming.ROUTER_SUFFIX)
ROUTER_DISRUPTION_BUDGET = Child(POD_DISRUPTION_BUDGET, naming.ROUTER_SUFFIX)
ROUTER = (ROUTER_CONFIG, ROUTER_DEPLOYMENT, ROUTER_SERVICE, ROUTER_DISRUPTION_BUDGET)
"""The router's children, in the order they are applied: its configuration before the pods that read it."""
CHILDREN = (MODEL_DEPLOYMENT, MODEL_SERVICE, PODS_SERVICE, DISRUPTION_BUDGET, AUTOSCALER, MONITOR, *ROUTER)
SERVICE_MONITOR_CRD = "servicemonitors.monitoring.coreos.com"
SERVICE_MONITOR_ENDPOINTS = [{"port": "metrics", "path": "/metrics"}, {"port": "worker", "path": "/metrics"}]
FINGERPRINT_ANNOTATION = f"{GROUP}/fingerprint"


def _header(child: Child, model: PyTritonModel) -> dict[str, Any]:
    """apiVersion, kind and metadata of one of the model's children."""
    metadata: dict[str, Any] = {
        "name": child.name(model.metadata.name),
        "labels": naming.labels(model.metadata.name),
    }
    if model.metadata.namespace:
        metadata["namespace"] = model.metadata.namespace
    return {"apiVersion": child.kind.api_version, "kind": child.kind.kind, "metadata": metadata}


def _object(child: Child, model: PyTritonModel, spec: dict[str, Any]) -> dict[str, Any]:
    return {**_header(child, model), "spec": spec}


def build_deployment(model: PyTritonModel) -> dict[str, Any]:
    """The Deployment: rolling updates that never drop below the wanted number of ready pods."""
    spec: dict[str, Any] = {
        "selector": {"matchLabels": naming.selector_labels(model.metadata.name)},
        "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
        "template": pod_template(model),
    }
    if model.spec.fixed_replicas is not None:
        spec["replicas"] = model.spec.fixed_replicas
    return _object(MODEL_DEPLOYMENT, model, spec)


def first_deployment(deployment: dict[str, Any], model: PyTritonModel) -> dict[str, Any]:
    """The Deployment as it is created: an autoscaled model starts with its minimum of replicas.

    The count is set on creation only; from then on the autoscaler owns it (see
    `build_replicas`), and the Deployment keeps the fingerprint of the object without it.
    """
    if "replicas" in deployment["spec"]:
        return deployment
    first = copy.deepcopy(deployment)
    first["spec"]["replicas"] = model.spec.min_replicas
    return first


def build_replicas(model: PyTritonModel, replicas: int) -> dict[str, Any]:
    """The Deployment's replica count alone (at least the autoscaler's minimum), for a field manager
    other than the operator's own: the operator's autoscaler, or the handover below.

    Under server-side apply, a field that its only manager stops applying is removed, and a
    Deployment without replicas falls back to one. Applying the live count under another manager
    first keeps it while an autoscaler takes the field over.
    """
    metadata: dict[str, Any] = {"name": model.metadata.name}
    if model.metadata.namespace:
        metadata["namespace"] = model.metadata.namespace
    return {
        "apiVersion": DEPLOYMENT.api_version,
        "kind": DEPLOYMENT.kind,
        "metadata": metadata,
        "spec": {"replicas": max(replicas, model.spec.min_replicas)},
    }


def _serving_ports(model: PyTritonModel) -> list[dict[str, Any]]:
    """Triton's HTTP and gRPC ports."""
    ports = model.spec.service.ports
    return [
        {"name": "http", "port": ports.http, "targetPort": "http", "protocol": "TCP"},
        {"name": "grpc", "port": ports.grpc, "targetPort": "grpc", "protocol": "TCP", "appProtocol": "grpc"},
    ]


def _metrics_ports(model: PyTritonModel) -> list[dict[str, Any]]:
    """Triton's metrics port and the worker's health port (its /metrics, /readyz and /livez)."""
    ports = model.spec.service.ports
    return [
        {"name": "metrics", "port": ports.metrics, "targetPort": "metrics", "protocol": "TCP"},
        {"name": "worker", "port": ports.worker, "targetPort": "health", "protocol": "TCP"},
    ]


def _metrics_inside(model: PyTritonModel) -> bool:
    """Whether the model's Service carries the metrics ports: where it is reached from inside the cluster
    only (ClusterIP). A NodePort or LoadBalancer Service would publish them beyond it, so the headless
    Service carries them then. One Service or the other, never both: the ServiceMonitor, which selects
    the model's Services by their labels, scrapes each pod once."""
    return model.spec.service.type == "ClusterIP"


def build_service(model: PyTritonModel) -> dict[str, Any]:
    """The Service of the spec's type: one address for the model, balanced per connection."""
    ports = _serving_ports(model) + (_metrics_ports(model) if _metrics_inside(model) else [])
    return _object(
        MODEL_SERVICE,
        model,
        {
            "type": model.spec.service.type,
            "selector": naming.selector_labels(model.metadata.name),
            "ports": ports,
        },
    )


def build_pods_service(model: PyTritonModel) -> dict[str, Any]:
    """A headless Service: its name resolves to the address of each Ready pod, so that a client (a
    ModelClient given this name, or the router) balances each request over the pods itself. A pod that
    stops or is not Ready leaves the answer. The HTTP and gRPC ports, and the metrics ports where the
    model's Service is published beyond the cluster (`_metrics_inside`)."""
    ports = _serving_ports(model) + ([] if _metrics_inside(model) else _metrics_ports(model))
    return _object(
        PODS_SERVICE,
        model,
        {"clusterIP": "None", "selector": naming.selector_labels(model.metadata.name), "ports": ports},
    )


def _one_at_a_time(selector: dict[str, str]) -> dict[str, Any]:
    """A disruption budget's spec: voluntary evictions take one Ready pod at a time, and a pod that is not
    Ready may always go (it serves nothing), so that a model that cannot become Ready, or a router with
    no pod to send to, does not hold up a node's drain."""
    return {
        "maxUnavailable": 1,
        "unhealthyPodEvictionPolicy": "AlwaysAllow",
        "selector": {"matchLabels": selector},
    }


def build_pod_disruption_budget(model: PyTritonModel) -> dict[str, Any]:
    """Voluntary evictions take one pod at a time (`_one_at_a_time`)."""
    return _object(DISRUPTION_BUDGET, model, _one_at_a_time(naming.selector_labels(model.metadata.name)))


def build_horizontal_pod_autoscaler(model: PyTritonModel) -> dict[str, Any]:
    """The HorizontalPodAutoscaler of the Deployment; CPU utilisation when no metrics are given. (A model
    scaled on its own signals has none: the operator scales it, see `autoscaler`.)"""
    autoscaling = model.spec.autoscaling
    assert autoscaling is not None, "only models with autoscaling have an autoscaler"
    metrics = autoscaling.metrics or [
        {
            "type": "Resource",
            "resource": {
                "name": "cpu",
                "target": {
                    "type": "Utilization",
                    "averageUtilization": autoscaling.target_cpu_utilization
                    or DEFAULT_TARGET_CPU_UTILIZATION,
                },
            },
        }
    ]
    return _object(
        AUTOSCALER,
        model,
        {
            "scaleTargetRef": {
                "apiVersion": DEPLOYMENT.api_version,
                "kind": DEPLOYMENT.kind,
                "name": model.metadata.name,
            },
            "minReplicas": autoscaling.min_replicas,
            "maxReplicas": autoscaling.max_replicas,
            "metrics": metrics,
        },
    )


def build_service_monitor(model: PyTritonModel) -> dict[str, Any]:
    """Prometheus Operator scraping of Triton's metrics and of the worker's (requests, failures, busy
    time, in-flight requests and attached instances per model)."""
    return _object(
        MONITOR,
        model,
        {
            "selector": {"matchLabels": naming.selector_labels(model.metadata.name)},
            "endpoints": SERVICE_MONITOR_ENDPOINTS,
        },
    )


def build_router_config(model: PyTritonModel, settings: RouterSettings) -> dict[str, Any]:
    """The router's HAProxy configuration."""
    return {**_header(ROUTER_CONFIG, model), "data": {router.CONFIG_FILE: router.config(model, settings)}}


def build_router_deployment(model: PyTritonModel, settings: RouterSettings) -> dict[str, Any]:
    """The router's pods; a new one starts before an old one stops."""
    name = model.metadata.name
    return _object(
        ROUTER_DEPLOYMENT,
        model,
        {
            "replicas": router.REPLICAS,
            "selector": {"matchLabels": naming.router_selector_labels(name)},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
            "template": router.pod_template(
                model, settings, ROUTER_CONFIG.name(name), router.config(model, settings)
            ),
        },
    )


def build_router_service(model: PyTritonModel, settings: RouterSettings) -> dict[str, Any]:
    """The router's address, inside the cluster: the model's HTTP and gRPC ports, and its metrics."""
    return _object(
        ROUTER_SERVICE,
        model,
        {
            "type": "ClusterIP",
            "selector": naming.router_selector_labels(model.metadata.name),
            "ports": router.service_ports(model),
        },
    )


def build_router_disruption_budget(model: PyTritonModel, settings: RouterSettings) -> dict[str, Any]:
    """Voluntary evictions take one router pod at a time (`_one_at_a_time`)."""
    return _object(
        ROUTER_DISRUPTION_BUDGET, model, _one_at_a_time(naming.router_selector_labels(model.metadata.name))
    )


def wanted(model: PyTritonModel, *, service_monitor: bool) -> list[Child]:
    """The children the model needs, in the order they are applied."""
    wanted = [MODEL_DEPLOYMENT, MODEL_SERVICE, PODS_SERVICE]
    if model.spec.min_replicas > 1:
        wanted.append(DISRUPTION_BUDGET)
    if model.spec.autoscaling is not None and not model.spec.scaled_by_operator:
        wanted.append(AUTOSCALER)
    if service_monitor:
        wanted.append(MONITOR)
    if model.spec.router:
        wanted.extend(ROUTER)
    return wanted


_BUILDERS = {
    MODEL_DEPLOYMENT: build_deployment,
    MODEL_SERVICE: build_service,
    PODS_SERVICE: build_pods_service,
    DISRUPTION_BUDGET: build_pod_disruption_budget,
    AUTOSCALER: build_horizontal_pod_autoscaler,
    MONITOR: build_service_monitor,
}
_ROUTER_BUILDERS = {
    ROUTER_CONFIG: build_router_config,
    ROUTER_DEPLOYMENT: build_router_deployment,
    ROUTER_SERVICE: build_router_service,
    ROUTER_DISRUPTION_BUDGET: build_router_disruption_budget,
}


def build(
    child: Child, model: PyTritonModel, router_settings: RouterSettings = DEFAULT_SETTINGS
) -> dict[str, Any]:
    """The object of one of the model's children."""
    if child in _ROUTER_BUILDERS:
        return _ROUTER_BUILDERS[child](model, router_settings)
    return _BUILDERS[child](model)


def desired(
    model: PyTritonModel, *, service_monitor: bool, router_settings: RouterSettings = DEFAULT_SETTINGS
) -> list[dict[str, Any]]:
    """Every child object the model needs."""
    return [build(child, model, router_settings) for child in wanted(model, service_monitor=service_monitor)]


def fingerprint(child: dict[str, Any]) -> str:
    """A digest of everything the operator sets on a child, owner reference included."""
    canonical = json.dumps(child, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def stamped(child: dict[str, Any]) -> dict[str, Any]:
    """The child with its fingerprint in an annotation, as it is applied."""
    metadata = child["metadata"]
    annotations = {**metadata.get("annotations", {}), FINGERPRINT_ANNOTATION: fingerprint(child)}
    return {**child, "metadata": {**metadata, "annotations": annotations}}


def unwanted(model: PyTritonModel, *, service_monitor_available: bool) -> list[Child]:
    """Children that a previous spec may have created and this one no longer needs.

    A ServiceMonitor is only considered where its API exists: elsewhere there is nothing to delete.
    """
    needed = wanted(model, service_monitor=service_monitor_available)
    candidates = [child for child in CHILDREN if child is not MONITOR or service_monitor_available]
    return [child for child in candidates if child not in needed]
