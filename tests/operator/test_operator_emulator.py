"""The emulator keeps the API server promises the operator tests rely on."""

from __future__ import annotations

import asyncio
import json

import pytest
from emulator import SERVICE_MONITOR_CRD, ClusterEmulator

pytestmark = pytest.mark.asyncio

PODS = "/api/v1/namespaces/default/pods"


async def call(
    cluster: ClusterEmulator, method: str, path: str, body: object = None, kind: str = "json"
) -> tuple:
    headers = {"Content-Type": f"application/{kind}"}
    async with cluster.request(method, path, data=json.dumps(body), headers=headers) as response:
        return response.status, await response.json()


async def test_json_patch_tests_the_resource_version(cluster: ClusterEmulator) -> None:
    status, created = await call(cluster, "POST", PODS, {"metadata": {"name": "p"}, "spec": {"a": 1}})
    assert status == 201 and created["metadata"]["uid"] and created["metadata"]["generation"] == 1
    version = created["metadata"]["resourceVersion"]
    add = {"op": "add", "path": "/metadata/finalizers", "value": ["example.com/x"]}
    stale = [{"op": "test", "path": "/metadata/resourceVersion", "value": "0"}, add]
    assert (await call(cluster, "PATCH", f"{PODS}/p", stale, "json-patch+json"))[0] == 422
    fresh = [{"op": "test", "path": "/metadata/resourceVersion", "value": version}, add]
    status, patched = await call(cluster, "PATCH", f"{PODS}/p", fresh, "json-patch+json")
    assert status == 200 and patched["metadata"]["finalizers"] == ["example.com/x"]
    assert int(patched["metadata"]["resourceVersion"]) > int(version)
    assert patched["metadata"]["generation"] == 1


async def test_generation_follows_the_spec_only(cluster: ClusterEmulator) -> None:
    await call(cluster, "POST", PODS, {"metadata": {"name": "p"}, "spec": {"a": 1}})
    _, labelled = await call(
        cluster, "PATCH", f"{PODS}/p", {"metadata": {"labels": {"x": "y"}}}, "merge-patch+json"
    )
    assert labelled["metadata"]["generation"] == 1
    _, changed = await call(cluster, "PATCH", f"{PODS}/p", {"spec": {"a": 2}}, "merge-patch+json")
    assert changed["metadata"]["generation"] == 2


async def test_watch_from_a_version_replays_only_later_events(cluster: ClusterEmulator) -> None:
    await call(cluster, "POST", PODS, {"metadata": {"name": "before"}})
    _, listing = await call(cluster, "GET", PODS)
    since = listing["metadata"]["resourceVersion"]
    await call(cluster, "POST", PODS, {"metadata": {"name": "after"}})
    async with cluster.get(PODS, params={"watch": "true", "resourceVersion": since}) as response:
        first = json.loads(await asyncio.wait_for(response.content.readline(), 5))
    assert (first["type"], first["object"]["metadata"]["name"]) == ("ADDED", "after")


DEPLOYMENTS = "/apis/apps/v1/namespaces/default/deployments"


async def apply(cluster: ClusterEmulator, name: str, spec: dict, manager: str) -> dict:
    body = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name}, "spec": spec}
    headers = {"Content-Type": "application/apply-patch+yaml"}
    params = {"fieldManager": manager, "force": "true"}
    async with cluster.patch(
        f"{DEPLOYMENTS}/{name}", data=json.dumps(body), headers=headers, params=params
    ) as r:
        assert r.status in (200, 201), await r.text()
        return await r.json()


async def test_server_side_apply_removes_what_only_its_manager_stopped_applying(
    cluster: ClusterEmulator,
) -> None:
    await apply(cluster, "d", {"replicas": 3, "paused": False}, "operator")
    await apply(cluster, "d", {"replicas": 3}, "handover")
    after = await apply(cluster, "d", {"paused": True}, "operator")
    assert after["spec"] == {"replicas": 3, "paused": True}, "replicas stay: another manager owns them"
    managers = {entry["manager"]: entry["fieldsV1"] for entry in after["metadata"]["managedFields"]}
    assert managers == {"handover": {"f:spec": {"f:replicas": {}}}, "operator": {"f:spec": {"f:paused": {}}}}
    dropped = await apply(cluster, "d", {}, "operator")
    assert dropped["spec"] == {"replicas": 3}


async def test_custom_resources_exist_only_with_their_crd(cluster: ClusterEmulator) -> None:
    monitors = "/apis/monitoring.coreos.com/v1/namespaces/default/servicemonitors"
    assert (await call(cluster, "GET", monitors))[0] == 404
    status, crd = await call(
        cluster, "POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", SERVICE_MONITOR_CRD
    )
    assert status == 201 and crd["status"]["conditions"] == [{"type": "Established", "status": "True"}]
    assert (await call(cluster, "GET", monitors))[0] == 200
    _, group = await call(cluster, "GET", "/apis/monitoring.coreos.com/v1")
    assert [resource["name"] for resource in group["resources"]] == ["servicemonitors"]


async def test_nothing_new_in_a_terminating_namespace(cluster: ClusterEmulator) -> None:
    await call(cluster, "POST", "/api/v1/namespaces", {"metadata": {"name": "doomed"}})
    status, deleted = await call(cluster, "DELETE", "/api/v1/namespaces/doomed")
    assert status == 200 and deleted["status"]["phase"] == "Terminating"
    status, refusal = await call(
        cluster, "POST", "/api/v1/namespaces/doomed/pods", {"metadata": {"name": "p"}}
    )
    assert status == 403
    assert refusal["message"].endswith(
        "unable to create new content in namespace doomed because it is being terminated"
    )
    _, listing = await call(cluster, "GET", "/api/v1/namespaces")
    assert [item["metadata"]["name"] for item in listing["items"]] == ["doomed"]
