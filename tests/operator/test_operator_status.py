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


AUTOSCALED_FROM_ONE = AUTOSCALED.model_copy(
    update={
        "spec": AUTOSCALED.spec.model_copy(
            update={"autoscaling": AutoscalingSpec.model_validate({"minReplicas": 1, "maxReplicas": 5})}
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
    container: str,
    reason: str,
    message: str = "",
    last: dict[str, Any] | None = None,
    running: bool = False,
    restarts: int = 0,
) -> dict[str, Any]:
    state = (
        {"running": {"startedAt": "t"}} if running else {"waiting": {"reason": reason, "message": message}}
    )
    entry = {
        "name": container,
        "ready": False,
        "restartCount": restarts,
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
        "worker crashing, restarted once: the kubelet may still get it going",
        MODEL,
        deployment(),
        [
            waiting_pod(
                "worker",
                "CrashLoopBackOff",
                "back-off",
                last={"exitCode": 1, "message": "ImportError: torch"},
                restarts=1,
            )
        ],
        {
            "Ready": ("False", "CrashLoopBackOff"),
            "Progressing": ("True", "RollingOut"),
            "Degraded": ("True", "CrashLoopBackOff"),
        },
    ),
    (
        "worker crashing for good",
        MODEL,
        deployment(),
        [
            waiting_pod(
                "worker",
                "CrashLoopBackOff",
                "back-off",
                last={"exitCode": 1, "message": "ImportError: torch"},
                restarts=2,
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
            "Progressing": ("True", "RollingOut"),
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
    assert ready["message"] == (
        "1/2 replicas ready; pod esm1-a: 0/3 nodes are available: 3 Insufficient nvidia.com/gpu."
    )


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


TRITON_ABORTED = """I1129 07:21:16.011991 11 http_server.cc:4713] "Started HTTPService at 0.0.0.0:8000"
I1129 07:21:18.144129 11 model_lifecycle.cc:472] "loading: Identity:1"
terminate called after throwing an instance of 'triton::backend::python::PythonBackendException'
  what():  Failed to create temporary directory for Python environments.
Signal (6) received.
 0# 0x00005631B0CB352D in tritonserver
19# __clone in /lib/x86_64-linux-gnu/libc.so.6

Aborted
"""
TRITON_REFUSED = """I1129 07:21:16.011991 11 http_server.cc:4713] "Started HTTPService at 0.0.0.0:8000"
E1129 07:21:16.2 11 main.cc:233] "failed to start GRPC service: Unavailable - Socket in use"
W1129 07:21:16.3 11 server.cc:100] "Waiting for in-flight requests to complete."
"""


@pytest.mark.parametrize(
    ("output", "said"),
    [
        (TRITON_ABORTED, "Failed to create temporary directory for Python environments."),
        (TRITON_REFUSED, "failed to start GRPC service: Unavailable - Socket in use"),
    ],
    ids=["uncaught exception", "error line"],
)
def test_a_crashing_triton_says_why_not_how_it_ended(output: str, said: str) -> None:
    pods = [waiting_pod("triton", "CrashLoopBackOff", last={"exitCode": 134, "message": output}, restarts=4)]
    ready = status.summarize(MODEL, deployment(ready=0), pods)["conditions"][0]
    assert ready["reason"] == "CrashLoopBackOff"
    assert ready["message"].endswith(f"container triton exited with code 134 5 times: {said}")


def test_a_crashing_worker_says_its_scripts_last_line_not_a_librarys_log_line() -> None:
    output = (
        "E0000 00:00:1711.1 12 cuda_dnn.cc:8310] Unable to register cuDNN factory\n"
        "Traceback (most recent call last):\n  ...\nRuntimeError: weights file w.pt not found\n"
    )
    pods = [waiting_pod("worker", "CrashLoopBackOff", last={"exitCode": 1, "message": output}, restarts=2)]
    ready = status.summarize(MODEL, deployment(ready=0), pods)["conditions"][0]
    assert ready["message"].endswith("exited with code 1 3 times: RuntimeError: weights file w.pt not found")


@pytest.mark.parametrize("container", ["worker", "triton"])
def test_a_container_killed_for_its_memory_says_so_not_its_last_log_line(container: str) -> None:
    last = {"exitCode": 137, "reason": "OOMKilled", "message": "Loading the weights\n"}
    pods = [waiting_pod(container, "CrashLoopBackOff", last=last, restarts=2)]
    summary = status.summarize(MODEL, deployment(ready=0), pods)
    by_type = {condition["type"]: condition for condition in summary["conditions"]}
    assert by_type["Ready"]["reason"] == by_type["Degraded"]["reason"] == "OOMKilled"
    assert by_type["Degraded"]["message"].endswith(
        f"container {container} went past its memory limit and was killed (3 times); raise"
        f" spec.{container}.resources.limits.memory, or make it use less"
    )


# What the cluster says of a stuck pod, and the cause the status names. Messages are the kubelet's and the
# scheduler's own words (Kubernetes 1.35).


def event(reason: str, message: str, container: str = "", kind: str = "Pod", type: str = "Warning") -> dict:
    """An Event about the pod esm1-x as the API server stores it."""
    involved = {"kind": kind, "name": "esm1-x", "namespace": "models"}
    if container:
        involved["fieldPath"] = f"spec.containers{{{container}}}"
    return {"type": type, "reason": reason, "message": message, "involvedObject": involved, "count": 3}


def stuck(pod: dict[str, Any], *events: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    pod = {**pod, "metadata": {"name": "esm1-x"}}
    warnings = [warning for warning in map(status.pod_warning, events) if warning is not None]
    return pod, warnings


INITIALIZING = {
    "status": {
        "phase": "Pending",
        "initContainerStatuses": [
            {
                "name": "bootstrap",
                "ready": False,
                "restartCount": 0,
                "state": {"waiting": {"reason": "PodInitializing"}},
            }
        ],
    }
}
PVC_POD = {
    "spec": {"volumes": [{"name": "weights", "persistentVolumeClaim": {"claimName": "weights"}}]},
    "status": {
        "conditions": [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": "0/1 nodes are available: pod has unbound immediate PersistentVolumeClaims. "
                "preemption: 0/1 nodes are available: 1 Preemption is not helpful for scheduling.",
            }
        ]
    },
}
CONFIG_ERROR = "pytriton.exceptions.PyTritonModelConfigError: Triton refused to load model 'Sleep': bad"
NOT_BOUND = "spec.models declares Other, which the script does not bind before serve() (it binds Sleep): ..."
PROBE = 'Startup probe failed: Get "http://10.244.0.7:8010/livez": dial tcp 10.244.0.7:8010: connect: refused'

CAUSES = [
    (
        "a script ConfigMap that does not exist",
        stuck(
            INITIALIZING,
            event(
                "FailedMount",
                'MountVolume.SetUp failed for volume "script" : configmap "no-such-cm" not found',
            ),
        ),
        ("ConfigMapNotFound", True, "ConfigMap no-such-cm does not exist (a volume of the pod: MountVolume"),
    ),
    (
        "a Secret volume that does not exist",
        stuck(
            INITIALIZING,
            event("FailedMount", 'MountVolume.SetUp failed for volume "creds" : secret "no-such" not found'),
        ),
        ("SecretNotFound", True, "Secret no-such does not exist"),
    ),
    (
        "a Secret the worker's environment reads, missing",
        stuck(waiting_pod("worker", "CreateContainerConfigError", 'secret "api-key" not found')),
        (
            "SecretNotFound",
            True,
            'Secret api-key does not exist (container worker: secret "api-key" not found)',
        ),
    ),
    (
        "a key missing from a Secret",
        stuck(
            waiting_pod(
                "worker", "CreateContainerConfigError", "couldn't find key token in Secret models/api"
            )
        ),
        ("SecretNotFound", True, "Secret models/api has no key token (container worker)"),
    ),
    (
        "a mount that fails otherwise may still succeed",
        stuck(INITIALIZING, event("FailedMount", 'MountVolume.SetUp failed for volume "nfs" : timed out')),
        ("MountFailed", False, 'pod esm1-x: MountVolume.SetUp failed for volume "nfs" : timed out'),
    ),
    (
        "a PersistentVolumeClaim that does not bind",
        stuck(PVC_POD),
        ("VolumeNotBound", True, "PersistentVolumeClaim weights is not bound to a volume"),
    ),
    (
        "a node selector that no node satisfies",
        stuck(
            pending_pod(
                "0/1 nodes are available: 1 node(s) didn't match Pod's node affinity/selector. preemption: "
                "0/1 nodes are available: 1 Preemption is not helpful for scheduling."
            )
        ),
        ("Unschedulable", True, "didn't match Pod's node affinity/selector"),
    ),
    (
        "a GPU request that no node satisfies",
        stuck(pending_pod("0/1 nodes are available: 1 Insufficient nvidia.com/gpu.")),
        ("InsufficientGPU", True, "1 Insufficient nvidia.com/gpu"),
    ),
    (
        "a declared model the script does not bind",
        stuck(
            waiting_pod(
                "worker",
                "CrashLoopBackOff",
                last={"exitCode": podenv.MODEL_NOT_BOUND_EXIT_CODE, "message": NOT_BOUND},
                restarts=1,
            )
        ),
        ("ModelNotBound", True, f"pod esm1-x: {NOT_BOUND}"),
    ),
    (
        "Triton refuses the generated configuration",
        stuck(
            waiting_pod(
                "worker",
                "",
                last={"exitCode": 1, "message": f"Traceback:\n  ...\n{CONFIG_ERROR}"},
                running=True,
            )
        ),
        ("ModelConfigRejected", True, "pod esm1-x: Triton refused to load model 'Sleep': bad"),
    ),
    (
        "a startup probe that stops a slow load",
        stuck(
            waiting_pod("worker", "", last={"exitCode": 143, "reason": "Error"}, running=True, restarts=1),
            event("Unhealthy", PROBE, container="worker"),
        ),
        ("StartupProbeFailed", True, "container worker did not start within spec.startupSeconds (1200 s)"),
    ),
    (
        "a script that raises at its start, three times",
        stuck(
            waiting_pod(
                "worker",
                "CrashLoopBackOff",
                "back-off 20s restarting failed container",
                last={
                    "exitCode": 1,
                    "message": "Traceback (most recent call last):\n  ...\nRuntimeError: boom",
                },
                restarts=2,
            )
        ),
        ("CrashLoopBackOff", True, "container worker exited with code 1 3 times: RuntimeError: boom"),
    ),
    (
        "a script that raises while its startup probe fails is no slow load",
        stuck(
            waiting_pod(
                "worker",
                "CrashLoopBackOff",
                last={"exitCode": 1, "message": "Traceback (most recent call last):\nRuntimeError: boom"},
                restarts=2,
            ),
            event("Unhealthy", PROBE, container="worker"),
        ),
        ("CrashLoopBackOff", True, "container worker exited with code 1 3 times: RuntimeError: boom"),
    ),
    (
        "an image that cannot be pulled",
        stuck(waiting_pod("worker", "ImagePullBackOff", 'Back-off pulling image "nope:1"')),
        ("ImagePullBackOff", True, 'container worker: Back-off pulling image "nope:1"'),
    ),
]


@pytest.mark.parametrize(
    ("stuck_pod", "expected"), [case[1:] for case in CAUSES], ids=[case[0] for case in CAUSES]
)
def test_a_stuck_pod_names_its_cause(stuck_pod: tuple, expected: tuple) -> None:
    pod, warnings = stuck_pod
    reason, stalled, message = expected
    summary = status.summarize(MODEL, deployment(), [pod], warnings={"esm1-x": warnings})
    by_type = {condition["type"]: condition for condition in summary["conditions"]}
    assert by_type["Degraded"]["status"] == "True"
    assert by_type["Degraded"]["reason"] == by_type["Ready"]["reason"] == reason
    assert by_type["Degraded"]["message"].startswith("pod esm1-x: ")
    assert message in by_type["Degraded"]["message"]
    assert "\n" not in by_type["Degraded"]["message"]
    assert (by_type["Progressing"]["status"], by_type["Progressing"]["reason"]) == (
        ("False", "Stalled") if stalled else ("True", "RollingOut")
    )


def test_only_warnings_about_pods_are_kept() -> None:
    assert status.pod_warning(event("Unhealthy", PROBE, container="worker")) == {
        "reason": "Unhealthy",
        "message": PROBE,
        "container": "worker",
        "count": 3,
    }
    assert status.pod_warning(event("Pulled", "pulled", type="Normal")) is None
    assert status.pod_warning(event("ModelLoadFailed", "1/2 replicas ready", kind="PyTritonModel")) is None


def test_a_mount_that_failed_once_for_a_passing_reason_is_no_cause_yet() -> None:
    once = event(
        "FailedMount", 'MountVolume.SetUp failed for volume "script" : failed to sync configmap cache'
    )
    pod, warnings = stuck(INITIALIZING, {**once, "count": 1})
    ready = status.summarize(MODEL, deployment(), [pod], warnings={"esm1-x": warnings})["conditions"][0]
    assert ready["reason"] == "ReplicasNotReady"


def test_a_mount_warning_from_before_the_volume_mounted_is_forgotten() -> None:
    pod, warnings = stuck(
        waiting_pod("worker", "", running=True),
        event("FailedMount", 'MountVolume.SetUp failed for volume "script" : configmap "late" not found'),
    )
    ready = status.summarize(MODEL, deployment(), [pod], warnings={"esm1-x": warnings})["conditions"][0]
    assert ready["reason"] == "Loading"


def test_in_a_rollout_the_new_pods_problem_is_named() -> None:
    old = waiting_pod("worker", "CrashLoopBackOff", last={"exitCode": 1, "message": "old bug"}, restarts=5)
    old["metadata"] = {"name": "esm1-old", "creationTimestamp": "2026-01-01T00:00:00Z"}
    new = waiting_pod("worker", "ImagePullBackOff", "not found")
    new["metadata"] = {"name": "esm1-new", "creationTimestamp": "2026-01-01T00:05:00Z"}
    degraded = status.summarize(MODEL, deployment(), [old, new])["conditions"][2]
    assert (degraded["reason"], degraded["message"]) == (
        "ImagePullBackOff",
        "pod esm1-new: container worker: not found",
    )
    loading = waiting_pod("worker", "", running=True)
    loading["metadata"] = new["metadata"]
    degraded = status.summarize(MODEL, deployment(), [old, loading])["conditions"][2]
    assert degraded["reason"] == "CrashLoopBackOff" and degraded["message"].startswith("pod esm1-old: ")


def test_a_change_of_replicas_alone_keeps_a_ready_model_ready() -> None:
    """An autoscaler set 1 replica where 4 are ready, and the Deployment's controller has not caught up
    (its status is of generation 3, the spec of 4): the model stays Ready, whichever way it scales."""
    for ready, wanted in ((4, 1), (1, 4)):
        scaled = deployment(ready=ready, replicas=ready, wanted=wanted)
        scaled["metadata"]["generation"] = 4
        summary = status.summarize(AUTOSCALED_FROM_ONE, scaled, [], template_generation=3)
        assert summary["conditions"][0]["status"] == "True", (ready, wanted)
    stale = deployment(ready=4, replicas=4, wanted=1)
    stale["metadata"]["generation"] = 4
    rolling = status.summarize(MODEL, stale, [], template_generation=4)["conditions"][0]
    assert (rolling["status"], rolling["reason"]) == ("False", "ReplicasNotReady"), "a new template rolls"
