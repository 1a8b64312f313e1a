"""A Kubernetes API emulator that kopf and the operator can run against: kmock's, with what it lacks.

kmock 0.8's `KubernetesEmulator` stores objects and streams watch events, but kopf needs more of the
API server's bookkeeping, and kmock matches every request against every recorded one, which a few
thousand requests turn into minutes. This subclass serves requests on objects itself, from kmock's
object store (so `objects` and the recorded requests stay available to assertions), and adds:

- `uid`, `creationTimestamp`, `generation` on create (and a name from `generateName`), and one
  cluster-wide `resourceVersion` counter stamped on every change and watch event, deletions included;
- `generation` bumped when a change touches `spec`;
- JSON patches (kopf adds and removes finalizers with them), with a failed `test` answered by 422;
- server-side apply as the operator sends it: create when absent, otherwise merge;
- lists that report the current resourceVersion, and watches that subscribe before they replay,
  then replay either the current objects or, when a resourceVersion is named, the events after it;
- equality label selectors on lists and watches.

`OperatorThread` runs the real operator on its own thread and event loop, because
`kopf.operator()` cancels every task of the loop it runs on when it stops.
"""

from __future__ import annotations

import asyncio
import collections
import copy
import datetime
import itertools
import json
import threading
import uuid
from collections.abc import Callable
from typing import Any

import aiohttp.web
import attrs
import jsonpatch
import kmock
import kopf
from kmock._internal import aiobus, enums, rendering
from kubetriton.operator import reconciler, spec

RESOURCES = {
    f"{spec.GROUP}/{spec.VERSION}/{spec.PLURAL}": kmock.ResourceInfo(
        kind=spec.KIND,
        singular=spec.SINGULAR,
        namespaced=True,
        shortnames={spec.SHORT_NAME},
        subresources={"status", "scale"},
        verbs={"get", "list", "watch", "patch", "create", "delete"},
    ),
    "apps/v1/deployments": kmock.ResourceInfo(
        kind="Deployment",
        singular="deployment",
        namespaced=True,
        subresources={"status", "scale"},
        verbs={"get", "list", "watch", "patch", "create", "delete"},
    ),
    "v1/pods": kmock.ResourceInfo(
        kind="Pod",
        singular="pod",
        namespaced=True,
        subresources={"status"},
        verbs={"get", "list", "watch", "patch", "create", "delete"},
    ),
    "v1/services": kmock.ResourceInfo(kind="Service", singular="service", namespaced=True, verbs={"patch"}),
    "v1/namespaces": kmock.ResourceInfo(
        kind="Namespace", singular="namespace", namespaced=False, verbs={"get", "list", "watch"}
    ),
    "apiextensions.k8s.io/v1/customresourcedefinitions": kmock.ResourceInfo(
        kind="CustomResourceDefinition",
        singular="customresourcedefinition",
        namespaced=False,
        verbs={"get", "list", "watch"},
    ),
    "v1/events": kmock.ResourceInfo(kind="Event", singular="event", namespaced=True, verbs={"create"}),
    "policy/v1/poddisruptionbudgets": kmock.ResourceInfo(
        kind="PodDisruptionBudget", singular="poddisruptionbudget", namespaced=True, verbs={"patch", "delete"}
    ),
    "autoscaling/v2/horizontalpodautoscalers": kmock.ResourceInfo(
        kind="HorizontalPodAutoscaler",
        singular="horizontalpodautoscaler",
        namespaced=True,
        verbs={"patch", "delete"},
    ),
}


class _Clock:
    """The cluster-wide resourceVersion counter."""

    def __init__(self) -> None:
        self._counter = itertools.count(1)
        self.now = 0

    def tick(self) -> int:
        self.now = next(self._counter)
        return self.now


@attrs.define(kw_only=True)
class _VersionedBus(aiobus.Bus[Any]):
    """A watch-event bus that stamps each event with the next resourceVersion and keeps a history."""

    clock: _Clock
    history: list[dict[str, Any]] = attrs.field(factory=list)

    async def put(self, *items: Any) -> None:
        for event in items:
            event["object"].setdefault("metadata", {})["resourceVersion"] = str(self.clock.tick())
            self.history.append({"type": event["type"], "object": copy.deepcopy(event["object"])})
        await super().put(*items)


def _version(event: dict[str, Any]) -> int:
    return int(event["object"]["metadata"]["resourceVersion"])


def _merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: `patch` merged into `target`, null meaning removal."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = _merge_patch(result.get(key), value)
    return result


def _merge_diff(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """The JSON merge patch that turns `old` into `new`."""
    diff: dict[str, Any] = {key: None for key in old if key not in new}
    for key, value in new.items():
        if isinstance(value, dict) and isinstance(old.get(key), dict):
            nested = _merge_diff(old[key], value)
            if nested:
                diff[key] = nested
        elif old.get(key) != value or key not in old:
            diff[key] = value
    return diff


def _equality_selector(selector: str) -> dict[str, str]:
    """`a=b,c==d` as a dict; other label-selector forms are not emulated."""
    wanted = {}
    for term in filter(None, selector.split(",")):
        key, separator, value = term.replace("==", "=").partition("=")
        if not separator or "!" in key:
            raise kmock.KubernetesError(
                status=400, reason="BadRequest", message=f"unsupported selector {term!r}"
            )
        wanted[key.strip()] = value.strip()
    return wanted


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


_OBJECT_ACTIONS = {
    enums.action.CREATE,
    enums.action.FETCH,
    enums.action.LIST,
    enums.action.WATCH,
    enums.action.UPDATE,
    enums.action.DELETE,
}


@attrs.define(kw_only=True)
class ClusterEmulator(kmock.KubernetesEmulator):
    """kmock's emulator with the API server bookkeeping kopf relies on.

    Requests on objects are served here directly from kmock's object store; kmock's own reaction
    matching, which compares each request with every recorded one, serves discovery only.
    """

    record_requests: bool = True
    """Keep every finished request for assertions; a long benchmark keeps only those in flight."""
    rejections: dict[str, str] = attrs.field(factory=dict)
    """Plural name → message: writes to that resource fail with 422, as an admission webhook might."""
    _clock: _Clock = attrs.field(factory=_Clock, init=False)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        clock = self._clock
        self._buses = collections.defaultdict(lambda: _VersionedBus(clock=clock))
        for key, info in RESOURCES.items():
            self.resources[key] = info

    async def _handle(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        try:
            resource = request.resource
            if resource is None or resource.plural is None or request.action not in _OBJECT_ACTIONS:
                return await super()._handle(request)
            writes = (enums.action.CREATE, enums.action.UPDATE)
            if (
                request.action in writes
                and resource.plural in self.rejections
                and request.subresource is None
            ):
                raise kmock.KubernetesError(
                    status=422, reason="Invalid", message=self.rejections[resource.plural]
                )
            serve = {
                enums.action.CREATE: self._create,
                enums.action.FETCH: self._fetch,
                enums.action.LIST: self._list,
                enums.action.WATCH: self._watch,
                enums.action.UPDATE: self._update,
                enums.action.DELETE: self._delete,
            }[request.action]
            return await serve(request)
        finally:
            if not self.record_requests:
                self._requests.remove(request)

    @staticmethod
    def _content_type(request: rendering.Request) -> str:
        return next((v for k, v in request.headers.items() if k.lower() == "content-type"), "").split(";")[0]

    def _stored(self, request: rendering.Request) -> kmock.Object | None:
        key = (request.resource, request.namespace, request.name)
        return self._objects[key] if key in self._objects and not self._objects[key].deleted else None

    def _existing(self, request: rendering.Request) -> kmock.Object:
        stored = self._stored(request)
        if stored is None:
            raise kmock.KubernetesObjectNotFoundError()
        return stored

    @staticmethod
    def _stamp_new(data: dict[str, Any], namespace: str | None) -> None:
        metadata = data.setdefault("metadata", {})
        if "name" not in metadata and "generateName" in metadata:
            metadata["name"] = metadata["generateName"] + uuid.uuid4().hex[:8]
        metadata.setdefault("uid", str(uuid.uuid4()))
        metadata.setdefault("creationTimestamp", _now())
        metadata["generation"] = 1
        if namespace:
            metadata.setdefault("namespace", namespace)

    async def _publish(
        self, request: rendering.Request, event_type: str, raw: dict[str, Any]
    ) -> dict[str, Any]:
        assert request.resource is not None
        await self._buses[request.resource].put({"type": event_type, "object": raw})
        return raw

    async def _settle(self, request: rendering.Request, stored: kmock.Object) -> dict[str, Any]:
        """Publish a change; an object marked for deletion goes once its last finalizer has."""
        metadata = stored.raw.get("metadata", {})
        if metadata.get("deletionTimestamp") and not metadata.get("finalizers"):
            raw = copy.deepcopy(stored.raw)
            stored.delete()
            return await self._publish(request, "DELETED", raw)
        return await self._publish(request, "MODIFIED", stored.raw)

    def _create_locked(self, request: rendering.Request) -> kmock.Object:
        data = copy.deepcopy(request.data)
        self._stamp_new(data, request.namespace)
        key = (request.resource, request.namespace, data["metadata"]["name"])
        if key in self._objects and not self._objects[key].deleted:
            raise kmock.KubernetesError(
                status=409, reason="AlreadyExists", message=f"{key[2]} already exists"
            )
        if key in self._objects:
            self._objects[key].create(data)
        else:
            self._objects[key] = data
        return self._objects[key]

    async def _create(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        async with self._lock:
            body = await self._publish(request, "ADDED", self._create_locked(request).raw)
        return aiohttp.web.json_response(body, status=201)

    async def _fetch(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        return aiohttp.web.json_response(self._existing(request).raw)

    async def _update(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        content_type = self._content_type(request)
        async with self._lock:
            if self._stored(request) is None and content_type == "application/apply-patch+yaml":
                body = await self._publish(request, "ADDED", self._create_locked(request).raw)
                return aiohttp.web.json_response(body, status=201)
            stored = self._existing(request)
            before = copy.deepcopy(stored.raw)
            if content_type == "application/json-patch+json":
                try:
                    after = jsonpatch.apply_patch(copy.deepcopy(before), request.data)
                except jsonpatch.JsonPatchTestFailed as error:
                    raise kmock.KubernetesError(status=422, reason="Invalid", message=str(error)) from error
            else:
                after = _merge_patch(copy.deepcopy(before), request.data)
            if request.subresource == "status":
                after = {**before, "status": after.get("status")}
            elif after.get("spec") != before.get("spec"):
                after["metadata"]["generation"] = before["metadata"].get("generation", 1) + 1
            stored.patch(_merge_diff(before, after))
            body = await self._settle(request, stored)
        return aiohttp.web.json_response(body)

    async def _delete(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        async with self._lock:
            stored = self._existing(request)
            metadata = stored.raw.get("metadata", {})
            if metadata.get("finalizers") and not metadata.get("deletionTimestamp"):
                stored.patch({"metadata": {"deletionTimestamp": _now()}})
                body = await self._publish(request, "MODIFIED", stored.raw)
            elif metadata.get("finalizers"):
                body = stored.raw
            else:
                stored.patch({"metadata": {"deletionTimestamp": _now()}})
                body = await self._settle(request, stored)
        return aiohttp.web.json_response(body)

    def _matching(self, request: rendering.Request) -> list[dict[str, Any]]:
        return [
            copy.deepcopy(obj.raw)
            for (resource, _, _), obj in self._objects.items()
            if resource == request.resource and not obj.deleted and self._in_scope(request, obj.raw)
        ]

    async def _list(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        async with self._lock:
            items = self._matching(request)
            version = str(self._clock.now)
        return aiohttp.web.json_response({"metadata": {"resourceVersion": version}, "items": items})

    async def _watch(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        """Subscribe first, then replay, then stream what came after the replay."""
        assert request.resource is not None and request._raw_request is not None
        response = aiohttp.web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request._raw_request)
        bus = self._buses[request.resource]
        since = request.params.get("resourceVersion", "")
        marker = await bus.mark()
        try:
            async with self._lock:
                if since.isdigit() and since != "0":
                    backlog = [event for event in bus.history if _version(event) > int(since)]
                else:
                    backlog = [{"type": "ADDED", "object": obj} for obj in self._matching(request)]
                horizon = self._clock.now
            for event in backlog:
                if self._in_scope(request, event["object"]):
                    await response.write(json.dumps(event).encode() + b"\n")
            async for event in bus.stream(since=marker):
                if _version(event) > horizon and self._in_scope(request, event["object"]):
                    await response.write(json.dumps(event).encode() + b"\n")
        finally:
            await bus.unmark(marker)
        return response

    @staticmethod
    def _in_scope(request: rendering.Request, obj: dict[str, Any]) -> bool:
        """The object is in the request's namespace and has the labels its selector asks for."""
        metadata = obj.get("metadata", {})
        if request.namespace is not None and metadata.get("namespace") != request.namespace:
            return False
        wanted = _equality_selector(request.params.get("labelSelector", ""))
        labels = metadata.get("labels") or {}
        return all(labels.get(key) == value for key, value in wanted.items())


def fast_settings() -> kopf.OperatorSettings:
    """The operator's settings, with waits shortened for tests and CRD scanning off."""
    settings = reconciler.operator_settings()
    settings.scanning.disabled = True
    settings.watching.reconnect_backoff = 0.1
    settings.queueing.exit_timeout = 0.5
    return settings


class OperatorThread:
    """The real operator, on its own thread and event loop, pointed at an emulator's URL."""

    def __init__(
        self, server_url: str, settings: Callable[[], kopf.OperatorSettings] = fast_settings
    ) -> None:
        self._url = server_url
        self._settings = settings
        self._stop = threading.Event()
        self.ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="operator", daemon=True)
        self.error: BaseException | None = None

    def _login(self, **_: Any) -> kopf.ConnectionInfo:
        return kopf.ConnectionInfo(server=self._url, insecure=True, default_namespace="default")

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        try:
            loop.run_until_complete(
                kopf.operator(
                    registry=reconciler.build_registry(login=self._login),
                    settings=self._settings(),
                    clusterwide=True,
                    standalone=True,
                    stop_flag=self._stop,
                    ready_flag=self.ready,
                )
            )
        except BaseException as error:  # reported to the test that started the thread
            self.error = error
        finally:
            loop.close()

    def start(self) -> OperatorThread:
        self._thread.start()
        return self

    def stop(self, timeout: float = 10) -> None:
        self._stop.set()
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the operator did not stop"

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()
