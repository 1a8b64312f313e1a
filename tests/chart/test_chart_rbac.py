"""The operator's ServiceAccount is granted exactly kubetriton.operator.rbac.RULES: every verb on every
resource the operator uses, nothing more, cluster-wide or only in the watched namespaces."""

from __future__ import annotations

from typing import Any

import pytest
from helm_cluster import requires_helm
from kubetriton.operator import children, naming, rbac
from releases import NAMESPACE, VALUE_SETS, installed, lease_name

pytestmark = requires_helm

Grant = tuple[str | None, str, str, str, str]
"""(namespace, or None for cluster-wide; API group; resource; verb; the one object's name, or "" for any)."""

CLUSTER_SCOPED = {"namespaces", "customresourcedefinitions"}
"""The cluster-scoped resources among those the operator uses: Roles cannot grant them."""


def _allowed(rules: list[dict[str, Any]]) -> set[tuple[str, str, str, str]]:
    """(group, resource, verb, name) of each thing the rules allow; the name "" for any object."""
    return {
        (group, resource, verb, name)
        for rule in rules
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
        for name in rule.get("resourceNames") or [""]
    }


def _lease_grants(name: str) -> set[Grant]:
    """Leader election's grants: the Lease the operator is told to hold, in its own namespace only, in
    every watch mode."""
    lease = lease_name(installed(name))
    return {(NAMESPACE, *allowed) for allowed in _allowed(rbac.leader_election_rules(lease))}


def _grants(name: str) -> set[Grant]:
    """Everything the operator's ServiceAccount may do, resolved through the release's bindings."""
    release = installed(name)
    pod = release.one("Deployment")["spec"]["template"]["spec"]
    subject = {"kind": "ServiceAccount", "name": pod["serviceAccountName"], "namespace": NAMESPACE}
    grants: set[Grant] = set()
    for binding in release.find("ClusterRoleBinding") + release.find("RoleBinding"):
        if subject not in binding["subjects"]:
            continue
        scope = binding["metadata"].get("namespace")
        kind, role_name = binding["roleRef"]["kind"], binding["roleRef"]["name"]
        role_namespace = scope if kind == "Role" else None
        (role,) = [
            r for r in release.find(kind, role_name) if r["metadata"].get("namespace") == role_namespace
        ]
        grants |= {(scope, *allowed) for allowed in _allowed(role["rules"])}
    return grants


def _operator_objects(name: str, kind: str) -> list[dict[str, Any]]:
    """The release's objects of `kind` that are the operator's, not those of `helm test`."""
    return [
        obj
        for obj in installed(name).find(kind)
        if obj["metadata"]["labels"].get("app.kubernetes.io/component") != "test"
    ]


@pytest.mark.parametrize("name", ["defaults", "crd-not-kept"])
def test_watching_every_namespace_grants_the_rules_cluster_wide(name: str) -> None:
    assert _grants(name) == {(None, *allowed) for allowed in _allowed(rbac.RULES)} | _lease_grants(name)
    roles = [role["metadata"]["name"] for role in _operator_objects(name, "Role")]
    bindings = [binding["metadata"]["name"] for binding in _operator_objects(name, "RoleBinding")]
    assert roles == bindings == ["kubetriton-leader-election"], "no Role but the Lease's"


@pytest.mark.parametrize(
    ("name", "namespaces"),
    [
        ("two-namespaces", {"team-a", "team-b"}),
        ("release-namespace-only", {NAMESPACE}),
        ("customized", {"models"}),
    ],
)
def test_watching_namespaces_grants_namespaced_rules_only_there(name: str, namespaces: set[str]) -> None:
    expected: set[Grant] = set()
    for group, resource, verb, object_name in _allowed(rbac.RULES):
        scopes = {None} if resource in CLUSTER_SCOPED else namespaces
        expected |= {(scope, group, resource, verb, object_name) for scope in scopes}
    assert _grants(name) == expected | _lease_grants(name)


@pytest.mark.parametrize("name", VALUE_SETS)
def test_every_rbac_object_is_bound_to_the_operator_or_aggregated(name: str) -> None:
    release = installed(name)
    bound = {(b["roleRef"]["kind"], b["roleRef"]["name"]) for b in release.find("ClusterRoleBinding")}
    bound |= {(b["roleRef"]["kind"], b["roleRef"]["name"]) for b in release.find("RoleBinding")}
    for role in release.find("ClusterRole") + release.find("Role"):
        labels = role["metadata"]["labels"]
        aggregated = any(key.startswith("rbac.authorization.k8s.io/aggregate-to-") for key in labels)
        assert aggregated or (role["kind"], role["metadata"]["name"]) in bound, role["metadata"]["name"]


def test_users_who_edit_a_namespace_may_manage_models_there() -> None:
    release = installed("defaults")
    edit = release.one("ClusterRole", "kubetriton-edit")
    view = release.one("ClusterRole", "kubetriton-view")
    assert edit["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-edit"] == "true"
    assert edit["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-admin"] == "true"
    assert view["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-view"] == "true"
    edit_grants, view_grants = _allowed(edit["rules"]), _allowed(view["rules"])
    for verb in ("get", "list", "watch", "create", "update", "patch", "delete"):
        assert ("kubetriton.dev", "pytritonmodels", verb, "") in edit_grants
    assert {verb for _, _, verb, _ in view_grants} == {"get", "list", "watch"}
    assert {group for group, _, _, _ in edit_grants | view_grants} == {"kubetriton.dev"}


def test_aggregation_can_be_turned_off() -> None:
    names = {role["metadata"]["name"] for role in installed("customized").find("ClusterRole")}
    assert names == {"triton-operator"}


def test_the_operator_may_write_only_what_it_manages() -> None:
    """The admission policy matches the operator's writes of its children's kinds; only its own pass."""
    release = installed("customized")
    policy = release.one("ValidatingAdmissionPolicy")
    binding = release.one("ValidatingAdmissionPolicyBinding")
    assert binding["spec"] == {"policyName": policy["metadata"]["name"], "validationActions": ["Deny"]}
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Fail"
    children_kinds = {(kind.group, kind.plural) for kind in children.CHILD_KINDS}
    matched = {
        (group, resource)
        for rule in spec["matchConstraints"]["resourceRules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
    }
    assert matched == children_kinds and ("", "events") not in matched, "kopf's Events carry no labels"
    assert all(
        rule["operations"] == ["CREATE", "UPDATE", "DELETE"]
        for rule in spec["matchConstraints"]["resourceRules"]
    )
    account = release.one("Deployment")["spec"]["template"]["spec"]["serviceAccountName"]
    (condition,) = spec["matchConditions"]
    assert (
        condition["expression"]
        == f"request.userInfo.username == 'system:serviceaccount:{NAMESPACE}:{account}'"
    )
    label = f"['{naming.MANAGED_BY_LABEL}'] == '{naming.MANAGER}'"
    old, new = spec["validations"]
    assert (
        old["expression"].startswith("request.operation == 'CREATE' || ")
        and f"oldObject.metadata.labels{label}" in old["expression"]
    )
    assert (
        new["expression"].startswith("request.operation == 'DELETE' || ")
        and f"object.metadata.labels{label}" in new["expression"]
    )


def test_the_admission_policy_can_be_left_out() -> None:
    release = installed("crd-not-kept")
    assert release.find("ValidatingAdmissionPolicy") == release.find("ValidatingAdmissionPolicyBinding") == []
