"""The operator's RBAC rules: the one list that the manifest and the Helm chart are written from.

Each rule names only the verbs the operator uses. Server-side apply needs `create` and `patch`;
kopf needs `list` and `watch` on what it watches or indexes (the models, every kind of child, so
that a deleted child is put back, and the pods). A child is read (`get`) before the model's first apply:
an object of its name that is not the model's is not taken over. The models themselves are only listed
and watched (kopf's indexes and event handlers read nothing else), and their status is patched, never
read back. Events are created (kopf posts each as a new one, never patching it) and read: the Warnings
about a model's pods (a volume that cannot be mounted, a failing probe) are what its status names as the
cause of a stuck model.
Children the spec may stop wanting are also deleted (any kind: a router has a Deployment, a Service
and a ConfigMap). ConfigMaps are watched for the routers' configuration; the operator reads no Secret.
Watching CRDs tells whether ServiceMonitors exist and lets kopf serve a CRD installed after the
operator started; watching namespaces tells which ones are being deleted, and serves kopf's
namespace patterns.

Leader election needs its Lease only, in the operator's own namespace: a Role there
(`leader_election_rules`) creates Leases (a create cannot be limited to a name) and reads and patches
the one of the operator's `--lease-name` (a renewal is a JSON patch that tests the resourceVersion it
read).
"""

from __future__ import annotations

from typing import Any

from kubetriton.operator import children, spec

NAME = "kubetriton-operator"
NAMESPACE = "kubetriton-system"

WATCH = ["list", "watch"]
RULES: list[dict[str, list[str]]] = [
    {"apiGroups": [spec.GROUP], "resources": [spec.PLURAL], "verbs": WATCH},
    {"apiGroups": [spec.GROUP], "resources": [f"{spec.PLURAL}/status"], "verbs": ["patch"]},
    *(
        {
            "apiGroups": [kind.group],
            "resources": [kind.plural],
            "verbs": ["get", *WATCH, "create", "patch", "delete"],
        }
        for kind in children.CHILD_KINDS
    ),
    {"apiGroups": [""], "resources": ["pods"], "verbs": WATCH},
    {"apiGroups": [""], "resources": ["events"], "verbs": [*WATCH, "create"]},
    {"apiGroups": [""], "resources": ["namespaces"], "verbs": WATCH},
    {"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"], "verbs": WATCH},
]


def leader_election_rules(lease: str = NAME) -> list[dict[str, list[str]]]:
    """What leader election on the Lease named `lease` needs in the operator's namespace."""
    leases = {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"]}
    return [{**leases, "verbs": ["create"]}, {**leases, "resourceNames": [lease], "verbs": ["get", "patch"]}]


def manifests(namespace: str = NAMESPACE) -> list[dict[str, Any]]:
    """ServiceAccount, ClusterRole and ClusterRoleBinding for an operator watching any namespace, and
    the Role and RoleBinding for its Lease in its own namespace."""
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
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": NAME, "namespace": namespace},
            "rules": leader_election_rules(),
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": NAME, "namespace": namespace},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": NAME},
            "subjects": [{"kind": "ServiceAccount", "name": NAME, "namespace": namespace}],
        },
    ]
