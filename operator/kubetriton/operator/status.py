"""A model's status, computed from what its Deployment and pods report and what applying failed.

Pure functions: the reconciler hands in the observed objects and its last failure to apply a child,
and writes back what comes out. The reasons name the problem a user can act on (no GPU left, image
not pulled, worker crashing, a child the API server refused) rather than the generic "not ready".
A refused child keeps the model Degraded, whatever its pods do, until every child is applied.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kubetriton import podenv
from kubetriton.operator import naming
from kubetriton.operator.pod import WORKER_CONTAINER
from kubetriton.operator.spec import PyTritonModel


def now() -> str:
    """The time as status fields and conditions stamp it: UTC, whole seconds."""
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


READY = "Ready"
PROGRESSING = "Progressing"
DEGRADED = "Degraded"

INSUFFICIENT_GPU = "InsufficientGPU"
UNSCHEDULABLE = "Unschedulable"
CRASH_LOOP = "CrashLoopBackOff"
WORKER_IMAGE_UNSUPPORTED = "WorkerImageUnsupported"
NO_PYTHON = '"python3": executable file not found'
"""What the container runtime says when the launcher's `python3` is not in the worker image."""
MODEL_LOAD_FAILED = "ModelLoadFailed"
INVALID_SPEC = "InvalidSpec"
APPLY_FAILED = "ApplyFailed"
APPLY_RETRYING = "ApplyRetrying"
LOADING = "Loading"
IMAGE_PULL_REASONS = ("ImagePullBackOff", "ErrImagePull", "InvalidImageName")

_SEVERITY = (
    INSUFFICIENT_GPU,
    UNSCHEDULABLE,
    *IMAGE_PULL_REASONS,
    WORKER_IMAGE_UNSUPPORTED,
    CRASH_LOOP,
    MODEL_LOAD_FAILED,
    "ReplicaFailure",
    "ProgressDeadlineExceeded",
)


@dataclass(frozen=True)
class Diagnosis:
    """Why pods of a model do not become ready."""

    reason: str
    message: str


@dataclass(frozen=True)
class ApplyFailure:
    """The last attempt to apply a model's children failed; it is retried."""

    message: str
    temporary: bool
    """No answer or a busy API server, rather than a refusal that the spec has to fix."""


def _container_statuses(pod: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    status = pod.get("status") or {}
    return [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]


def scheduling_problem(pod: Mapping[str, Any], gpu_resource: str) -> Diagnosis | None:
    """Why the pod cannot be scheduled (no GPU free, or another reason the scheduler gave), or None."""
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            message = condition.get("message", "")
            if f"Insufficient {gpu_resource}" in message or "Insufficient nvidia.com/" in message:
                return Diagnosis(INSUFFICIENT_GPU, message)
            return Diagnosis(UNSCHEDULABLE, message or condition.get("reason", ""))
    return None


def _unsupported_image(container: Mapping[str, Any]) -> Diagnosis | None:
    """The launcher's refusal of the worker image (its exit status and one line), or an image without the
    `python3` that runs the launcher."""
    if container.get("name") != WORKER_CONTAINER:
        return None
    for state in (container.get("state") or {}, container.get("lastState") or {}):
        exit_ = state.get("terminated") or {}
        message = exit_.get("message", "").strip()
        if exit_.get("exitCode") == podenv.UNSUPPORTED_IMAGE_EXIT_CODE and message:
            return Diagnosis(WORKER_IMAGE_UNSUPPORTED, message.splitlines()[-1])
        if NO_PYTHON in message:
            return Diagnosis(
                WORKER_IMAGE_UNSUPPORTED,
                "The worker image cannot run kubetriton: it has no python3 on its PATH",
            )
    return None


def _container_problem(container: Mapping[str, Any]) -> Diagnosis | None:
    name = container.get("name", "")
    waiting = (container.get("state") or {}).get("waiting") or {}
    last_exit = (container.get("lastState") or {}).get("terminated") or {}
    reason = waiting.get("reason")
    if reason in IMAGE_PULL_REASONS:
        return Diagnosis(reason, f"container {name}: {waiting.get('message', reason)}")
    unsupported = _unsupported_image(container)
    if unsupported:
        return unsupported
    if reason == CRASH_LOOP:
        detail = last_exit.get("message") or last_exit.get("reason") or waiting.get("message", "")
        return Diagnosis(CRASH_LOOP, f"container {name} keeps exiting: {detail}".rstrip(": "))
    if _worker_running_unready(container) and last_exit.get("exitCode"):
        detail = last_exit.get("message") or f"exit code {last_exit['exitCode']}"
        return Diagnosis(MODEL_LOAD_FAILED, f"the worker restarted and is not ready: {detail}")
    return None


def diagnose_pod(pod: Mapping[str, Any], gpu_resource: str) -> Diagnosis | None:
    """The most telling problem of one pod, or None when nothing is wrong yet."""
    found = scheduling_problem(pod, gpu_resource)
    if found:
        return found
    for container in _container_statuses(pod):
        found = _container_problem(container)
        if found:
            return found
    return None


def _worker_running_unready(container: Mapping[str, Any]) -> bool:
    return (
        container.get("name") == WORKER_CONTAINER
        and "running" in (container.get("state") or {})
        and not container.get("ready")
    )


def loading(pods: Iterable[Mapping[str, Any]]) -> list[str]:
    """The pods whose worker runs but is not ready yet and has not failed: it is loading its models, or
    binding them. That is no problem, however long it takes."""
    names = []
    for pod in pods:
        for container in (pod.get("status") or {}).get("containerStatuses") or []:
            failed_before = ((container.get("lastState") or {}).get("terminated") or {}).get("exitCode")
            if _worker_running_unready(container) and not failed_before:
                names.append(pod["metadata"]["name"])
    return sorted(names)


def _deployment_problem(deployment: Mapping[str, Any]) -> Diagnosis | None:
    for condition in (deployment.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "ReplicaFailure" and condition.get("status") == "True":
            return Diagnosis("ReplicaFailure", condition.get("message", ""))
        if condition.get("type") == "Progressing" and condition.get("reason") == "ProgressDeadlineExceeded":
            return Diagnosis("ProgressDeadlineExceeded", condition.get("message", ""))
    return None


def diagnose(
    deployment: Mapping[str, Any] | None, pods: Iterable[Mapping[str, Any]], gpu_resource: str
) -> Diagnosis | None:
    """The most severe problem among the pods and the Deployment."""
    found = [diagnose_pod(pod, gpu_resource) for pod in sorted(pods, key=lambda p: p["metadata"]["name"])]
    if deployment is not None:
        found.append(_deployment_problem(deployment))
    problems = [problem for problem in found if problem is not None]
    return min(problems, key=lambda problem: _SEVERITY.index(problem.reason), default=None)


def _condition(kind: str, true: bool, reason: str, message: str) -> dict[str, str]:
    return {"type": kind, "status": "True" if true else "False", "reason": reason, "message": message}


def _conditions(
    deployment: Mapping[str, Any] | None,
    problem: Diagnosis | None,
    least_ready: int | None,
    loading_pods: list[str],
) -> list[dict[str, str]]:
    """Ready once the rollout is done and enough pods are ready: every wanted one, or at least
    `least_ready` (an autoscaled model's minimum) when that is given. Not ready for no problem but
    workers still loading reads Loading."""
    if deployment is None:
        return [
            _condition(READY, False, "Creating", "the Deployment does not exist yet"),
            _condition(PROGRESSING, True, "Creating", "creating the Deployment"),
            _condition(DEGRADED, problem is not None, *_problem_or_fine(problem)),
        ]
    spec = deployment.get("spec") or {}
    status = deployment.get("status") or {}
    wanted = spec.get("replicas", 1)
    ready = status.get("readyReplicas", 0)
    updated = status.get("updatedReplicas", 0)
    current = (deployment.get("metadata") or {}).get("generation", 0) <= status.get("observedGeneration", 0)
    rolled_out = current and updated >= wanted and status.get("replicas", 0) == updated
    needed = wanted if least_ready is None else least_ready
    counts = f"{ready}/{max(wanted, needed)} replicas ready"
    if least_ready is not None:
        counts += f" (at least {least_ready} needed)"
    if wanted == 0:
        ready_condition = _condition(READY, False, "ScaledToZero", "the model has no replicas")
    elif rolled_out and ready >= wanted and ready >= needed:
        ready_condition = _condition(READY, True, "AllReplicasReady", counts)
    elif rolled_out and ready >= needed:
        ready_condition = _condition(READY, True, "MinReplicasReady", counts)
    elif problem is not None:
        ready_condition = _condition(READY, False, problem.reason, f"{counts}; {problem.message}")
    elif loading_pods:
        message = f"{counts}; the worker is loading its models in {', '.join(loading_pods)}"
        ready_condition = _condition(READY, False, LOADING, message)
    else:
        ready_condition = _condition(READY, False, "ReplicasNotReady", counts)
    settled = rolled_out and ready >= max(wanted, needed)
    if settled:
        progressing = _condition(PROGRESSING, False, "RolloutComplete", counts)
    elif problem is not None:
        progressing = _condition(PROGRESSING, False, "Stalled", problem.message)
    else:
        progressing = _condition(PROGRESSING, True, "RollingOut", counts)
    return [
        ready_condition,
        progressing,
        _condition(DEGRADED, problem is not None, *_problem_or_fine(problem)),
    ]


def _problem_or_fine(problem: Diagnosis | None) -> tuple[str, str]:
    return (problem.reason, problem.message) if problem else ("AsExpected", "")


def stamp_transitions(
    conditions: list[dict[str, str]], previous: Iterable[Mapping[str, Any]], now: str
) -> list[dict[str, str]]:
    """Keep each condition's lastTransitionTime unless its status changed."""
    before = {condition.get("type"): condition for condition in previous}
    stamped = []
    for condition in conditions:
        old = before.get(condition["type"])
        unchanged = old is not None and old.get("status") == condition["status"]
        since = old.get("lastTransitionTime") if unchanged and old else None
        stamped.append({**condition, "lastTransitionTime": since or now})
    return stamped


def failure_conditions(reason: str, message: str) -> list[dict[str, str]]:
    """Conditions for a model the operator could not act on (bad spec, refused children)."""
    return [
        _condition(READY, False, reason, message),
        _condition(PROGRESSING, False, reason, message),
        _condition(DEGRADED, True, reason, message),
    ]


def _retrying_conditions(conditions: list[dict[str, str]], failure: ApplyFailure) -> list[dict[str, str]]:
    """The observed conditions, but not Ready and still progressing while the apply is retried."""
    replaced = {
        READY: _condition(READY, False, APPLY_RETRYING, failure.message),
        PROGRESSING: _condition(PROGRESSING, True, APPLY_RETRYING, failure.message),
    }
    return [replaced.get(condition["type"], condition) for condition in conditions]


def summarize(
    model: PyTritonModel,
    deployment: Mapping[str, Any] | None,
    pods: Iterable[Mapping[str, Any]],
    failure: ApplyFailure | None = None,
) -> dict[str, Any]:
    """The status of a model, without transition times and observedGeneration. Stopping pods are left
    out: a draining worker is neither loading nor failing."""
    pods = [pod for pod in pods if not (pod.get("metadata") or {}).get("deletionTimestamp")]
    problem = diagnose(deployment, pods, model.spec.gpus.resource_name)
    deployment_status = (deployment or {}).get("status") or {}
    name, namespace = model.metadata.name, model.metadata.namespace or "default"
    ports = model.spec.service.ports
    least_ready = model.spec.min_replicas if model.spec.autoscaling is not None else None
    if failure is not None and not failure.temporary:
        conditions = failure_conditions(APPLY_FAILED, failure.message)
    else:
        conditions = _conditions(deployment, problem, least_ready, loading(pods))
        if failure is not None:
            conditions = _retrying_conditions(conditions, failure)
    return {
        "replicas": deployment_status.get("replicas", 0),
        "readyReplicas": deployment_status.get("readyReplicas", 0),
        "selector": naming.selector_string(name),
        "conditions": conditions,
        **_urls(name, namespace, ports.http, ports.grpc),
    }


ROUTER_READY = "RouterReady"


def router(
    model: PyTritonModel, deployment: Mapping[str, Any] | None
) -> tuple[dict[str, Any], dict[str, str]]:
    """status.router, and the RouterReady condition: true while a router pod serves. A router whose
    rollout stalled (its pods cannot start) says why, as its Deployment does."""
    name = naming.child_name(model.metadata.name, naming.ROUTER_SUFFIX)
    namespace, ports = model.metadata.namespace or "default", model.spec.service.ports
    observed = (deployment or {}).get("status") or {}
    ready, wanted = observed.get("readyReplicas", 0), (deployment or {}).get("spec", {}).get("replicas", 0)
    counts = f"{ready}/{wanted} router replicas ready"
    stalled = next(
        (
            c.get("message", "")
            for c in observed.get("conditions") or []
            if c.get("type") == "Progressing" and c.get("status") == "False"
        ),
        "",
    )
    condition = (
        _condition(ROUTER_READY, True, "RouterServing", counts)
        if ready > 0
        else _condition(ROUTER_READY, False, "RouterNotReady", f"{counts}; {stalled}" if stalled else counts)
    )
    summary = {
        "url": naming.http_url(name, namespace, ports.http),
        "grpcUrl": naming.grpc_url(name, namespace, ports.grpc),
        "replicas": observed.get("replicas", 0),
        "readyReplicas": ready,
    }
    return summary, condition


def invalid_spec(name: str, namespace: str, message: str) -> dict[str, Any]:
    """The status of a model whose spec cannot be parsed: nothing is applied until it is fixed."""
    return {
        "selector": naming.selector_string(name),
        "conditions": failure_conditions(INVALID_SPEC, message),
        **_urls(name, namespace),
    }


def _urls(
    name: str, namespace: str, http: int = podenv.HTTP_PORT, grpc: int = podenv.GRPC_PORT
) -> dict[str, str]:
    """Where clients reach the model: its Service, and the name of its pods that ModelClient balances
    over."""
    pods = naming.pods_host(name, namespace)
    return {
        "url": naming.http_url(name, namespace, http),
        "grpcUrl": naming.grpc_url(name, namespace, grpc),
        "podsUrl": f"http://{pods}:{http}",
        "podsGrpcUrl": f"grpc://{pods}:{grpc}",
    }
