"""The emulator keeps the API server promises the operator tests rely on."""

from __future__ import annotations

import asyncio
import json

import pytest
from emulator import ClusterEmulator

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
