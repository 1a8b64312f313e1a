"""How a model's children are named, labelled and found again.

Children carry the model's name and a fixed set of labels. The builders stamp them, the reconciler's
watches select on them, and the status reports the selector; all three read them from here.
"""

from __future__ import annotations

import hashlib

from kubetriton import podenv

NAME_LABEL = "app.kubernetes.io/name"
INSTANCE_LABEL = "app.kubernetes.io/instance"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
APP_NAME = "pytriton-model"
MANAGER = "kubetriton-operator"


def selector_labels(model_name: str) -> dict[str, str]:
    """The labels that select a model's pods; fixed for the life of the Deployment."""
    return {NAME_LABEL: APP_NAME, INSTANCE_LABEL: model_name}


ROUTER_APP_NAME = "pytriton-model-router"


def router_selector_labels(model_name: str) -> dict[str, str]:
    """The labels that select a model's router pods: not the model's selector, so that neither the model's
    Service nor the operator's count of the model's pods takes them for the model's."""
    return {NAME_LABEL: ROUTER_APP_NAME, INSTANCE_LABEL: model_name}


def router_pod_labels(model_name: str) -> dict[str, str]:
    """The labels of a model's router pods: their selector, and the operator's label, which the operator's
    watch of pods selects on (it reads the router pods' states into the model's status)."""
    return {**router_selector_labels(model_name), MANAGED_BY_LABEL: MANAGER}


def labels(model_name: str) -> dict[str, str]:
    """The labels every child of a model carries."""
    return {**selector_labels(model_name), MANAGED_BY_LABEL: MANAGER}


def selector_string(model_name: str) -> str:
    """The pod selector in the string form used by the scale subresource and `kubectl -l`."""
    return ",".join(f"{key}={value}" for key, value in sorted(selector_labels(model_name).items()))


PODS_SUFFIX = "-pods"
"""The headless Service that lists a model's Ready pods: `<model>-pods`."""
ROUTER_SUFFIX = "-router"
"""The router's children: `<model>-router`."""
RESERVED_SUFFIXES = (PODS_SUFFIX, ROUTER_SUFFIX)
"""No model's name ends with one of these, so that no child of one model has the name of another's."""
CHILD_NAME_MAX_LENGTH = 63
"""A Service's name is a DNS label."""


def child_name(model_name: str, suffix: str) -> str:
    """The model's name and the suffix; a name too long for a DNS label keeps its start and a digest of
    the whole, so that it stays one model's."""
    name = model_name + suffix
    if len(name) <= CHILD_NAME_MAX_LENGTH:
        return name
    digest = hashlib.sha256(model_name.encode()).hexdigest()[:8]
    return f"{model_name[: CHILD_NAME_MAX_LENGTH - len(suffix) - 9]}-{digest}{suffix}"


def http_url(model_name: str, namespace: str, port: int = podenv.HTTP_PORT) -> str:
    return f"http://{model_name}.{namespace}.svc:{port}"


def grpc_url(model_name: str, namespace: str, port: int = podenv.GRPC_PORT) -> str:
    return f"grpc://{model_name}.{namespace}.svc:{port}"


def pods_host(model_name: str, namespace: str) -> str:
    """The name that resolves to each Ready pod of the model: a ModelClient given it balances each
    request over them."""
    return f"{child_name(model_name, PODS_SUFFIX)}.{namespace}.svc"
