"""Following a model until it is Ready (and its router serves, where it has one), as `kubetriton deploy`
shows it: one line per change.

What a user waits for on a cluster happens in steps that take very different times: the operator
takes the new spec, pods are scheduled, images are pulled, the worker loads its models, pods turn
ready. Each step's count is shown when it changes, and so is a problem the operator reports
(Degraded, with its reason and message), so a stalled deploy says why. Where the operator says that
nothing changes without the user (Progressing=False beside Degraded=True: a missing ConfigMap, a crash
loop, a declared model the script does not bind, an image kubetriton cannot run in...), the wait ends
there, with the cause and the last lines of the failing container's output.

The pods counted are those of this deploy: their worker runs the spec's image and mounts the
spec's script, so the pods of the previous script, still serving during a rollout, are not.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from kubetriton.operator import status
from kubetriton.operator.connection import Cluster, CommandError
from kubetriton.operator.pod import WORKER_CONTAINER
from kubetriton.operator.spec import PyTritonModel
from pydantic import ValidationError

POLL_SECONDS = 1.0


def condition(model: Mapping[str, Any], kind: str) -> dict[str, Any]:
    """The model's condition of that type, or {} when it has none."""
    conditions = (model.get("status") or {}).get("conditions") or []
    return next((found for found in conditions if found.get("type") == kind), {})


def observed(model: Mapping[str, Any]) -> bool:
    """The operator's status describes the model's current spec."""
    generation = (model.get("metadata") or {}).get("generation")
    seen = (model.get("status") or {}).get("observedGeneration")
    return seen is not None and (generation is None or seen >= generation)


def is_ready(model: Mapping[str, Any]) -> bool:
    return observed(model) and condition(model, status.READY).get("status") == "True"


def scaled_to_zero(model: Mapping[str, Any]) -> bool:
    """The model asks for no pods and its Deployment has scaled down (its pods are stopping, draining
    their clients): a deploy of zero replicas is done then. Ready stays False: nothing serves."""
    return (
        observed(model)
        and condition(model, status.READY).get("reason") == status.SCALED_TO_ZERO
        and condition(model, status.PROGRESSING).get("status") == "False"
    )


def router_serving(model: Mapping[str, Any]) -> bool:
    """True unless the model has a router that serves no request yet (RouterReady false): a router is
    ready a few seconds after the model's first pod, once it has found the pod."""
    router = condition(model, status.ROUTER_READY)
    return not router or router.get("status") == "True"


def wanted_replicas(model: Mapping[str, Any]) -> int:
    """The pods a deploy waits for: the fixed count, or an autoscaled model's minimum."""
    try:
        return PyTritonModel.read(model).spec.min_replicas
    except ValidationError:
        return 1


def _worker(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    containers = (pod.get("spec") or {}).get("containers") or []
    return next((container for container in containers if container.get("name") == WORKER_CONTAINER), {})


def current_pods(model: Mapping[str, Any], pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The model's pods that run its spec's worker image and script, and are not stopping."""
    worker = (model.get("spec") or {}).get("worker") or {}
    script_map = (worker.get("script") or {}).get("configMap")

    def current(pod: Mapping[str, Any]) -> bool:
        volumes = (pod.get("spec") or {}).get("volumes") or []
        mounted = {(volume.get("configMap") or {}).get("name") for volume in volumes}
        return (
            not (pod.get("metadata") or {}).get("deletionTimestamp")
            and _worker(pod).get("image") == worker.get("image")
            and (script_map is None or script_map in mounted)
        )

    return [pod for pod in pods if current(pod)]


def _images_pulled(pod: Mapping[str, Any]) -> bool:
    pod_status = pod.get("status") or {}
    containers = [
        *(pod_status.get("initContainerStatuses") or []),
        *(pod_status.get("containerStatuses") or []),
    ]
    return bool(containers) and all(container.get("imageID") for container in containers)


def steps(model: Mapping[str, Any], pods: list[dict[str, Any]]) -> dict[str, str]:
    """What a look at the model and its pods shows, one line per step, by step."""
    if not observed(model):
        return {"operator": "waiting for the operator to take the new spec"}
    wanted = wanted_replicas(model)
    # a Failed pod (evicted) stays beside the one made in its place: it is not one of the wanted
    mine = [pod for pod in current_pods(model, pods) if (pod.get("status") or {}).get("phase") != "Failed"]
    shown: dict[str, str] = {}
    if mine:
        shown["scheduled"] = (
            f"pods scheduled: {sum(status.pod_condition(p, 'PodScheduled') for p in mine)} of {wanted}"
        )
        shown["pulled"] = f"images pulled: {sum(_images_pulled(p) for p in mine)} of {wanted}"
        loading = status.loading(mine)
        if loading:
            shown["loading"] = f"models loading: {len(loading)} of {wanted} pods"
    degraded = condition(model, status.DEGRADED)
    if degraded.get("status") == "True":
        shown["problem"] = f"{degraded.get('reason')}: {degraded.get('message')}"
    ready = (model.get("status") or {}).get("readyReplicas", 0) if is_ready(model) else None
    if ready is None and mine:
        ready = sum(status.pod_condition(p, "Ready") for p in mine)
    if ready:
        shown["ready"] = f"ready: {ready} of {wanted}"
    router = condition(model, status.ROUTER_READY)
    if router and (is_ready(model) or router.get("reason") != status.ROUTER_NOT_READY):
        shown["router"] = f"router: {router.get('message')}"
    return shown


def _named(pods: list[dict[str, Any]], message: str) -> list[dict[str, Any]]:
    """The pods that a condition's message is about (`status.about_pod`)."""
    return [pod for pod in pods if status.about_pod(pod["metadata"]["name"]) in message]


def stalled(model: Mapping[str, Any], pods: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The Degraded condition of a model that cannot get Ready without a change from the user, or None.

    That is the operator's word on the current spec: Progressing=False beside Degraded=True. A cause in a
    pod of an earlier spec, which the rollout replaces, is not this deploy's (a fixed script rolls out
    while the broken one still crashes)."""
    degraded = condition(model, status.DEGRADED)
    if not observed(model) or degraded.get("status") != "True":
        return None
    if condition(model, status.PROGRESSING).get("status") != "False":
        return None
    about = _named(pods, degraded.get("message", ""))
    mine = {pod["metadata"]["name"] for pod in current_pods(model, pods)}
    if about and not any(pod["metadata"]["name"] in mine for pod in about):
        return None
    return degraded


def error_output(pods: list[dict[str, Any]], message: str) -> list[str]:
    """The last lines of what the failing container said as it exited (its termination message: the
    script's traceback, or the launcher's one line), from the pod the message is about; the worker's
    first. Empty when no container of it has exited with a message, or when the kubelet evicted the pod
    (what its containers said as they were killed tells nothing of why: the message does)."""
    for pod in _named(pods, message):
        if status.evicted(pod):
            continue
        found = pod.get("status") or {}
        containers = [*(found.get("containerStatuses") or []), *(found.get("initContainerStatuses") or [])]
        for container in containers:
            for state in (container.get("state") or {}, container.get("lastState") or {}):
                said = ((state.get("terminated") or {}).get("message") or "").rstrip()
                if said:
                    lines = said.splitlines()[-status.ERROR_OUTPUT_LINES :]
                    header = (
                        f"the last lines of container {container['name']} of pod {pod['metadata']['name']}:"
                    )
                    return [header, *(f"  {line}" for line in lines)]
    return []


def still_missing(model: Mapping[str, Any]) -> str:
    """What the model is still waiting for, in a sentence."""
    name = model["metadata"]["name"]
    if not observed(model):
        return f"the operator has not taken the new spec of {name} yet (is it running?)"
    ready = condition(model, status.READY)
    if is_ready(model):
        router = condition(model, status.ROUTER_READY)
        return f"{name} is Ready, its router is not: {router.get('reason')}: {router.get('message')}"
    detail = (
        f": {ready.get('reason')}: {ready.get('message')}" if ready else " (it has no Ready condition yet)"
    )
    return f"{name} is not Ready{detail}"


def follow(
    cluster: Cluster,
    name: str,
    timeout: float,
    show: Callable[[str], None],
    poll_seconds: float = POLL_SECONDS,
) -> dict[str, Any]:
    """Wait until the model is Ready, and its router serves where it has one, or is scaled to zero, and
    return it, showing each step as it changes.

    Raises CommandError once the model cannot get Ready without a change from the user (`stalled`), on
    timeout, or when the model goes."""
    deadline = time.monotonic() + timeout
    shown: dict[str, str] = {}
    while True:
        model = cluster.get_model(name)
        if model is None:
            raise CommandError(f"model {name} was deleted while waiting for it")
        pods = cluster.pods(name)
        for step, line in steps(model, pods).items():
            if shown.get(step) != line:
                show(line)
                shown[step] = line
        if (is_ready(model) and router_serving(model)) or scaled_to_zero(model):
            return model
        cause = stalled(model, pods)
        if cause is not None:
            said = error_output(pods, cause.get("message", ""))
            raise CommandError(
                "\n".join(
                    [f"{name} cannot become Ready: {cause.get('reason')}: {cause.get('message')}", *said]
                )
            )
        if time.monotonic() >= deadline:
            raise CommandError(f"timed out after {timeout:g}s: {still_missing(model)}")
        time.sleep(poll_seconds)
