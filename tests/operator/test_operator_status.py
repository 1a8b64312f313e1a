"""Status from observed children: the reasons a user sees in `kubectl get ptm -o wide`."""

from __future__ import annotations

from typing import Any

import pytest
from kubetriton import podenv
from kubetriton.operator import status
from kubetriton.operator.spec import AutoscalingSpec, PyTritonModel

MODEL = PyTritonModel.model_validate(
    {
        "metadata": {"name": "esm1", "namespace": "models"},
        "spec": {"worker": {"image": "w:1"}, "models": ["ESM1"], "replicas": 2, "gpus": {"count": 1}},
    }
)
MIG_MODEL = MODEL.model_copy(
    update={
        "spec": MODEL.spec.model_copy(
            update={"gpus": MODEL.spec.gpus.model_copy(update={"resource_name": "nvidia.com/mig-1g.10gb"})}
        )
    }
)


AUTOSCALED = MODEL.model_copy(
    update={
        "spec": MODEL.spec.model_copy(
            update={
                "replicas": None,
                "autoscaling": AutoscalingSpec.model_validate({"minReplicas": 2, "maxReplicas": 5}),
            }
        )
    }
)


def deployment(
    ready: int = 0, replicas: int = 2, updated: int | None = None, wanted: int = 2, **extra: Any
) -> dict[str, Any]:
    updated = replicas if updated is None else updated
    return {
        "metadata": {"name": "esm1", "generation": 3},
        "spec": {"replicas": wanted},
        "status": {
            "observedGeneration": 3,
            "replicas": replicas,
            "readyReplicas": ready,
            "updatedReplicas": updated,
            **extra,
        },
    }


def pending_pod(message: str, reason: str = "Unschedulable") -> dict[str, Any]:
    return {
        "metadata": {"name": "esm1-a"},
        "status": {
            "phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": "False", "reason": reason, "message": message}],
        },
    }


def stopping(pod: dict[str, Any]) -> dict[str, Any]:
    return {**pod, "metadata": {**pod["metadata"], "deletionTimestamp": True}}


def waiting_pod(
    container: str, reason: str, message: str = "", last: dict[str, Any] | None = None, running: bool = False
) -> dict[str, Any]:
    state = (
        {"running": {"startedAt": "t"}} if running else {"waiting": {"reason": reason, "message": message}}
    )
    entry = {
        "name": container,
        "ready": False,
        "state": state,
        "lastState": {"terminated": last} if last else {},
    }
    key = "containerStatuses" if container == "worker" else "initContainerStatuses"
    return {"metadata": {"name": f"esm1-{container}"}, "status": {"phase": "Pending", key: [entry]}}


def conditions(
    model: PyTritonModel,
    dep: dict[str, Any] | None,
    pods: list[dict[str, Any]],
    failure: status.ApplyFailure | None = None,
) -> dict[str, tuple]:
    summary = status.summarize(model, dep, pods, failure)
    return {c["type"]: (c["status"], c["reason"]) for c in summary["conditions"]}


CASES = [
    (
        "no deployment yet",
        MODEL,
        None,
        [],
        {
            "Ready": ("False", "Creating"),
            "Progressing": ("True", "Creating"),
            "Degraded": ("False", "AsExpected"),
        },
    ),
    (
        "all ready",
        MODEL,
        deployment(ready=2),
        [],
        {
            "Ready": ("True", "AllReplicasReady"),
            "Progressing": ("False", "RolloutComplete"),
            "Degraded": ("False", "AsExpected"),
        },
    ),
    (
        "starting",
        MODEL,
        deployment(ready=1),
        [],
        {
            "Ready": ("False", "ReplicasNotReady"),
            "Progressing": ("True", "RollingOut"),
            "Degraded": ("False", "AsExpected"),
        },
    ),
    (
        "ready but old pods remain",
        MODEL,
        deployment(ready=2, replicas=3, updated=2),
        [],
        {
            "Ready": ("False", "ReplicasNotReady"),
            "Progressing": ("True", "RollingOut"),
            "Degraded": ("False", "AsExpected"),
        },
    ),
    (
        "autoscaled, created with fewer pods than its minimum",
        AUTOSCALED,
        deployment(ready=1, replicas=1, wanted=1),
        [],
        {
            "Ready": ("False", "ReplicasNotReady"),
            "Progressing": ("True", "RollingOut"),
            "Degraded": ("False", "AsExpected"),
        },
    ),
    (
        "autoscaled, its minimum ready",
        AUTOSCALED,
        deployment(ready=2, replicas=2, wanted=2),
        [],
        {
            "Ready": ("True", "AllReplicasReady"),
            "Progressing": ("False", "RolloutComplete"),
            "Degraded": ("False", "AsExpected"),
        },
    ),
    (
        "autoscaled up, more than its minimum ready",
        AUTOSCALED,
        deployment(ready=3, replicas=4, wanted=4),
        [],
        {
            "Ready": ("True", "MinReplicasReady"),
            "Progressing": ("True", "RollingOut"),
            "Degraded": ("False", "AsExpected"),
        },
    ),
    (
        "no GPU left",
        MODEL,
        deployment(),
        [pending_pod("0/3 nodes are available: 3 Insufficient nvidia.com/gpu.")],
        {
            "Ready": ("False", "InsufficientGPU"),
            "Progressing": ("False", "Stalled"),
            "Degraded": ("True", "InsufficientGPU"),
        },
    ),
    (
        "no MIG slice left",
        MIG_MODEL,
        deployment(),
        [pending_pod("0/2 nodes are available: 2 Insufficient nvidia.com/mig-1g.10gb.")],
        {
            "Ready": ("False", "InsufficientGPU"),
            "Progressing": ("False", "Stalled"),
            "Degraded": ("True", "InsufficientGPU"),
        },
    ),
    (
        "taints",
        MODEL,
        deployment(),
        [pending_pod("0/3 nodes are available: 3 node(s) had untolerated taint {gpu: true}.")],
        {
            "Ready": ("False", "Unschedulable"),
            "Progressing": ("False", "Stalled"),
            "Degraded": ("True", "Unschedulable"),
        },
    ),
    (
        "worker image missing",
        MODEL,
        deployment(),
        [waiting_pod("worker", "ImagePullBackOff", "not found")],
        {
            "Ready": ("False", "ImagePullBackOff"),
            "Progressing": ("False", "Stalled"),
            "Degraded": ("True", "ImagePullBackOff"),
        },
    ),
    (
        "triton image cannot be pulled",
        MODEL,
        deployment(),
        [waiting_pod("triton", "ErrImagePull", "denied")],
        {
            "Ready": ("False", "ErrImagePull"),
            "Progressing": ("False", "Stalled"),
            "Degraded": ("True", "ErrImagePull"),
        },
    ),
    (
        "worker crashing",
        MODEL,
        deployment(),
        [
            waiting_pod(
                "worker",
                "CrashLoopBackOff",
                "back-off",
                last={"exitCode": 1, "message": "ImportError: torch"},
            )
        ],
        {
            "Ready": ("False", "CrashLoopBackOff"),
            "Progressing": ("False", "Stalled"),
            "Degraded": ("True", "CrashLoopBackOff"),
        },
    ),
    (
        "worker restarted and not ready",
        MODEL,
        deployment(),
        [
            waiting_pod(
                "worker", "", last={"exitCode": 3, "message": "model ESM1 failed to load"}, running=True
            )
        ],
        {
            "Ready": ("False", "ModelLoadFailed"),
            "Progressing": ("False", "Stalled"),
            "Degraded": ("True", "ModelLoadFailed"),
        },
    ),
    (
        "worker loading its models",
        MODEL,
        deployment(ready=1),
        [waiting_pod("worker", "", running=True)],
        {
            "Ready": ("False", "Loading"),
            "Progressing": ("True", "RollingOut"),
            "Degraded": ("False", "AsExpected"),
        },
    ),
    (
        "a stopping worker is not loading",
        MODEL,
        deployment(ready=1),
        [stopping(waiting_pod("worker", "", running=True))],
        {
            "Ready": ("False", "ReplicasNotReady"),
            "Progressing": ("True", "RollingOut"),
            "Degraded": ("False", "AsExpected"),
        },
    ),
    (
        "quota",
        MODEL,
        deployment(
            conditions=[
                {
                    "type": "ReplicaFailure",
                    "status": "True",
                    "reason": "FailedCreate",
                    "message": "exceeded quota",
                }
            ]
        ),
        [],
        {
            "Ready": ("False", "ReplicaFailure"),
            "Progressing": ("False", "Stalled"),
            "Degraded": ("True", "ReplicaFailure"),
        },
    ),
]


@pytest.mark.parametrize(
    ("model", "dep", "pods", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_conditions(
    model: PyTritonModel, dep: Any, pods: list[dict[str, Any]], expected: dict[str, tuple]
) -> None:
    assert conditions(model, dep, pods) == expected


def test_the_most_severe_problem_wins_and_its_message_is_kept() -> None:
    pods = [
        waiting_pod("worker", "CrashLoopBackOff", last={"exitCode": 1}),
        pending_pod("0/3 nodes are available: 3 Insufficient nvidia.com/gpu."),
    ]
    summary = status.summarize(MODEL, deployment(ready=1), pods)
    ready = summary["conditions"][0]
    assert ready["reason"] == "InsufficientGPU"
    assert ready["message"] == "1/2 replicas ready; 0/3 nodes are available: 3 Insufficient nvidia.com/gpu."


def test_loading_names_the_pods_that_load() -> None:
    pods = [waiting_pod("worker", "", running=True), pending_pod("waiting for a node", reason="")]
    pods[1]["status"]["conditions"] = []
    ready = status.summarize(MODEL, deployment(ready=0), pods)["conditions"][0]
    assert ready == {
        "type": "Ready",
        "status": "False",
        "reason": "Loading",
        "message": "0/2 replicas ready; the worker is loading its models in esm1-worker",
    }


def test_summary_fields() -> None:
    summary = status.summarize(MODEL, deployment(ready=1, replicas=2), [])
    assert summary["replicas"] == 2
    assert summary["readyReplicas"] == 1
    assert summary["selector"] == "app.kubernetes.io/instance=esm1,app.kubernetes.io/name=pytriton-model"
    assert summary["url"] == "http://esm1.models.svc:8000"
    assert summary["grpcUrl"] == "grpc://esm1.models.svc:8001"


def test_transition_times_move_only_on_a_status_change() -> None:
    previous = [
        {
            "type": "Ready",
            "status": "False",
            "reason": "Creating",
            "lastTransitionTime": "2026-01-01T00:00:00Z",
        },
        {
            "type": "Degraded",
            "status": "False",
            "reason": "AsExpected",
            "lastTransitionTime": "2026-01-01T00:00:00Z",
        },
    ]
    now = "2026-01-02T00:00:00Z"
    new = [
        {"type": "Ready", "status": "False", "reason": "ReplicasNotReady", "message": ""},
        {"type": "Degraded", "status": "True", "reason": "InsufficientGPU", "message": ""},
        {"type": "Progressing", "status": "True", "reason": "RollingOut", "message": ""},
    ]
    stamped = {c["type"]: c["lastTransitionTime"] for c in status.stamp_transitions(new, previous, now)}
    assert stamped == {"Ready": "2026-01-01T00:00:00Z", "Degraded": now, "Progressing": now}


def test_a_refused_child_keeps_the_model_degraded_whatever_its_pods_do() -> None:
    refused = status.ApplyFailure("Service: HTTP 422: spec.ports[1]: Duplicate value", temporary=False)
    summary = status.summarize(MODEL, deployment(ready=2), [], refused)
    assert {c["type"]: (c["status"], c["reason"], c["message"]) for c in summary["conditions"]} == {
        "Ready": ("False", "ApplyFailed", refused.message),
        "Progressing": ("False", "ApplyFailed", refused.message),
        "Degraded": ("True", "ApplyFailed", refused.message),
    }
    assert summary["readyReplicas"] == 2


def test_an_apply_without_answer_is_reported_as_retried() -> None:
    no_answer = status.ApplyFailure("Service: no answer from the API server within 30 s", temporary=True)
    pods = [pending_pod("0/3 nodes are available: 3 Insufficient nvidia.com/gpu.")]
    assert conditions(MODEL, deployment(ready=2), pods, no_answer) == {
        "Ready": ("False", "ApplyRetrying"),
        "Progressing": ("True", "ApplyRetrying"),
        "Degraded": ("True", "InsufficientGPU"),
    }


NO_NUMPY = "The worker image cannot run kubetriton: its Python 3.12 has no NumPy; install numpy in the image"
NO_PYTHON_START_ERROR = (
    "failed to create containerd task: failed to create shim task: OCI runtime create failed: runc create "
    'failed: unable to start container process: exec: "python3": executable file not found in $PATH: unknown'
)


@pytest.mark.parametrize(
    ("last_exit", "message"),
    [
        ({"exitCode": podenv.UNSUPPORTED_IMAGE_EXIT_CODE, "reason": "Error", "message": NO_NUMPY}, NO_NUMPY),
        (
            {"exitCode": 128, "reason": "StartError", "message": NO_PYTHON_START_ERROR},
            "The worker image cannot run kubetriton: it has no python3 on its PATH",
        ),
    ],
    ids=["refused by the launcher", "no python3"],
)
def test_an_image_that_cannot_run_kubetriton_is_named_in_one_line(last_exit, message) -> None:
    pods = [waiting_pod("worker", "CrashLoopBackOff", "back-off 10s restarting failed container", last_exit)]
    summary = status.summarize(MODEL, deployment(ready=0), pods)
    by_type = {condition["type"]: condition for condition in summary["conditions"]}
    assert by_type["Degraded"]["status"] == "True"
    assert by_type["Ready"]["reason"] == by_type["Degraded"]["reason"] == "WorkerImageUnsupported"
    assert by_type["Degraded"]["message"].endswith(message)
    assert "\n" not in by_type["Ready"]["message"]


def test_an_ordinary_crash_is_not_blamed_on_the_image() -> None:
    pods = [waiting_pod("worker", "CrashLoopBackOff", last={"exitCode": 1, "message": "ValueError: bad"})]
    ready = status.summarize(MODEL, deployment(ready=0), pods)["conditions"][0]
    assert ready["reason"] == "CrashLoopBackOff" and "ValueError: bad" in ready["message"]
