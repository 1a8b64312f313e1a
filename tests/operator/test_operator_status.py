"""Status from observed children: the reasons a user sees in `kubectl get ptm -o wide`."""

from __future__ import annotations

from typing import Any

import kopf
import pytest
from kubetriton import podenv
from kubetriton.operator import reconciler, status
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
SETTING_REFUSED = (
    "PyTritonValidationError: KUBETRITON_ARENA_BYTES='lots' is not a positive whole number of bytes "
    "(the default, 268435456, is 256 MiB)"
)
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
        "a setting kubetriton refuses",
        stuck(
            waiting_pod(
                "worker",
                "CrashLoopBackOff",
                last={"exitCode": podenv.CONFIGURATION_ERROR_EXIT_CODE, "message": f"{SETTING_REFUSED}\n"},
                restarts=1,
            )
        ),
        ("SettingsRejected", True, f"pod esm1-x: {SETTING_REFUSED}"),
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


# Evictions: the kubelet's words on a pod it evicted (Kubernetes 1.35), and what the status makes of them.
PAST_POD_LIMIT = "Pod ephemeral local storage usage exceeds the total limit of containers 128Mi. "
PAST_CONTAINER_LIMIT = 'Container worker exceeded its local ephemeral storage limit "128Mi". '
PAST_VOLUME_LIMIT = 'Usage of EmptyDir volume "cache" exceeds the limit "1Gi". '
NODE_LOW_ON_DISK = (
    "The node was low on resource: ephemeral-storage. Threshold quantity: 1Gi, available: 812Mi. "
    "Container worker was using 2Gi, which exceeds its request of 0. "
)
NODE_UNDER_PRESSURE = "The node had condition: [DiskPressure]. "
TEMPLATE = "5d8f9c7b6"


def evicted_pod(name: str, created: str, message: str = PAST_POD_LIMIT, template: str = TEMPLATE) -> dict:
    """A pod of the model that the kubelet evicted, as the API server returns it."""
    return {
        "metadata": {"name": name, "creationTimestamp": created, "labels": {"pod-template-hash": template}},
        "status": {
            "phase": "Failed",
            "reason": "Evicted",
            "message": message,
            "conditions": [
                {"type": "DisruptionTarget", "status": "True", "reason": "TerminationByKubelet"},
                {"type": "Ready", "status": "False", "reason": "PodFailed"},
                {"type": "PodScheduled", "status": "True"},
            ],
            "containerStatuses": [
                {
                    "name": "worker",
                    "ready": False,
                    "restartCount": 0,
                    "state": {"terminated": {"exitCode": 137, "reason": "Error", "message": "loading\n"}},
                }
            ],
        },
    }


def running_pod(name: str, created: str, ready: bool, template: str = TEMPLATE) -> dict[str, Any]:
    """A pod of the model whose worker runs: it serves when ready, else it loads its models."""
    pod = waiting_pod("worker", "", running=True)
    pod["metadata"] = {"name": name, "creationTimestamp": created, "labels": {"pod-template-hash": template}}
    pod["status"]["phase"] = "Running"
    pod["status"]["containerStatuses"][0]["ready"] = ready
    pod["status"]["conditions"] = [{"type": "Ready", "status": str(ready)}]
    return pod


def by_type(model: PyTritonModel, dep: dict[str, Any], pods: list[dict[str, Any]]) -> dict[str, dict]:
    return {c["type"]: c for c in status.summarize(model, dep, pods)["conditions"]}


EVICTIONS = [
    (
        "past the pod's limit",
        PAST_POD_LIMIT,
        True,
        "the pod's files, logs and emptyDir volumes went past its ephemeral-storage limit (128Mi, its"
        " containers' limits together), and it was evicted (1 pod evicted so far); raise"
        " spec.worker.resources.limits.ephemeral-storage, or make container worker write less to its disk"
        " and emptyDir volumes",
    ),
    (
        "past the worker's limit",
        PAST_CONTAINER_LIMIT,
        True,
        "container worker went past its ephemeral-storage limit (128Mi) with its files and logs, and the pod"
        " was evicted (1 pod evicted so far); raise spec.worker.resources.limits.ephemeral-storage, or make"
        " it write less to its disk",
    ),
    (
        "past an emptyDir's sizeLimit",
        PAST_VOLUME_LIMIT,
        True,
        "emptyDir volume cache went past its sizeLimit (1Gi), and the pod was evicted (1 pod evicted so far);"
        " raise its sizeLimit in spec.volumes, or write less to it",
    ),
    (
        "a node low on disk",
        NODE_LOW_ON_DISK,
        False,
        "the node ran low on ephemeral-storage, and the pod was evicted (1 pod evicted so far): container"
        " worker used 2Gi, more than it requests; request what it uses in"
        " spec.worker.resources.requests.ephemeral-storage (pods past their requests are evicted first)",
    ),
    (
        "a node under pressure",
        NODE_UNDER_PRESSURE,
        False,
        "the pod was evicted (1 pod evicted so far): The node had condition: [DiskPressure].",
    ),
]


@pytest.mark.parametrize(
    ("message", "stalled", "said"), [case[1:] for case in EVICTIONS], ids=[case[0] for case in EVICTIONS]
)
def test_an_evicted_pod_says_why_while_its_replacement_loads(message: str, stalled: bool, said: str) -> None:
    """Stalled, where the pod went past a limit of its own, once a second pod of the spec went past it."""
    pods = [
        evicted_pod("esm1-a", "2026-01-01T00:00:00Z", message),
        running_pod("esm1-b", "2026-01-01T00:01:00Z", ready=False),
    ]
    found = by_type(MODEL, deployment(replicas=1, wanted=1), pods)
    assert found["Degraded"]["status"] == "True"
    assert found["Degraded"]["reason"] == found["Ready"]["reason"] == "Evicted"
    assert found["Degraded"]["message"] == f"pod esm1-a: {said}"
    assert found["Ready"]["message"] == f"0/1 replicas ready; pod esm1-a: {said}"
    assert (found["Progressing"]["status"], found["Progressing"]["reason"]) == ("True", "RollingOut")
    pods[1] = evicted_pod("esm1-b", "2026-01-01T00:01:00Z", message)
    pods.append(running_pod("esm1-c", "2026-01-01T00:02:00Z", ready=False))
    found = by_type(MODEL, deployment(replicas=1, wanted=1), pods)
    assert found["Degraded"]["message"] == f"pod esm1-b: {said}".replace("1 pod evicted", "2 pods evicted")
    assert (found["Progressing"]["status"], found["Progressing"]["reason"]) == (
        ("False", "Stalled") if stalled else ("True", "RollingOut")
    )


def test_a_router_pods_limits_are_named_where_they_are_set() -> None:
    """A router's resources are the operator's (the chart's router.resources), not the model's spec."""
    evicted = evicted_pod("esm1-router-a", "2026-01-01T00:00:00Z")
    evicted["status"]["containerStatuses"][0]["name"] = "haproxy"
    oom = {"exitCode": 137, "reason": "OOMKilled"}
    killed = waiting_pod("haproxy", "CrashLoopBackOff", last=oom, restarts=1)
    killed["metadata"]["creationTimestamp"] = "2026-01-01T00:01:00Z"
    killed["status"]["containerStatuses"] = killed["status"].pop("initContainerStatuses")
    router_deployment = deployment(replicas=1, wanted=1)
    _, ready = status.router(MODEL, router_deployment, [evicted], pods_ready=1)
    assert ready["reason"] == "Evicted"
    assert (
        "raise the chart's router.resources.limits.ephemeral-storage, or make container haproxy"
        in ready["message"]
    )
    _, ready = status.router(MODEL, router_deployment, [evicted, killed], pods_ready=1)
    assert ready["reason"] == "OOMKilled"
    assert ready["message"].endswith(
        "container haproxy went past its memory limit and was killed (2 times); raise the chart's"
        " router.resources.limits.memory, or make it use less"
    )


def test_the_newest_eviction_is_named_with_how_many_there_were() -> None:
    pods = [
        evicted_pod("esm1-a", "2026-01-01T00:00:00Z"),
        evicted_pod("esm1-b", "2026-01-01T00:01:00Z", PAST_CONTAINER_LIMIT),
        evicted_pod("esm1-c", "2026-01-01T00:02:00Z"),
        evicted_pod("esm1-old", "2025-12-31T00:00:00Z", template="0ld"),
        running_pod("esm1-d", "2026-01-01T00:03:00Z", ready=False),
    ]
    degraded = by_type(MODEL, deployment(replicas=1, wanted=1), pods)["Degraded"]
    assert degraded["message"].startswith("pod esm1-c: the pod's files, logs and emptyDir volumes")
    assert "it was evicted (3 pods evicted so far)" in degraded["message"]


def test_an_eviction_is_named_until_a_pod_made_after_it_is_ready() -> None:
    serving = running_pod("esm1-a", "2026-01-01T00:00:00Z", ready=True)
    evicted = evicted_pod("esm1-b", "2026-01-01T00:01:00Z")
    replacement = running_pod("esm1-c", "2026-01-01T00:02:00Z", ready=False)
    found = by_type(MODEL, deployment(ready=1), [serving, evicted, replacement])
    assert (found["Degraded"]["reason"], found["Progressing"]["status"]) == ("Evicted", "True")
    assert found["Degraded"]["message"].startswith("pod esm1-b: ")
    # the replacement serves; another pod, made later, loads: the model waits for it, and nothing is wrong
    replacement = running_pod("esm1-c", "2026-01-01T00:02:00Z", ready=True)
    later = running_pod("esm1-d", "2026-01-01T00:03:00Z", ready=False)
    found = by_type(MODEL, deployment(ready=1), [evicted, replacement, later])
    assert (found["Degraded"]["status"], found["Degraded"]["reason"]) == ("False", "AsExpected")
    assert (found["Ready"]["reason"], found["Progressing"]["status"]) == ("Loading", "True")


def test_an_eviction_is_forgotten_once_the_model_has_every_replica_ready() -> None:
    """Scaled from 2 replicas to 1 while the evicted pod's replacement loaded: the replacement went, and
    the evicted pod is the newest of its template, beside an older one that serves."""
    serving = running_pod("esm1-a", "2026-01-01T00:00:00Z", ready=True)
    evicted = evicted_pod("esm1-b", "2026-01-01T00:01:00Z")
    assert by_type(MODEL, deployment(ready=1), [serving, evicted])["Degraded"]["reason"] == "Evicted"
    found = by_type(MODEL, deployment(ready=1, replicas=1, wanted=1), [serving, evicted])
    assert (found["Ready"]["status"], found["Ready"]["reason"]) == ("True", "AllReplicasReady")
    assert (found["Degraded"]["status"], found["Progressing"]["reason"]) == ("False", "RolloutComplete")


def test_an_eviction_of_an_earlier_template_is_not_the_rollouts() -> None:
    """The limit was raised after an eviction: the new template's pod loads, the evicted pod stays."""
    one = deployment(replicas=1, wanted=1)
    evicted = evicted_pod("esm1-a", "2026-01-01T00:00:00Z", template="small")
    loading = running_pod("esm1-b", "2026-01-01T00:01:00Z", ready=False, template="small")
    assert by_type(MODEL, one, [evicted, loading])["Degraded"]["status"] == "True"
    rolled = running_pod("esm1-c", "2026-01-01T00:02:00Z", ready=False, template="raised")
    found = by_type(MODEL, one, [evicted, rolled])
    assert (found["Degraded"]["status"], found["Ready"]["reason"]) == ("False", "Loading")
    assert (found["Progressing"]["status"], found["Progressing"]["reason"]) == ("True", "RollingOut")


def test_the_replacements_own_problem_is_named_over_the_eviction() -> None:
    one = deployment(replicas=1, wanted=1)
    evicted = evicted_pod("esm1-a", "2026-01-01T00:00:00Z")
    replacement = running_pod("esm1-b", "2026-01-01T00:01:00Z", ready=False)
    assert by_type(MODEL, one, [evicted, replacement])["Ready"]["reason"] == "Evicted"
    crashing = waiting_pod(
        "worker", "CrashLoopBackOff", last={"exitCode": 1, "message": "OSError: disk full"}
    )
    crashing["metadata"] = replacement["metadata"]
    degraded = by_type(MODEL, one, [evicted, crashing])["Degraded"]
    assert (degraded["reason"], degraded["message"]) == (
        "CrashLoopBackOff",
        "pod esm1-b: container worker exited with code 1 1 times: OSError: disk full",
    )


def test_an_evicted_pod_is_named_for_its_eviction_not_for_its_containers_past() -> None:
    """A slow load, restarted once by its startup probe, then evicted for what it wrote."""
    pod, warnings = stuck(evicted_pod("esm1-x", ""), event("Unhealthy", PROBE, container="worker"))
    restarted = {"restartCount": 1, "lastState": {"terminated": {"exitCode": 143, "reason": "Error"}}}
    pod["status"]["containerStatuses"][0].update(restarted)
    summary = status.summarize(MODEL, deployment(), [pod], warnings={"esm1-x": warnings})
    degraded = {c["type"]: c for c in summary["conditions"]}["Degraded"]
    assert degraded["reason"] == "Evicted"
    assert degraded["message"].startswith("pod esm1-x: the pod's files, logs and emptyDir volumes went past")


async def indexed(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The pods as the operator keeps them in its index, which is what it hands to the status."""
    kept = []
    for pod in pods:
        labels = pod["metadata"]["labels"]
        summary = await reconciler._pod_summary(body=kopf.Body(pod), namespace="models", labels=labels)
        kept.extend(summary.values())
    return kept


@pytest.mark.asyncio
async def test_the_operator_keeps_of_each_pod_what_its_eviction_needs() -> None:
    """Its reason and message, its Ready condition (a replacement that serves) and its template."""
    evicted = evicted_pod("esm1-a", "2026-01-01T00:00:00Z")
    loading = running_pod("esm1-c", "2026-01-01T00:02:00Z", ready=False)
    found = by_type(MODEL, deployment(ready=1), await indexed([evicted, loading]))
    assert (found["Degraded"]["reason"], found["Progressing"]["reason"]) == ("Evicted", "RollingOut")
    replaced = running_pod("esm1-b", "2026-01-01T00:01:00Z", ready=True)
    found = by_type(MODEL, deployment(ready=1), await indexed([evicted, replaced, loading]))
    assert found["Degraded"]["status"] == "False"
    rolled = running_pod("esm1-c", "2026-01-01T00:02:00Z", ready=False, template="raised")
    found = by_type(MODEL, deployment(ready=1), await indexed([evicted, rolled]))
    assert found["Degraded"]["status"] == "False"
