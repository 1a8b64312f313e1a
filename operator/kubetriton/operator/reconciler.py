"""The kopf layer: observe models and their children, apply the desired children, write status.

One level-based routine, `converge`, brings a model's children in line with its spec and reports
what they show. It runs for each generation of a model's spec the operator has not converged yet
(so for every model once at start), a child deleted under a live model, a ServiceMonitor CRD that
appears after the models, and the retries of a failed apply; running it again changes nothing.
Models are watched with a plain event handler, not kopf's create/update/resume handlers, which
keep their state in an annotation of each model: that is one write per model and change, and the
operator keeps what it needs in memory. Every child kind is watched into a kopf index, so the routine
knows what exists and what was applied (each child carries a fingerprint of it) without a request:
an unchanged model costs no write at all.

A change of the operator's own pod template (a new operator version whose generator differs) is
applied to at most `max_concurrent_rollouts` serving models at a time: such a model's Deployment
waits while that many others roll out. A change of a model's spec is never held back. The generator
change is told from the spec change by the model's status: its spec's generation is the one the
operator last converged (`observedGeneration`), yet its Deployment differs from what it wants.

A failed apply is retried by the operator itself, with a backoff, rather than through kopf's
handler retries: kopf keeps a failed handler's delay even when the spec changes, and a corrected
spec is acted on at once here. The failure is kept in the status (Degraded, with the API server's
message) until every child is applied. A namespace being deleted is left alone: nothing is
applied, written or announced in it.

A model scaled on its own signals (autoscaling.targetQueueMilliseconds or targetInFlightPerPod) gets
no HorizontalPodAutoscaler: the operator's `autoscaler`, which runs beside the handlers, decides its
replicas, and applies them here, under the model's lock, with a field manager of its own that the
Deployment's applies never touch.

Nothing here builds a manifest: that is `children`'s job, and the status is `status`'s.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import kopf
from kopf._cogs.structs import references
from kubetriton.operator import autoscaler, children, naming, status
from kubetriton.operator.autoscaler import Key
from kubetriton.operator.kube import (
    AUTOSCALER_FIELD_MANAGER,
    CONFLICT,
    FIELD_MANAGER,
    HANDOVER_FIELD_MANAGER,
    NOT_SENT,
    REQUEST_TIMEOUT_SECONDS,
    KubeApi,
    KubeError,
)
from kubetriton.operator.router import DEFAULT_SETTINGS, RouterSettings
from kubetriton.operator.spec import (
    GROUP,
    PLURAL,
    VERSION,
    PyTritonModel,
    describe_validation_error,
)
from pydantic import ValidationError

Insights = references.Insights
"""What kopf serves (watched resources, namespaces): kopf.operator() fills in the one it is given.
kopf does not export the type; the health endpoint reads whether the models are watched from it."""
Login = Callable[..., kopf.ConnectionInfo | None]
"""A kopf login handler: called with kopf's keyword arguments, returns the API server connection."""

CHILD_LABELS = {naming.MANAGED_BY_LABEL: naming.MANAGER}
MODEL_CRD = f"{PLURAL}.{GROUP}"
WATCHED_CRDS = (MODEL_CRD, children.SERVICE_MONITOR_CRD)
RETRY_DELAYS = (1.0, 2.0, 4.0, 8.0, 16.0, 30.0)
"""Seconds before the next attempt after a temporary failure; the last one repeats."""
REFUSED_RETRY_DELAYS = (10.0, 30.0, 60.0, 120.0, 300.0)
"""The same after a refusal, which usually waits for a spec change (acted on at once anyway)."""
MAX_CONCURRENT_ROLLOUTS = 3
"""Serving models whose pods roll at once for a change of the operator's own pod template."""
API_RETRY_DELAYS = (1.0, 1.0, 2.0, 3.0, 5.0, 8.0, 13.0, 21.0, 30.0)
"""Seconds between kopf's attempts of one of its own requests (a list, a watch) that the API server
refuses with a server error, throttling or a 403 (kopf's own delays, then 30 s); the last one repeats."""

POD = children.ChildKind("v1", "Pod", "pods")
INDEXES = {
    children.DEPLOYMENT: "model_deployments",
    children.SERVICE: "model_services",
    children.POD_DISRUPTION_BUDGET: "model_disruption_budgets",
    children.HORIZONTAL_POD_AUTOSCALER: "model_autoscalers",
    children.SERVICE_MONITOR: "model_service_monitors",
    children.CONFIG_MAP: "model_config_maps",
    POD: "model_pods",
}
"""The kopf index of each watched kind, keyed by the model's namespace and name."""
MODELS_INDEX = "models"
CRDS_INDEX = "established_crds"
TERMINATING_INDEX = "terminating_namespaces"
POD_MODELS_INDEX = "pod_models"
"""The model of each of the operator's pods (the models' and their routers'), keyed by the pod's namespace
and name."""
ROUTER_PODS_INDEX = "router_pods"
"""The routers' pods, keyed by the model's namespace and name."""
MODEL_POD_LABELS = {**CHILD_LABELS, naming.NAME_LABEL: naming.APP_NAME}
"""The models' own pods among the operator's: not the routers' (`naming.router_pod_labels`)."""
ROUTER_POD_LABELS = {**CHILD_LABELS, naming.NAME_LABEL: naming.ROUTER_APP_NAME}
POD_WARNINGS_INDEX = "pod_warnings"
"""The Warning events about pods, keyed by the pod's namespace and name (`status.pod_warning`)."""
ALL_INDEXES = (
    MODELS_INDEX,
    CRDS_INDEX,
    TERMINATING_INDEX,
    POD_MODELS_INDEX,
    ROUTER_PODS_INDEX,
    POD_WARNINGS_INDEX,
    *INDEXES.values(),
)
EVENTS = ("v1", "events")
POD_WARNINGS_ONLY = "involvedObject.kind=Pod,type=Warning"
"""The API server sends the operator only the Events that warn about pods."""
MODEL_HANDLER, CRD_HANDLER, WARNING_HANDLER, ROUTER_POD_HANDLER = "model", "crd", "warning", "router-pods"
WATCH_HANDLERS = (
    MODEL_HANDLER,
    CRD_HANDLER,
    WARNING_HANDLER,
    ROUTER_POD_HANDLER,
    *(kind.plural for kind in INDEXES),
)
"""The ids of the handlers that kopf calls for every watch event of what they watch."""


@dataclass(frozen=True)
class Endless:
    """Delays of which the last repeats for ever: kopf's backoffs for its own requests.

    kopf gives up on a request once its backoffs run out (54 s of its own), and a list or a watch
    that gives up stops the whole operator: an API server that answered 503 for a minute (its etcd
    away, an upgrade behind a load balancer) ended the operator's process. Retried for ever, a list
    or a watch resumes when the API server does, as one whose connection is refused always did. (Not
    being `Sized` is what tells kopf to go on.)
    """

    delays: Sequence[float]

    def __iter__(self) -> Iterator[float]:
        return itertools.chain(self.delays, itertools.repeat(self.delays[-1]))


class NoEssence(kopf.DiffBaseStorage):
    """Keeps no essence of an object for kopf to compare with its next version.

    kopf builds one for every watch event, by deep-copying the whole body twice, for its
    change-detecting handlers (create/update/resume, daemons, timers). The operator registers none,
    only event and index handlers, which never read it: at 200 models that copying was the
    operator's largest CPU cost.
    """

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
        return kopf.BodyEssence()

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return kopf.BodyEssence()

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        raise AssertionError("the operator has no change-detecting handler whose essence to store")


def operator_settings() -> kopf.OperatorSettings:
    """kopf settings: children filtered by the API server
    (the operator never sees other apps' objects), CRDs watched, so that a CRD installed after
    the operator started is served, no essence of each watched object kept, and kopf's requests
    retried for as long as the API server refuses them (`Endless`)."""
    settings = kopf.OperatorSettings()
    settings.persistence.diffbase_storage = NoEssence()
    managed = ",".join(f"{key}={value}" for key, value in CHILD_LABELS.items())
    for kind in INDEXES:
        settings.watching.label_selectors[kind.resource] = managed
    settings.watching.field_selectors[EVENTS] = POD_WARNINGS_ONLY
    settings.posting.level = logging.WARNING
    settings.scanning.disabled = False
    settings.networking.error_backoffs = Endless(API_RETRY_DELAYS)
    return settings


def login_from_environment(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """The pod's service account inside a cluster, the kubeconfig outside of one."""
    return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)


def _first(index: kopf.Index[Any, Any] | None, key: Any) -> Any:
    return next(iter(index.get(key, ()))) if index is not None and key in index else None


def _named(index: kopf.Index[Any, Any] | None, key: Any, name: str) -> Any:
    """The summary of the child called `name` among those indexed under the model's key."""
    found = index.get(key, ()) if index is not None and key in index else ()
    return next((summary for summary in found if summary["metadata"]["name"] == name), None)


def _stamp(metadata: Mapping[str, Any]) -> tuple[str, int]:
    """A model's uid and spec generation: what a converge or a parse is done once for."""
    return metadata.get("uid", ""), metadata.get("generation", 0)


async def _model_summary(body: kopf.Body, namespace: str, name: str, **_: Any) -> dict[Key, dict[str, Any]]:
    """What the operator needs of a model: identity, spec and status, without kopf's annotations."""
    metadata = body.metadata
    kept = ("name", "namespace", "uid", "generation", "deletionTimestamp")
    return {
        (namespace, name): {
            "apiVersion": body["apiVersion"],
            "kind": body["kind"],
            "metadata": {key: metadata[key] for key in kept if key in metadata},
            "spec": dict(body.spec),
            "status": dict(body.status),
        }
    }


def _converged_before(owner: Mapping[str, Any]) -> bool:
    """Whether the operator converged the model's current spec before (its status says so): a
    Deployment that differs from what the model wants then differs because the generator changed."""
    observed = (owner.get("status") or {}).get("observedGeneration")
    return observed is not None and observed == owner["metadata"].get("generation")


def _owns_replicas(managed_fields: Sequence[Mapping[str, Any]]) -> bool:
    """Whether the operator's own field manager applied spec.replicas."""
    return any(
        entry.get("manager") == FIELD_MANAGER
        and entry.get("operation") == "Apply"
        and "f:replicas" in ((entry.get("fieldsV1") or {}).get("f:spec") or {})
        for entry in managed_fields
    )


DEPLOYMENT_STATUS_FIELDS = (
    "observedGeneration",
    "replicas",
    "readyReplicas",
    "updatedReplicas",
    "availableReplicas",
    "conditions",
)


def _fingerprint_of(child: Mapping[str, Any]) -> str:
    return ((child.get("metadata") or {}).get("annotations") or {}).get(children.FINGERPRINT_ANNOTATION, "")


def _deployment_summary(deployment: Mapping[str, Any]) -> dict[str, Any]:
    """What the operator needs of a Deployment: what the status reads, the fingerprint of what it
    applied, and whether it owns the replica count."""
    metadata, observed = deployment.get("metadata") or {}, deployment.get("status") or {}
    return {
        "metadata": {"name": metadata.get("name"), "generation": metadata.get("generation", 0)},
        "spec": {"replicas": (deployment.get("spec") or {}).get("replicas", 1)},
        "status": {name: observed[name] for name in DEPLOYMENT_STATUS_FIELDS if name in observed},
        "fingerprint": _fingerprint_of(deployment),
        "ownsReplicas": _owns_replicas(metadata.get("managedFields") or []),
    }


def rolling_out(deployment: Mapping[str, Any]) -> bool:
    """Whether a Deployment (its summary) is rolling out pods that serve: not every wanted pod is
    updated and available yet or old pods remain, some are available, and its rollout has not stalled.
    Mid-surge a one-replica Deployment counts one updated and one available pod, the old one: only
    the pods of the old template, `replicas` beyond `updatedReplicas`, show it still rolls. A model
    with no available pod has nothing a rollout could take away, and never holds others back."""
    observed, wanted = deployment["status"], deployment["spec"]["replicas"]
    available, updated = observed.get("availableReplicas", 0), observed.get("updatedReplicas", 0)
    stalled = any(
        c.get("type") == "Progressing" and c.get("status") == "False"
        for c in observed.get("conditions") or []
    )
    incomplete = (
        observed.get("observedGeneration", 0) < deployment["metadata"]["generation"]
        or updated < wanted
        or observed.get("replicas", 0) > updated
        or available < wanted
    )
    return incomplete and available > 0 and not stalled


async def _child_summary(
    body: kopf.Body, namespace: str, labels: Mapping[str, str], **_: Any
) -> dict[Key, Any]:
    """A Deployment's summary; of any other child, its name and the fingerprint of what the operator
    applied. A model may have several children of one kind, told apart by name."""
    key = (namespace, labels.get(naming.INSTANCE_LABEL, ""))
    if body.get("kind") == children.DEPLOYMENT.kind:
        return {key: _deployment_summary(body)}
    return {key: {"metadata": {"name": body.metadata.name}, "fingerprint": _fingerprint_of(body)}}


async def _pod_summary(
    body: kopf.Body, namespace: str, labels: Mapping[str, str], **_: Any
) -> dict[Key, Any]:
    """What the status reads of a pod (its age and template, volume claims, scheduling and Ready conditions,
    containers' states, why it failed: an eviction), and what the autoscaler needs (whether it is Ready,
    its address)."""
    observed = body.status

    def containers(field: str) -> list[dict[str, Any]]:
        kept = ("name", "ready", "restartCount", "state", "lastState")
        return [{key: entry[key] for key in kept if key in entry} for entry in observed.get(field) or []]

    conditions = observed.get("conditions") or []
    read_conditions = [c for c in conditions if c.get("type") in ("PodScheduled", "Ready")]
    claims = [volume for volume in body.spec.get("volumes") or [] if volume.get("persistentVolumeClaim")]
    template = labels.get(status.TEMPLATE_HASH_LABEL)
    return {
        (namespace, labels.get(naming.INSTANCE_LABEL, "")): {
            "metadata": {
                "name": body.metadata.name,
                "creationTimestamp": body.metadata.get("creationTimestamp", ""),
                "labels": {status.TEMPLATE_HASH_LABEL: template} if template else {},
                **({"deletionTimestamp": True} if body.metadata.get("deletionTimestamp") else {}),
            },
            "spec": {"volumes": claims},
            "status": {
                "podIP": observed.get("podIP", ""),
                **{key: observed[key] for key in ("reason", "message") if key in observed},
                "conditions": read_conditions,
                "initContainerStatuses": containers("initContainerStatuses"),
                "containerStatuses": containers("containerStatuses"),
            },
        }
    }


async def _pod_model(namespace: str, name: str, labels: Mapping[str, str], **_: Any) -> dict[Key, str]:
    return {(namespace, name): labels.get(naming.INSTANCE_LABEL, "")}


async def _pod_warning(body: kopf.Body, namespace: str, **_: Any) -> dict[Key, dict[str, Any]]:
    """A Warning about a pod, under the pod's key; any other Event is not kept."""
    warning = status.pod_warning(body)
    if warning is None:
        return {}
    return {(namespace, body["involvedObject"].get("name", "")): warning}


async def _established(body: kopf.Body, name: str, **_: Any) -> dict[str, bool]:
    conditions = body.status.get("conditions") or []
    return {name: any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions)}


async def _terminating(body: kopf.Body, name: str, **_: Any) -> dict[str, bool]:
    """Only namespaces being deleted are kept; any other leaves the index (an empty result)."""
    deleting = body.status.get("phase") == "Terminating" or body.metadata.get("deletionTimestamp")
    return {name: True} if deleting else {}


def _watched_crd(name: str, **_: Any) -> bool:
    return name in WATCHED_CRDS


class ApplyError(Exception):
    """Applying or deleting one child failed."""

    def __init__(self, kind: children.ChildKind, error: KubeError) -> None:
        super().__init__(f"{kind.kind}: {error}")
        self.error = error


class NameTaken(KubeError):
    """A child's name is held by an object that is not the model's. Server-side apply would take it over
    (and the model's deletion would then delete it): the operator leaves it alone and says so, until it
    goes or the model is renamed."""

    def __init__(self, existing: Mapping[str, Any]) -> None:
        metadata = existing["metadata"]
        owners = ", ".join(f"{ref['kind']} {ref['name']}" for ref in metadata.get("ownerReferences") or [])
        held = f"it belongs to {owners}" if owners else "it belongs to no PyTritonModel"
        message = (
            f"{metadata['name']} exists already and is not this model's ({held}): delete it, or give the"
            " model another name"
        )
        Exception.__init__(self, message)  # not KubeError's "HTTP 409: ...": the operator says this
        self.status, self.message = CONFLICT, message

    @property
    def temporary(self) -> bool:
        return False


@dataclass
class ModelState:
    """What the operator remembers of one model between events."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    """Serializes everything done for the model: kopf's handlers, child events and retries."""
    parsed: tuple[str, int, PyTritonModel | str] | None = None
    """uid, generation, and the model or the reason its spec is invalid."""
    converged: tuple[str, int] | None = None
    """uid and generation of the spec last converged."""
    failure: status.ApplyFailure | None = None
    attempts: int = 0
    retry: asyncio.TimerHandle | None = None
    written: dict[str, Any] | None = None
    """The status last written, so that an unchanged one is not written again."""
    status_failure: str | None = None
    """Why the last status write failed, until one succeeds: said once, not at every retry."""
    applied_deployment: dict[str, Any] | None = None
    """The Deployment as the operator's last apply returned it, until the index has caught up."""
    template_generation: int | None = None
    """The Deployment's generation when the operator last applied its pod template: a later one changed
    its replicas only (an autoscaler), which no pod has to roll for."""
    stale: bool = False
    """Children changed while the lock was held: the status is refreshed before it is let go."""
    autoscaling: dict[str, Any] | None = None
    """status.autoscaling as the operator's autoscaler last decided it."""

    def cancel_retry(self) -> None:
        if self.retry is not None:
            self.retry.cancel()
            self.retry = None


class Reconciler:
    """The handlers of one operator, sharing one API session, kopf's indexes and per-model state."""

    def __init__(
        self,
        api: KubeApi,
        retry_delays: Sequence[float] = RETRY_DELAYS,
        refused_retry_delays: Sequence[float] = REFUSED_RETRY_DELAYS,
        worker_image: str | None = None,
        *,
        max_concurrent_rollouts: int = MAX_CONCURRENT_ROLLOUTS,
        autoscaler_options: Mapping[str, Any] | None = None,
        router_settings: RouterSettings = DEFAULT_SETTINGS,
    ) -> None:
        """`autoscaler_options` go to the operator's own `autoscaler.Autoscaler` (its interval);
        `router_settings` make every model's router, and say whether a model that does not say has one."""
        self.api = api
        self.worker_image = worker_image
        self.router_settings = router_settings
        self.retry_delays = retry_delays
        self.refused_retry_delays = refused_retry_delays
        self.max_concurrent_rollouts = max_concurrent_rollouts
        self._rollout_admission = asyncio.Lock()
        """Held from counting the rollouts to applying one, so that two models never take one slot."""
        self._waiting: set[Key] = set()
        """Models whose Deployment waits for a rollout slot."""
        self.settings = kopf.OperatorSettings()
        self.indices: Mapping[str, kopf.Index[Any, Any]] = {}
        self._models: dict[Key, ModelState] = {}
        self._retries: set[asyncio.Task[None]] = set()
        self.autoscaler = autoscaler.Autoscaler(self, **(autoscaler_options or {}))
        self._autoscaling: asyncio.Task[None] | None = None

    # What the indexes say.

    def crd_established(self, name: str) -> bool:
        return bool(_first(self.indices.get(CRDS_INDEX), name))

    def not_serving_because(self, insights: Insights) -> str | None:
        """Why models are not served yet (their CRD is missing, or kopf does not watch it yet), or
        None when kopf watches them."""
        if any(r.group == GROUP and r.plural == PLURAL for r in insights.watched_resources):
            return None
        if not self.crd_established(MODEL_CRD):
            return f"the CustomResourceDefinition {MODEL_CRD} is not installed or not established"
        return f"the CustomResourceDefinition {MODEL_CRD} is installed but not served yet"

    def namespace_terminating(self, namespace: str) -> bool:
        return _first(self.indices.get(TERMINATING_INDEX), namespace) is not None

    def _owner(self, key: Key) -> dict[str, Any] | None:
        """The model, unless it is gone, being deleted, or in a namespace being deleted."""
        owner = _first(self.indices.get(MODELS_INDEX), key)
        if owner is None or owner["metadata"].get("deletionTimestamp") or self.namespace_terminating(key[0]):
            return None
        return owner

    def _observed(self, child: children.Child, key: Key) -> Any:
        return _named(self.indices.get(INDEXES[child.kind]), key, child.name(key[1]))

    def _deployment(self, key: Key) -> dict[str, Any] | None:
        """The Deployment's summary: the operator's last apply, until the index has caught up with it."""
        observed = self._observed(children.MODEL_DEPLOYMENT, key)
        state = self._models.get(key)
        applied = state.applied_deployment if state is not None else None
        if applied is None or (
            observed and observed["metadata"]["generation"] >= applied["metadata"]["generation"]
        ):
            if state is not None:
                state.applied_deployment = None
            return observed
        return applied

    def _rollouts(self) -> int:
        """How many models' Deployments roll out serving pods now."""
        index = self.indices.get(INDEXES[children.DEPLOYMENT])
        keys = set(index.keys()) if index is not None else set()
        keys |= {key for key, state in self._models.items() if state.applied_deployment is not None}
        return sum(1 for key in keys if (deployment := self._deployment(key)) and rolling_out(deployment))

    def _pods(self, key: Key, index_id: str = INDEXES[POD]) -> list[dict[str, Any]]:
        """The model's pods, or with `ROUTER_PODS_INDEX` its router's."""
        index = self.indices.get(index_id)
        return list(index.get(key, ())) if index is not None else []

    def _warnings(self, key: Key, pods: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
        """The Warning events about the model's pods, by pod name."""
        index = self.indices.get(POD_WARNINGS_INDEX)
        names = [pod["metadata"]["name"] for pod in pods]
        return {name: list(index.get((key[0], name), ())) for name in names} if index is not None else {}

    def _template_generation(self, state: ModelState, deployment: Mapping[str, Any] | None) -> int | None:
        """The Deployment's generation when its pod template was last applied. Not known (an operator that
        started, with nothing to apply): the generation it has once its status has caught up with it."""
        if deployment is None:
            return None
        generation = deployment["metadata"]["generation"]
        if (
            state.template_generation is None
            and deployment["status"].get("observedGeneration", 0) >= generation
        ):
            state.template_generation = generation
        return state.template_generation

    def _logger(self, owner: Mapping[str, Any]) -> kopf.Logger:
        """A logger whose lines name the model, whichever object's event is being handled."""
        return kopf.LocalObjectLogger(body=owner, settings=self.settings)

    def _state(self, key: Key) -> ModelState:
        return self._models.setdefault(key, ModelState())

    # Lifecycle.

    async def start(self, settings: kopf.OperatorSettings, **kwargs: Any) -> None:
        """Keep kopf's settings (for loggers) and its indexes, which outlive every handler call."""
        self.settings = settings
        self.indices = {index_id: kwargs[index_id] for index_id in ALL_INDEXES}

    async def stop(self, **_: Any) -> None:
        if self._autoscaling is not None:
            self._autoscaling.cancel()
            await asyncio.gather(self._autoscaling, return_exceptions=True)
        for state in self._models.values():
            state.cancel_retry()
        for task in list(self._retries):
            task.cancel()
        await asyncio.gather(*self._retries, return_exceptions=True)
        await self.api.close()

    # The level-based routine.

    def _parse(self, state: ModelState, owner: Mapping[str, Any]) -> PyTritonModel | str:
        """The validated model, or why its spec is invalid; parsed once per generation."""
        metadata = owner["metadata"]
        stamp = _stamp(metadata)
        if state.parsed is None or state.parsed[:2] != stamp:
            try:
                parsed: PyTritonModel | str = PyTritonModel.read(
                    {
                        "metadata": {"name": metadata["name"], "namespace": metadata["namespace"]},
                        "spec": owner["spec"],
                    }
                )
            except ValidationError as error:
                parsed = describe_validation_error(error)
            else:
                parsed.spec.bootstrap.image = parsed.spec.bootstrap.image or self.worker_image
                if parsed.spec.router is None:
                    parsed.spec.router = self.router_settings.enabled_by_default
            state.parsed = (*stamp, parsed)
        return state.parsed[2]

    async def _for_model(
        self, key: Key, act: Callable[[Key, ModelState, dict[str, Any]], Awaitable[None]]
    ) -> None:
        """Run `act` on the model under its lock, unless the model is gone or being deleted."""
        if self._owner(key) is None:
            return
        state = self._state(key)
        async with state.lock:
            owner = self._owner(key)
            if owner is None:
                state.cancel_retry()
                return
            await act(key, state, owner)
            while state.stale and (owner := self._owner(key)) is not None:
                state.stale = False
                await self._refresh(key, state, owner)

    async def converge(self, key: Key) -> None:
        """Apply what the model's children lack, delete what it no longer needs, write the status."""
        await self._for_model(key, self._converge)

    async def refresh(self, key: Key) -> None:
        """Write the status again from what the children show now.

        While something else is being done for the model, the refresh is left to it (it refreshes
        once more before it lets go), so that a burst of pod events neither waits nor piles up.
        """
        state = self._models.get(key)
        if state is not None and state.lock.locked():
            state.stale = True
            return
        await self._for_model(key, self._refresh)

    async def _converge(self, key: Key, state: ModelState, owner: dict[str, Any]) -> None:
        """Apply and publish; a generation's first converge says so once, even when nothing changed
        (as for every model at start)."""
        logger = self._logger(owner)
        metadata = owner["metadata"]
        stamp = _stamp(metadata)
        model = self._parse(state, owner)
        if isinstance(model, str):
            if stamp != state.converged:  # said once per generation, not at each child's event
                logger.warning(f"invalid spec: {model}")
            state.failure = None
            state.cancel_retry()
        else:
            try:
                done = await self._apply_children(model, owner, state)
            except ApplyError as failed:
                if failed.error.namespace_terminating:
                    logger.debug(f"not applied, the namespace is being deleted: {failed}")
                    return
                if failed.error.status == NOT_SENT:  # no longer the leader: stepping down, silently
                    return
                self._failed(key, state, failed, logger)
            else:
                state.failure = None
                state.cancel_retry()
                if stamp != state.converged:
                    logger.info(f"generation {stamp[1]} reconciled: {done or 'no change needed'}")
                elif done:
                    logger.info(done)
        state.converged = stamp
        await self._publish(key, state, owner, logger, observed_generation=metadata.get("generation"))

    async def _refresh(self, key: Key, state: ModelState, owner: dict[str, Any]) -> None:
        await self._publish(key, state, owner, self._logger(owner))

    def _failed(self, key: Key, state: ModelState, failed: ApplyError, logger: kopf.Logger) -> None:
        """Keep the failure for the status, say so once, and try again later."""
        temporary = failed.error.temporary
        delays = self.retry_delays if temporary else self.refused_retry_delays
        delay = self._schedule_retry(key, state, delays)
        if state.failure is None or state.failure.message != str(failed):
            logger.warning(f"applying the children failed: {failed}; retrying in {delay:g} s")
        state.failure = status.ApplyFailure(message=str(failed), temporary=temporary)

    def _schedule_retry(self, key: Key, state: ModelState, delays: Sequence[float]) -> float:
        """Converge the model again after the next delay of its backoff; returns the delay."""
        delay = delays[min(state.attempts, len(delays) - 1)]
        state.attempts += 1
        state.cancel_retry()
        state.retry = asyncio.get_running_loop().call_later(delay, self._retry, key)
        return delay

    def _retry(self, key: Key) -> None:
        task = asyncio.get_running_loop().create_task(self.converge(key))
        self._retries.add(task)
        task.add_done_callback(self._retries.discard)

    async def _apply(
        self, kind: children.ChildKind, obj: dict[str, Any], manager: str = FIELD_MANAGER
    ) -> dict[str, Any]:
        try:
            return await self.api.apply(obj, kind.plural, field_manager=manager)
        except KubeError as error:
            raise ApplyError(kind, error) from error

    async def _apply_children(self, model: PyTritonModel, owner: Mapping[str, Any], state: ModelState) -> str:
        """Apply the children that differ from what the model wants, delete the unwanted ones that
        exist; say what was done (nothing, for a model whose children are as it wants them)."""
        key = (model.metadata.namespace or "", model.metadata.name)
        monitor = self.crd_established(children.SERVICE_MONITOR_CRD)
        applied, deleted, held = [], [], ""
        for part in children.wanted(model, service_monitor=monitor):
            kind, child = part.kind, children.build(part, model, self.router_settings)
            kopf.append_owner_reference(child, owner=dict(owner))
            observed = self._observed(part, key)
            if observed is not None and observed["fingerprint"] == children.fingerprint(child):
                continue
            if part is children.MODEL_DEPLOYMENT and observed and _converged_before(owner):
                held = await self._roll_when_free(key, kind, child, state)
                if held is None:
                    applied.append(part.describe(key[1]))
                continue
            if observed is None:
                await self._refuse_a_taken_name(kind, child, owner)
            child = children.stamped(child)
            if part is children.MODEL_DEPLOYMENT and observed is None:
                child = children.first_deployment(child, model)
            elif part is children.MODEL_DEPLOYMENT and model.spec.autoscaling:
                live = self._deployment(key) or observed  # the autoscaler's last write, if newer
                if live["ownsReplicas"]:
                    handover = children.build_replicas(model, live["spec"]["replicas"])
                    await self._apply(kind, handover, HANDOVER_FIELD_MANAGER)
            answer = await self._apply(kind, child)
            if part is children.MODEL_DEPLOYMENT:
                state.applied_deployment = _deployment_summary(answer)
                state.template_generation = state.applied_deployment["metadata"]["generation"]
            applied.append(part.describe(key[1]))
        for part in children.unwanted(model, service_monitor_available=monitor):
            if self._observed(part, key) is None:
                continue
            try:
                if await self.api.delete(part.kind.api_version, part.kind.plural, key[0], part.name(key[1])):
                    deleted.append(part.describe(key[1]))
            except KubeError as error:
                raise ApplyError(part.kind, error) from error
        done = [
            f"{verb} {', '.join(kinds)}"
            for verb, kinds in (("applied", applied), ("deleted", deleted))
            if kinds
        ]
        return "; ".join([*done, held] if held else done)

    async def _refuse_a_taken_name(
        self, kind: children.ChildKind, child: Mapping[str, Any], owner: Mapping[str, Any]
    ) -> None:
        """Raise ApplyError (NameTaken) when an object not owned by the model holds the child's name. Asked
        of the API server for a child the operator has not seen (its watches see its own children only):
        on the model's first apply, once per child."""
        metadata = child["metadata"]
        try:
            existing = await self.api.get(
                kind.api_version, kind.plural, metadata["namespace"], metadata["name"]
            )
        except KubeError as error:
            raise ApplyError(kind, error) from error
        if existing is None:
            return
        owners = existing["metadata"].get("ownerReferences") or []
        if not any(ref.get("uid") == owner["metadata"]["uid"] for ref in owners):
            raise ApplyError(kind, NameTaken(existing))

    async def _roll_when_free(
        self, key: Key, kind: children.ChildKind, child: dict[str, Any], state: ModelState
    ) -> str | None:
        """Apply a Deployment that the operator's own generator changed, if fewer than
        max_concurrent_rollouts models roll out now; None once applied, otherwise what to say (the
        first time only: the model then waits until a rollout completes, see `child_event`)."""
        async with self._rollout_admission:
            rolling = self._rollouts()
            if rolling >= self.max_concurrent_rollouts:
                first = key not in self._waiting
                self._waiting.add(key)
                return (
                    f"Deployment waits: {rolling} models are rolling out a new pod template" if first else ""
                )
            answer = await self._apply(kind, children.stamped(child))
            state.applied_deployment = _deployment_summary(answer)
            state.template_generation = state.applied_deployment["metadata"]["generation"]
            self._waiting.discard(key)
            return None

    async def _admit_waiting(self) -> None:
        """Converge as many waiting models as there are free rollout slots."""
        if not self._waiting:
            return
        free = self.max_concurrent_rollouts - self._rollouts()
        await asyncio.gather(*(self.converge(key) for key in sorted(self._waiting)[: max(free, 0)]))

    # Status.

    def _status(
        self, state: ModelState, owner: Mapping[str, Any], key: Key, previous: Mapping[str, Any]
    ) -> dict[str, Any]:
        """The model's status; status.autoscaling as the autoscaler decided it, and gone once the
        operator no longer scales the model; status.router and its condition while it has a router."""
        model = self._parse(state, owner)
        if isinstance(model, str):
            return status.invalid_spec(key[1], key[0], model)
        deployment, pods = self._deployment(key), self._pods(key)
        summary = status.summarize(
            model,
            deployment,
            pods,
            state.failure,
            self._warnings(key, pods),
            self._template_generation(state, deployment),
        )
        if model.spec.scaled_by_operator and state.autoscaling is not None:
            summary["autoscaling"] = state.autoscaling
        elif not model.spec.scaled_by_operator and previous.get("autoscaling"):
            summary["autoscaling"] = None
        if model.spec.router:
            router_pods = self._pods(key, ROUTER_PODS_INDEX)
            summary["router"], condition = status.router(
                model,
                self._observed(children.ROUTER_DEPLOYMENT, key),
                router_pods,
                summary["readyReplicas"],
                self._warnings(key, router_pods),
            )
            summary["conditions"].append(condition)
        elif previous.get("router"):
            summary["router"] = None
        return summary

    async def _publish(
        self,
        key: Key,
        state: ModelState,
        owner: Mapping[str, Any],
        logger: kopf.Logger,
        *,
        observed_generation: int | None = None,
    ) -> None:
        """Write the status when it differs from the last one written, and announce Ready changes.

        A write that fails is tried again later, as an apply that fails is, on the same backoff: only a
        model whose children are applied and whose status is written starts it again from its first
        delay (otherwise every retry's successful apply did, and an API server that refuses status
        writes got one a second from each model).
        """
        previous = state.written if state.written is not None else owner.get("status") or {}
        new_status = self._status(state, owner, key, previous)
        new_status["conditions"] = status.stamp_transitions(
            new_status["conditions"], previous.get("conditions", []), status.now()
        )
        if observed_generation is not None:
            new_status["observedGeneration"] = observed_generation
        if any(previous.get(name) != value for name, value in new_status.items()):
            try:
                await self.api.patch_status(owner["apiVersion"], PLURAL, key[0], key[1], new_status)
            except KubeError as error:
                if error.status in (404, NOT_SENT):  # the model is gone, or this operator no longer leads
                    return
                if state.status_failure != str(error):
                    logger.warning(f"writing the status failed: {error}; retrying")
                state.status_failure = str(error)
                if state.retry is None:
                    delays = self.retry_delays if error.temporary else self.refused_retry_delays
                    self._schedule_retry(key, state, delays)
                return
            if state.status_failure is not None:
                logger.info("the status is written again")
                state.status_failure = None
            state.written = {**previous, **new_status}
            self._announce(owner, previous.get("conditions", []), new_status["conditions"])
        if state.failure is None:
            state.attempts = 0

    @staticmethod
    def _announce(
        owner: Mapping[str, Any], before: list[dict[str, Any]], after: list[dict[str, Any]]
    ) -> None:
        """An event when the model becomes ready or stops being ready, and a warning for each new
        problem; not for the steps in between (creating, rolling out). A model whose first status is
        Ready (its pods were ready before the operator first wrote it) becomes ready then."""
        old = next((c for c in before if c.get("type") == status.READY), {})
        new = next(c for c in after if c["type"] == status.READY)
        degraded = next(c for c in after if c["type"] == status.DEGRADED)["status"] == "True"
        became = old.get("status", "False") != new["status"]
        new_problem = degraded and old.get("reason") != new["reason"]
        if became or new_problem:
            message = new["message"] or new["reason"]
            kopf.event(
                dict(owner), type="Warning" if degraded else "Normal", reason=new["reason"], message=message
            )

    # The operator's own autoscaler (`autoscaler.Host`).

    def scaled_models(self) -> list[tuple[Key, PyTritonModel]]:
        """The models whose autoscaling names a target of the model's own."""
        models = self.indices.get(MODELS_INDEX)
        scaled = []
        for key in list(models.keys()) if models is not None else []:
            owner = self._owner(key)
            model = self._parse(self._state(key), owner) if owner is not None else None
            if isinstance(model, PyTritonModel) and model.spec.scaled_by_operator:
                scaled.append((key, model))
        return scaled

    def pods_of(self, key: Key) -> list[dict[str, Any]]:
        return self._pods(key)

    async def autoscale(
        self,
        key: Key,
        scaler: autoscaler.ModelScaler,
        observe: Callable[[int], autoscaler.Observation],
    ) -> None:
        """One decision of the autoscaler, under the model's lock, from the Deployment's replicas now: a
        new count is applied by the autoscaler's own field manager and announced, and status.autoscaling
        says what was decided and why."""

        async def act(key: Key, state: ModelState, owner: dict[str, Any]) -> None:
            model = self._parse(state, owner)
            deployment = self._deployment(key)
            if isinstance(model, str) or model.spec.autoscaling is None or deployment is None:
                return
            if not model.spec.scaled_by_operator:
                return
            logger = self._logger(owner)
            policy = autoscaler.Policy.of(model.spec.autoscaling)
            observation = observe(deployment["spec"]["replicas"])
            now = self.autoscaler.clock()
            decision = scaler.decide(policy, observation, now)
            failure = ""
            if decision.replicas != observation.replicas:
                replicas = children.build_replicas(model, decision.replicas)
                try:
                    answer = await self._apply(children.DEPLOYMENT, replicas, AUTOSCALER_FIELD_MANAGER)
                except ApplyError as failed:
                    if failed.error.status == NOT_SENT or failed.error.namespace_terminating:
                        return
                    failure = str(failed)
                    logger.warning(f"setting {decision.replicas} replicas failed: {failed}")
                else:
                    state.applied_deployment = _deployment_summary(answer)
                    logger.info(decision.message)
            announcement = None if failure else scaler.announcement(observation, decision)
            state.autoscaling = scaler.settle(policy, observation, decision, now, failure)
            if announcement is not None:
                kind, reason = announcement
                kopf.event(dict(owner), type=kind, reason=reason, message=decision.message)
            await self._publish(key, state, owner, logger)

        await self._for_model(key, act)

    # kopf handlers.

    async def model_event(
        self, type: str | None, body: kopf.Body, namespace: str, name: str, **_: Any
    ) -> None:
        """A model listed at start, created, or with a spec not converged yet is converged; a deleted
        model's state is forgotten. Other events (its status, written here) change nothing."""
        if self._autoscaling is None:
            # started from a handler, whose context lets it post Events (kopf sets it per watch stream)
            self._autoscaling = asyncio.create_task(self.autoscaler.run())
        key = (namespace, name)
        if type == "DELETED":
            state = self._models.pop(key, None)
            if state is not None:
                state.cancel_retry()
            self._waiting.discard(key)
            await self._admit_waiting()
            return
        state = self._models.get(key)
        if state is None or state.converged != _stamp(body.metadata):
            await self.converge(key)

    async def child_event(
        self, type: str, body: kopf.Body, namespace: str, labels: Mapping[str, str], **_: Any
    ) -> None:
        """A child changed: a deleted one (not a pod) is applied again, anything else updates the status."""
        key = (namespace, labels.get(naming.INSTANCE_LABEL, ""))
        if type == "DELETED" and body.get("kind") != POD.kind:
            await self.converge(key)
        else:
            await self.refresh(key)
        if body.get("kind") == children.DEPLOYMENT.kind:
            await self._admit_waiting()

    async def warning_event(self, body: kopf.Body, namespace: str, **_: Any) -> None:
        """A Warning about a model's pod or its router's (a volume not mounted, a probe failing): the model's
        status is refreshed."""
        pod = (body.get("involvedObject") or {}).get("name", "")
        model = _first(self.indices.get(POD_MODELS_INDEX), (namespace, pod))
        if model and status.pod_warning(body) is not None:
            await self.refresh((namespace, model))

    async def crd_event(self, type: str | None, name: str, **_: Any) -> None:
        """The ServiceMonitor CRD appeared or changed: every model gets what it now wants."""
        appeared = type in ("ADDED", "MODIFIED") and self.crd_established(name)
        if appeared and name == children.SERVICE_MONITOR_CRD:
            models = self.indices.get(MODELS_INDEX)
            keys = list(models.keys()) if models is not None else []
            await asyncio.gather(*(self.converge(key) for key in keys))


@dataclass
class Operator:
    """The registry to run and the reconciler behind it (whose `serving` the health endpoint reads)."""

    registry: kopf.OperatorRegistry
    reconciler: Reconciler


def build_operator(
    login: Login = login_from_environment,
    *,
    request_timeout: float | None = None,
    retry_delays: Sequence[float] = RETRY_DELAYS,
    refused_retry_delays: Sequence[float] = REFUSED_RETRY_DELAYS,
    worker_image: str | None = None,
    may_write: Callable[[], bool] | None = None,
    max_concurrent_rollouts: int = MAX_CONCURRENT_ROLLOUTS,
    autoscaler_options: Mapping[str, Any] | None = None,
    router_settings: RouterSettings = DEFAULT_SETTINGS,
) -> Operator:
    """A registry with every handler of the operator, bound to one API session. `worker_image` runs the
    pods' init step where a model's spec.bootstrap.image does not say otherwise; `autoscaler_options`
    go to the operator's own autoscaler (its interval, and in tests the pods' ports); `router_settings`
    make the models' routers."""
    registry = kopf.OperatorRegistry()
    api = KubeApi(timeout=request_timeout or REQUEST_TIMEOUT_SECONDS, may_write=may_write)
    reconciler = Reconciler(
        api,
        retry_delays,
        refused_retry_delays,
        worker_image,
        max_concurrent_rollouts=max_concurrent_rollouts,
        autoscaler_options=autoscaler_options,
        router_settings=router_settings,
    )

    @kopf.on.login(registry=registry)
    async def authenticate(**kwargs: Any) -> kopf.ConnectionInfo | None:
        info = login(**kwargs)
        if info is not None:
            await api.connect(info)
        return info

    kopf.on.startup(registry=registry)(reconciler.start)
    kopf.on.cleanup(registry=registry)(reconciler.stop)

    # The index functions are coroutines: kopf runs a plain function in its executor's threads, a hop
    # there and back (and a task to shield it) for every watch event.
    kopf.index(GROUP, VERSION, PLURAL, id=MODELS_INDEX, registry=registry)(_model_summary)
    crds = ("apiextensions.k8s.io", "v1", "customresourcedefinitions")
    kopf.index(*crds, id=CRDS_INDEX, when=_watched_crd, registry=registry)(_established)
    kopf.index("v1", "namespaces", id=TERMINATING_INDEX, registry=registry)(_terminating)
    kopf.index(*POD.resource, labels=CHILD_LABELS, id=POD_MODELS_INDEX, registry=registry)(_pod_model)
    kopf.index(*POD.resource, labels=ROUTER_POD_LABELS, id=ROUTER_PODS_INDEX, registry=registry)(_pod_summary)
    watch_routers = kopf.on.event(
        *POD.resource, labels=ROUTER_POD_LABELS, id=ROUTER_POD_HANDLER, registry=registry
    )
    watch_routers(reconciler.child_event)
    kopf.index(*EVENTS, id=POD_WARNINGS_INDEX, registry=registry)(_pod_warning)
    kopf.on.event(*EVENTS, id=WARNING_HANDLER, registry=registry)(reconciler.warning_event)
    for kind, index_id in INDEXES.items():
        summary, labels = (_pod_summary, MODEL_POD_LABELS) if kind is POD else (_child_summary, CHILD_LABELS)
        kopf.index(*kind.resource, labels=labels, id=index_id, registry=registry)(summary)
        watch = kopf.on.event(*kind.resource, labels=labels, id=kind.plural, registry=registry)
        watch(reconciler.child_event)

    kopf.on.event(GROUP, VERSION, PLURAL, id=MODEL_HANDLER, registry=registry)(reconciler.model_event)
    kopf.on.event(*crds, id=CRD_HANDLER, when=_watched_crd, registry=registry)(reconciler.crd_event)
    return Operator(registry, reconciler)
