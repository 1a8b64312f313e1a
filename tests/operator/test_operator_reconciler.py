"""The operator running for real (kopf, its own thread) against the emulated API server."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Awaitable, Callable
from typing import Any

import jsonschema
import pytest
from conftest import eventually
from crd_check import admit, load_schema
from emulator import ClusterEmulator, OperatorThread
from kubetriton.operator import children, naming
from kubetriton.operator.spec import PyTritonModel

pytestmark = pytest.mark.asyncio

MODELS = "/apis/kubetriton.dev/v1alpha1/namespaces/{ns}/pytritonmodels"
StartOperator = Callable[[], Awaitable[OperatorThread]]


def model_document(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "kubetriton.dev/v1alpha1",
        "kind": "PyTritonModel",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"worker": {"image": "registry.example.com/identity:1"}, "models": ["Identity"], **spec},
    }


async def request(cluster: ClusterEmulator, method: str, path: str, body: Any, content_type: str) -> dict:
    headers = {"Content-Type": content_type}
    async with cluster.request(method, path, json=body, headers=headers) as response:
        payload = await response.json()
        assert response.status < 300, payload
        return payload


async def create_model(
    cluster: ClusterEmulator, document: dict[str, Any], *, admitted: bool = True, namespace: str = "default"
) -> dict:
    """Create a model as the API server would store it: defaulted, and validated unless told otherwise."""
    if admitted:
        document, errors = admit(document)
        assert errors == []
    return await request(cluster, "POST", MODELS.format(ns=namespace), document, "application/json")


async def patch(cluster: ClusterEmulator, path: str, changes: dict[str, Any]) -> dict:
    return await request(cluster, "PATCH", path, changes, "application/merge-patch+json")


def stored(
    cluster: ClusterEmulator, api: str, name: str, namespace: str = "default"
) -> dict[str, Any] | None:
    try:
        obj = cluster.objects[api, namespace, name]
    except KeyError:
        return None
    return None if obj.deleted else obj.raw


def model(cluster: ClusterEmulator, name: str) -> dict[str, Any] | None:
    return stored(cluster, "kubetriton.dev/v1alpha1/pytritonmodels", name)


def condition(cluster: ClusterEmulator, name: str, kind: str) -> dict[str, Any]:
    conditions = ((model(cluster, name) or {}).get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == kind), {})


def events(cluster: ClusterEmulator, reason: str) -> list[dict[str, Any]]:
    return [
        obj.raw
        for (resource, _, _), obj in cluster.objects.items()
        if resource.plural == "events" and not obj.deleted and obj.raw.get("reason") == reason
    ]


CHILD_APIS = {
    "Deployment": "apps/v1/deployments",
    "Service": "v1/services",
    "PodDisruptionBudget": "policy/v1/poddisruptionbudgets",
    "HorizontalPodAutoscaler": "autoscaling/v2/horizontalpodautoscalers",
}


async def test_create_applies_children_owned_by_the_model(
    cluster: ClusterEmulator, start_operator: StartOperator
):
    await start_operator()
    created = await create_model(cluster, model_document("identity"))
    deployment = await eventually(
        lambda: stored(cluster, CHILD_APIS["Deployment"], "identity"), message="Deployment"
    )
    service = await eventually(lambda: stored(cluster, CHILD_APIS["Service"], "identity"), message="Service")
    owner = {
        "apiVersion": "kubetriton.dev/v1alpha1",
        "kind": "PyTritonModel",
        "name": "identity",
        "uid": created["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }
    for child in (deployment, service):
        assert child["metadata"]["ownerReferences"] == [owner]
    assert stored(cluster, CHILD_APIS["PodDisruptionBudget"], "identity") is None

    status = await eventually(
        lambda: (
            "observedGeneration" in ((model(cluster, "identity") or {}).get("status") or {})
            and model(cluster, "identity")["status"]
        ),
        message="the status of the handled generation",
    )
    assert status["observedGeneration"] == 1
    assert status["selector"] == naming.selector_string("identity")
    assert status["url"] == "http://identity.default.svc:8000"
    assert status["grpcUrl"] == "grpc://identity.default.svc:8001"
    assert {c["type"]: c["status"] for c in status["conditions"]} == {
        "Ready": "False",
        "Progressing": "True",
        "Degraded": "False",
    }
    jsonschema.validate(status, load_schema()["properties"]["status"])
    assert "finalizers" not in model(cluster, "identity")["metadata"]

    rendered = children.desired(
        PyTritonModel.model_validate(admit(model_document("identity"))[0]), service_monitor=False
    )
    assert [deployment["spec"], service["spec"]] == [child["spec"] for child in rendered]


async def test_ready_follows_the_deployment(cluster: ClusterEmulator, start_operator: StartOperator):
    await start_operator()
    await create_model(cluster, model_document("identity"))
    deployment = await eventually(lambda: stored(cluster, CHILD_APIS["Deployment"], "identity"))
    await patch(
        cluster,
        "/apis/apps/v1/namespaces/default/deployments/identity/status",
        {
            "status": {
                "observedGeneration": deployment["metadata"]["generation"],
                "replicas": 1,
                "readyReplicas": 1,
                "updatedReplicas": 1,
                "availableReplicas": 1,
            }
        },
    )
    ready = await eventually(
        lambda: condition(cluster, "identity", "Ready").get("status") == "True", message="Ready=True"
    )
    assert ready
    assert model(cluster, "identity")["status"]["readyReplicas"] == 1
    announced = await eventually(
        lambda: events(cluster, "AllReplicasReady"), message="an event saying it is ready"
    )
    assert announced[0]["type"] == "Normal"


async def test_spec_changes_reach_the_children(cluster: ClusterEmulator, start_operator: StartOperator):
    await start_operator()
    await create_model(cluster, model_document("identity"))
    await eventually(lambda: stored(cluster, CHILD_APIS["Deployment"], "identity"))
    path = MODELS.format(ns="default") + "/identity"

    def worker_image() -> str:
        deployment = stored(cluster, CHILD_APIS["Deployment"], "identity") or {}
        containers = deployment["spec"]["template"]["spec"]["containers"]
        return next(c["image"] for c in containers if c["name"] == "worker")

    await patch(cluster, path, {"spec": {"worker": {"image": "registry.example.com/identity:2"}}})
    await eventually(lambda: worker_image() == "registry.example.com/identity:2", message="new worker image")

    await patch(cluster, path, {"spec": {"replicas": 3}})
    await eventually(lambda: stored(cluster, CHILD_APIS["Deployment"], "identity")["spec"]["replicas"] == 3)
    await eventually(lambda: stored(cluster, CHILD_APIS["PodDisruptionBudget"], "identity"), message="PDB")

    await patch(cluster, path, {"spec": {"replicas": 1}})
    await eventually(
        lambda: stored(cluster, CHILD_APIS["PodDisruptionBudget"], "identity") is None,
        message="PDB removed for a single replica",
    )
    await eventually(
        lambda: model(cluster, "identity")["status"].get("observedGeneration") == 4,
        message="observedGeneration follows the spec",
    )


async def test_autoscaler_takes_over_the_live_replica_count(
    cluster: ClusterEmulator, start_operator: StartOperator
):
    await start_operator()
    await create_model(cluster, model_document("identity", replicas=3))
    await eventually(lambda: stored(cluster, CHILD_APIS["PodDisruptionBudget"], "identity"))
    seen = len(list(cluster))
    await patch(
        cluster,
        MODELS.format(ns="default") + "/identity",
        {"spec": {"replicas": None, "autoscaling": {"minReplicas": 2, "maxReplicas": 5}}},
    )
    await eventually(
        lambda: stored(cluster, CHILD_APIS["HorizontalPodAutoscaler"], "identity"), message="HPA"
    )
    applies = [
        (r.params["fieldManager"], r.data["spec"])
        for r in list(cluster)[seen:]
        if r.method == "PATCH" and r.resource is not None and r.resource.plural == "deployments"
    ]
    assert applies[0] == ("kubetriton-operator-handover", {"replicas": 3})
    assert applies[1][0] == "kubetriton-operator" and "replicas" not in applies[1][1]


async def test_a_deleted_deployment_comes_back(cluster: ClusterEmulator, start_operator: StartOperator):
    await start_operator()
    await create_model(cluster, model_document("identity"))
    first = await eventually(lambda: stored(cluster, CHILD_APIS["Deployment"], "identity"))
    async with cluster.delete("/apis/apps/v1/namespaces/default/deployments/identity") as response:
        assert response.status == 200
    again = await eventually(
        lambda: stored(cluster, CHILD_APIS["Deployment"], "identity"), message="the Deployment applied again"
    )
    assert again["metadata"]["uid"] != first["metadata"]["uid"]
    assert again["spec"] == first["spec"]


async def test_deleted_model_leaves_children_to_garbage_collection(
    cluster: ClusterEmulator, start_operator: StartOperator
):
    operator = await start_operator()
    created = await create_model(cluster, model_document("identity", replicas=2))
    await eventually(lambda: stored(cluster, CHILD_APIS["PodDisruptionBudget"], "identity"))
    async with cluster.delete(MODELS.format(ns="default") + "/identity") as response:
        assert response.status == 200
    await eventually(
        lambda: model(cluster, "identity") is None, message="deletion not blocked by a finalizer"
    )
    uid = created["metadata"]["uid"]
    for api in ("Deployment", "Service", "PodDisruptionBudget"):
        child = stored(cluster, CHILD_APIS[api], "identity")
        assert child is not None and [ref["uid"] for ref in child["metadata"]["ownerReferences"]] == [uid]
    assert operator.alive


async def test_restart_creates_no_duplicates(cluster: ClusterEmulator, start_operator: StartOperator):
    first = await start_operator()
    await create_model(cluster, model_document("identity", replicas=2))
    await eventually(lambda: stored(cluster, CHILD_APIS["PodDisruptionBudget"], "identity"))
    uids = {
        kind: stored(cluster, api, "identity")["metadata"]["uid"]
        for kind, api in CHILD_APIS.items()
        if kind != "HorizontalPodAutoscaler"
    }
    await asyncio.to_thread(first.stop)
    seen = len(list(cluster))

    await start_operator()
    await eventually(
        lambda: any(
            r.method == "PATCH" and r.resource is not None and r.resource.plural == "deployments"
            for r in list(cluster)[seen:]
        ),
        message="the operator resumed the model",
    )
    after = {
        kind: stored(cluster, api, "identity")["metadata"]["uid"]
        for kind, api in CHILD_APIS.items()
        if kind != "HorizontalPodAutoscaler"
    }
    assert after == uids
    assert not [r for r in list(cluster)[seen:] if r.method == "POST" and r.resource.plural != "events"]
    children = [
        key
        for key, obj in cluster.objects.items()
        if not obj.deleted
        and (obj.raw.get("metadata") or {}).get("labels", {}).get(naming.INSTANCE_LABEL) == "identity"
    ]
    assert len(children) == 3


def pending_pod(model_name: str, message: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{model_name}-6d4cf56db6-x2x9z",
            "namespace": "default",
            "labels": naming.labels(model_name),
        },
        "spec": {"containers": [{"name": "worker", "image": "w"}]},
        "status": {
            "phase": "Pending",
            "conditions": [
                {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}
            ],
        },
    }


async def test_pod_without_a_gpu_is_reported(cluster: ClusterEmulator, start_operator: StartOperator):
    await start_operator()
    await create_model(cluster, model_document("esm1", gpus={"count": 1}))
    await eventually(lambda: stored(cluster, CHILD_APIS["Deployment"], "esm1"))
    message = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."
    await request(
        cluster, "POST", "/api/v1/namespaces/default/pods", pending_pod("esm1", message), "application/json"
    )
    ready = await eventually(
        lambda: (
            condition(cluster, "esm1", "Ready").get("reason") == "InsufficientGPU"
            and condition(cluster, "esm1", "Ready")
        ),
        message="InsufficientGPU",
    )
    assert ready["status"] == "False" and message in ready["message"]
    assert condition(cluster, "esm1", "Degraded")["status"] == "True"
    warning = await eventually(lambda: events(cluster, "InsufficientGPU"), message="a warning event")
    assert warning[0]["type"] == "Warning"
    assert warning[0]["involvedObject"]["name"] == "esm1"
    pod_watches = [r for r in cluster if r.resource and r.resource.plural == "pods" and r.params.get("watch")]
    assert {r.params.get("labelSelector") for r in pod_watches} == {
        "app.kubernetes.io/managed-by=kubetriton-operator"
    }


async def test_bad_spec_is_reported_and_the_operator_carries_on(
    cluster: ClusterEmulator, start_operator: StartOperator
):
    operator = await start_operator()
    bad = model_document("broken", replicas=2, autoscaling={"maxReplicas": 1, "minReplicas": 3})
    await create_model(cluster, bad, admitted=False)
    invalid = await eventually(
        lambda: (
            condition(cluster, "broken", "Ready").get("reason") == "InvalidSpec"
            and condition(cluster, "broken", "Ready")
        ),
        message="InvalidSpec",
    )
    assert "spec.autoscaling: autoscaling.maxReplicas must be greater than or equal to" in invalid["message"]
    assert condition(cluster, "broken", "Degraded")["status"] == "True"
    assert stored(cluster, CHILD_APIS["Deployment"], "broken") is None

    await create_model(cluster, model_document("identity"))
    await eventually(lambda: stored(cluster, CHILD_APIS["Deployment"], "identity"), message="a good model")
    fixed = copy.deepcopy(bad["spec"])
    fixed["replicas"] = None
    fixed["autoscaling"]["minReplicas"] = 1
    await patch(cluster, MODELS.format(ns="default") + "/broken", {"spec": fixed})
    await eventually(
        lambda: stored(cluster, CHILD_APIS["HorizontalPodAutoscaler"], "broken"),
        message="the fixed model's autoscaler",
    )
    await eventually(
        lambda: condition(cluster, "broken", "Degraded").get("status") == "False",
        message="no longer degraded",
    )
    assert operator.alive and operator.error is None


async def test_rejected_children_are_reported(cluster: ClusterEmulator, start_operator: StartOperator):
    operator = await start_operator()
    cluster.rejections["deployments"] = (
        'admission webhook "policy.example.com" denied the request: no GPUs here'
    )
    await create_model(cluster, model_document("identity"))
    failed = await eventually(
        lambda: (
            condition(cluster, "identity", "Degraded").get("reason") == "ApplyFailed"
            and condition(cluster, "identity", "Degraded")
        ),
        message="ApplyFailed",
    )
    assert failed["status"] == "True"
    assert "denied the request: no GPUs here" in failed["message"]
    assert condition(cluster, "identity", "Ready")["status"] == "False"
    assert operator.alive


async def test_service_monitor_only_where_its_crd_exists(
    cluster: ClusterEmulator, start_operator: StartOperator
):
    await start_operator()
    await create_model(cluster, model_document("plain"))
    await eventually(lambda: stored(cluster, CHILD_APIS["Service"], "plain"))
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "servicemonitors.monitoring.coreos.com"},
        "spec": {},
    }
    await request(
        cluster, "POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd, "application/json"
    )
    await create_model(cluster, model_document("monitored"))
    monitor = await eventually(
        lambda: stored(cluster, "monitoring.coreos.com/v1/servicemonitors", "monitored"),
        message="ServiceMonitor",
    )
    assert [endpoint["port"] for endpoint in monitor["spec"]["endpoints"]] == ["metrics", "worker"]
    assert stored(cluster, "monitoring.coreos.com/v1/servicemonitors", "plain") is None
