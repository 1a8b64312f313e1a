"""The operator running for real (kopf, its own thread) against the emulated API server."""

from __future__ import annotations

import asyncio
import copy
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import jsonschema
import kopf
import pytest
from conftest import eventually
from crd_check import admit, load_schema
from emulator import MODEL_CRD, SERVICE_MONITOR_CRD, ClusterEmulator, OperatorThread
from kubetriton.operator import children, naming, reconciler
from kubetriton.operator.router import RouterSettings
from kubetriton.operator.spec import PyTritonModel

pytestmark = pytest.mark.asyncio

MODELS = "/apis/kubetriton.dev/v1alpha1/namespaces/{ns}/pytritonmodels"
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
StartOperator = Callable[..., Awaitable[OperatorThread]]
WRITES = {"POST", "PUT", "PATCH", "DELETE"}


def model_document(name: str, namespace: str = "default", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "kubetriton.dev/v1alpha1",
        "kind": "PyTritonModel",
        "metadata": {"name": name, "namespace": namespace},
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


async def create(cluster: ClusterEmulator, path: str, document: dict[str, Any]) -> dict:
    return await request(cluster, "POST", path, document, "application/json")


async def create_namespace(cluster: ClusterEmulator, name: str) -> dict:
    return await create(
        cluster, "/api/v1/namespaces", {"metadata": {"name": name}, "status": {"phase": "Active"}}
    )


async def patch(cluster: ClusterEmulator, path: str, changes: dict[str, Any]) -> dict:
    return await request(cluster, "PATCH", path, changes, "application/merge-patch+json")


async def delete(cluster: ClusterEmulator, path: str) -> None:
    async with cluster.delete(path) as response:
        assert response.status == 200, await response.text()


def stored(
    cluster: ClusterEmulator, api: str, name: str, namespace: str = "default"
) -> dict[str, Any] | None:
    try:
        obj = cluster.objects[api, namespace, name]
    except KeyError:
        return None
    return None if obj.deleted else obj.raw


def model(cluster: ClusterEmulator, name: str, namespace: str = "default") -> dict[str, Any] | None:
    return stored(cluster, "kubetriton.dev/v1alpha1/pytritonmodels", name, namespace)


def status_of(cluster: ClusterEmulator, name: str, namespace: str = "default") -> dict[str, Any]:
    return (model(cluster, name, namespace) or {}).get("status") or {}


def condition(cluster: ClusterEmulator, name: str, kind: str) -> dict[str, Any]:
    conditions = status_of(cluster, name).get("conditions") or []
    return next((c for c in conditions if c["type"] == kind), {})


def events(
    cluster: ClusterEmulator, reason: str | None = None, namespace: str = "default"
) -> list[dict[str, Any]]:
    return [
        obj.raw
        for (resource, ns, _), obj in cluster.objects.items()
        if resource.plural == "events"
        and ns == namespace
        and not obj.deleted
        and reason in (None, obj.raw.get("reason"))
    ]


def requests_since(cluster: ClusterEmulator, seen: int, by: OperatorThread | None = None) -> list[Any]:
    """The operator's requests (kopf's and its own) since the `seen`-th request; only those of the
    operator `by` where given (a stopped one's last requests may still reach the emulator after `seen`)."""
    return [
        r
        for r in list(cluster)[seen:]
        if r.resource is not None
        and r.headers.get("User-Agent", "").startswith(("kopf", "kubetriton"))
        and (by is None or r.headers.get("Authorization") == f"Bearer {by.token}")
    ]


def writes_since(cluster: ClusterEmulator, seen: int, by: OperatorThread | None = None) -> list[Any]:
    """What of `requests_since` writes."""
    return [r for r in requests_since(cluster, seen, by) if r.method.value.upper() in WRITES]


CHILD_APIS = {
    "Deployment": "apps/v1/deployments",
    "Service": "v1/services",
    "PodDisruptionBudget": "policy/v1/poddisruptionbudgets",
    "HorizontalPodAutoscaler": "autoscaling/v2/horizontalpodautoscalers",
    "ServiceMonitor": "monitoring.coreos.com/v1/servicemonitors",
    "ConfigMap": "v1/configmaps",
}


def child_path(kind: str, name: str, namespace: str = "default") -> str:
    group_version, _, plural = CHILD_APIS[kind].rpartition("/")
    root = "/api" if group_version == "v1" else "/apis"
    return f"{root}/{group_version}/namespaces/{namespace}/{plural}/{name}"


async def set_deployment_status(
    cluster: ClusterEmulator,
    name: str,
    *,
    ready: int,
    replicas: int,
    updated: int | None = None,
    namespace: str = "default",
) -> None:
    """The Deployment controller's status: `replicas` pods, `ready` of them available, `updated` (all,
    unless said) of the current template."""
    deployment = stored(cluster, CHILD_APIS["Deployment"], name, namespace)
    assert deployment is not None
    status = {
        "observedGeneration": deployment["metadata"]["generation"],
        "replicas": replicas,
        "readyReplicas": ready,
        "updatedReplicas": replicas if updated is None else updated,
        "availableReplicas": ready,
    }
    await patch(cluster, child_path("Deployment", name, namespace) + "/status", {"status": status})


def has_status(cluster: ClusterEmulator, name: str, namespace: str = "default") -> dict[str, Any] | None:
    status = status_of(cluster, name, namespace)
    return status if "observedGeneration" in status else None


async def test_create_applies_children_owned_by_the_model(
    cluster: ClusterEmulator, start_operator: StartOperator
):
    await start_operator()
    created = await create_model(cluster, model_document("identity"))
    deployment = await eventually(
        lambda: stored(cluster, CHILD_APIS["Deployment"], "identity"), message="Deployment"
    )
    service = await eventually(lambda: stored(cluster, CHILD_APIS["Service"], "identity"), message="Service")
    pods = await eventually(lambda: stored(cluster, CHILD_APIS["Service"], "identity-pods"), message="pods")
    owner = {
        "apiVersion": "kubetriton.dev/v1alpha1",
        "kind": "PyTritonModel",
        "name": "identity",
        "uid": created["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }
    for child in (deployment, service, pods):
        assert child["metadata"]["ownerReferences"] == [owner]
        assert children.FINGERPRINT_ANNOTATION in child["metadata"]["annotations"]
    assert stored(cluster, CHILD_APIS["PodDisruptionBudget"], "identity") is None

    status = await eventually(lambda: has_status(cluster, "identity"), message="the handled generation")
    assert status["observedGeneration"] == 1
    assert status["selector"] == naming.selector_string("identity")
    assert status["url"] == "http://identity.default.svc:8000"
    assert status["grpcUrl"] == "grpc://identity.default.svc:8001"
    assert status["podsUrl"] == "http://identity-pods.default.svc:8000"
    assert status["podsGrpcUrl"] == "grpc://identity-pods.default.svc:8001"
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
    assert [deployment["spec"], service["spec"], pods["spec"]] == [child["spec"] for child in rendered]
    deletes = [r for r in cluster if r.method.value.upper() == "DELETE"]
    crd_reads = [
        r for r in cluster if r.resource and r.resource.plural == "customresourcedefinitions" and r.name
    ]
    assert deletes == [] and crd_reads == [], "nothing is deleted or looked up for a new model"


async def test_the_operators_worker_image_runs_the_init_step_unless_the_model_names_one(
    cluster: ClusterEmulator, start_operator: StartOperator
):
    await start_operator(worker_image="registry.example.com/kubetriton/worker:0.1.0")
    await create_model(cluster, model_document("plain"))
    named = model_document("named")
    named["spec"]["bootstrap"] = {"image": "registry.example.com/ours/kubetriton-worker:2"}
    await create_model(cluster, named)

    def bootstrap_image(name: str) -> str | None:
        deployment = stored(cluster, CHILD_APIS["Deployment"], name)
        if deployment is None:
            return None
        return deployment["spec"]["template"]["spec"]["initContainers"][0]["image"]

    assert (
        await eventually(lambda: bootstrap_image("plain")) == "registry.example.com/kubetriton/worker:0.1.0"
    )
    assert (
        await eventually(lambda: bootstrap_image("named")) == "registry.example.com/ours/kubetriton-worker:2"
    )


async def test_a_router_is_applied_shown_and_deleted_with_the_spec(
    cluster: ClusterEmulator, start_operator: StartOperator
):
    await start_operator(router_settings=RouterSettings(image="registry.example.com/haproxy:2.8"))
    await create_model(cluster, model_document("identity", replicas=3, router=True))
    found = {
        kind: await eventually(
            lambda kind=kind: stored(cluster, CHILD_APIS[kind], "identity-router"), message=f"router {kind}"
        )
        for kind in ("ConfigMap", "Deployment", "Service", "PodDisruptionBudget")
    }
    template = found["Deployment"]["spec"]["template"]
    assert template["spec"]["containers"][0]["image"] == "registry.example.com/haproxy:2.8"
    assert "identity-pods.default.svc.cluster.local:8000" in found["ConfigMap"]["data"]["haproxy.cfg"]
    await set_deployment_status(cluster, "identity-router", ready=0, replicas=2)
    await eventually(
        lambda: condition(cluster, "identity", "RouterReady").get("status") == "False" or None,
        message="RouterReady=False",
    )
    assert condition(cluster, "identity", "RouterReady")["message"] == (
        "0/2 router replicas ready; a router is ready once it reaches a ready pod of the model, and none is"
    )
    await set_deployment_status(cluster, "identity-router", ready=2, replicas=2)
    await eventually(
        lambda: condition(cluster, "identity", "RouterReady").get("status") == "True", message="RouterReady"
    )
    status = status_of(cluster, "identity")
    assert status["router"] == {
        "url": "http://identity-router.default.svc:8000",
        "grpcUrl": "grpc://identity-router.default.svc:8001",
        "replicas": 2,
        "readyReplicas": 2,
    }
    jsonschema.validate(status, load_schema()["properties"]["status"])
    assert condition(cluster, "identity", "Ready").get("status") == "False", "the model's own pods decide"

    await patch(cluster, MODELS.format(ns="default") + "/identity", {"spec": {"router": False}})
    for kind in found:
        await eventually(
            lambda kind=kind: stored(cluster, CHILD_APIS[kind], "identity-router") is None,
            message=f"router {kind} deleted",
        )
    await eventually(lambda: "router" not in status_of(cluster, "identity"), message="status.router gone")
    assert condition(cluster, "identity", "RouterReady") == {}
    assert stored(cluster, CHILD_APIS["Deployment"], "identity") is not None
    assert stored(cluster, CHILD_APIS["Service"], "identity-pods") is not None


async def test_a_router_that_cannot_start_says_why_and_is_not_the_models_problem(
    cluster: ClusterEmulator, start_operator: StartOperator
):
    """A router pod whose image cannot be pulled: RouterReady names the pod and the kubelet's message; the
    model's own conditions, which its pods decide, do not take it for theirs."""
    await start_operator(router_settings=RouterSettings(image="registry.example.com/haproxy:missing"))
    await create_model(cluster, model_document("identity", replicas=1, router=True))
    await eventually(lambda: stored(cluster, CHILD_APIS["Deployment"], "identity-router"), message="router")
    await set_deployment_status(cluster, "identity-router", ready=0, replicas=2)
    pulled = "Back-off pulling image registry.example.com/haproxy:missing"
    router_pod = pod_document(
        "identity-router",
        {"phase": "Pending", "containerStatuses": [haproxy_waiting("ImagePullBackOff", pulled)]},
    )
    router_pod["metadata"]["labels"] = naming.router_pod_labels("identity")
    await create(cluster, "/api/v1/namespaces/default/pods", router_pod)
    found = await eventually(
        lambda: (
            (got := condition(cluster, "identity", "RouterReady")).get("reason") == "ImagePullBackOff" and got
        ),
        message="RouterReady=False ImagePullBackOff",
    )
    assert found["status"] == "False"
    assert found["message"] == (
        f"0/2 router replicas ready; pod {router_pod['metadata']['name']}: container haproxy: {pulled}"
    )
    assert condition(cluster, "identity", "Degraded")["status"] == "False", "the model's pods are fine"
    assert condition(cluster, "identity", "Ready")["reason"] == "ReplicasNotReady"


def haproxy_waiting(reason: str, message: str) -> dict[str, Any]:
    return {
        "name": "haproxy",
        "ready": False,
        "restartCount": 0,
        "state": {"waiting": {"reason": reason, "message": message}},
    }


async def test_the_operators_default_gives_a_router_to_a_model_that_does_not_say(
    cluster: ClusterEmulator, start_operator: StartOperator
):
    await start_operator(
        router_settings=RouterSettings(enabled_by_default=True, cluster_domain="corp.example")
    )
    await create_model(cluster, model_document("unsaid"))
    await create_model(cluster, model_document("declined", router=False))
    config = await eventually(
        lambda: stored(cluster, CHILD_APIS["ConfigMap"], "unsaid-router"), message="a router by default"
    )
    assert "unsaid-pods.default.svc.corp.example:8000" in config["data"]["haproxy.cfg"]
    await eventually(lambda: has_status(cluster, "declined"), message="the declining model handled")
    assert stored(cluster, CHILD_APIS["Deployment"], "declined-router") is None


async def test_ready_follows_the_deployment(cluster: ClusterEmulator, start_operator: StartOperator):
    await start_operator()
    await create_model(cluster, model_document("identity"))
    await eventually(lambda: stored(cluster, CHILD_APIS["Deployment"], "identity"))
    await set_deployment_status(cluster, "identity", ready=1, replicas=1)
    ready = await eventually(
        lambda: condition(cluster, "identity", "Ready").get("status") == "True", message="Ready=True"
    )
    assert ready
    assert status_of(cluster, "identity")["readyReplicas"] == 1
    announced = await eventually(
        lambda: events(cluster, "AllReplicasReady"), message="an event saying it is ready"
    )
    assert announced[0]["type"] == "Normal"
    assert events(cluster, "Creating") == events(cluster, "ReplicasNotReady") == [], "only Ready changes"


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
        lambda: status_of(cluster, "identity").get("observedGeneration") == 4,
        message="observedGeneration follows the spec",
    )


def deployment_applies(cluster: ClusterEmulator, seen: int) -> list[tuple[str, dict[str, Any]]]:
    return [
        (r.params["fieldManager"], r.data["spec"])
        for r in list(cluster)[seen:]
        if r.method.value.upper() == "PATCH" and r.resource is not None and r.resource.plural == "deployments"
    ]


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
    applies = deployment_applies(cluster, seen)
    assert applies[0] == ("kubetriton-operator-handover", {"replicas": 3})
    assert applies[1][0] == "kubetriton-operator" and "replicas" not in applies[1][1]
    assert stored(cluster, CHILD_APIS["Deployment"], "identity")["spec"]["replicas"] == 3


async def test_an_autoscaled_model_starts_at_its_minimum(
    cluster: ClusterEmulator, start_operator: StartOperator
):
    await start_operator()
    path = MODELS.format(ns="default") + "/identity"
    await create_model(cluster, model_document("identity", autoscaling={"minReplicas": 2, "maxReplicas": 4}))
    deployment = await eventually(lambda: stored(cluster, CHILD_APIS["Deployment"], "identity"))
    assert deployment["spec"]["replicas"] == 2

    await set_deployment_status(cluster, "identity", ready=1, replicas=2)
    await eventually(lambda: status_of(cluster, "identity").get("readyReplicas") == 1)
    assert condition(cluster, "identity", "Ready")["status"] == "False"
    await set_deployment_status(cluster, "identity", ready=2, replicas=2)
    await eventually(lambda: condition(cluster, "identity", "Ready").get("status") == "True", message="Ready")

    seen = len(list(cluster))
    await patch(cluster, path, {"spec": {"worker": {"image": "registry.example.com/identity:2"}}})
    await eventually(lambda: len(deployment_applies(cluster, seen)) == 2, message="the new image applied")
    handover, image = deployment_applies(cluster, seen)
    assert handover == ("kubetriton-operator-handover", {"replicas": 2})
    assert image[0] == "kubetriton-operator" and "replicas" not in image[1]
    assert stored(cluster, CHILD_APIS["Deployment"], "identity")["spec"]["replicas"] == 2


async def test_every_deleted_child_comes_back(cluster: ClusterEmulator, start_operator: StartOperator):
    await create(cluster, CRDS, SERVICE_MONITOR_CRD)
    await start_operator()
    spec = {"autoscaling": {"minReplicas": 2, "maxReplicas": 3}, "router": True}
    await create_model(cluster, model_document("identity", **spec))
    every = [(child.kind.kind, child.name("identity")) for child in children.CHILDREN]
    for kind, name in every:
        await eventually(lambda kind=kind, name=name: stored(cluster, CHILD_APIS[kind], name), message=name)
    for kind, name in every:
        api = CHILD_APIS[kind]
        first = stored(cluster, api, name)
        await delete(cluster, child_path(kind, name))
        again = await eventually(
            lambda api=api, name=name, first=first: (
                (
                    (found := stored(cluster, api, name))
                    and found["metadata"]["uid"] != first["metadata"]["uid"]
                )
                and found
            ),
            message=f"the {kind} {name} applied again",
        )
        assert again.get("spec") == first.get("spec") and again.get("data") == first.get("data")


async def test_deleted_model_leaves_children_to_garbage_collection(
    cluster: ClusterEmulator, start_operator: StartOperator
):
    operator = await start_operator()
    created = await create_model(cluster, model_document("identity", replicas=2))
    await eventually(lambda: stored(cluster, CHILD_APIS["PodDisruptionBudget"], "identity"))
    await delete(cluster, MODELS.format(ns="default") + "/identity")
    await eventually(
        lambda: model(cluster, "identity") is None, message="deletion not blocked by a finalizer"
    )
    uid = created["metadata"]["uid"]
    for api in ("Deployment", "Service", "PodDisruptionBudget"):
        child = stored(cluster, CHILD_APIS[api], "identity")
        assert child is not None and [ref["uid"] for ref in child["metadata"]["ownerReferences"]] == [uid]
    assert operator.alive


def handled_models(caplog: pytest.LogCaptureFixture) -> set[str]:
    """The models whose events the operator's model handler has handled, by kopf's log lines."""
    return {
        record.k8s_ref["name"]
        for record in caplog.records
        if record.getMessage() == "Handler 'model' succeeded." and hasattr(record, "k8s_ref")
    }


async def test_an_unchanged_model_costs_no_write(
    cluster: ClusterEmulator, start_operator: StartOperator, caplog: pytest.LogCaptureFixture
):
    caplog.set_level(logging.INFO)
    first = await start_operator()
    await create_model(cluster, model_document("fixed", replicas=2))
    await create_model(cluster, model_document("scaled", autoscaling={"minReplicas": 2, "maxReplicas": 3}))
    await eventually(lambda: stored(cluster, CHILD_APIS["PodDisruptionBudget"], "fixed"))
    await eventually(lambda: stored(cluster, CHILD_APIS["HorizontalPodAutoscaler"], "scaled"))
    await eventually(lambda: has_status(cluster, "fixed") and has_status(cluster, "scaled"))
    model_writes = [
        r for r in writes_since(cluster, 0) if r.resource.plural == "pytritonmodels" and not r.subresource
    ]
    assert model_writes == [], "the operator writes a model's status, never the model"
    uids = {
        (name, api): child["metadata"]["uid"]
        for name in ("fixed", "scaled")
        for api in CHILD_APIS.values()
        if (child := stored(cluster, api, name))
    }
    await asyncio.to_thread(first.stop)
    seen = len(list(cluster))
    caplog.clear()

    second = await start_operator()
    await eventually(lambda: handled_models(caplog) == {"fixed", "scaled"}, message="both models handled")
    assert requests_since(cluster, seen, by=second), "the second operator's requests are told apart"
    assert writes_since(cluster, seen, by=second) == [], "a resumed model that did not change is not written"
    assert {key: stored(cluster, key[1], key[0])["metadata"]["uid"] for key in uids} == uids

    caplog.clear()
    await patch(cluster, MODELS.format(ns="default") + "/fixed", {"metadata": {"labels": {"team": "a"}}})
    await eventually(lambda: handled_models(caplog) == {"fixed"}, message="the label change handled")
    child_writes = [
        r
        for r in writes_since(cluster, seen, by=second)
        if r.resource.plural != "pytritonmodels" or r.subresource
    ]
    assert child_writes == [], "a change outside the spec writes no child and no status"


async def test_no_handler_needs_the_essence_the_operator_does_not_keep():
    """kopf would deep-copy every watched body twice for change-detecting handlers; the operator
    keeps no such essence, which is only right while it registers none of them."""
    registry = reconciler.build_operator().registry
    assert registry._changing.get_all_handlers() == []
    assert registry._spawning.get_all_handlers() == []
    assert len(registry._watching.get_all_handlers()) == len(reconciler.WATCH_HANDLERS)
    storage = reconciler.operator_settings().persistence.diffbase_storage
    pod = kopf.Body(pending_pod("fixed", "0/1 nodes are available"))
    assert storage.build(body=pod) == storage.fetch(body=pod) == {}


def pod_document(model_name: str, status: dict[str, Any], namespace: str = "default") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{model_name}-6d4cf56db6-x2x9z",
            "namespace": namespace,
            "labels": naming.labels(model_name),
        },
        "spec": {"containers": [{"name": "worker", "image": "w"}]},
        "status": status,
    }


def pending_pod(model_name: str, message: str) -> dict[str, Any]:
    scheduling = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}
    return pod_document(model_name, {"phase": "Pending", "conditions": [scheduling]})


async def test_pod_without_a_gpu_is_reported(cluster: ClusterEmulator, start_operator: StartOperator):
    await start_operator()
    await create_model(cluster, model_document("esm1", gpus={"count": 1}))
    await eventually(lambda: stored(cluster, CHILD_APIS["Deployment"], "esm1"))
    message = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."
    await create(cluster, "/api/v1/namespaces/default/pods", pending_pod("esm1", message))
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


async def test_a_pods_mount_failure_is_the_models_cause(
    cluster: ClusterEmulator, start_operator: StartOperator
):
    """The kubelet cannot mount the script's ConfigMap: nothing about the pod changes, only a Warning
    event names the ConfigMap, and the model's status says so, stalled; Events about other objects, and
    Normal ones, are not kept."""
    operator = await start_operator()
    await create_model(cluster, model_document("esm1"))
    await eventually(lambda: stored(cluster, CHILD_APIS["Deployment"], "esm1"))
    pod = pod_document("esm1", {"phase": "Pending"})
    await create(cluster, "/api/v1/namespaces/default/pods", pod)
    await eventually(lambda: condition(cluster, "esm1", "Ready").get("reason") == "ReplicasNotReady")
    involved = {"kind": "Pod", "name": pod["metadata"]["name"], "namespace": "default"}
    mount = 'MountVolume.SetUp failed for volume "script" : configmap "no-such-cm" not found'
    for kind, type_ in (("Pod", "Normal"), ("Service", "Warning"), ("Pod", "Warning")):
        warning = {
            "metadata": {"generateName": "esm1-", "namespace": "default"},
            "type": type_,
            "reason": "FailedMount",
            "message": mount,
            "involvedObject": {**involved, "kind": kind},
        }
        await create(cluster, "/api/v1/namespaces/default/events", warning)
    degraded = await eventually(
        lambda: (
            condition(cluster, "esm1", "Degraded").get("reason") == "ConfigMapNotFound"
            and condition(cluster, "esm1", "Degraded")
        ),
        message="ConfigMapNotFound",
    )
    assert degraded["message"].startswith(
        f"pod {pod['metadata']['name']}: ConfigMap no-such-cm does not exist"
    )
    assert condition(cluster, "esm1", "Progressing")["reason"] == "Stalled"
    index = operator.reconciler.indices[reconciler.POD_WARNINGS_INDEX]
    assert [warning["reason"] for key in list(index.keys()) for warning in index[key]] == ["FailedMount"]
    event_watches = [
        r for r in cluster if r.resource and r.resource.plural == "events" and r.params.get("watch")
    ]
    assert {r.params.get("fieldSelector") for r in event_watches} == {"involvedObject.kind=Pod,type=Warning"}


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


NO_LOAD_BALANCERS = 'admission webhook "policy.example.com" denied the request: no load balancers here'


def no_load_balancers(service: dict[str, Any]) -> str | None:
    """A policy's answer to a Service of type LoadBalancer, which the model's own schema allows."""
    return NO_LOAD_BALANCERS if service.get("spec", {}).get("type") == "LoadBalancer" else None


def failed_to_apply(cluster: ClusterEmulator, name: str) -> dict[str, Any]:
    degraded = condition(cluster, name, "Degraded")
    return degraded if degraded.get("reason") == "ApplyFailed" else {}


async def test_a_refused_child_keeps_the_model_degraded(
    cluster: ClusterEmulator, start_operator: StartOperator
):
    operator = await start_operator(refused_retry_delays=(0.2,))
    refusal = 'admission webhook "policy.example.com" denied the request: no Services here'
    cluster.rejections["services"] = lambda _: refusal
    await create_model(cluster, model_document("identity"))
    failed = await eventually(lambda: failed_to_apply(cluster, "identity"), message="ApplyFailed")
    assert failed["status"] == "True" and refusal in failed["message"]
    assert condition(cluster, "identity", "Ready")["status"] == "False"
    assert stored(cluster, CHILD_APIS["Deployment"], "identity") is not None

    await set_deployment_status(cluster, "identity", ready=1, replicas=1)
    await eventually(lambda: status_of(cluster, "identity").get("readyReplicas") == 1)
    still = failed_to_apply(cluster, "identity")
    assert still["status"] == "True" and refusal in still["message"], "the pods' news does not hide it"
    assert condition(cluster, "identity", "Ready")["reason"] == "ApplyFailed"

    del cluster.rejections["services"]
    await eventually(lambda: stored(cluster, CHILD_APIS["Service"], "identity"), message="Service, retried")
    await eventually(lambda: condition(cluster, "identity", "Ready").get("status") == "True", message="Ready")
    assert condition(cluster, "identity", "Degraded")["status"] == "False"
    assert operator.alive


async def test_an_object_that_holds_a_childs_name_is_not_taken_over(
    cluster: ClusterEmulator, start_operator: StartOperator
):
    """Server-side apply with force would take the Service over, and the model's deletion would take it
    along: the operator leaves another's object alone and says so, until it goes."""
    theirs = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "identity", "labels": {"team": "web"}},
    }
    theirs["spec"] = {"selector": {"app": "web"}, "ports": [{"port": 80}]}
    await create(cluster, child_path("Service", "").rsplit("/", 1)[0], theirs)
    await start_operator(refused_retry_delays=(0.2,))
    await create_model(cluster, model_document("identity"))
    failed = await eventually(lambda: failed_to_apply(cluster, "identity"), message="ApplyFailed")
    assert failed["message"] == (
        "Service: identity exists already and is not this model's (it belongs to no PyTritonModel):"
        " delete it, or give the model another name"
    )
    service = stored(cluster, CHILD_APIS["Service"], "identity")
    assert service is not None and service["spec"]["selector"] == {"app": "web"}, "left as it was"
    assert "ownerReferences" not in service["metadata"]

    await delete(cluster, child_path("Service", "identity"))
    await eventually(
        lambda: (
            (stored(cluster, CHILD_APIS["Service"], "identity") or {})
            .get("metadata", {})
            .get("ownerReferences")
        ),
        message="the model's own Service, once the other is gone",
    )
    await eventually(lambda: not failed_to_apply(cluster, "identity"), message="no longer ApplyFailed")


async def test_a_corrected_spec_is_acted_on_at_once(cluster: ClusterEmulator, start_operator: StartOperator):
    await start_operator(refused_retry_delays=(3600,))
    cluster.rejections["services"] = no_load_balancers
    await create_model(cluster, model_document("identity", service={"type": "LoadBalancer"}))
    failed = await eventually(lambda: failed_to_apply(cluster, "identity"), message="ApplyFailed")
    assert NO_LOAD_BALANCERS in failed["message"]

    await patch(
        cluster, MODELS.format(ns="default") + "/identity", {"spec": {"service": {"type": "ClusterIP"}}}
    )
    service = await eventually(lambda: stored(cluster, CHILD_APIS["Service"], "identity"), message="Service")
    assert service["spec"]["type"] == "ClusterIP"
    await eventually(lambda: condition(cluster, "identity", "Degraded").get("status") == "False")


async def test_an_api_server_without_an_answer_is_retried_soon(
    cluster: ClusterEmulator, start_operator: StartOperator, caplog: pytest.LogCaptureFixture
):
    caplog.set_level(logging.INFO)
    await start_operator(request_timeout=0.5, retry_delays=(0.2,))
    cluster.held.add("services")
    try:
        await create_model(cluster, model_document("identity"))
        retrying = await eventually(
            lambda: (
                condition(cluster, "identity", "Progressing").get("reason") == "ApplyRetrying"
                and condition(cluster, "identity", "Progressing")
            ),
            message="a condition saying the apply is retried",
        )
        assert retrying["status"] == "True"
        assert retrying["message"] == "Service: no answer from the API server within 0.5 s"
    finally:
        cluster.held.discard("services")
    await eventually(lambda: stored(cluster, CHILD_APIS["Service"], "identity"), message="Service, retried")
    await eventually(lambda: condition(cluster, "identity", "Progressing").get("reason") != "ApplyRetrying")
    assert [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info] == []
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and "no answer" in r.getMessage()]
    assert warnings and all(r.k8s_ref["name"] == "identity" for r in warnings)


async def test_a_terminating_namespace_is_left_alone(
    cluster: ClusterEmulator, start_operator: StartOperator, caplog: pytest.LogCaptureFixture
):
    caplog.set_level(logging.INFO)
    await create_namespace(cluster, "doomed")
    operator = await start_operator()
    names = ("first", "second")
    for name in names:
        await create_model(cluster, model_document(name, "doomed", replicas=2), namespace="doomed")
    for name in names:
        await eventually(lambda name=name: stored(cluster, CHILD_APIS["PodDisruptionBudget"], name, "doomed"))
        await set_deployment_status(cluster, name, ready=2, replicas=2, namespace="doomed")
    await eventually(lambda: len(events(cluster, "AllReplicasReady", "doomed")) == 2, message="both Ready")
    posted = len(events(cluster, namespace="doomed"))
    caplog.clear()

    await delete(cluster, "/api/v1/namespaces/doomed")
    await eventually(lambda: operator.reconciler.namespace_terminating("doomed"), message="termination seen")
    seen = len(list(cluster))
    for name in names:  # as the namespace controller does: children and models go, in any order
        await set_deployment_status(cluster, name, ready=0, replicas=2, namespace="doomed")
        for kind, child in (
            ("Deployment", name),
            ("Service", name),
            ("Service", f"{name}-pods"),
            ("PodDisruptionBudget", name),
        ):
            await delete(cluster, child_path(kind, child, "doomed"))
        await delete(cluster, MODELS.format(ns="doomed") + f"/{name}")

    indices = operator.reconciler.indices
    await eventually(
        lambda: not any(("doomed", name) in indices[index] for name in names for index in indices),
        message="the operator saw every deletion",
    )
    await asyncio.to_thread(operator.stop)
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert len(events(cluster, namespace="doomed")) == posted
    assert writes_since(cluster, seen) == [], "nothing is applied, written or announced"


async def test_service_monitors_follow_their_crd(cluster: ClusterEmulator, start_operator: StartOperator):
    await start_operator()
    await create_model(cluster, model_document("plain"))
    await eventually(lambda: has_status(cluster, "plain"), message="a model without ServiceMonitor")
    assert stored(cluster, CHILD_APIS["ServiceMonitor"], "plain") is None

    await create(cluster, CRDS, SERVICE_MONITOR_CRD)
    earlier = await eventually(
        lambda: stored(cluster, CHILD_APIS["ServiceMonitor"], "plain"),
        message="the ServiceMonitor of a model that existed before its CRD",
    )
    assert [endpoint["port"] for endpoint in earlier["spec"]["endpoints"]] == ["metrics", "worker"]
    await create_model(cluster, model_document("monitored"))
    await eventually(lambda: stored(cluster, CHILD_APIS["ServiceMonitor"], "monitored"), message="a new one")


def watching_crds(cluster: ClusterEmulator) -> bool:
    """kopf's CRD watch and the operator's are both open: a CRD created now is noticed.

    (kopf misses a CRD created between its first discovery and the start of its CRD watch.)"""
    return cluster.request_counts["GET customresourcedefinitions watch"] >= 2


@pytest.mark.parametrize("cluster", [{"model_crd": False}], indirect=True)
async def test_models_are_served_once_their_crd_appears(
    cluster: ClusterEmulator, start_operator: StartOperator
):
    operator = await start_operator()
    await eventually(lambda: watching_crds(cluster), message="the operator watches CRDs")
    assert "is not installed" in operator.reconciler.not_serving_because(operator.insights)
    await create(cluster, CRDS, MODEL_CRD)
    await eventually(
        lambda: operator.reconciler.not_serving_because(operator.insights) is None, message="served"
    )
    await create_model(cluster, model_document("identity"))
    await eventually(lambda: stored(cluster, CHILD_APIS["Service"], "identity"), message="children")
    await eventually(lambda: has_status(cluster, "identity"), message="status")


async def test_child_events_do_not_wait_for_a_slow_apply(
    cluster: ClusterEmulator, start_operator: StartOperator, caplog: pytest.LogCaptureFixture
):
    caplog.set_level(logging.INFO)
    await start_operator()
    cluster.held.add("services")
    try:
        await create_model(cluster, model_document("identity"))
        await eventually(lambda: stored(cluster, CHILD_APIS["Deployment"], "identity"), message="Deployment")
        caplog.clear()
        await set_deployment_status(cluster, "identity", ready=1, replicas=1)

        def handled() -> bool:
            return any(
                r.getMessage() == "Handler 'deployments' succeeded." and r.k8s_ref["name"] == "identity"
                for r in caplog.records
            )

        await eventually(handled, message="the Deployment's event handled while the Service hangs")
    finally:
        cluster.held.discard("services")
    await eventually(
        lambda: status_of(cluster, "identity").get("readyReplicas") == 1, message="a current status"
    )
    await eventually(lambda: condition(cluster, "identity", "Ready").get("status") == "True", message="Ready")
