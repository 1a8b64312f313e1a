"""The chart on a real cluster: two operators come up under their restricted settings, one of them holding
the Lease, their ServiceAccount writes only what it manages, and `helm test` serves one inference from a
CPU model through its Service."""

from __future__ import annotations

import asyncio
import subprocess
from typing import Any

from kubernetes import client

from e2e.cluster import CRD_NAME, Cluster, Settings, kubectl, kubectl_path, wait_for


def test_two_operators_are_available_and_one_holds_the_lease(
    release: dict[str, Any], cluster: Cluster, settings: Settings
) -> None:
    (deployment,) = cluster.apps.list_namespaced_deployment(
        settings.namespace, label_selector="app.kubernetes.io/component=operator"
    ).items
    assert deployment.status.available_replicas == 2
    listed = cluster.core.list_namespaced_pod(
        settings.namespace, label_selector="app.kubernetes.io/component=operator"
    ).items
    pods = [pod for pod in listed if pod.metadata.deletion_timestamp is None]  # not one an upgrade replaced
    assert len(pods) == 2, [pod.metadata.name for pod in listed]
    for pod in pods:
        assert pod.status.phase == "Running"
        assert pod.spec.security_context.run_as_non_root is True
    leases = client.CoordinationV1Api(cluster.core.api_client)

    def holder() -> str:
        """The pod holding the Lease; none for a moment after an upgrade, whose old leader released it."""
        lease = leases.read_namespaced_lease(deployment.metadata.name, settings.namespace)
        return (lease.spec.holder_identity or "").rsplit("_", 1)[0]

    names = {pod.metadata.name for pod in pods}
    wait_for(lambda: holder() in names, 60, f"one of {sorted(names)} to hold the Lease")


def test_the_crd_is_established(release: dict[str, Any], cluster: Cluster) -> None:
    crd = cluster.crd()
    assert crd is not None, f"{CRD_NAME} is missing"
    conditions = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
    assert conditions.get("Established") == "True"


def test_helm_test_serves_one_inference(release: dict[str, Any], helm_config: Any) -> None:
    import helm_sdkpy  # see conftest.helm_config

    result = asyncio.run(helm_sdkpy.ReleaseTest(helm_config).run(release["name"]))
    phases = {hook["name"]: hook.get("last_run", {}).get("phase") for hook in result.get("hooks", [])}
    assert phases and all(phase == "Succeeded" for phase in phases.values()), phases


MANAGED = """apiVersion: v1
kind: ConfigMap
metadata:
  name: managed-by-the-operator
  labels:
    app.kubernetes.io/managed-by: kubetriton-operator
"""
EVENT = """apiVersion: v1
kind: Event
metadata:
  generateName: posted-by-the-operator-
involvedObject:
  apiVersion: v1
  kind: ConfigMap
  name: not-the-operators
  namespace: {namespace}
type: Normal
reason: Posted
message: an Event as kopf posts one, without labels
"""


def test_the_operators_account_writes_only_what_it_manages(
    release: dict[str, Any], cluster: Cluster, settings: Settings
) -> None:
    """The chart's admission policy: the operator's RBAC lets it write any ConfigMap in the namespaces it
    watches, its token only those labelled as the operator's, and it cannot take one over by labelling it.
    The Events it posts (kopf's, unlabelled) pass."""
    (deployment,) = cluster.apps.list_namespaced_deployment(
        settings.namespace, label_selector="app.kubernetes.io/component=operator"
    ).items
    account = deployment.spec.template.spec.service_account_name
    namespace = settings.models_namespace

    def as_operator(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        command = [kubectl_path(), f"--as=system:serviceaccount:{settings.namespace}:{account}", *args]
        return subprocess.run(command, input=stdin, capture_output=True, text=True, timeout=60)

    def refused_unlabelled() -> subprocess.CompletedProcess[str] | None:
        """The refusal of an unlabelled ConfigMap, or None where it was made (the policy not in force yet)."""
        found = as_operator("create", "configmap", "unlabelled", "-n", namespace)
        if found.returncode == 0:
            kubectl("delete", "configmap", "unlabelled", "-n", namespace)
            return None
        return found

    kubectl("create", "configmap", "not-the-operators", "-n", namespace)
    try:
        refused = wait_for(refused_unlabelled, 30, "the admission policy to be in force", interval_s=1)
        assert "only objects labelled app.kubernetes.io/managed-by=kubetriton-operator" in refused.stderr
        label = "app.kubernetes.io/managed-by=kubetriton-operator"
        for attempt in (
            ("label", "configmap", "not-the-operators", label),
            ("delete", "configmap", "not-the-operators"),
        ):
            done = as_operator(*attempt, "-n", namespace)
            assert done.returncode != 0 and "ValidatingAdmissionPolicy" in done.stderr, (attempt, done.stderr)
        posted = as_operator("create", "-n", namespace, "-f", "-", stdin=EVENT.format(namespace=namespace))
        assert posted.returncode == 0, posted.stderr
        assert as_operator("apply", "-n", namespace, "-f", "-", stdin=MANAGED).returncode == 0
        assert as_operator("delete", "configmap", "managed-by-the-operator", "-n", namespace).returncode == 0
    finally:
        for name in ("not-the-operators", "managed-by-the-operator"):
            kubectl("delete", "configmap", name, "-n", namespace, "--ignore-not-found")
