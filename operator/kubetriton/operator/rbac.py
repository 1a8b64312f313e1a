"""The operator's RBAC rules: the one list that the manifest and the Helm chart are written from.

Each rule names only the verbs the operator uses. Server-side apply needs `create` and `patch`;
kopf needs `list` and `watch` on what it watches or indexes and `patch` on the models for its
annotations. Reading CRDs tells whether ServiceMonitors exist; listing and watching CRDs and
namespaces serves kopf's scanning, which runs when the operator watches namespace patterns.
"""

from __future__ import annotations

from typing import Any

from kubetriton.operator import children, spec

NAME = "kubetriton-operator"
NAMESPACE = "kubetriton-system"

RULES: list[dict[str, list[str]]] = [
    {"apiGroups": [spec.GROUP], "resources": [spec.PLURAL], "verbs": ["get", "list", "watch", "patch"]},
    {"apiGroups": [spec.GROUP], "resources": [f"{spec.PLURAL}/status"], "verbs": ["get", "patch"]},
    {
        "apiGroups": [children.DEPLOYMENT.group],
        "resources": [children.DEPLOYMENT.plural],
        "verbs": ["list", "watch", "create", "patch"],
    },
    {
        "apiGroups": [children.SERVICE.group],
        "resources": [children.SERVICE.plural],
        "verbs": ["create", "patch"],
    },
    *(
        {"apiGroups": [kind.group], "resources": [kind.plural], "verbs": ["create", "patch", "delete"]}
        for kind in (
            children.POD_DISRUPTION_BUDGET,
            children.HORIZONTAL_POD_AUTOSCALER,
            children.SERVICE_MONITOR,
        )
    ),
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]},
    {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["list", "watch"]},
    {
        "apiGroups": ["apiextensions.k8s.io"],
        "resources": ["customresourcedefinitions"],
        "verbs": ["get", "list", "watch"],
    },
]


def manifests(namespace: str = NAMESPACE) -> list[dict[str, Any]]:
    """ServiceAccount, ClusterRole and ClusterRoleBinding for an operator watching any namespace."""
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": NAME, "namespace": namespace}},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": NAME},
            "rules": RULES,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": NAME},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": NAME},
            "subjects": [{"kind": "ServiceAccount", "name": NAME, "namespace": namespace}],
        },
    ]
