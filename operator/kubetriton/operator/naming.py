"""How a model's children are named, labelled and found again.

Children carry the model's name and a fixed set of labels. The builders stamp them, the reconciler's
watches select on them, and the status reports the selector; all three read them from here.
"""

from __future__ import annotations

from kubetriton import podenv

NAME_LABEL = "app.kubernetes.io/name"
INSTANCE_LABEL = "app.kubernetes.io/instance"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
APP_NAME = "pytriton-model"
MANAGER = "kubetriton-operator"


def selector_labels(model_name: str) -> dict[str, str]:
    """The labels that select a model's pods; fixed for the life of the Deployment."""
    return {NAME_LABEL: APP_NAME, INSTANCE_LABEL: model_name}


def labels(model_name: str) -> dict[str, str]:
    """The labels every child of a model carries."""
    return {**selector_labels(model_name), MANAGED_BY_LABEL: MANAGER}


def selector_string(model_name: str) -> str:
    """The pod selector in the string form used by the scale subresource and `kubectl -l`."""
    return ",".join(f"{key}={value}" for key, value in sorted(selector_labels(model_name).items()))


def http_url(model_name: str, namespace: str, port: int = podenv.HTTP_PORT) -> str:
    return f"http://{model_name}.{namespace}.svc:{port}"


def grpc_url(model_name: str, namespace: str, port: int = podenv.GRPC_PORT) -> str:
    return f"grpc://{model_name}.{namespace}.svc:{port}"
