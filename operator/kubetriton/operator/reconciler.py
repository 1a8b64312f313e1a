"""The kopf layer: observe models and their children, apply the desired children, write status.

One level-based handler serves create, update and resume: it validates the spec, applies every
child the builders produce (server-side apply, fixed names, owner references) and deletes the kinds
the spec no longer needs, so running it twice or after a restart changes nothing. Deployments and
pods are kept in kopf indexes; their events recompute the owner's status, and a Deployment deleted
under a live model is applied again. Nothing here builds a manifest: that is `children`'s job, and
the status is `status`'s.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Callable, Mapping
from typing import Any

import kopf
from kubetriton.operator import children, naming, status
from kubetriton.operator.kube import HANDOVER_FIELD_MANAGER, KubeApi, KubeError
from kubetriton.operator.spec import (
    GROUP,
    PLURAL,
    VERSION,
    PyTritonModel,
    describe_validation_error,
)
from pydantic import ValidationError

Login = Callable[..., kopf.ConnectionInfo | None]
"""A kopf login handler: called with kopf's keyword arguments, returns the API server connection."""
CRD_API_VERSION = "apiextensions.k8s.io/v1"
RETRY_DELAY_SECONDS = 30
CHILD_LABELS = {naming.MANAGED_BY_LABEL: naming.MANAGER}


def operator_settings() -> kopf.OperatorSettings:
    """kopf settings: state kept in annotations of our group, events only for warnings from logs,
    and Deployments and pods filtered by the API server, so the operator never sees other apps' pods.
    """
    settings = kopf.OperatorSettings()
    managed = ",".join(f"{key}={value}" for key, value in CHILD_LABELS.items())
    settings.watching.label_selectors["apps", "v1", "deployments"] = managed
    settings.watching.label_selectors["v1", "pods"] = managed
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration"
    )
    settings.posting.level = logging.WARNING
    return settings


def login_from_environment(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """The pod's service account inside a cluster, the kubeconfig outside of one."""
    return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _first(index: kopf.Index[Any, Any], key: tuple[str, str]) -> Any:
    return next(iter(index.get(key, ())), None)


def _parse(name: str, namespace: str, spec: Mapping[str, Any]) -> PyTritonModel:
    return PyTritonModel.model_validate(
        {"metadata": {"name": name, "namespace": namespace}, "spec": dict(spec)}
    )


class Reconciler:
    """The handlers of one operator, sharing one API session."""

    def __init__(self, api: KubeApi) -> None:
        self.api = api

    async def publish(
        self,
        owner: Mapping[str, Any],
        new_status: dict[str, Any],
        *,
        observed_generation: int | None = None,
    ) -> None:
        """Write the status when it differs from the owner's, and post an event when Ready changes."""
        previous = owner.get("status") or {}
        new_status = {
            **new_status,
            "conditions": status.stamp_transitions(
                new_status["conditions"], previous.get("conditions", []), _now()
            ),
        }
        if observed_generation is not None:
            new_status["observedGeneration"] = observed_generation
        if all(previous.get(key) == value for key, value in new_status.items()):
            return
        metadata = owner["metadata"]
        await self.api.patch_status(
            owner["apiVersion"], PLURAL, metadata["namespace"], metadata["name"], new_status
        )
        self._announce(owner, previous.get("conditions", []), new_status["conditions"])

    @staticmethod
    def _announce(
        owner: Mapping[str, Any], before: list[dict[str, Any]], after: list[dict[str, Any]]
    ) -> None:
        old = next((c for c in before if c.get("type") == status.READY), {})
        new = next(c for c in after if c["type"] == status.READY)
        if (old.get("status"), old.get("reason")) == (new["status"], new["reason"]):
            return
        ref = {
            "apiVersion": owner["apiVersion"],
            "kind": owner["kind"],
            "metadata": {key: owner["metadata"].get(key) for key in ("name", "namespace", "uid")},
        }
        degraded = next(c for c in after if c["type"] == status.DEGRADED)
        event_type = "Warning" if degraded["status"] == "True" else "Normal"
        kopf.event(ref, type=event_type, reason=new["reason"], message=new["message"] or new["reason"])

    async def _apply_children(
        self, model: PyTritonModel, owner: Mapping[str, Any], deployed_replicas: int | None = None
    ) -> str:
        """Apply the wanted children, delete the unwanted ones; say what was done."""
        monitor = await self.api.exists(
            CRD_API_VERSION, "customresourcedefinitions", None, children.SERVICE_MONITOR_CRD
        )
        if model.spec.autoscaling is not None and deployed_replicas is not None:
            handover = children.build_replicas_handover(model, deployed_replicas)
            await self.api.apply(handover, children.DEPLOYMENT.plural, field_manager=HANDOVER_FIELD_MANAGER)
        applied, deleted = [], []
        for child in children.desired(model, service_monitor=monitor):
            kopf.append_owner_reference(child, owner=owner)
            await self.api.apply(child, children.kind_of(child).plural)
            applied.append(child["kind"])
        for kind in children.unwanted(model, service_monitor_available=monitor):
            if await self.api.delete(
                kind.api_version, kind.plural, model.metadata.namespace or "", model.metadata.name
            ):
                deleted.append(kind.kind)
        return f"applied {', '.join(applied)}" + (f"; deleted {', '.join(deleted)}" if deleted else "")

    async def reconcile(
        self,
        body: kopf.Body,
        name: str,
        namespace: str,
        logger: kopf.Logger,
        model_deployments: kopf.Index[tuple[str, str], dict[str, Any]],
        model_pods: kopf.Index[tuple[str, str], dict[str, Any]],
        **_: Any,
    ) -> None:
        """Bring the children in line with the spec, then report what they show."""
        owner = dict(body)
        generation = body.metadata.get("generation")
        try:
            model = _parse(name, namespace, body.spec)
        except ValidationError as error:
            message = describe_validation_error(error)
            logger.warning(f"invalid spec: {message}")
            await self.publish(
                owner,
                self._failure(name, namespace, status.INVALID_SPEC, message),
                observed_generation=generation,
            )
            return
        try:
            deployed = _first(model_deployments, (namespace, name))
            replicas = deployed["spec"]["replicas"] if deployed else None
            outcome = await self._apply_children(model, owner, replicas)
        except KubeError as error:
            await self.publish(
                owner,
                self._failure(name, namespace, status.APPLY_FAILED, error.message),
                observed_generation=generation,
            )
            raise kopf.TemporaryError(
                f"applying children failed: {error}", delay=RETRY_DELAY_SECONDS
            ) from error
        logger.info(outcome)
        key = (namespace, name)
        pods = [pod for pod in model_pods.get(key, ())]
        summary = status.summarize(model, _first(model_deployments, key), pods)
        await self.publish(owner, summary, observed_generation=generation)

    @staticmethod
    def _failure(name: str, namespace: str, reason: str, message: str) -> dict[str, Any]:
        return {
            "selector": naming.selector_string(name),
            "conditions": status.failure_conditions(reason, message),
            "url": naming.http_url(name, namespace),
            "grpcUrl": naming.grpc_url(name, namespace),
        }

    async def child_changed(
        self,
        type: str,
        body: kopf.Body,
        namespace: str,
        labels: Mapping[str, str],
        logger: kopf.Logger,
        model_objects: kopf.Index[tuple[str, str], dict[str, Any]],
        model_deployments: kopf.Index[tuple[str, str], dict[str, Any]],
        model_pods: kopf.Index[tuple[str, str], dict[str, Any]],
        **_: Any,
    ) -> None:
        """A Deployment or pod of a model changed: recompute that model's status.

        A Deployment deleted while its model lives is applied again at once.
        """
        key = (namespace, labels.get(naming.INSTANCE_LABEL, ""))
        owner = _first(model_objects, key)
        if owner is None or owner["metadata"].get("deletionTimestamp"):
            return
        try:
            model = _parse(key[1], namespace, owner.get("spec") or {})
        except ValidationError:
            return
        if type == "DELETED" and body.get("kind") == children.DEPLOYMENT.kind:
            logger.warning(
                f"the Deployment of {key[1]} was deleted; {await self._apply_children(model, owner)}"
            )
        pods = [pod for pod in model_pods.get(key, ())]
        await self.publish(owner, status.summarize(model, _first(model_deployments, key), pods))


def _model_object(
    body: kopf.Body, namespace: str, name: str, **_: Any
) -> dict[tuple[str, str], dict[str, Any]]:
    return {(namespace, name): dict(body)}


def _child_object(
    body: kopf.Body, namespace: str, labels: Mapping[str, str], **_: Any
) -> dict[tuple[str, str], dict[str, Any]]:
    """What the status needs of a Deployment or pod: names, generations, replica counts, status."""
    summary = {
        "metadata": {"name": body.metadata.name, "generation": body.metadata.get("generation", 0)},
        "spec": {"replicas": body.spec.get("replicas", 1)},
        "status": dict(body.status),
    }
    return {(namespace, labels.get(naming.INSTANCE_LABEL, "")): summary}


def build_registry(login: Login = login_from_environment) -> kopf.OperatorRegistry:
    """A registry with every handler of the operator, bound to one API session."""
    registry = kopf.OperatorRegistry()
    api = KubeApi()
    reconciler = Reconciler(api)

    @kopf.on.login(registry=registry)
    async def authenticate(**kwargs: Any) -> kopf.ConnectionInfo | None:
        info = login(**kwargs)
        if info is not None:
            await api.connect(info)
        return info

    @kopf.on.cleanup(registry=registry)
    async def disconnect(**_: Any) -> None:
        await api.close()

    kopf.index(GROUP, VERSION, PLURAL, id="model_objects", registry=registry)(_model_object)
    kopf.index("apps", "v1", "deployments", labels=CHILD_LABELS, id="model_deployments", registry=registry)(
        _child_object
    )
    kopf.index("v1", "pods", labels=CHILD_LABELS, id="model_pods", registry=registry)(_child_object)

    for cause in (kopf.on.create, kopf.on.update, kopf.on.resume):
        cause(GROUP, VERSION, PLURAL, id="reconcile", registry=registry)(reconciler.reconcile)
    kopf.on.event("apps", "v1", "deployments", labels=CHILD_LABELS, id="deployment", registry=registry)(
        reconciler.child_changed
    )
    kopf.on.event("v1", "pods", labels=CHILD_LABELS, id="pod", registry=registry)(reconciler.child_changed)
    return registry
