"""Models that cannot become Ready, each made as a user makes it: the status names the cause and the wait
ends there.

For each way of getting stuck, the model's status must show `Degraded=True` with the cause's reason
within 60 s of the first pod showing the problem (a waiting or failed container, a scheduling refusal, a
Warning event about the pod), and the command that waits for it must exit non-zero within 30 s of that
status, with the cause in its output: `kubetriton deploy`, or `kubetriton status NAME --wait` for the
one case that `deploy` cannot make (a script ConfigMap that does not exist, from `kubectl apply`). Cases
that need fields `deploy` has no flag for (a Secret, a node selector, a volume claim, `startupSeconds`, a
memory or disk limit, an environment variable) are applied with kubectl from `deploy --dry-run=client -o
yaml`, then deployed again, as a user who edits the generated YAML would.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.cluster import INSTANCE_LABEL, Cluster, Settings, kubectl

SCRIPT = """
import time

import numpy as np
from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from pytriton.triton import Triton

{before}
with Triton() as triton:
    triton.bind(
        model_name="Sleep",
        infer_func=lambda requests: requests,
        inputs=[Tensor(name="x", dtype=np.float32, shape=(1,))],
        outputs=[Tensor(name="x", dtype=np.float32, shape=(1,))],
        config={config},
    )
    triton.serve()
"""
BATCHED = "ModelConfig(max_batch_size=4)"
REFUSED_BY_TRITON = "ModelConfig(max_batch_size=4, batcher=DynamicBatcher(preferred_batch_size=[16]))"
"""Triton refuses it when it loads the generated config.pbtxt: a preferred batch size above the maximum."""
FILLS_ITS_DISK = """with open("/tmp/cache.bin", "wb") as cache:  # the image's /tmp: the container's own disk
    cache.writelines(bytes(2**20) for _ in range(256))  # 256 MiB, more than its 128Mi
time.sleep(300)  # the kubelet, which looks every 10 s, evicts it before it serves"""
POLL_S = 1.0
DEGRADED_WITHIN_S = 60
EXIT_WITHIN_S = 30
WAIT_TIMEOUT = "300s"
UNBOUND_CLAIM = "stuck-weights"


@dataclass(frozen=True)
class Case:
    """One way of getting stuck: the script, what else the model's spec says (applied with kubectl), and
    the reason and words the status and the command must give."""

    script: str
    reason: str
    said: str
    deploy_flags: tuple[str, ...] = ()
    spec: Callable[[dict[str, Any]], None] | None = None
    """Changes to the generated model before it is applied with kubectl; None: deploy it as it is."""
    wait_with_status: bool = False
    """Created with kubectl only and waited for with `kubetriton status --wait` (deploy would mend it)."""


def _script(before: str = "", config: str = BATCHED) -> str:
    return SCRIPT.format(before=before, config=config)


def _missing_config_map(model: dict[str, Any]) -> None:
    model["spec"]["worker"]["script"]["configMap"] = "no-such-cm"


def _missing_secret(model: dict[str, Any]) -> None:
    model["spec"]["worker"]["envFrom"] = [{"secretRef": {"name": "no-such-secret"}}]


def _node_selector(model: dict[str, Any]) -> None:
    model["spec"]["scheduling"] = {"nodeSelector": {"kubetriton.dev/e2e-node": "nowhere"}}


def _unbound_claim(model: dict[str, Any]) -> None:
    model["spec"]["volumes"] = [{"name": "weights", "persistentVolumeClaim": {"claimName": UNBOUND_CLAIM}}]
    model["spec"]["worker"]["volumeMounts"] = [{"name": "weights", "mountPath": "/weights"}]


def _short_startup(model: dict[str, Any]) -> None:
    model["spec"]["startupSeconds"] = 10


def _small_memory_limit(model: dict[str, Any]) -> None:
    model["spec"]["worker"]["resources"] = {"limits": {"memory": "192Mi"}}


def _small_disk_limit(model: dict[str, Any]) -> None:
    model["spec"]["worker"]["resources"] = {"limits": {"ephemeral-storage": "128Mi"}}


def _arena_of_no_size(model: dict[str, Any]) -> None:
    model["spec"]["worker"]["env"] = [{"name": "KUBETRITON_ARENA_BYTES", "value": "lots"}]


CASES = {
    "a script that raises at its start": Case(
        _script('raise RuntimeError("the weights are not where the script looks")'),
        "CrashLoopBackOff",
        "RuntimeError: the weights are not where the script looks",
    ),
    "a script ConfigMap that does not exist": Case(
        _script(),
        "ConfigMapNotFound",
        "ConfigMap no-such-cm does not exist",
        spec=_missing_config_map,
        wait_with_status=True,
    ),
    "a declared model the script never binds": Case(
        _script(),
        "ModelNotBound",
        "spec.models declares Other, which the script does not bind before serve() (it binds Sleep)",
        deploy_flags=("--model", "Other"),
    ),
    "a Secret that does not exist": Case(
        _script(), "SecretNotFound", "Secret no-such-secret does not exist", spec=_missing_secret
    ),
    "a node selector no node satisfies": Case(
        _script(), "Unschedulable", "didn't match Pod's node affinity/selector", spec=_node_selector
    ),
    "a GPU request no node satisfies": Case(_script(), "InsufficientGPU", "Insufficient nvidia.com/gpu"),
    "a PersistentVolumeClaim that does not bind": Case(
        _script(),
        "VolumeNotBound",
        f"PersistentVolumeClaim {UNBOUND_CLAIM} is not bound",
        spec=_unbound_claim,
    ),
    "a startup probe that stops a slow load": Case(
        _script("time.sleep(120)  # loads for longer than startupSeconds"),
        "StartupProbeFailed",
        "container worker did not start within spec.startupSeconds (10 s)",
        spec=_short_startup,
    ),
    "a worker that goes past its memory limit": Case(
        _script("weights = np.ones(512 * 2**20, np.uint8)  # more than its 192Mi"),
        "OOMKilled",
        "container worker went past its memory limit and was killed",
        spec=_small_memory_limit,
    ),
    "a worker that writes past its disk limit": Case(
        _script(FILLS_ITS_DISK),
        "Evicted",
        "raise spec.worker.resources.limits.ephemeral-storage",
        spec=_small_disk_limit,
    ),
    "a setting kubetriton refuses": Case(
        _script(),
        "SettingsRejected",
        "PyTritonValidationError: KUBETRITON_ARENA_BYTES='lots' is not a positive whole number of bytes",
        spec=_arena_of_no_size,
    ),
    "Triton refusing the generated configuration": Case(
        _script(config=REFUSED_BY_TRITON), "ModelConfigRejected", "Triton refused"
    ),
}


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "kubetriton.cli", *args]


def _json(*args: str) -> dict[str, Any]:
    return json.loads(kubectl(*args, "-o", "json"))


def pods_show_a_problem(name: str, namespace: str) -> str:
    """What the model's pods show that is wrong (a scheduling refusal, a container waiting for a reason
    other than starting, one that failed, a Warning about a pod), or "" while they show nothing."""
    pods = _json("get", "pods", "-n", namespace, "-l", f"{INSTANCE_LABEL}={name}")["items"]
    names = {pod["metadata"]["name"] for pod in pods}
    for pod in pods:
        found = pod.get("status") or {}
        for condition in found.get("conditions") or []:
            if condition["type"] == "PodScheduled" and condition["status"] == "False":
                return f"{pod['metadata']['name']}: {condition.get('message')}"
        for container in [
            *(found.get("initContainerStatuses") or []),
            *(found.get("containerStatuses") or []),
        ]:
            waiting = (container.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") not in (None, "ContainerCreating", "PodInitializing"):
                return f"{pod['metadata']['name']}/{container['name']}: {waiting['reason']}"
            for state in (container.get("state") or {}, container.get("lastState") or {}):
                code = (state.get("terminated") or {}).get("exitCode")
                if code:
                    return f"{pod['metadata']['name']}/{container['name']}: exited {code}"
    warnings = _json("get", "events", "-n", namespace, "--field-selector", "type=Warning")["items"]
    for event in warnings:
        if event["involvedObject"].get("kind") == "Pod" and event["involvedObject"].get("name") in names:
            return f"{event['involvedObject']['name']}: {event['reason']}: {event['message']}"
    return ""


def degraded(cluster: Cluster, name: str, namespace: str) -> dict[str, Any]:
    conditions = ((cluster.model(name, namespace) or {}).get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == "Degraded" and c["status"] == "True"), {})


def _generated(script: Path, name: str, namespace: str, image: str, flags: tuple[str, ...]) -> list[dict]:
    """The ConfigMap and the model that `kubetriton deploy` would apply."""
    printed = subprocess.run(
        cli("deploy", str(script), "--image", image, "--name", name, "-n", namespace, *flags,
            "--dry-run=client", "-o", "yaml"),
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return list(yaml.safe_load_all(printed))


@pytest.mark.parametrize("case_id", list(CASES))
def test_a_stuck_model_says_why_and_the_wait_ends(
    case_id: str, release: dict[str, Any], cluster: Cluster, settings: Settings, tmp_path: Path
) -> None:
    case = CASES[case_id]
    namespace = settings.models_namespace
    name = "stuck-" + "".join(c for c in case.reason.lower() if c.isalnum())
    script = tmp_path / "serve.py"
    script.write_text(case.script)
    flags = list(case.deploy_flags)
    if case.reason == "InsufficientGPU":
        flags += ["--gpus", str(cluster.allocatable("nvidia.com/gpu") + 1)]
    if case.spec is _unbound_claim:
        claim = {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": UNBOUND_CLAIM, "namespace": namespace},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "storageClassName": "",  # no class: it waits for a PersistentVolume that nobody makes
                "resources": {"requests": {"storage": "1Gi"}},
            },
        }
        cluster.apply(claim, namespace)
    wait = cli("deploy", str(script), "--name", name, "-n", namespace, "--timeout", WAIT_TIMEOUT, *flags)
    if case.spec is not None:
        config_map, model = _generated(script, name, namespace, settings.worker_image, tuple(flags))
        case.spec(model)
        if not case.wait_with_status:
            cluster.apply(config_map, namespace)
        cluster.apply(model, namespace)
        if case.wait_with_status:
            wait = cli("status", name, "-n", namespace, "--wait", "--timeout", WAIT_TIMEOUT)
    else:
        wait += ["--image", settings.worker_image]
    started = time.monotonic()
    waiting = subprocess.Popen(wait, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    shown_at = degraded_at = None
    shown = cause = ""
    try:
        while waiting.poll() is None and time.monotonic() - started < 400:
            now = time.monotonic()
            if shown_at is None and (shown := pods_show_a_problem(name, namespace)):
                shown_at = now
            found = degraded(cluster, name, namespace)
            if degraded_at is None and found.get("reason") == case.reason:
                degraded_at, cause = now, found["message"]
            time.sleep(POLL_S)
        output, _ = waiting.communicate(timeout=60)
        exited_at = time.monotonic()
        # the command may have seen the cause between two of these polls: then it was there by its exit
        if shown_at is None and (shown := pods_show_a_problem(name, namespace)):
            shown_at = exited_at
        if degraded_at is None and (found := degraded(cluster, name, namespace)).get("reason") == case.reason:
            degraded_at, cause = exited_at, found["message"]
        pods = kubectl("get", "pods", "-n", namespace, "-l", f"{INSTANCE_LABEL}={name}", "-o", "wide")
    finally:
        if waiting.poll() is None:
            waiting.kill()
        subprocess.run(cli("delete", name, "-n", namespace), capture_output=True)
        if case.spec is _unbound_claim:
            kubectl("delete", "pvc", UNBOUND_CLAIM, "-n", namespace, "--ignore-not-found")
    print(f"$ {' '.join(wait[3:])}\n{output}{pods}")
    assert shown_at is not None and degraded_at is not None, (shown, degraded(cluster, name, namespace))
    print(
        f"{case_id}: the pods showed it at {shown_at - started:.1f} s ({shown}); Degraded {case.reason} "
        f"{degraded_at - shown_at:.1f} s later ({cause}); the wait exited {waiting.returncode} "
        f"{exited_at - degraded_at:.1f} s after that"
    )
    assert waiting.returncode != 0
    assert case.said in cause and "\n" not in cause
    assert f"cannot become Ready: {case.reason}: " in output and case.said in output
    assert degraded_at - shown_at <= DEGRADED_WITHIN_S
    assert exited_at - degraded_at <= EXIT_WITHIN_S + POLL_S
