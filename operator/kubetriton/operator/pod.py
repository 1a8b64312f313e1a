"""The pod template of a model: bootstrap step, Triton native sidecar and the user's worker.

This is the pod contract of DESIGN.md ("Pod shape") written as a pure function. Every name, path and
port comes from `kubetriton.podenv`, which the worker and the sidecar read on their side.
"""

from __future__ import annotations

import re
import shlex
from typing import Any

from kubetriton import podenv
from kubetriton.operator import naming
from kubetriton.operator.spec import PyTritonModel, PyTritonModelSpec

BOOTSTRAP_CONTAINER = "bootstrap"
TRITON_CONTAINER = "triton"
WORKER_CONTAINER = "worker"

STARTUP_PROBE_PERIOD_S = 5
PRESTOP_SECONDS = 5
"""How long a stopping pod keeps serving so that the endpoints controller can take it out of the Service."""
SHUTDOWN_SLACK_SECONDS = 10
"""Grace beyond preStop, drain and Triton's exit timeout, for unloading the models and exiting."""

_TOKEN_VARIABLES = {"\x00repository-token\x00": "token", "\x00access-token\x00": "access"}
"""Placeholders in the sidecar's arguments, and the shell variables that hold the secrets at run time."""
_REPOSITORY_TOKEN, _ACCESS_TOKEN = _TOKEN_VARIABLES


def _restricted_security_context(*, read_only_root: bool = False) -> dict[str, Any]:
    """The worker runs the user's image, which may write where it likes (caches, weights); the bootstrap
    step and the Triton sidecar write only into their volumes (the workspace, /dev/shm, Triton's /tmp)."""
    context: dict[str, Any] = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    if read_only_root:
        context["readOnlyRootFilesystem"] = True
    return context


def _workspace_mount() -> dict[str, str]:
    return {"name": podenv.WORKSPACE_VOLUME, "mountPath": podenv.WORKSPACE_MOUNT}


def _shm_mount() -> dict[str, str]:
    return {"name": podenv.SHM_VOLUME, "mountPath": podenv.SHM_MOUNT}


def _quote_with_tokens(argument: str) -> str:
    """Shell-quote one argument, with the token placeholders turned into their shell variables."""
    parts = re.split("(" + "|".join(_TOKEN_VARIABLES) + ")", argument)
    return "".join(
        f'"${_TOKEN_VARIABLES[part]}"' if part in _TOKEN_VARIABLES else shlex.quote(part) if part else ""
        for part in parts
    )


LATENCY_SUMMARIES = "--metrics-config=summary_latencies=true"
"""Triton's latency quantiles (nv_inference_request_summary_us), which the dashboard's p50/p99 panels read;
a model's own `--metrics-config=summary_latencies=...` argument replaces it."""


def triton_arguments(spec: PyTritonModelSpec) -> list[str]:
    """tritonserver's arguments in the sidecar, the repository and access tokens as placeholders."""
    arguments = podenv.tritonserver_args(
        model_repository=f"{podenv.WORKSPACE_MOUNT}/{podenv.MODELS_SUBDIR}",
        repository_token=_REPOSITORY_TOKEN,
        access_token=_ACCESS_TOKEN,
        exit_timeout_s=podenv.SIDECAR_EXIT_TIMEOUT_S,
    )
    connection_age_s = min(podenv.GRPC_MAX_CONNECTION_AGE_S, spec.drain_seconds)
    arguments += [
        f"--backend-config=python,shm-region-prefix-name={podenv.SIDECAR_SHM_PREFIX}",
        f"--grpc-max-connection-age={connection_age_s * 1000}",
        f"--grpc-max-connection-age-grace={spec.drain_seconds * 1000}",
    ]
    if not any(argument.startswith("--cache-config") for argument in spec.triton.args):
        arguments.append(f"--cache-config={podenv.DEFAULT_CACHE_CONFIG}")
    if not any(argument.startswith("--metrics-config=summary_latencies") for argument in spec.triton.args):
        arguments.append(LATENCY_SUMMARIES)
    return [*arguments, *spec.triton.args]


def triton_command(spec: PyTritonModelSpec) -> list[str]:
    """`/bin/sh -c` that reads the repository and access tokens from the workspace, removes the shared
    memory a killed predecessor left in the pod's /dev/shm, and runs tritonserver until it exits.

    The shell stays as the container's first process: it passes SIGTERM on to tritonserver, and sends it
    SIGTERM itself when a line arrives on the stop FIFO, which the draining worker writes."""
    workspace = podenv.WORKSPACE_MOUNT
    token_file = shlex.quote(f"{workspace}/{podenv.REPOSITORY_TOKEN_FILE}")
    access_file = shlex.quote(f"{workspace}/{podenv.ACCESS_TOKEN_FILE}")
    stop_fifo = shlex.quote(f"{workspace}/{podenv.SIDECAR_STOP_FIFO}")
    stale_regions = shlex.quote(f"{podenv.SHM_MOUNT}/{podenv.SIDECAR_SHM_PREFIX}") + "*"
    line = " ".join(_quote_with_tokens(argument) for argument in triton_arguments(spec))
    script = "; ".join(
        [
            f'token="$(cat {token_file})" && access="$(cat {access_file})"'
            f" && rm -f {stale_regions} {stop_fifo}"
            f" && mkfifo -m 600 {stop_fifo} || exit 1",
            f"tritonserver {line} & server=$!",
            # the reader starts before the trap: a subshell forked while a trap is set may swallow the
            # SIGTERM that ends it, and then waits on the FIFO forever
            f'{{ read -r _ < {stop_fifo} && kill -TERM "$server"; }} & reader=$!',
            "trap 'kill -TERM \"$server\"' TERM INT",
            'status=0; while kill -0 "$server" 2>/dev/null; do wait "$server"; status=$?; done',
            f'kill "$reader" 2>/dev/null; rm -f {stop_fifo}; exit "$status"',
        ]
    )
    return ["/bin/sh", "-c", script]


def _bootstrap_container(spec: PyTritonModelSpec) -> dict[str, Any]:
    """The init step, from the kubetriton worker image: the proxy's runtime for the sidecar, the worker's for
    an image without kubetriton, and the tokens."""
    image = spec.bootstrap.image or spec.worker.image
    container: dict[str, Any] = {
        "name": BOOTSTRAP_CONTAINER,
        "image": image,
        "command": ["kubetriton", "bootstrap"],
        "env": [
            {"name": podenv.ENV_WORKSPACE, "value": podenv.WORKSPACE_MOUNT},
            {"name": podenv.ENV_TRITON_IMAGE, "value": spec.triton.image},
        ],
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "volumeMounts": [_workspace_mount()],
        "securityContext": _restricted_security_context(read_only_root=True),
    }
    if spec.worker.image_pull_policy and image == spec.worker.image:
        container["imagePullPolicy"] = spec.worker.image_pull_policy
    if spec.bootstrap.resources:
        container["resources"] = spec.bootstrap.resources
    return container


def _http_probe(path: str, port: int, *, period: int, failures: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": port},
        "periodSeconds": period,
        "failureThreshold": failures,
        "timeoutSeconds": 2,
    }


def _triton_container(spec: PyTritonModelSpec) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": TRITON_CONTAINER,
        "image": spec.triton.image,
        "restartPolicy": "Always",
        "command": triton_command(spec),
        "env": [
            {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"},
        ],
        "ports": [
            {"name": "http", "containerPort": podenv.HTTP_PORT},
            {"name": "grpc", "containerPort": podenv.GRPC_PORT},
            {"name": "metrics", "containerPort": podenv.METRICS_PORT},
        ],
        "startupProbe": _http_probe("/v2/health/live", podenv.HTTP_PORT, period=2, failures=150),
        "livenessProbe": _http_probe("/v2/health/live", podenv.HTTP_PORT, period=10, failures=3),
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "volumeMounts": [
            _workspace_mount(),
            _shm_mount(),
            {"name": podenv.TRITON_TMP_VOLUME, "mountPath": podenv.TRITON_TMP_MOUNT},
        ],
        "securityContext": _restricted_security_context(read_only_root=True),
    }
    if spec.triton.resources:
        container["resources"] = spec.triton.resources
    return container


def worker_environment(spec: PyTritonModelSpec) -> list[dict[str, str]]:
    """The contract's variables; they come after the user's so that a stray override cannot win."""
    contract = {
        podenv.ENV_MODE: "attach",
        podenv.ENV_WORKSPACE: podenv.WORKSPACE_MOUNT,
        podenv.ENV_TRITON_HOST: "127.0.0.1",
        podenv.ENV_MODELS: ",".join(spec.models),
        podenv.ENV_DRAIN_SECONDS: str(spec.drain_seconds),
        podenv.ENV_HEALTH_PORT: str(podenv.HEALTH_PORT),
    }
    if spec.worker.processes > 1:
        contract[podenv.ENV_PROCESS_COUNT] = str(spec.worker.processes)
        contract[podenv.ENV_STARTUP_SECONDS] = str(spec.startup_seconds)
    return [*spec.worker.env, *({"name": name, "value": value} for name, value in contract.items())]


def worker_resources(spec: PyTritonModelSpec) -> dict[str, Any]:
    """The user's resources with the GPU limit added (extended resources need only a limit)."""
    resources = {key: dict(value) for key, value in spec.worker.resources.items()}
    if spec.gpus.count:
        resources.setdefault("limits", {})[spec.gpus.resource_name] = spec.gpus.count
    return resources


def worker_command(spec: PyTritonModelSpec) -> list[str]:
    """The worker's entrypoint: the user's, or the launcher running the script from its ConfigMap (with
    whatever `python3` the image has), or none (the image's own). With several worker processes the
    launcher supervises them (KUBETRITON_PROCESS_COUNT), running the user's command through `--exec`."""
    launcher = f"{podenv.WORKSPACE_MOUNT}/{podenv.WORKER_RUNTIME_SUBDIR}/{podenv.LAUNCHER}"
    if spec.worker.command:
        if spec.worker.processes > 1:
            return ["python3", launcher, podenv.LAUNCHER_EXEC, *spec.worker.command]
        return spec.worker.command
    if spec.worker.script is None:
        return []
    return ["python3", launcher, f"{podenv.SCRIPT_MOUNT}/{spec.worker.script.entrypoint}"]


def _worker_container(spec: PyTritonModelSpec) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": WORKER_CONTAINER,
        "image": spec.worker.image,
        "env": worker_environment(spec),
        "ports": [{"name": "health", "containerPort": podenv.HEALTH_PORT}],
        "startupProbe": _http_probe(
            "/livez",
            podenv.HEALTH_PORT,
            period=STARTUP_PROBE_PERIOD_S,
            failures=-(-spec.startup_seconds // STARTUP_PROBE_PERIOD_S),
        ),
        "readinessProbe": _http_probe("/readyz", podenv.HEALTH_PORT, period=5, failures=2),
        "livenessProbe": _http_probe("/livez", podenv.HEALTH_PORT, period=10, failures=3),
        "lifecycle": {"preStop": {"sleep": {"seconds": PRESTOP_SECONDS}}},
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "volumeMounts": [_workspace_mount(), _shm_mount(), *spec.worker.volume_mounts],
        "securityContext": _restricted_security_context(),
    }
    if spec.worker.script is not None:
        container["volumeMounts"].append(
            {"name": podenv.SCRIPT_VOLUME, "mountPath": podenv.SCRIPT_MOUNT, "readOnly": True}
        )
    if spec.service_account_name:
        container["volumeMounts"].append(
            {"name": podenv.API_TOKEN_VOLUME, "mountPath": podenv.API_TOKEN_MOUNT, "readOnly": True}
        )
    if spec.worker.env_from:
        container["envFrom"] = spec.worker.env_from
    command = worker_command(spec)
    if command:
        container["command"] = command
    if spec.worker.args:
        container["args"] = spec.worker.args
    if spec.worker.image_pull_policy:
        container["imagePullPolicy"] = spec.worker.image_pull_policy
    resources = worker_resources(spec)
    if resources:
        container["resources"] = resources
    return container


def _api_token_volume() -> dict[str, Any]:
    """What the kubelet mounts where it automounts a ServiceAccount's token (the token, refreshed before
    it expires, the cluster's CA certificate, the namespace), as a volume for the worker alone."""
    sources = [
        # 3607 s as the kubelet's own: an API server that extends automounted tokens (the default) makes
        # it a year, so clients that read the token once keep working
        {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}},
        {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
        {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}]}},
    ]
    return {"name": podenv.API_TOKEN_VOLUME, "projected": {"sources": sources}}


def _script_volume(spec: PyTritonModelSpec) -> list[dict[str, Any]]:
    if spec.worker.script is None:
        return []
    return [{"name": podenv.SCRIPT_VOLUME, "configMap": {"name": spec.worker.script.config_map}}]


def termination_grace_seconds(spec: PyTritonModelSpec) -> int:
    """Enough for the preStop pause, the worker's drain, and Triton's exit while the worker still serves."""
    return PRESTOP_SECONDS + spec.drain_seconds + podenv.SIDECAR_EXIT_TIMEOUT_S + SHUTDOWN_SLACK_SECONDS


def pod_template(model: PyTritonModel) -> dict[str, Any]:
    """The Deployment's pod template for a model."""
    spec = model.spec
    pod_spec: dict[str, Any] = {
        "initContainers": [_bootstrap_container(spec), _triton_container(spec)],
        "containers": [_worker_container(spec)],
        "volumes": [
            {"name": podenv.WORKSPACE_VOLUME, "emptyDir": {}},
            {
                "name": podenv.SHM_VOLUME,
                "emptyDir": {"medium": "Memory", "sizeLimit": spec.shared_memory_limit},
            },
            {"name": podenv.TRITON_TMP_VOLUME, "emptyDir": {}},
            *_script_volume(spec),
            *(volume.model_dump() for volume in spec.volumes),
        ],
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": podenv.RUN_AS_UID,
            "runAsGroup": podenv.RUN_AS_UID,
            "fsGroup": podenv.RUN_AS_UID,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "terminationGracePeriodSeconds": termination_grace_seconds(spec),
        "enableServiceLinks": False,
    }
    # Nothing of kubetriton's in the pod talks to the API server, and Triton faces the network: no
    # container gets a token, except the worker that of a ServiceAccount the spec names.
    pod_spec["automountServiceAccountToken"] = False
    if spec.service_account_name:
        pod_spec["volumes"].append(_api_token_volume())
    scheduling = spec.scheduling
    optional = {
        "serviceAccountName": spec.service_account_name,
        "nodeSelector": scheduling.node_selector,
        "tolerations": scheduling.tolerations,
        "affinity": scheduling.affinity,
        "topologySpreadConstraints": scheduling.topology_spread_constraints,
        "priorityClassName": scheduling.priority_class_name,
        "imagePullSecrets": spec.image_pull_secrets,
        "runtimeClassName": spec.runtime_class_name,
    }
    pod_spec.update({key: value for key, value in optional.items() if value})
    metadata: dict[str, Any] = {"labels": {**spec.pod_labels, **naming.labels(model.metadata.name)}}
    if spec.pod_annotations:
        metadata["annotations"] = spec.pod_annotations
    return {"metadata": metadata, "spec": pod_spec}
