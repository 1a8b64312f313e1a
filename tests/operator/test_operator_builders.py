"""The pure builders: every child a spec produces, checked against the pod contract and the API schemas."""

from __future__ import annotations

import argparse
import copy
import os
import shlex
import signal
import stat
import subprocess
import time
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from kubetriton import podenv
from kubetriton.drain import request_sidecar_stop
from kubetriton.operator import children, naming, pod
from kubetriton.operator.spec import DEFAULT_STARTUP_SECONDS, PyTritonModel
from kubetriton.sidecar import bootstrap as sidecar_bootstrap

KUBERNETES_VERSION = "1.37.0"

BASE: dict[str, Any] = {
    "metadata": {"name": "esm1", "namespace": "models"},
    "spec": {"worker": {"image": "registry.example.com/esm1:1"}, "models": ["ESM1"]},
}


def model_with(**spec_changes: Any) -> PyTritonModel:
    document = copy.deepcopy(BASE)
    document["spec"].update(spec_changes)
    return PyTritonModel.model_validate(document)


ROUTER_GONE = [
    "ConfigMap esm1-router",
    "Deployment esm1-router",
    "Service esm1-router",
    "PodDisruptionBudget esm1-router",
]
ROUTER_KINDS = ["ConfigMap", "Deployment", "Service", "PodDisruptionBudget"]
SCENARIOS: list[tuple[str, dict[str, Any], bool, list[str], list[str]]] = [
    # id, spec changes, ServiceMonitor CRD present, wanted kinds, children to delete
    (
        "defaults",
        {},
        False,
        ["Deployment", "Service", "Service"],
        ["PodDisruptionBudget", "HorizontalPodAutoscaler", *ROUTER_GONE],
    ),
    (
        "one replica",
        {"replicas": 1},
        True,
        ["Deployment", "Service", "Service", "ServiceMonitor"],
        ["PodDisruptionBudget", "HorizontalPodAutoscaler", *ROUTER_GONE],
    ),
    (
        "two replicas",
        {"replicas": 2, "gpus": {"count": 1}},
        False,
        ["Deployment", "Service", "Service", "PodDisruptionBudget"],
        ["HorizontalPodAutoscaler", *ROUTER_GONE],
    ),
    (
        "autoscaling from one",
        {"autoscaling": {"maxReplicas": 4}},
        False,
        ["Deployment", "Service", "Service", "HorizontalPodAutoscaler"],
        ["PodDisruptionBudget", *ROUTER_GONE],
    ),
    (
        "autoscaling from two on MIG",
        {
            "autoscaling": {"minReplicas": 2, "maxReplicas": 4, "targetCPUUtilization": 60},
            "gpus": {"count": 1, "resourceName": "nvidia.com/mig-1g.10gb"},
        },
        True,
        [
            "Deployment",
            "Service",
            "Service",
            "PodDisruptionBudget",
            "HorizontalPodAutoscaler",
            "ServiceMonitor",
        ],
        [*ROUTER_GONE],
    ),
    (
        "autoscaling on the model's own queue time: the operator scales, no HPA",
        {"autoscaling": {"minReplicas": 2, "maxReplicas": 4, "targetQueueMilliseconds": 10}},
        False,
        ["Deployment", "Service", "Service", "PodDisruptionBudget"],
        ["HorizontalPodAutoscaler", *ROUTER_GONE],
    ),
    (
        "everything set",
        {
            "replicas": 3,
            "gpus": {"count": 2},
            "sharedMemory": "2Gi",
            "drainSeconds": 90,
            "worker": {
                "image": "w:1",
                "command": ["python", "serve.py"],
                "args": ["--x"],
                "imagePullPolicy": "Always",
                "env": [
                    {"name": "A", "value": "1"},
                    {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hub", "key": "token"}}},
                ],
                "envFrom": [{"configMapRef": {"name": "settings"}, "prefix": "APP_"}],
                "volumeMounts": [{"name": "weights", "mountPath": "/models", "readOnly": True}],
                "resources": {"requests": {"cpu": "1"}, "limits": {"memory": "4Gi"}},
            },
            "volumes": [
                {"name": "weights", "persistentVolumeClaim": {"claimName": "hf-cache", "readOnly": True}}
            ],
            "imagePullSecrets": [{"name": "registry"}],
            "podLabels": {"team": "ml"},
            "podAnnotations": {"sidecar.istio.io/inject": "false"},
            "runtimeClassName": "nvidia",
            "startupSeconds": 900,
            "bootstrap": {"resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}},
            "triton": {
                "image": "t:1",
                "args": ["--log-info=true"],
                "resources": {"requests": {"cpu": "500m"}},
            },
            "scheduling": {
                "nodeSelector": {"gpu": "a100"},
                "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                "affinity": {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [
                                {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
                            ]
                        }
                    }
                },
                "topologySpreadConstraints": [
                    {
                        "maxSkew": 1,
                        "topologyKey": "kubernetes.io/hostname",
                        "whenUnsatisfiable": "DoNotSchedule",
                    }
                ],
                "priorityClassName": "inference",
            },
            "service": {
                "type": "LoadBalancer",
                "ports": {"http": 80, "grpc": 81, "metrics": 82, "worker": 83},
            },
            "serviceAccountName": "esm1-reader",
        },
        False,
        ["Deployment", "Service", "Service", "PodDisruptionBudget"],
        ["HorizontalPodAutoscaler", *ROUTER_GONE],
    ),
    (
        "a router in front of the pods",
        {"replicas": 3, "router": True, "service": {"ports": {"http": 80, "grpc": 81}}},
        True,
        ["Deployment", "Service", "Service", "PodDisruptionBudget", "ServiceMonitor", *ROUTER_KINDS],
        ["HorizontalPodAutoscaler"],
    ),
    (
        "a router, autoscaled to more pods than the router has slots for by default",
        {"router": True, "autoscaling": {"maxReplicas": 100, "targetQueueMilliseconds": 10}},
        False,
        ["Deployment", "Service", "Service", *ROUTER_KINDS],
        ["PodDisruptionBudget", "HorizontalPodAutoscaler"],
    ),
]
IDS = [scenario[0] for scenario in SCENARIOS]


@pytest.mark.parametrize(("changes", "monitor", "kinds", "gone"), [s[1:] for s in SCENARIOS], ids=IDS)
def test_children_per_spec(changes: dict[str, Any], monitor: bool, kinds: list[str], gone: list[str]) -> None:
    model = model_with(**changes)
    built = children.desired(model, service_monitor=monitor)
    assert [obj["kind"] for obj in built] == kinds
    assert [
        child.describe("esm1") for child in children.unwanted(model, service_monitor_available=monitor)
    ] == gone
    routed = ["esm1-router"] if model.spec.router else []
    assert [obj["metadata"]["name"] for obj in built if obj["kind"] == "Service"] == [
        "esm1",
        "esm1-pods",
        *routed,
    ]
    for obj in built:
        assert obj["metadata"]["namespace"] == "models"
        assert obj["metadata"]["labels"] == {
            "app.kubernetes.io/name": "pytriton-model",
            "app.kubernetes.io/instance": "esm1",
            "app.kubernetes.io/managed-by": "kubetriton-operator",
        }


@pytest.mark.parametrize(("changes", "monitor"), [s[1:3] for s in SCENARIOS], ids=IDS)
def test_children_pass_the_kubernetes_schemas(changes: dict[str, Any], monitor: bool) -> None:
    for obj in children.desired(model_with(**changes), service_monitor=monitor):
        if obj["kind"] == "ServiceMonitor":
            assert obj["spec"]["endpoints"] == [
                {"port": "metrics", "path": "/metrics"},
                {"port": "worker", "path": "/metrics"},
            ]
            continue
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)


def test_a_drain_evicts_one_ready_pod_at_a_time_and_any_pod_that_is_not_ready() -> None:
    """Both budgets, the model's and its router's: a pod that is not Ready serves nothing, so a model that
    cannot become Ready, or a router with no pod to send to, does not hold up a node's drain."""
    built = children.desired(model_with(replicas=3, router=True), service_monitor=False)
    budgets = {obj["metadata"]["name"]: obj["spec"] for obj in built if obj["kind"] == "PodDisruptionBudget"}
    assert set(budgets) == {"esm1", "esm1-router"}
    for spec in budgets.values():
        assert (spec["maxUnavailable"], spec["unhealthyPodEvictionPolicy"]) == (1, "AlwaysAllow")
    assert budgets["esm1"]["selector"]["matchLabels"] == naming.selector_labels("esm1")
    assert budgets["esm1-router"]["selector"]["matchLabels"] == naming.router_selector_labels("esm1")


def test_the_pods_service_lists_each_ready_pod_and_the_metrics_ports_one_service_only_has() -> None:
    model = model_with(
        service={"type": "LoadBalancer", "ports": {"http": 80, "grpc": 81, "metrics": 82, "worker": 83}}
    )
    service, pods = children.build_service(model), children.build_pods_service(model)
    assert pods["metadata"]["name"] == "esm1-pods"
    assert pods["spec"]["clusterIP"] == "None"
    assert "type" not in pods["spec"] and "publishNotReadyAddresses" not in pods["spec"]
    assert pods["spec"]["selector"] == service["spec"]["selector"]
    assert pods["spec"]["ports"][:2] == service["spec"]["ports"], "HTTP and gRPC, as the model's Service"
    assert [port["name"] for port in service["spec"]["ports"]] == ["http", "grpc"], "nothing else published"
    assert [port["name"] for port in pods["spec"]["ports"]] == ["http", "grpc", "metrics", "worker"]
    internal = model_with(service={"ports": {"http": 80, "grpc": 81, "metrics": 82, "worker": 83}})
    service, pods = children.build_service(internal), children.build_pods_service(internal)
    assert [port["name"] for port in service["spec"]["ports"]] == ["http", "grpc", "metrics", "worker"]
    assert [port["name"] for port in pods["spec"]["ports"]] == ["http", "grpc"], "each pod scraped once"


@pytest.mark.parametrize(
    ("model_name", "suffix", "expected"),
    [
        ("esm1", "-pods", "esm1-pods"),
        ("a" * 58, "-pods", "a" * 58 + "-pods"),
        ("a" * 59, "-pods", "a" * 49 + "-111bb261-pods"),
        ("a" * 63, "-router", "a" * 47 + "-7d3e74a0-router"),
    ],
)
def test_a_childs_name_is_a_dns_label_that_names_one_model(
    model_name: str, suffix: str, expected: str
) -> None:
    name = naming.child_name(model_name, suffix)
    assert len(name) <= 63
    assert name.endswith(suffix)
    assert name == expected


def _deployment(**changes: Any) -> dict[str, Any]:
    return children.build_deployment(model_with(**changes))


def _containers(deployment: dict[str, Any]) -> dict[str, dict[str, Any]]:
    pod_spec = deployment["spec"]["template"]["spec"]
    return {c["name"]: c for c in [*pod_spec["initContainers"], *pod_spec["containers"]]}


def test_bootstrap_runs_before_the_native_sidecar() -> None:
    pod_spec = _deployment()["spec"]["template"]["spec"]
    assert [c["name"] for c in pod_spec["initContainers"]] == ["bootstrap", "triton"]
    bootstrap, triton = pod_spec["initContainers"]
    assert bootstrap["image"] == "registry.example.com/esm1:1"
    assert bootstrap["command"] == ["kubetriton", "bootstrap"]
    assert bootstrap["volumeMounts"] == [{"name": "workspace", "mountPath": podenv.WORKSPACE_MOUNT}]
    assert "restartPolicy" not in bootstrap
    assert triton["restartPolicy"] == "Always"
    assert [c["name"] for c in pod_spec["containers"]] == ["worker"]


def test_a_script_from_a_config_map_runs_with_the_launcher_in_the_users_image() -> None:
    worker_spec = {
        "image": "python:3.13-slim",
        "script": {"configMap": "esm1-script-0a1b", "entrypoint": "app.py"},
    }
    model = model_with(
        worker=worker_spec, bootstrap={"image": "registry.example.com/kubetriton/worker:0.1.0"}
    )
    deployment = children.build_deployment(model)
    containers = _containers(deployment)
    assert containers["bootstrap"]["image"] == "registry.example.com/kubetriton/worker:0.1.0"
    worker = containers["worker"]
    assert worker["image"] == "python:3.13-slim"
    launcher = f"{podenv.WORKSPACE_MOUNT}/{podenv.WORKER_RUNTIME_SUBDIR}/{podenv.LAUNCHER}"
    assert worker["command"] == ["python3", launcher, f"{podenv.SCRIPT_MOUNT}/app.py"]
    assert {"name": "script", "mountPath": podenv.SCRIPT_MOUNT, "readOnly": True} in worker["volumeMounts"]
    volumes = deployment["spec"]["template"]["spec"]["volumes"]
    assert {"name": "script", "configMap": {"name": "esm1-script-0a1b"}} in volumes
    changed = model_with(
        worker={**worker_spec, "script": {"configMap": "esm1-script-2c3d", "entrypoint": "app.py"}}
    )
    assert children.fingerprint(children.build_deployment(changed)) != children.fingerprint(deployment), (
        "a new script must roll the pods"
    )


def test_a_given_command_wins_over_the_script_and_without_a_bootstrap_image_the_worker_image_runs_it() -> (
    None
):
    worker_spec = {"image": "registry.example.com/esm1:1", "script": {"configMap": "s"}, "command": ["serve"]}
    containers = _containers(children.build_deployment(model_with(worker=worker_spec)))
    assert containers["worker"]["command"] == ["serve"]
    assert containers["bootstrap"]["image"] == "registry.example.com/esm1:1"


LAUNCHER = f"{podenv.WORKSPACE_MOUNT}/{podenv.WORKER_RUNTIME_SUBDIR}/{podenv.LAUNCHER}"


@pytest.mark.parametrize(
    ("worker", "command"),
    [
        ({"script": {"configMap": "s"}}, ["python3", LAUNCHER, f"{podenv.SCRIPT_MOUNT}/serve.py"]),
        (
            {"command": ["python", "/app/serve.py"]},
            ["python3", LAUNCHER, "--exec", "python", "/app/serve.py"],
        ),
    ],
    ids=["script", "command"],
)
def test_several_worker_processes_run_under_the_launchers_supervision(
    worker: dict[str, Any], command: list[str]
) -> None:
    one = _containers(children.build_deployment(model_with(worker={**BASE["spec"]["worker"], **worker})))
    several = _containers(
        children.build_deployment(model_with(worker={**BASE["spec"]["worker"], **worker, "processes": 3}))
    )["worker"]
    assert several["command"] == command
    env = {variable["name"]: variable["value"] for variable in several["env"]}
    assert env[podenv.ENV_PROCESS_COUNT] == "3"
    assert env[podenv.ENV_STARTUP_SECONDS] == str(DEFAULT_STARTUP_SECONDS), "bounds a restarted process"
    attach = podenv.AttachSettings.from_environ(env)
    assert attach is not None and attach.startup_seconds == DEFAULT_STARTUP_SECONDS, (
        "as the supervisor reads it"
    )
    names = {variable["name"] for variable in one["worker"]["env"]}
    assert not names & {podenv.ENV_PROCESS_COUNT, podenv.ENV_STARTUP_SECONDS}, (
        "one process renders the pod as before: upgrading the operator must not roll existing models"
    )


@pytest.mark.parametrize("image", [podenv.TRITON_IMAGE, "nvcr.io/nvidia/tritonserver:25.01-py3"])
def test_bootstrap_prepares_the_runtime_for_the_sidecar_image(image: str) -> None:
    containers = _containers(_deployment(triton={"image": image}))
    env = {e["name"]: e["value"] for e in containers["bootstrap"]["env"]}
    with pytest.MonkeyPatch.context() as patch:
        for name, value in env.items():
            patch.setenv(name, value)
        arguments = argparse.ArgumentParser()
        sidecar_bootstrap.add_arguments(arguments)
        parsed = arguments.parse_args([])
    assert parsed.triton_image == containers["triton"]["image"] == image
    assert str(parsed.workspace) == podenv.WORKSPACE_MOUNT
    assert sidecar_bootstrap.sidecar_python(parsed.triton_image)


def test_triton_sidecar_is_the_stock_image_without_a_gpu() -> None:
    triton = _containers(_deployment())["triton"]
    assert triton["image"] == podenv.TRITON_IMAGE
    env = {e["name"]: e["value"] for e in triton["env"]}
    assert env == {"NVIDIA_VISIBLE_DEVICES": "void"}
    assert triton["startupProbe"]["httpGet"] == {"path": "/v2/health/live", "port": podenv.HTTP_PORT}
    assert "resources" not in triton


def _local_sidecar_script(spec: Any, workspace: Path) -> str:
    """The sidecar's shell line with the workspace's token files and stop FIFO in a local directory."""
    script = pod.triton_command(spec)[2]
    for name in (podenv.REPOSITORY_TOKEN_FILE, podenv.ACCESS_TOKEN_FILE, podenv.SIDECAR_STOP_FIFO):
        script = script.replace(f"{podenv.WORKSPACE_MOUNT}/{name}", str(workspace / name))
    return script


def _fake_tritonserver(directory: Path, body: str) -> dict[str, str]:
    """An environment whose PATH finds a stand-in `tritonserver` shell script with this body."""
    fake = directory / "bin" / "tritonserver"
    fake.parent.mkdir()
    fake.write_text(f"#!/bin/sh\n{body}\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    return {**os.environ, "PATH": f"{fake.parent}:{os.environ['PATH']}"}


@pytest.mark.parametrize("token", ["plain", "with space", 'it\'s "quoted" $(rm -rf /) `x` \\ ;&|'])
def test_triton_command_passes_the_tokens_from_the_workspace_files(tmp_path: Path, token: str) -> None:
    """Run the sidecar's shell line with a stand-in tritonserver that prints the arguments it got."""
    model = model_with(drainSeconds=45, triton={"args": ["--log-info=true", "--id=a b"]})
    shell, flag, _ = pod.triton_command(model.spec)
    assert (shell, flag) == ("/bin/sh", "-c")
    (tmp_path / podenv.REPOSITORY_TOKEN_FILE).write_text(token)
    (tmp_path / podenv.ACCESS_TOKEN_FILE).write_text(f"access {token}")
    env = _fake_tritonserver(tmp_path, 'for a in "$@"; do printf "%s\\n" "$a"; done')
    script = _local_sidecar_script(model.spec, tmp_path)
    printed = subprocess.run([shell, flag, script], env=env, capture_output=True, text=True, check=True)
    expected = podenv.tritonserver_args(
        model_repository="/workspace/models",
        repository_token=token,
        access_token=f"access {token}",
        exit_timeout_s=podenv.SIDECAR_EXIT_TIMEOUT_S,
    )
    expected += [
        f"--backend-config=python,shm-region-prefix-name={podenv.SIDECAR_SHM_PREFIX}",
        f"--grpc-max-connection-age={podenv.GRPC_MAX_CONNECTION_AGE_S * 1000}",
        "--grpc-max-connection-age-grace=45000",
        f"--cache-config={podenv.DEFAULT_CACHE_CONFIG}",
        pod.LATENCY_SUMMARIES,
        "--log-info=true",
        "--id=a b",
    ]
    assert printed.stdout.splitlines() == expected
    assert not (tmp_path / podenv.SIDECAR_STOP_FIFO).exists(), "the stop FIFO outlived the sidecar"


def test_grpc_connections_age_within_a_short_drain_budget() -> None:
    script = pod.triton_command(model_with(drainSeconds=2).spec)[2]
    assert "--grpc-max-connection-age=2000 " in script
    assert "--grpc-max-connection-age-grace=2000 " in script


@pytest.mark.parametrize("stop", ["fifo", "sigterm"])
def test_the_sidecar_passes_a_stop_on_to_tritonserver(tmp_path: Path, stop: str) -> None:
    """A line on the stop FIFO (the draining worker) or SIGTERM (the kubelet) makes the shell send SIGTERM to
    tritonserver, and the shell exits with tritonserver's status once it has stopped."""
    (tmp_path / podenv.REPOSITORY_TOKEN_FILE).write_text("t")
    (tmp_path / podenv.ACCESS_TOKEN_FILE).write_text("a")
    started, stopped = tmp_path / "started", tmp_path / "stopped"
    env = _fake_tritonserver(
        tmp_path,
        f"trap 'touch {stopped}; exit 7' TERM; touch {started}; while :; do sleep 0.05; done",
    )
    sidecar = subprocess.Popen(["/bin/sh", "-c", _local_sidecar_script(model_with().spec, tmp_path)], env=env)
    try:
        deadline = time.monotonic() + 10
        while not started.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert started.exists(), "tritonserver did not start"
        if stop == "fifo":
            assert request_sidecar_stop(tmp_path / podenv.SIDECAR_STOP_FIFO)
        else:
            sidecar.send_signal(signal.SIGTERM)
        assert sidecar.wait(10) == 7
    finally:
        sidecar.kill()
    assert stopped.exists(), "tritonserver did not get SIGTERM"
    assert not request_sidecar_stop(tmp_path / podenv.SIDECAR_STOP_FIFO), "nothing listens once it has gone"


def test_triton_gets_the_default_response_cache_unless_the_user_configures_one() -> None:
    default = f"--cache-config={podenv.DEFAULT_CACHE_CONFIG}"
    assert shlex.quote(default) in pod.triton_command(model_with().spec)[2]
    own = model_with(triton={"args": ["--cache-config=local,size=1048576"]})
    script = pod.triton_command(own.spec)[2]
    assert shlex.quote(default) not in script and "--cache-config=local,size=1048576" in script


def test_triton_reports_latency_quantiles_unless_the_user_turns_them_off() -> None:
    assert pod.LATENCY_SUMMARIES in pod.triton_arguments(model_with().spec)
    off = "--metrics-config=summary_latencies=false"
    arguments = pod.triton_arguments(model_with(triton={"args": [off]}).spec)
    assert pod.LATENCY_SUMMARIES not in arguments and arguments[-1] == off


def test_triton_does_not_start_without_the_token_file(tmp_path: Path) -> None:
    env = _fake_tritonserver(tmp_path, "echo started")
    missing = _local_sidecar_script(model_with().spec, tmp_path)
    result = subprocess.run(["/bin/sh", "-c", missing], env=env, capture_output=True, text=True)
    assert result.returncode != 0
    assert "started" not in result.stdout


def test_worker_gets_the_contract_environment_last() -> None:
    worker = _containers(
        _deployment(
            models=["A", "B"],
            drainSeconds=12,
            worker={"image": "w:1", "env": [{"name": "HF_HOME", "value": "/hf"}]},
        )
    )["worker"]
    names = [e["name"] for e in worker["env"]]
    assert names[0] == "HF_HOME"
    contract = {e["name"]: e["value"] for e in worker["env"][1:]}
    assert contract == {
        podenv.ENV_MODE: "attach",
        podenv.ENV_WORKSPACE: podenv.WORKSPACE_MOUNT,
        podenv.ENV_TRITON_HOST: "127.0.0.1",
        podenv.ENV_MODELS: "A,B",
        podenv.ENV_DRAIN_SECONDS: "12",
        podenv.ENV_HEALTH_PORT: str(podenv.HEALTH_PORT),
    }
    attach = podenv.AttachSettings.from_environ({e["name"]: e["value"] for e in worker["env"]})
    assert attach is not None and attach.models == ("A", "B") and attach.drain_seconds == 12
    assert attach.startup_seconds is None, "one process: no restarted process to bound"


@pytest.mark.parametrize(
    ("gpus", "resources", "expected"),
    [
        ({}, {}, None),
        ({"count": 1}, {}, {"limits": {"nvidia.com/gpu": 1}}),
        (
            {"count": 2, "resourceName": "nvidia.com/mig-1g.10gb"},
            {"limits": {"memory": "1Gi"}},
            {"limits": {"memory": "1Gi", "nvidia.com/mig-1g.10gb": 2}},
        ),
        ({"count": 1, "resourceName": "nvidia.com/gpu.shared"}, {}, {"limits": {"nvidia.com/gpu.shared": 1}}),
    ],
)
def test_worker_requests_the_gpus(gpus: dict[str, Any], resources: dict[str, Any], expected: Any) -> None:
    worker = _containers(_deployment(gpus=gpus, worker={"image": "w:1", "resources": resources}))["worker"]
    assert worker.get("resources") == expected


def test_worker_health_and_shutdown() -> None:
    deployment = _deployment(drainSeconds=40)
    worker = _containers(deployment)["worker"]
    assert worker["ports"] == [{"name": "health", "containerPort": 8080}]
    assert worker["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": 8080}
    assert worker["livenessProbe"]["httpGet"] == {"path": "/livez", "port": 8080}
    pre_stop = worker["lifecycle"]["preStop"]["sleep"]["seconds"]
    grace = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace >= pre_stop + 40 + podenv.SIDECAR_EXIT_TIMEOUT_S
    sidecar_script = _containers(deployment)["triton"]["command"][2]
    assert f"--exit-timeout-secs={podenv.SIDECAR_EXIT_TIMEOUT_S}" in sidecar_script
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0


def test_volumes_and_mounts() -> None:
    pod_spec = _deployment(gpus={"count": 2})["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod_spec["volumes"]}
    assert volumes["workspace"] == {"name": "workspace", "emptyDir": {}}
    assert volumes["dshm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "1088Mi"}
    mounts = {
        name: {m["mountPath"] for m in c["volumeMounts"]}
        for name, c in _containers({"spec": {"template": {"spec": pod_spec}}}).items()
    }
    assert mounts == {
        "bootstrap": {"/workspace"},
        "triton": {"/workspace", "/dev/shm", "/tmp"},
        "worker": {"/workspace", "/dev/shm"},
    }
    assert volumes[podenv.TRITON_TMP_VOLUME] == {"name": podenv.TRITON_TMP_VOLUME, "emptyDir": {}}


def test_pod_meets_the_restricted_standard() -> None:
    pod_spec = _deployment()["spec"]["template"]["spec"]
    assert pod_spec["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": podenv.RUN_AS_UID,
        "runAsGroup": podenv.RUN_AS_UID,
        "fsGroup": podenv.RUN_AS_UID,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    restricted = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    read_only = {**restricted, "readOnlyRootFilesystem": True}
    contexts = {name: c["securityContext"] for name, c in _containers(_deployment()).items()}
    # the user's image may write where it likes; kubetriton's steps write only into their volumes
    assert contexts == {"bootstrap": read_only, "triton": read_only, "worker": restricted}
    assert pod_spec["automountServiceAccountToken"] is False, "no API token for the user's code and Triton"


def test_replicas_belong_to_the_autoscaler_when_there_is_one() -> None:
    assert _deployment()["spec"]["replicas"] == 1
    assert _deployment(replicas=0)["spec"]["replicas"] == 0
    assert "replicas" not in _deployment(autoscaling={"maxReplicas": 3})["spec"]


def test_an_autoscaled_deployment_is_created_with_its_minimum() -> None:
    autoscaled = model_with(autoscaling={"minReplicas": 2, "maxReplicas": 5})
    steady = children.build_deployment(autoscaled)
    first = children.first_deployment(steady, autoscaled)
    assert first["spec"]["replicas"] == 2
    assert "replicas" not in steady["spec"]
    fixed = model_with(replicas=3)
    assert children.first_deployment(children.build_deployment(fixed), fixed)["spec"]["replicas"] == 3


def test_the_handover_keeps_the_live_count_but_not_below_the_minimum() -> None:
    autoscaled = model_with(autoscaling={"minReplicas": 2, "maxReplicas": 5})
    assert children.build_replicas(autoscaled, 3)["spec"] == {"replicas": 3}
    assert children.build_replicas(autoscaled, 1)["spec"] == {"replicas": 2}


def test_a_stamped_child_carries_the_fingerprint_of_what_is_applied() -> None:
    service = children.build_service(model_with())
    stamped = children.stamped(service)
    annotation = stamped["metadata"]["annotations"][children.FINGERPRINT_ANNOTATION]
    assert annotation == children.fingerprint(service)
    assert "annotations" not in service["metadata"]
    other = children.build_service(model_with(service={"ports": {"http": 80}}))
    assert children.fingerprint(other) != annotation


def test_service_ports() -> None:
    service = children.build_service(model_with(service={"ports": {"http": 80}}))
    assert service["spec"]["ports"] == [
        {"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"},
        {"name": "grpc", "port": 8001, "targetPort": "grpc", "protocol": "TCP", "appProtocol": "grpc"},
        {"name": "metrics", "port": 8002, "targetPort": "metrics", "protocol": "TCP"},
        {"name": "worker", "port": 8080, "targetPort": "health", "protocol": "TCP"},
    ]
    assert service["spec"]["selector"] == {
        "app.kubernetes.io/name": "pytriton-model",
        "app.kubernetes.io/instance": "esm1",
    }


@pytest.mark.parametrize(
    ("autoscaling", "metrics"),
    [
        (
            {"maxReplicas": 3},
            [
                {
                    "type": "Resource",
                    "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 80}},
                }
            ],
        ),
        (
            {"maxReplicas": 3, "targetCPUUtilization": 55},
            [
                {
                    "type": "Resource",
                    "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 55}},
                }
            ],
        ),
        (
            {
                "maxReplicas": 3,
                "metrics": [
                    {
                        "type": "Pods",
                        "pods": {
                            "metric": {"name": "queue"},
                            "target": {"type": "AverageValue", "averageValue": "5"},
                        },
                    }
                ],
            },
            [
                {
                    "type": "Pods",
                    "pods": {
                        "metric": {"name": "queue"},
                        "target": {"type": "AverageValue", "averageValue": "5"},
                    },
                }
            ],
        ),
    ],
)
def test_autoscaler_metrics(autoscaling: dict[str, Any], metrics: list[dict[str, Any]]) -> None:
    hpa = children.build_horizontal_pod_autoscaler(model_with(autoscaling=autoscaling))
    assert hpa["spec"]["metrics"] == metrics
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "esm1"}
    kubernetes_validate.validate(hpa, KUBERNETES_VERSION, strict=True)


def test_the_users_pod_settings_reach_the_pod() -> None:
    """Volumes, mounts, envFrom, pull secrets, labels, annotations, runtime class and the bootstrap's
    resources land where they belong, beside the operator's own, which keep winning."""
    ((_, changes, *_),) = [scenario for scenario in SCENARIOS if scenario[0] == "everything set"]
    template = _deployment(**changes)["spec"]["template"]
    pod_spec, containers = template["spec"], _containers(_deployment(**changes))
    assert [volume["name"] for volume in pod_spec["volumes"]] == [
        podenv.WORKSPACE_VOLUME,
        podenv.SHM_VOLUME,
        podenv.TRITON_TMP_VOLUME,
        "weights",
        podenv.API_TOKEN_VOLUME,
    ]
    assert pod_spec["volumes"][3] == changes["volumes"][0]
    worker = containers["worker"]
    assert worker["volumeMounts"][-2] == {"name": "weights", "mountPath": "/models", "readOnly": True}
    assert worker["envFrom"] == [{"configMapRef": {"name": "settings"}, "prefix": "APP_"}]
    assert {"name": "weights", "mountPath": "/models", "readOnly": True} not in containers["triton"][
        "volumeMounts"
    ]
    assert pod_spec["imagePullSecrets"] == [{"name": "registry"}]
    assert pod_spec["runtimeClassName"] == "nvidia"
    assert pod_spec["serviceAccountName"] == "esm1-reader"
    assert pod_spec["automountServiceAccountToken"] is False, "the account's token for the worker only:"
    token = {"name": podenv.API_TOKEN_VOLUME, "mountPath": podenv.API_TOKEN_MOUNT, "readOnly": True}
    assert worker["volumeMounts"][-1] == token
    assert all(token not in containers[name].get("volumeMounts", []) for name in ("triton", "bootstrap"))
    (projected,) = [volume["projected"] for volume in pod_spec["volumes"] if "projected" in volume]
    assert [next(iter(source)) for source in projected["sources"]] == [
        "serviceAccountToken",
        "configMap",
        "downwardAPI",
    ]
    assert template["metadata"]["labels"]["team"] == "ml"
    assert template["metadata"]["labels"]["app.kubernetes.io/instance"] == "esm1"
    assert template["metadata"]["annotations"] == {"sidecar.istio.io/inject": "false"}
    assert containers["bootstrap"]["resources"] == {"requests": {"cpu": "100m", "memory": "64Mi"}}


@pytest.mark.parametrize(("startup_seconds", "failures"), [(None, 240), (900, 180), (12, 3)])
def test_a_slow_worker_start_gets_its_budget_before_liveness(
    startup_seconds: int | None, failures: int
) -> None:
    changes = {} if startup_seconds is None else {"startupSeconds": startup_seconds}
    worker = _containers(_deployment(**changes))["worker"]
    startup = worker["startupProbe"]
    assert startup["httpGet"] == worker["livenessProbe"]["httpGet"] == {"path": "/livez", "port": 8080}
    assert startup["periodSeconds"] * startup["failureThreshold"] >= (startup_seconds or 1200)
    assert startup["failureThreshold"] == failures
