"""A Kubernetes API emulator that kopf and the operator can run against: kmock's, with what it lacks.

kmock 0.8's `KubernetesEmulator` stores objects and streams watch events, but kopf needs more of the
API server's bookkeeping, and kmock matches every request against every recorded one, which a few
thousand requests turn into minutes. This subclass serves requests on objects itself, from kmock's
object store (so `objects` and the recorded requests stay available to assertions), and adds:

- `uid`, `creationTimestamp`, `generation` on create (and a name from `generateName`), and one
  cluster-wide `resourceVersion` counter stamped on every change and watch event, deletions included;
- `generation` bumped when a change touches `spec`;
- JSON patches (kopf adds and removes finalizers with them), with a failed `test` answered by 422;
- server-side apply as the operator sends it: create when absent, otherwise merge, with
  `managedFields` kept per field manager for the keys of objects (lists count as one field), and a
  field that its only manager stops applying removed;
- lists that report the current resourceVersion, and watches that subscribe before they replay,
  then replay either the current objects or, when a resourceVersion is named, the events after it;
- equality label selectors on lists and watches;
- custom resources that exist only while their CRD does: a created CRD's resource appears in
  discovery, and with `established_crds` the CRD is established at once; `model_crd` installs the
  PyTritonModel CRD from the start;
- namespaces as objects (kmock reads `/api/v1/namespaces/NAME` as a path into a namespace), and
  namespaces that terminate: deleting one marks it Terminating, and creating anything in it then
  fails with the API server's 403;
- a count of requests by method and resource, and writes that can be refused (as by an admission
  webhook) or held without an answer (as by an overloaded API server);
- `faults`: checks of every request on objects (reads, watches and subresources included) that may
  answer it with an error, hold it, or answer in the server's place, as an API server that fails
  does; and `drop_watches`, which cuts the open watch streams of a resource, as a restarting API
  server or a load balancer in between does.

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
import re
import secrets
import threading
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp.web
import attrs
import jsonpatch
import kmock
import kopf
import yaml
from crd_check import CRD_FILE
from kmock._internal import aiobus, enums, parsing, rendering
from kubetriton.operator import reconciler

ALL_VERBS = {"get", "list", "watch", "patch", "create", "delete"}
RESOURCES = {
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
    "v1/services": kmock.ResourceInfo(kind="Service", singular="service", namespaced=True, verbs=ALL_VERBS),
    "v1/configmaps": kmock.ResourceInfo(
        kind="ConfigMap", singular="configmap", namespaced=True, verbs=ALL_VERBS
    ),
    "v1/namespaces": kmock.ResourceInfo(
        kind="Namespace", singular="namespace", namespaced=False, verbs=ALL_VERBS
    ),
    "apiextensions.k8s.io/v1/customresourcedefinitions": kmock.ResourceInfo(
        kind="CustomResourceDefinition",
        singular="customresourcedefinition",
        namespaced=False,
        verbs=ALL_VERBS,
    ),
    "v1/events": kmock.ResourceInfo(kind="Event", singular="event", namespaced=True, verbs=ALL_VERBS),
    "policy/v1/poddisruptionbudgets": kmock.ResourceInfo(
        kind="PodDisruptionBudget", singular="poddisruptionbudget", namespaced=True, verbs=ALL_VERBS
    ),
    "autoscaling/v2/horizontalpodautoscalers": kmock.ResourceInfo(
        kind="HorizontalPodAutoscaler",
        singular="horizontalpodautoscaler",
        namespaced=True,
        verbs=ALL_VERBS,
    ),
}
MODEL_CRD = yaml.safe_load(CRD_FILE.read_text())
SERVICE_MONITOR_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "servicemonitors.monitoring.coreos.com"},
    "spec": {
        "group": "monitoring.coreos.com",
        "scope": "Namespaced",
        "names": {"kind": "ServiceMonitor", "plural": "servicemonitors", "singular": "servicemonitor"},
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "schema": {
                    "openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
                },
            }
        ],
    },
}
"""The least of a ServiceMonitor CRD that an API server accepts: what discovery and the operator use."""
NAMESPACE_TERMINATING = "unable to create new content in namespace {namespace} because it is being terminated"


def crd_resource(crd: dict[str, Any]) -> tuple[str, kmock.ResourceInfo]:
    """The resource a CRD serves, as discovery shows it."""
    crd_spec = crd["spec"]
    names, version = crd_spec["names"], crd_spec["versions"][0]
    info = kmock.ResourceInfo(
        kind=names["kind"],
        singular=names.get("singular"),
        namespaced=crd_spec.get("scope") == "Namespaced",
        shortnames=set(names.get("shortNames", [])),
        subresources=set((version.get("subresources") or {}).keys()),
        verbs=ALL_VERBS,
    )
    return f"{crd_spec['group']}/{version['name']}/{names['plural']}", info


Fault = Callable[[rendering.Request], Awaitable[aiohttp.web.StreamResponse | None]]
"""A check of a request before the emulator serves it (see `ClusterEmulator.faults`)."""


NAMESPACE_PATH = re.compile(r"/api/v1/namespaces(?:/(?P<name>[^/]+))?/?")
_parse_any_path = parsing.parse_path


def _parse_path(path: str) -> parsing.ParsedPath:
    """kmock's path parsing, with the namespaces collection and a namespace object read as such."""
    match = NAMESPACE_PATH.fullmatch(path)
    if match is None:
        return _parse_any_path(path)
    return parsing.ParsedPath(group="", version="v1", plural="namespaces", name=match["name"])


parsing.parse_path = _parse_path


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


def _field_set(value: Any) -> dict[str, Any]:
    """The fieldsV1 form of an applied object: its keys, nested; a list or a scalar is one field."""
    if not isinstance(value, dict):
        return {}
    return {f"f:{key}": _field_set(item) for key, item in value.items()}


def _leaves(fields: dict[str, Any], prefix: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
    found = set()
    for name, nested in fields.items():
        path = (*prefix, name.removeprefix("f:"))
        found |= _leaves(nested, path) if nested else {path}
    return found


def _lookup(obj: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        if not isinstance(obj, dict) or key not in obj:
            return None
        obj = obj[key]
    return obj


def _without_leaves(fields: dict[str, Any], paths: set[tuple[str, ...]]) -> dict[str, Any]:
    kept = {}
    for name, nested in fields.items():
        key = name.removeprefix("f:")
        inner = _without_leaves(nested, {p[1:] for p in paths if p[0] == key and len(p) > 1})
        if (key,) in paths or (nested and not inner):
            continue
        kept[name] = inner
    return kept


def _server_side_apply(
    before: dict[str, Any], applied: dict[str, Any], manager: str, api_version: str
) -> dict[str, Any]:
    """The object after `manager` applied `applied` with force.

    Fields that only this manager set before and no longer applies are removed; fields it changes
    are taken from other managers; every manager's set is kept in managedFields.
    """
    entries = [dict(entry) for entry in before.get("metadata", {}).get("managedFields") or []]
    previous = next((entry for entry in entries if entry["manager"] == manager), None)
    tracked = {key: value for key, value in applied.items() if key not in ("apiVersion", "kind", "status")}
    metadata = {
        key: value for key, value in applied.get("metadata", {}).items() if key not in ("name", "namespace")
    }
    tracked.pop("metadata", None)
    new_fields = _field_set({**tracked, **({"metadata": metadata} if metadata else {})})
    new_leaves = _leaves(new_fields)
    others = [entry for entry in entries if entry is not previous]
    kept_by_others = set().union(*(_leaves(entry["fieldsV1"]) for entry in others))
    after = copy.deepcopy(before)
    if previous is not None:
        for path in _leaves(previous["fieldsV1"]) - new_leaves - kept_by_others:
            parent = _lookup(after, path[:-1])
            if isinstance(parent, dict):
                parent.pop(path[-1], None)
    after = _merge_patch(after, applied)
    changed = {path for path in new_leaves if _lookup(before, path) != _lookup(after, path)}
    for entry in others:
        entry["fieldsV1"] = _without_leaves(entry["fieldsV1"], changed)
    mine = {"manager": manager, "operation": "Apply", "apiVersion": api_version, "fieldsV1": new_fields}
    after.setdefault("metadata", {})["managedFields"] = [
        *(entry for entry in others if entry["fieldsV1"]),
        mine,
    ]
    return after


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
    model_crd: bool = False
    """Whether the PyTritonModel CRD is installed from the start (the operator tests' clusters)."""
    established_crds: bool = False
    """Whether a CRD gets the Established condition, as the API server gives it; off where a test
    compares a stored CRD with the generated file."""
    rejections: dict[str, Callable[[dict[str, Any]], str | tuple[int, str] | None]] = attrs.field(
        factory=dict
    )
    """Plural name → a check of the written object that returns why it is refused (a message for a
    422, as from an admission webhook, or the status and message), or None to accept it."""
    held: set[str] = attrs.field(factory=set)
    """Plural names, or `plural/name` for one object, whose writes get no answer while they are here."""
    request_counts: collections.Counter[str] = attrs.field(factory=collections.Counter)
    """Requests by method and resource, such as "PATCH deployments" or "GET pods watch"."""
    faults: list[Fault] = attrs.field(factory=list)
    """Checks of every request on objects, in order, before it is served: one may raise the API
    server's error (`kmock.KubernetesError`), take its time (a slow API server), or return the
    answer to send in the server's place; None lets the request through."""
    _watching: dict[str, set[asyncio.BaseTransport]] = attrs.field(
        factory=lambda: collections.defaultdict(set), init=False
    )
    """The connections of the open watches, by plural name."""
    _clock: _Clock = attrs.field(factory=_Clock, init=False)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        clock = self._clock
        self._buses = collections.defaultdict(lambda: _VersionedBus(clock=clock))
        for key, info in RESOURCES.items():
            self.resources[key] = info
        if self.model_crd:
            self._store_new("apiextensions.k8s.io/v1/customresourcedefinitions", MODEL_CRD)

    def _store_new(self, resource: str, obj: dict[str, Any]) -> None:
        """An object that exists before any client connects, as the API server's own do."""
        data = copy.deepcopy(obj)
        self._stamp_new(data, None)
        self._install_crd(data)
        self._objects[kmock.resource(resource), None, data["metadata"]["name"]] = data

    def _install_crd(self, data: dict[str, Any]) -> None:
        """A CRD's resource appears in discovery, and the CRD is established at once."""
        if data.get("kind") != "CustomResourceDefinition":
            return
        if self.established_crds:
            data["status"] = {"conditions": [{"type": "Established", "status": "True"}]}
        key, info = crd_resource(data)
        self.resources[key] = info

    def _custom_resource_missing(self, resource: kmock.resource) -> bool:
        """A custom resource whose CRD does not exist, which the API server does not know."""
        served = f"{resource.group}/{resource.version}/{resource.plural}" if resource.group else ""
        return bool(resource.group) and served not in RESOURCES and resource not in self.resources

    def _terminating(self, namespace: str | None) -> bool:
        key = (kmock.resource("v1/namespaces"), None, namespace)
        if namespace is None or key not in self._objects or self._objects[key].deleted:
            return False
        return self._objects[key].raw.get("status", {}).get("phase") == "Terminating"

    async def _handle(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        try:
            resource = request.resource
            if resource is None or resource.plural is None or request.action not in _OBJECT_ACTIONS:
                return await super()._handle(request)
            watching = " watch" if request.action == enums.action.WATCH else ""
            self.request_counts[f"{request.method.value.upper()} {resource.plural}{watching}"] += 1
            for fault in list(self.faults):
                answer = await fault(request)
                if answer is not None:
                    return answer
            if self._custom_resource_missing(resource):
                raise kmock.KubernetesError(
                    status=404, reason="NotFound", message="the server could not find the requested resource"
                )
            writes = (enums.action.CREATE, enums.action.UPDATE)
            if request.action in writes and request.subresource is None:
                while self.held & {resource.plural, f"{resource.plural}/{request.name}"}:
                    await asyncio.sleep(0.05)
                check = self.rejections.get(resource.plural)
                refusal = check(request.data) if check is not None else None
                if refusal is not None:
                    status, message = refusal if isinstance(refusal, tuple) else (422, refusal)
                    raise kmock.KubernetesError(status=status, reason="Invalid", message=message)
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

    def drop_watches(self, plural: str) -> None:
        """Cut the connection of every open watch of the resource; its watchers reconnect."""
        for connection in self._watching.pop(plural, set()):
            connection.close()

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

    def _create_locked(self, request: rendering.Request, data: dict[str, Any]) -> kmock.Object:
        assert request.resource is not None
        self._stamp_new(data, request.namespace)
        key = (request.resource, request.namespace, data["metadata"]["name"])
        if self._terminating(request.namespace):
            message = NAMESPACE_TERMINATING.format(namespace=request.namespace)
            raise kmock.KubernetesError(
                status=403,
                reason="Forbidden",
                message=f'{request.resource.plural} "{key[2]}" is forbidden: {message}',
            )
        if key in self._objects and not self._objects[key].deleted:
            raise kmock.KubernetesError(
                status=409, reason="AlreadyExists", message=f"{key[2]} already exists"
            )
        self._install_crd(data)
        if key in self._objects:
            self._objects[key].create(data)
        else:
            self._objects[key] = data
        return self._objects[key]

    async def _create(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        async with self._lock:
            created = self._create_locked(request, copy.deepcopy(request.data))
            body = await self._publish(request, "ADDED", created.raw)
        return aiohttp.web.json_response(body, status=201)

    async def _fetch(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        return aiohttp.web.json_response(self._existing(request).raw)

    async def _update(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        content_type = self._content_type(request)
        applying = content_type == "application/apply-patch+yaml"
        manager = request.params.get("fieldManager", "")
        async with self._lock:
            if self._stored(request) is None and applying:
                data = _server_side_apply({}, request.data, manager, request.data.get("apiVersion", ""))
                body = await self._publish(request, "ADDED", self._create_locked(request, data).raw)
                return aiohttp.web.json_response(body, status=201)
            stored = self._existing(request)
            before = copy.deepcopy(stored.raw)
            if applying:
                after = _server_side_apply(before, request.data, manager, request.data.get("apiVersion", ""))
            elif content_type == "application/json-patch+json":
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
            assert request.resource is not None
            if request.resource.plural == "namespaces":
                stored.patch({"metadata": {"deletionTimestamp": _now()}, "status": {"phase": "Terminating"}})
                body = await self._publish(request, "MODIFIED", stored.raw)
            elif stored.raw.get("kind") == "CustomResourceDefinition":
                self.resources.pop(crd_resource(stored.raw)[0], None)
                stored.patch({"metadata": {"deletionTimestamp": _now()}})
                body = await self._settle(request, stored)
            elif metadata.get("finalizers") and not metadata.get("deletionTimestamp"):
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
        connection = request._raw_request.transport
        watching = self._watching[request.resource.plural]
        if connection is not None:
            watching.add(connection)
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
            watching.discard(connection)
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
    """The operator's settings, with waits shortened for tests."""
    settings = reconciler.operator_settings()
    settings.watching.reconnect_backoff = 0.1
    settings.queueing.exit_timeout = 0.5
    return settings


class OperatorThread:
    """The real operator, on its own thread and event loop, pointed at an emulator's URL."""

    def __init__(
        self,
        server_url: str,
        settings: Callable[[], kopf.OperatorSettings] = fast_settings,
        **options: Any,
    ) -> None:
        """`options` go to `build_operator`: request timeout and retry delays."""
        self._url = server_url
        self._settings = settings
        self.token = secrets.token_hex(8)
        """Its bearer token, which tells its requests from another operator's in the emulator's log."""
        self._operator = reconciler.build_operator(login=self._login, **options)
        self.insights = reconciler.Insights()
        self._stop = threading.Event()
        self.ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="operator", daemon=True)
        self.error: BaseException | None = None

    def _login(self, **_: Any) -> kopf.ConnectionInfo:
        return kopf.ConnectionInfo(
            server=self._url, insecure=True, default_namespace="default", scheme="Bearer", token=self.token
        )

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        try:
            loop.run_until_complete(
                kopf.operator(
                    registry=self._operator.registry,
                    settings=self._settings(),
                    insights=self.insights,
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

    @property
    def reconciler(self) -> reconciler.Reconciler:
        """What the operator's handlers know (its indexes), for tests that wait on it."""
        return self._operator.reconciler
