"""The chart on a real cluster: two operators come up under their restricted settings, one of them holding
the Lease, and `helm test` serves one inference from a CPU model through its Service."""

from __future__ import annotations

import asyncio
from typing import Any

from kubernetes import client

from e2e.cluster import CRD_NAME, Cluster, Settings, wait_for


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
