"""A model's status, computed from what its Deployment and pods report and what applying failed.

Pure functions: the reconciler hands in the observed objects, the warnings the cluster posted about the
pods (mount failures, probe failures) and its last failure to apply a child, and writes back what comes
out. The reasons name the problem a user can act on (no GPU left, a volume or a Secret missing, image
not pulled, worker crashing, a declared model the script never binds, a child the API server refused)
rather than the generic "not ready", and the message says which object, container or model it is.
A pod the kubelet evicted (past a disk limit of its own, or from a node short of a resource) stays,
Failed, beside the pod made in its place: its eviction is named while it explains missing replicas
(`_current_evictions`), not after its replacement serves.

A problem sets Degraded. Where nothing changes without the user (a missing ConfigMap stays missing, a
script that raised raises again), it also sets Progressing=False (Stalled): that is what `kubetriton
deploy` stops waiting at. A problem the cluster may still mend (a worker restarted once, a mount that
failed for a while) leaves Progressing=True. A refused child keeps the model Degraded, whatever its pods
do, until every child is applied.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kubetriton import podenv
from kubetriton.operator import naming
from kubetriton.operator.pod import TRITON_CONTAINER, WORKER_CONTAINER
from kubetriton.operator.router import CONTAINER as ROUTER_CONTAINER
from kubetriton.operator.spec import PyTritonModel


def now() -> str:
    """The time as status fields and conditions stamp it: UTC, whole seconds."""
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


READY = "Ready"
PROGRESSING = "Progressing"
DEGRADED = "Degraded"
STALLED = "Stalled"

INSUFFICIENT_GPU = "InsufficientGPU"
UNSCHEDULABLE = "Unschedulable"
VOLUME_NOT_BOUND = "VolumeNotBound"
CONFIG_MAP_NOT_FOUND = "ConfigMapNotFound"
SECRET_NOT_FOUND = "SecretNotFound"
MOUNT_FAILED = "MountFailed"
CONTAINER_CONFIG_ERROR = "CreateContainerConfigError"
CONTAINER_ERROR = "CreateContainerError"
CRASH_LOOP = "CrashLoopBackOff"
OUT_OF_MEMORY = "OOMKilled"
"""The kernel killed a container that went past its memory limit (the kubelet's reason for its exit)."""
EVICTED = "Evicted"
"""The kubelet evicted the pod (the reason of a Failed pod): past an ephemeral-storage limit or an emptyDir's
sizeLimit of its own, or from a node low on a resource."""
EVICTIONS_BEFORE_STALLED = 2
"""How many pods of one template evicted past a limit of their own make a model Stalled."""
TEMPLATE_HASH_LABEL = "pod-template-hash"
"""The label that says of which pod template (ReplicaSet) of its Deployment a pod is."""
WORKER_IMAGE_UNSUPPORTED = "WorkerImageUnsupported"
NO_PYTHON = '"python3": executable file not found'
"""What the container runtime says when the launcher's `python3` is not in the worker image."""
MODEL_NOT_BOUND = "ModelNotBound"
MODEL_CONFIG_REJECTED = "ModelConfigRejected"
SETTINGS_REJECTED = "SettingsRejected"
"""The worker ended on a setting of the user's that kubetriton refuses (a bind() argument, a TritonConfig,
an environment variable): `podenv.CONFIGURATION_ERROR_EXIT_CODE`."""
CONFIG_ERROR_MARKER = "PyTritonModelConfigError: "
"""How a traceback names the refusal of a model's configuration (by Triton, or by kubetriton before it)."""
STARTUP_PROBE_FAILED = "StartupProbeFailed"
MODEL_LOAD_FAILED = "ModelLoadFailed"
INVALID_SPEC = "InvalidSpec"
APPLY_FAILED = "ApplyFailed"
APPLY_RETRYING = "ApplyRetrying"
LOADING = "Loading"
SCALED_TO_ZERO = "ScaledToZero"
IMAGE_PULL_REASONS = ("ImagePullBackOff", "ErrImagePull", "InvalidImageName")
CRASH_LOOP_STALLED_RESTARTS = 2
"""A container in CrashLoopBackOff restarted this often (three exits) is taken to fail for good."""
ERROR_OUTPUT_LINES = 10
"""The last lines of a container's termination message (its error output) that `kubetriton deploy` prints."""

_SEVERITY = (
    INSUFFICIENT_GPU,
    VOLUME_NOT_BOUND,
    UNSCHEDULABLE,
    CONFIG_MAP_NOT_FOUND,
    SECRET_NOT_FOUND,
    MOUNT_FAILED,
    *IMAGE_PULL_REASONS,
    CONTAINER_CONFIG_ERROR,
    CONTAINER_ERROR,
    WORKER_IMAGE_UNSUPPORTED,
    MODEL_NOT_BOUND,
    MODEL_CONFIG_REJECTED,
    SETTINGS_REJECTED,
    STARTUP_PROBE_FAILED,
    OUT_OF_MEMORY,
    EVICTED,
    CRASH_LOOP,
    MODEL_LOAD_FAILED,
    "ReplicaFailure",
    "ProgressDeadlineExceeded",
)

_NOT_FOUND = re.compile(r'\b(configmap|secret)s? "([^"]+)" not found', re.IGNORECASE)
_KEY_NOT_FOUND = re.compile(r"couldn't find key (\S+) in (ConfigMap|Secret) (\S+)")
_MISSING = {"configmap": (CONFIG_MAP_NOT_FOUND, "ConfigMap"), "secret": (SECRET_NOT_FOUND, "Secret")}
_UNBOUND_CLAIMS = (
    "unbound immediate PersistentVolumeClaims",
    "didn't find available persistent volumes to bind",
    'persistentvolumeclaim "',
)
"""What the scheduler says of a pod whose PersistentVolumeClaim is not bound, or does not exist."""
_CONTAINER_FIELD = re.compile(r"spec\.(?:initContainers|containers)\{([^}]*)\}")
MOUNT_RETRIES = 3
"""How often the kubelet failed to mount a volume, for a reason other than a missing object, before the
status names it."""
STARTUP_PROBE_FAILURE = "Startup probe failed"
"""How the kubelet's Unhealthy warning begins when a container's startup probe fails."""
STOPPED_EXIT_CODES = (128 + 9, 128 + 15)
"""A container's exit status when the kubelet stopped it: SIGKILL, or SIGTERM that the launcher ends on."""
_PAST_CONTAINER_LIMIT = re.compile(r'Container (\S+) exceeded its local ephemeral storage limit "([^"]+)"')
_PAST_POD_LIMIT = re.compile(
    r"Pod ephemeral local storage usage exceeds the total limit of containers (\S+?)\.?(?:\s|$)"
)
_PAST_VOLUME_LIMIT = re.compile(r'Usage of EmptyDir volume "([^"]+)" exceeds the limit "([^"]+)"')
_NODE_LOW = re.compile(r"The node was low on resource: ([\w-]+)\.")
_PAST_REQUEST = re.compile(r"Container (\S+) was using (\S+?),")
"""The kubelet's words for an eviction (Kubernetes 1.35): past a container's ephemeral-storage limit, the
pod's (its containers' limits together) or an emptyDir's sizeLimit; or a node low on a resource, with the
containers that use more of it than they request."""


@dataclass(frozen=True)
class Diagnosis:
    """Why pods of a model do not become ready."""

    reason: str
    message: str
    stalled: bool = True
    """Nothing changes without the user (Progressing=False); otherwise the cluster may still mend it."""


@dataclass(frozen=True)
class ApplyFailure:
    """The last attempt to apply a model's children failed; it is retried."""

    message: str
    temporary: bool
    """No answer or a busy API server, rather than a refusal that the spec has to fix."""


def pod_warning(event: Mapping[str, Any]) -> dict[str, Any] | None:
    """What the status needs of an Event: a Warning about a pod (its reason, message, container and how
    often it was seen), or None for any other Event."""
    involved = event.get("involvedObject") or {}
    if event.get("type") != "Warning" or involved.get("kind") != "Pod":
        return None
    container = _CONTAINER_FIELD.fullmatch(involved.get("fieldPath") or "")
    return {
        "reason": event.get("reason", ""),
        "message": (event.get("message") or "").strip(),
        "container": container.group(1) if container else "",
        "count": event.get("count") or ((event.get("series") or {}).get("count")) or 1,
    }


def _container_statuses(pod: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    status = pod.get("status") or {}
    return [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]


def _resources_of(container: str) -> str:
    """Where a container's resources are set: the model's spec, or for the router's, the operator's settings,
    which the chart's values give."""
    if container == ROUTER_CONTAINER:
        return "the chart's router.resources"
    return f"spec.{container}.resources"


def _serving_container(pod: Mapping[str, Any]) -> str:
    """The container that serves in one of the operator's pods: a router pod's, or the model's worker."""
    names = {container.get("name") for container in _container_statuses(pod)}
    return ROUTER_CONTAINER if ROUTER_CONTAINER in names else WORKER_CONTAINER


def _claims(pod: Mapping[str, Any]) -> list[str]:
    volumes = (pod.get("spec") or {}).get("volumes") or []
    return [
        volume["persistentVolumeClaim"]["claimName"]
        for volume in volumes
        if volume.get("persistentVolumeClaim")
    ]


def scheduling_problem(pod: Mapping[str, Any], gpu_resource: str) -> Diagnosis | None:
    """Why the pod cannot be scheduled (no GPU free, a volume claim not bound, or another reason the
    scheduler gave), or None."""
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            message = condition.get("message", "")
            if f"Insufficient {gpu_resource}" in message or "Insufficient nvidia.com/" in message:
                return Diagnosis(INSUFFICIENT_GPU, message)
            if any(sign in message for sign in _UNBOUND_CLAIMS):
                claims = ", ".join(_claims(pod)) or "of the pod"
                return Diagnosis(
                    VOLUME_NOT_BOUND,
                    f"PersistentVolumeClaim {claims} is not bound to a volume (see kubectl describe pvc): "
                    + message,
                )
            return Diagnosis(UNSCHEDULABLE, message or condition.get("reason", ""))
    return None


def _missing_object(text: str, where: str) -> Diagnosis | None:
    """A ConfigMap or Secret (or a key of one) that the kubelet did not find, named."""
    found = _NOT_FOUND.search(text)
    if found:
        reason, kind = _MISSING[found.group(1).lower()]
        return Diagnosis(reason, f"{kind} {found.group(2)} does not exist ({where}: {text})")
    key = _KEY_NOT_FOUND.search(text)
    if key:
        reason, kind = _MISSING[key.group(2).lower()]
        return Diagnosis(reason, f"{kind} {key.group(3)} has no key {key.group(1)} ({where})")
    return None


def _started(pod: Mapping[str, Any]) -> bool:
    """Whether a container of the pod has run: its volumes were mounted then."""
    return any(
        "running" in (container.get(field) or {}) or "terminated" in (container.get(field) or {})
        for container in _container_statuses(pod)
        for field in ("state", "lastState")
    )


def _mount_problem(pod: Mapping[str, Any], warnings: Sequence[Mapping[str, Any]]) -> Diagnosis | None:
    """A volume the kubelet cannot mount, while no container could start because of it: a ConfigMap or
    Secret that does not exist at once, any other failure once the kubelet has retried it (a pod's first
    mount often fails once, "failed to sync configmap cache", and succeeds a second later)."""
    if _started(pod):
        return None
    for warning in reversed(warnings):
        if warning["reason"] in ("FailedMount", "FailedAttachVolume"):
            missing = _missing_object(warning["message"], "a volume of the pod")
            if missing or warning["count"] >= MOUNT_RETRIES:
                return missing or Diagnosis(MOUNT_FAILED, warning["message"], stalled=False)
    return None


def last_line(text: str) -> str:
    """The last line of a termination message that says something (a traceback ends with its exception)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


_CXX_EXCEPTION = re.compile(r"^\s*what\(\):\s*(.+)$", re.M)
_GLOG_ERROR = re.compile(r"^E\d{4} [\d:.]+ +\d+ [^\]]*\] (.+)$", re.M)
"""An uncaught C++ exception's text, and an error line of Triton's log (`E1129 07:21:18.1 11 x.cc:42]`)."""


def why_it_exited(text: str) -> str:
    """The line of a crashed Triton container's last output that says why: tritonserver's uncaught
    exception, else its last error line (its output ends with a stack trace and "Aborted"), else the last
    line."""
    for pattern in (_CXX_EXCEPTION, _GLOG_ERROR):
        found = pattern.findall(text)
        if found:
            return found[-1].strip().strip('"')
    return last_line(text)


def _exits(container: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The container's exits that its status still tells: the current one, then the previous."""
    states = (container.get("state") or {}, container.get("lastState") or {})
    return [state["terminated"] for state in states if state.get("terminated")]


def _unsupported_image(container: Mapping[str, Any]) -> Diagnosis | None:
    """The launcher's refusal of the worker image (its exit status and one line), or an image without the
    `python3` that runs the launcher."""
    for exit_ in _exits(container):
        message = exit_.get("message", "").strip()
        if exit_.get("exitCode") == podenv.UNSUPPORTED_IMAGE_EXIT_CODE and message:
            return Diagnosis(WORKER_IMAGE_UNSUPPORTED, message.splitlines()[-1])
        if NO_PYTHON in message:
            return Diagnosis(
                WORKER_IMAGE_UNSUPPORTED,
                "The worker image cannot run kubetriton: it has no python3 on its PATH",
            )
    return None


def _script_refusal(container: Mapping[str, Any]) -> Diagnosis | None:
    """What a worker that exited says the user has to change: a declared model its script does not bind,
    a model configuration refused, or another setting kubetriton refuses."""
    for exit_ in _exits(container):
        message = exit_.get("message", "")
        if exit_.get("exitCode") == podenv.MODEL_NOT_BOUND_EXIT_CODE and message.strip():
            return Diagnosis(MODEL_NOT_BOUND, last_line(message))
        refused = [line for line in message.splitlines() if CONFIG_ERROR_MARKER in line]
        if refused:
            said = refused[-1].split(CONFIG_ERROR_MARKER, 1)[1].strip()
            return Diagnosis(MODEL_CONFIG_REJECTED, f"{said} (the log of container triton says why)")
        if exit_.get("exitCode") == podenv.CONFIGURATION_ERROR_EXIT_CODE and message.strip():
            return Diagnosis(SETTINGS_REJECTED, last_line(message))
    return None


def _startup_killed(
    container: Mapping[str, Any], warnings: Sequence[Mapping[str, Any]], startup_seconds: int
) -> Diagnosis | None:
    """A container restarted because its startup probe kept failing: its last exit was the kubelet's
    signal, not the process's own (a script that raises while its probe fails exits with its own status)."""
    name = container.get("name")
    probed = [
        warning
        for warning in warnings
        if warning["reason"] == "Unhealthy"
        and warning["container"] == name
        and warning["message"].startswith(STARTUP_PROBE_FAILURE)
    ]
    last_exit = (container.get("lastState") or {}).get("terminated") or {}
    stopped = last_exit.get("exitCode") in STOPPED_EXIT_CODES and last_exit.get("reason") != "OOMKilled"
    if not probed or not container.get("restartCount") or not stopped:
        return None
    limit = f"spec.startupSeconds ({startup_seconds} s)" if name == WORKER_CONTAINER else "its startup probe"
    return Diagnosis(
        STARTUP_PROBE_FAILED,
        f"container {name} did not start within {limit} and was stopped (restarts: "
        f"{container['restartCount']}); raise spec.startupSeconds if the script takes longer to reach "
        f"Triton() (last probe: {probed[-1]['message']})",
    )


def _container_problem(
    container: Mapping[str, Any], warnings: Sequence[Mapping[str, Any]], startup_seconds: int
) -> Diagnosis | None:
    name = container.get("name", "")
    waiting = (container.get("state") or {}).get("waiting") or {}
    last_exit = (container.get("lastState") or {}).get("terminated") or {}
    reason = waiting.get("reason")
    detail = waiting.get("message", "") or reason or ""
    if reason in IMAGE_PULL_REASONS:
        return Diagnosis(reason, f"container {name}: {detail}")
    if reason == CONTAINER_CONFIG_ERROR:
        missing = _missing_object(detail, f"container {name}")
        return missing or Diagnosis(CONTAINER_CONFIG_ERROR, f"container {name}: {detail}")
    if reason == CONTAINER_ERROR:
        return Diagnosis(CONTAINER_ERROR, f"container {name}: {detail}")
    if name == WORKER_CONTAINER:
        found = _unsupported_image(container) or _script_refusal(container)
        if found:
            return found
    killed = _startup_killed(container, warnings, startup_seconds)
    if killed:
        return killed
    restarts = container.get("restartCount", 0)
    if reason == CRASH_LOOP and last_exit.get("reason") == OUT_OF_MEMORY:
        return Diagnosis(
            OUT_OF_MEMORY,
            f"container {name} went past its memory limit and was killed ({restarts + 1} times); raise"
            f" {_resources_of(name)}.limits.memory, or make it use less",
            stalled=restarts >= CRASH_LOOP_STALLED_RESTARTS,
        )
    if reason == CRASH_LOOP:
        # a worker's output is its script's, which may hold other programs' log lines: its last line says why
        told = why_it_exited if name == TRITON_CONTAINER else last_line
        said = told(last_exit.get("message", "")) or last_exit.get("reason") or detail
        exit_code = f" with code {last_exit['exitCode']}" if "exitCode" in last_exit else ""
        return Diagnosis(
            CRASH_LOOP,
            f"container {name} exited{exit_code} {restarts + 1} times: {said}",
            stalled=restarts >= CRASH_LOOP_STALLED_RESTARTS,
        )
    if _worker_running_unready(container) and last_exit.get("exitCode"):
        said = last_line(last_exit.get("message", "")) or f"exit code {last_exit['exitCode']}"
        return Diagnosis(MODEL_LOAD_FAILED, f"the worker restarted and is not ready: {said}", stalled=False)
    return None


def diagnose_pod(
    pod: Mapping[str, Any],
    gpu_resource: str,
    warnings: Sequence[Mapping[str, Any]] = (),
    startup_seconds: int = 0,
) -> Diagnosis | None:
    """The most telling problem of one pod, or None when nothing is wrong yet; its message names the pod.
    `warnings` are the cluster's Warning events about the pod (`pod_warning`), oldest first."""
    found = (
        scheduling_problem(pod, gpu_resource)
        or _mount_problem(pod, warnings)
        or next(
            (
                problem
                for container in _container_statuses(pod)
                if (problem := _container_problem(container, warnings, startup_seconds))
            ),
            None,
        )
    )
    if found is None:
        return None
    return Diagnosis(found.reason, about_pod(pod["metadata"]["name"]) + found.message, found.stalled)


def _eviction(pod: Mapping[str, Any], evictions: int) -> Diagnosis:
    """Why the kubelet evicted the pod (its `status.message`) and what to change; `evictions` counts the
    evicted pods of its template. Past a limit of its own, the pod made in its place runs the same spec and
    goes past it again: stalled from the second eviction (one pod's logs may have grown over days). A node
    low on a resource may have room again, or the new pod may go to another node."""
    message = ((pod.get("status") or {}).get("message") or "").strip()
    times = f"{evictions} pod{'' if evictions == 1 else 's'} evicted so far"
    stalled = evictions >= EVICTIONS_BEFORE_STALLED
    if found := _PAST_CONTAINER_LIMIT.search(message):
        container, limit = found.groups()
        said = (
            f"container {container} went past its ephemeral-storage limit ({limit}) with its files and logs,"
            f" and the pod was evicted ({times}); raise {_resources_of(container)}.limits.ephemeral-storage,"
            " or make it write less to its disk"
        )
    elif found := _PAST_POD_LIMIT.search(message):
        serving = _serving_container(pod)
        said = (
            "the pod's files, logs and emptyDir volumes went past its ephemeral-storage limit"
            f" ({found.group(1)}, its containers' limits together), and it was evicted ({times}); raise"
            f" {_resources_of(serving)}.limits.ephemeral-storage, or make container {serving} write less to"
            " its disk and emptyDir volumes"
        )
    elif found := _PAST_VOLUME_LIMIT.search(message):
        volume, limit = found.groups()
        said = (
            f"emptyDir volume {volume} went past its sizeLimit ({limit}), and the pod was evicted ({times});"
            " raise its sizeLimit in spec.volumes, or write less to it"
        )
    elif (low := _NODE_LOW.search(message)) and (user := _PAST_REQUEST.search(message)):
        resource = low.group(1)
        container, used = user.groups()
        said = (
            f"the node ran low on {resource}, and the pod was evicted ({times}): container {container} used"
            f" {used}, more than it requests; request what it uses in"
            f" {_resources_of(container)}.requests.{resource} (pods past their requests are evicted first)"
        )
        stalled = False
    else:
        said, stalled = f"the pod was evicted ({times}): {message}", False
    return Diagnosis(EVICTED, about_pod(pod["metadata"]["name"]) + said, stalled)


def about_pod(name: str) -> str:
    """How a problem's message begins: the pod it is about."""
    return f"pod {name}: "


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


def _created(pod: Mapping[str, Any]) -> str:
    return (pod.get("metadata") or {}).get("creationTimestamp") or ""


def _template(pod: Mapping[str, Any]) -> str | None:
    return ((pod.get("metadata") or {}).get("labels") or {}).get(TEMPLATE_HASH_LABEL)


def evicted(pod: Mapping[str, Any]) -> bool:
    """Whether the kubelet evicted the pod."""
    return (pod.get("status") or {}).get("reason") == EVICTED


def pod_condition(pod: Mapping[str, Any], kind: str) -> bool:
    """Whether the pod's condition `kind` (Ready, PodScheduled) is True."""
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(found.get("type") == kind and found.get("status") == "True" for found in conditions)


def _current_evictions(
    deployment: Mapping[str, Any] | None, pods: Sequence[Mapping[str, Any]]
) -> list[tuple[str, Diagnosis]]:
    """The evictions that say why replicas are missing now, each with its pod's creation time.

    An evicted pod stays, Failed, until the cluster's pod garbage collection, and its ReplicaSet makes
    another in its place. Its eviction counts while the Deployment has fewer ready replicas than it wants,
    if the pod is of the newest pod's template (an earlier template's eviction is not the rollout's), and
    until a pod of that template created in a later second is Ready (its replacement serves)."""
    wanted = ((deployment or {}).get("spec") or {}).get("replicas", 1)
    ready = ((deployment or {}).get("status") or {}).get("readyReplicas", 0)
    if not pods or ready >= wanted:
        return []
    template = _template(max(pods, key=_created))
    current = [pod for pod in pods if _template(pod) == template]
    gone = [pod for pod in current if evicted(pod)]
    newest_ready = max((_created(pod) for pod in current if pod_condition(pod, "Ready")), default="")
    return [(_created(pod), _eviction(pod, len(gone))) for pod in gone if _created(pod) >= newest_ready]


def _deployment_problem(deployment: Mapping[str, Any]) -> Diagnosis | None:
    for condition in (deployment.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "ReplicaFailure" and condition.get("status") == "True":
            return Diagnosis("ReplicaFailure", condition.get("message", ""))
        if condition.get("type") == "Progressing" and condition.get("reason") == "ProgressDeadlineExceeded":
            return Diagnosis("ProgressDeadlineExceeded", condition.get("message", ""))
    return None


def diagnose(
    deployment: Mapping[str, Any] | None,
    pods: Iterable[Mapping[str, Any]],
    gpu_resource: str,
    warnings: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
    startup_seconds: int = 0,
) -> Diagnosis | None:
    """The problem to report: of the newest pod that has one (in a rollout, the new pods' problem, not
    the old ones'), the most severe of those created in the same second; else the Deployment's. An
    evicted pod's problem is its eviction, while that counts (`_current_evictions`)."""
    pods = list(pods)
    found = _current_evictions(deployment, pods)
    for pod in pods:
        if evicted(pod):
            continue
        name = pod["metadata"]["name"]
        problem = diagnose_pod(pod, gpu_resource, (warnings or {}).get(name, ()), startup_seconds)
        if problem is not None:
            found.append((_created(pod), problem))
    if found:
        newest = max(created for created, _ in found)
        problems = [problem for created, problem in found if created == newest]
    else:
        problems = [problem for problem in [_deployment_problem(deployment or {})] if problem]
    return min(problems, key=lambda problem: (_SEVERITY.index(problem.reason), problem.message), default=None)


def _condition(kind: str, true: bool, reason: str, message: str) -> dict[str, str]:
    return {"type": kind, "status": "True" if true else "False", "reason": reason, "message": message}


def _conditions(
    deployment: Mapping[str, Any] | None,
    problem: Diagnosis | None,
    least_ready: int | None,
    loading_pods: list[str],
    template_generation: int | None = None,
) -> list[dict[str, str]]:
    """Ready once the rollout is done and enough pods are ready: every wanted one, or at least
    `least_ready` (an autoscaled model's minimum) when that is given. Not ready for no problem but
    workers still loading reads Loading.

    The rollout is done once the Deployment's status has seen the pod template last applied (its
    generation then, `template_generation`; the Deployment's own when not known) and no pod of another
    template is left. A change of the replica count alone (by an autoscaler) is no rollout: while the
    Deployment's controller has not caught up with it, the count is what its status says, and a model
    that was Ready stays Ready."""
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
    applied = template_generation or (deployment.get("metadata") or {}).get("generation", 0)
    rolled_out = applied <= status.get("observedGeneration", 0) and status.get("replicas", 0) == updated
    needed = wanted if least_ready is None else least_ready
    counts = f"{ready}/{max(wanted, needed)} replicas ready"
    if least_ready is not None:
        counts += f" (at least {least_ready} needed)"
    if wanted == 0:
        ready_condition = _condition(READY, False, SCALED_TO_ZERO, "the model has no replicas")
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
    elif problem is not None and problem.stalled:
        progressing = _condition(PROGRESSING, False, STALLED, problem.message)
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


def _not_stopping(pods: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The pods not being deleted: a stopping pod is neither loading nor failing."""
    return [pod for pod in pods if not (pod.get("metadata") or {}).get("deletionTimestamp")]


def summarize(
    model: PyTritonModel,
    deployment: Mapping[str, Any] | None,
    pods: Iterable[Mapping[str, Any]],
    failure: ApplyFailure | None = None,
    warnings: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
    template_generation: int | None = None,
) -> dict[str, Any]:
    """The status of a model, without transition times and observedGeneration; `warnings` are the
    cluster's Warning events about each pod, by pod name (`pod_warning`), and `template_generation` the
    Deployment's generation when its pod template was last applied. Stopping pods are left out: a
    draining worker is neither loading nor failing."""
    pods = _not_stopping(pods)
    spec = model.spec
    problem = diagnose(deployment, pods, spec.gpus.resource_name, warnings, spec.startup_seconds)
    deployment_status = (deployment or {}).get("status") or {}
    name, namespace = model.metadata.name, model.metadata.namespace or "default"
    ports = model.spec.service.ports
    least_ready = model.spec.min_replicas if model.spec.autoscaling is not None else None
    if failure is not None and not failure.temporary:
        conditions = failure_conditions(APPLY_FAILED, failure.message)
    else:
        conditions = _conditions(deployment, problem, least_ready, loading(pods), template_generation)
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
ROUTER_NOT_READY = "RouterNotReady"
ROUTER_WAITS_FOR_PODS = "a router is ready once it reaches a ready pod of the model, and none is"


def router(
    model: PyTritonModel,
    deployment: Mapping[str, Any] | None,
    pods: Iterable[Mapping[str, Any]],
    pods_ready: int,
    warnings: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
) -> tuple[dict[str, Any], dict[str, str]]:
    """status.router, and the RouterReady condition: true while a router pod serves. While none does, it
    says why: the most telling problem of the router's `pods` (`diagnose`, as for the model's own: an
    image that cannot be pulled, no node that takes them, a stalled rollout), or else that none of the
    model's pods is ready (`pods_ready`), since a router is ready once it reaches one."""
    name = naming.child_name(model.metadata.name, naming.ROUTER_SUFFIX)
    namespace, ports = model.metadata.namespace or "default", model.spec.service.ports
    observed = (deployment or {}).get("status") or {}
    ready, wanted = observed.get("readyReplicas", 0), (deployment or {}).get("spec", {}).get("replicas", 0)
    counts = f"{ready}/{wanted} router replicas ready"
    if ready > 0:
        condition = _condition(ROUTER_READY, True, "RouterServing", counts)
    else:
        problem = diagnose(deployment, _not_stopping(pods), model.spec.gpus.resource_name, warnings)
        if problem is not None:
            condition = _condition(ROUTER_READY, False, problem.reason, f"{counts}; {problem.message}")
        elif not pods_ready:
            waiting = f"{counts}; {ROUTER_WAITS_FOR_PODS}"
            condition = _condition(ROUTER_READY, False, ROUTER_NOT_READY, waiting)
        else:
            condition = _condition(ROUTER_READY, False, ROUTER_NOT_READY, counts)
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
