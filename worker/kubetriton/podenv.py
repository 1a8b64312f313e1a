"""The pod contract: the names, paths and ports that the operator's pod builder and the runtime share.

The operator writes these into the pod spec; the worker (`Triton()` in attach mode), the bootstrap
step and the proxy model read them. Keeping them in one module is what keeps the two sides in step.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pytriton import settings
from pytriton.exceptions import PyTritonBadParameterError, PyTritonValidationError

TRITON_VERSION = "2.51.0"
TRITON_IMAGE = "nvcr.io/nvidia/tritonserver:24.10-py3"
"""The stock Triton image for the sidecar; 24.10 ships Triton 2.51, the version used in local mode."""

HTTP_PORT = 8000
GRPC_PORT = 8001
METRICS_PORT = 8002
HEALTH_PORT = 8080
"""The worker's own HTTP endpoint: /livez, /readyz and /metrics."""


def process_health_port(health_port: int, index: int) -> int:
    """Where worker process `index` of several serves its own probes, on loopback: the ports after the
    worker's, whose endpoint the processes' supervisor serves."""
    return health_port + 1 + index


WORKSPACE_MOUNT = "/workspace"
"""The shared emptyDir: model repository, sockets and the bootstrapped runtime for the proxy."""
SHM_MOUNT = "/dev/shm"
WORKSPACE_VOLUME = "workspace"
SHM_VOLUME = "dshm"
"""The pod's own volumes, mounted at WORKSPACE_MOUNT and SHM_MOUNT in both containers."""
TRITON_TMP_VOLUME = "triton-tmp"
TRITON_TMP_MOUNT = "/tmp"
"""The Triton sidecar's /tmp, its root filesystem being read-only: the Python backend makes a directory
there when it starts, and aborts tritonserver when it cannot."""
API_TOKEN_VOLUME = "api-token"
API_TOKEN_MOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
"""The token, CA certificate and namespace of a ServiceAccount that the spec names, where Kubernetes
clients look for them: mounted in the worker only, not in the network-facing Triton sidecar."""
SIDECAR_SHM_PREFIX = "kubetriton-sidecar-"
"""The name prefix of the sidecar's Python-backend regions in the pod's /dev/shm. A killed Triton cannot
remove its regions, so the sidecar removes its predecessor's when it starts."""
RUNTIME_SUBDIR = "runtime"
"""Below the workspace: what `kubetriton bootstrap` (in a pod) or the local server installs for the proxy
(pyzmq, kubetriton)."""
WORKER_RUNTIME_SUBDIR = "worker-runtime"
"""Below the workspace: what `kubetriton bootstrap` provides for a worker image that has Python and NumPy
and nothing of kubetriton: the launcher, kubetriton's pure-Python packages in `packages/`, and pyzmq for each
supported Python in `cp3XX/`."""
LAUNCHER = "launch.py"
"""In the worker runtime: checks the image, puts the runtime on the import path and runs the user's script;
supervises the worker processes where there are several."""
LAUNCHER_EXEC = "--exec"
"""The launcher's option that runs a command (the rest of its arguments) instead of a script."""
LAUNCHER_LOCAL = "--local"
"""The launcher's option with which `kubetriton run` runs a script on this machine, in the interpreter that
runs kubetriton: no image to check, nothing to provide."""
WORKER_PYTHONS = ("3.10", "3.11", "3.12", "3.13")
"""The Python versions a worker image may have."""
UNSUPPORTED_IMAGE_EXIT_CODE = 78
"""The launcher's exit status when the worker image cannot run kubetriton (EX_CONFIG); its one-line reason
is the container's termination message."""
MODEL_NOT_BOUND_EXIT_CODE = 64
"""A worker's exit status when its script serves without binding a model the pod declares (EX_USAGE): no
restart binds it. Its one-line reason, which names the models bound, is the termination message."""
CONFIGURATION_ERRORS = (PyTritonValidationError, PyTritonBadParameterError)
"""The errors that say a setting of the user's is wrong, in PyTriton's terms (a value given to the API, a
parameter): an environment variable, a TritonConfig, a bind() argument, found before anything is loaded.
The same settings fail the same way again, so no restart mends them. Not PyTritonModelConfigError: a load
that Triton refused, or a warm-up that failed, may pass another time (a stub that did not start, a GPU
short of memory for a moment), so it is restarted, and the status names it (ModelConfigRejected)."""
CONFIGURATION_ERROR_EXIT_CODE = 65
"""A worker's exit status when its script ended on one of `CONFIGURATION_ERRORS` (the launcher sees to it):
no restart mends it. Its one line, `<error class>: <message>`, is on stderr and the termination message.
65 is EX_DATAERR of sysexits.h (the input, here the settings, is wrong): EX_CONFIG (78) and EX_USAGE (64)
are the two statuses above, and no other status a worker ends with (1 for an error, 2 for a usage error,
128 + N for signal N) is 65."""
TERMINATION_LOG = "/dev/termination-log"
"""Where a container's termination message goes (Kubernetes' default `terminationMessagePath`): the
operator reports it in the model's status."""
TERMINATION_MESSAGE_BYTES = 4000
"""Kubernetes keeps 4096 bytes of a termination message."""


def write_termination_message(message: str) -> None:
    """The worker container's termination message, which the model's status shows: written into the file
    that the kubelet provides, never into one made here (outside a pod /dev is left alone). The launcher,
    which runs before kubetriton can be imported, writes its own refusals the same way."""
    try:
        descriptor = os.open(TERMINATION_LOG, os.O_WRONLY | os.O_TRUNC)
    except OSError:  # not in a container
        return
    with os.fdopen(descriptor, "w") as log:
        log.write(message[:TERMINATION_MESSAGE_BYTES])


SCRIPT_VOLUME = "script"
SCRIPT_MOUNT = "/kubetriton/script"
"""Where a model's spec.worker.script ConfigMap appears in the worker container."""
MODELS_SUBDIR = "models"
SOCKETS_SUBDIR = "sockets"
SIDECAR_STOP_FIFO = "triton-stop"
"""Below the workspace: a FIFO the sidecar's shell reads. A line written to it makes the shell send SIGTERM to
tritonserver, so a draining worker can stop Triton while it goes on serving (a native sidecar gets SIGTERM
from the kubelet only after the worker has exited)."""
REPOSITORY_TOKEN_FILE = "repository-token"
"""Below the workspace: the value that Triton's model-repository API demands in its header.

Written by `kubetriton bootstrap` (pod) or the launcher (local mode); only processes that can read
the workspace can load or unload models, so the management API stays private to the pod.
"""
ACCESS_TOKEN_FILE = "access-token"
"""Below the workspace: the token of the endpoints a `TritonSecurityConfig` protects by default, written by
`kubetriton bootstrap`; the sidecar protects them with it and `Triton().get_access_token()` returns it."""

RUN_AS_UID = 1000
"""Both containers run as this non-root UID so that each can use the other's files."""

ENV_MODE = "KUBETRITON_MODE"
"""`attach` makes `Triton()` attach to a sidecar; absent or `local` launches a local tritonserver."""
ENV_WORKSPACE = "KUBETRITON_WORKSPACE"
ENV_TRITON_HOST = "KUBETRITON_TRITON_HOST"
ENV_MODELS = "KUBETRITON_MODELS"
"""Comma-separated model names the worker must bind before it reports ready."""
MODEL_NAME_MAX_LENGTH = 128
MODEL_NAME_PATTERN = rf"^[A-Za-z0-9_][-A-Za-z0-9_.]{{0,{MODEL_NAME_MAX_LENGTH - 1}}}$"
"""A model name that `bind()` accepts and the operator's spec allows: 1-128 letters, digits, '_', '.' or
'-', starting with a letter, digit or '_' (no ',', which ENV_MODELS separates by; a name of the model
repository's folders, not of Kubernetes objects)."""
ENV_DRAIN_SECONDS = "KUBETRITON_DRAIN_SECONDS"
ENV_DEBUG = "KUBETRITON_DEBUG"
"""`1` (or `true`, `yes`, `on`) sends clients the traceback of a callable's exception."""
ENV_ARENA_BYTES = "KUBETRITON_ARENA_BYTES"
ENV_HEALTH_PORT = "KUBETRITON_HEALTH_PORT"
ENV_TRITON_HTTP_PORT = "KUBETRITON_TRITON_HTTP_PORT"
ENV_TRITON_GRPC_PORT = "KUBETRITON_TRITON_GRPC_PORT"
"""Where the sidecar's Triton listens, for the worker: the fixed ports in a pod (the operator sets neither);
a pod's containers run as local processes beside other servers take free ones."""
ENV_WORKER_IMAGE = "KUBETRITON_WORKER_IMAGE"
"""Given to the operator: the kubetriton worker image, which runs the pods' init step."""
ENV_TRITON_IMAGE = "KUBETRITON_TRITON_IMAGE"
"""Given to `kubetriton bootstrap`: the sidecar's image, whose tag decides the sidecar's Python."""
ENV_SHM_DIR = "KUBETRITON_SHM_DIR"
"""Where the shared-memory volume is mounted in both containers (default /dev/shm)."""
ENV_PROCESS_COUNT = "KUBETRITON_PROCESS_COUNT"
"""How many worker processes run the script (`spec.worker.processes`, `kubetriton run --processes`)."""
ENV_PROCESS_INDEX = "KUBETRITON_PROCESS_INDEX"
"""Which of them this process is, from 0; set by the supervisor for each process it starts."""
ENV_STARTUP_SECONDS = "KUBETRITON_STARTUP_SECONDS"
"""With several processes in a pod: the model's `startupSeconds`, which bounds a restarted process's way
back to `Triton()` as the startup probe bounds the first start."""
ENV_SUPERVISOR = "KUBETRITON_SUPERVISOR"
"""Local mode with several processes: the supervisor's socket, through which `Triton()` asks for the one
local tritonserver that all of them serve through."""

REPOSITORY_TOKEN_HEADER = "kubetriton-repository-token"
GRPC_RESTRICTED_PREFIX = "triton-grpc-protocol-"
"""Over gRPC, Triton reads a restricted endpoint's header from the metadata of this name prefix."""
ACCESS_TOKEN_HEADER = "triton-access-token"
"""The header that carries a `TritonSecurityConfig`'s access token (over gRPC, Triton reads it from the
metadata `triton-grpc-protocol-triton-access-token`)."""
DEFAULT_PROTECTED_ENDPOINTS = tuple(settings.DEFAULT_PROTECTED_ENDPOINTS)
"""What the sidecar protects with the pod's access token: what `TritonSecurityConfig()` protects."""
DEFAULT_CACHE_CONFIG = "local,size=16777216"
"""Triton's response cache, local and 16 MiB, in local mode and in the sidecar alike, so that a model bound
with `ModelConfig(response_cache=True)` is cached in both unless the user configures the cache."""
DEFAULT_DRAIN_SECONDS = 30
SIDECAR_EXIT_TIMEOUT_S = 5
"""The sidecar's --exit-timeout-secs: how long a stopping Triton goes on serving the client connections that
are still open after the worker's drain, and finishes what is in flight, before it closes them."""
GRPC_MAX_CONNECTION_AGE_S = 5
"""In a pod, Triton sends each gRPC connection GOAWAY after this long (at most the drain budget), so
clients open their next call on a new connection, which the Service routes to a pod that is not stopping;
calls in flight finish within the drain budget."""
DEFAULT_ARENA_BYTES = 256 * 1024 * 1024


@dataclass(frozen=True)
class AttachSettings:
    """What a worker container learns from its environment when it runs beside a Triton sidecar."""

    workspace: str
    triton_host: str
    models: tuple[str, ...]
    drain_seconds: float
    health_port: int
    shm_dir: str
    triton_http_port: int = HTTP_PORT
    triton_grpc_port: int = GRPC_PORT
    startup_seconds: float | None = None
    """Given with several processes only: how long a restarted one may take to answer again."""

    @classmethod
    def from_environ(cls, environ: os._Environ[str] | dict[str, str] | None = None) -> AttachSettings | None:
        """The attach settings, or None when the environment asks for local mode."""
        env = os.environ if environ is None else environ
        if env.get(ENV_MODE, "local") != "attach":
            return None
        return cls(
            workspace=env.get(ENV_WORKSPACE, WORKSPACE_MOUNT),
            triton_host=env.get(ENV_TRITON_HOST, "127.0.0.1"),
            models=tuple(name for name in env.get(ENV_MODELS, "").split(",") if name),
            drain_seconds=float(env.get(ENV_DRAIN_SECONDS, DEFAULT_DRAIN_SECONDS)),
            health_port=int(env.get(ENV_HEALTH_PORT, HEALTH_PORT)),
            shm_dir=env.get(ENV_SHM_DIR, SHM_MOUNT),
            triton_http_port=int(env.get(ENV_TRITON_HTTP_PORT, HTTP_PORT)),
            triton_grpc_port=int(env.get(ENV_TRITON_GRPC_PORT, GRPC_PORT)),
            startup_seconds=float(env[ENV_STARTUP_SECONDS]) if env.get(ENV_STARTUP_SECONDS) else None,
        )


@dataclass(frozen=True)
class ProcessGroup:
    """The worker processes that serve one script's models together, and this process's place among them.

    Triton sees one model whose instance group holds every process's instances: process `index` serves
    instances `index * k` to `index * k + k - 1` of a model bound with k callables. Process 0 writes the
    model into the repository and loads it; the others only serve their instances."""

    index: int = 0
    count: int = 1

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> ProcessGroup:
        """The group the supervisor put this process in; one process alone without one. ValueError when
        the variables are not a valid place (an index outside 0..count-1)."""
        env = os.environ if environ is None else environ
        count = env.get(ENV_PROCESS_COUNT, "1")
        index = env.get(ENV_PROCESS_INDEX, "0")
        if not (count.isdigit() and index.isdigit() and int(index) < int(count)):
            raise ValueError(
                f"{ENV_PROCESS_INDEX}={index!r} and {ENV_PROCESS_COUNT}={count!r} are no place in a group of "
                "worker processes: the index must be a whole number below the count"
            )
        return cls(int(index), int(count))

    @property
    def loads_models(self) -> bool:
        """Whether this process writes the models into the repository and has Triton load them."""
        return self.index == 0

    def first_instance(self, instances_per_process: int) -> int:
        return self.index * instances_per_process


def restricted_api_groups(
    repository_token: str,
    access_token: str | None,
    protected_endpoints: Sequence[str],
    *,
    access_token_opens_repository: bool = False,
) -> list[str]:
    """Triton's restricted-API groups (`<apis>:<header>=<value>`): the model-repository API behind the
    repository token, every other protected endpoint behind the access token. Triton lets an API belong to
    one group only.

    `access_token_opens_repository`: a local server belongs to its user, so when the security config
    protects the model repository, the access token opens it with the other protected endpoints (and
    kubetriton manages models with that token too). In a pod the repository stays private to the pod."""
    if access_token_opens_repository and access_token and "model-repository" in protected_endpoints:
        return [f"{','.join(protected_endpoints)}:{ACCESS_TOKEN_HEADER}={access_token}"]
    groups = [f"model-repository:{REPOSITORY_TOKEN_HEADER}={repository_token}"]
    others = [endpoint for endpoint in protected_endpoints if endpoint != "model-repository"]
    if others and access_token:
        groups.append(f"{','.join(others)}:{ACCESS_TOKEN_HEADER}={access_token}")
    return groups


def tritonserver_args(
    *,
    model_repository: str,
    repository_token: str,
    access_token: str | None = None,
    protected_endpoints: Sequence[str] = DEFAULT_PROTECTED_ENDPOINTS,
    exit_timeout_s: float = DEFAULT_DRAIN_SECONDS,
    http_port: int = HTTP_PORT,
    grpc_port: int = GRPC_PORT,
    metrics_port: int = METRICS_PORT,
    log_verbose: int = 0,
    access_token_opens_repository: bool = False,
) -> list[str]:
    """The tritonserver arguments, identical for the local launcher and the pod's sidecar.

    Models are loaded explicitly by the worker, readiness is strict, the model-repository API demands the
    repository token and the protected endpoints the access token.
    """
    groups = restricted_api_groups(
        repository_token,
        access_token,
        protected_endpoints,
        access_token_opens_repository=access_token_opens_repository,
    )
    return [
        f"--model-repository={model_repository}",
        "--model-control-mode=explicit",
        "--strict-readiness=true",
        "--disable-auto-complete-config",
        f"--exit-timeout-secs={max(0, round(exit_timeout_s))}",
        f"--http-port={http_port}",
        f"--grpc-port={grpc_port}",
        "--allow-metrics=true",
        f"--metrics-port={metrics_port}",
        *(f"--http-restricted-api={group}" for group in groups),
        *(f"--grpc-restricted-protocol={group}" for group in groups),
        f"--log-verbose={log_verbose}",
    ]


def debug_requested() -> bool:
    """Whether ENV_DEBUG asks for tracebacks; a value it cannot read is refused rather than ignored."""
    value = os.environ.get(ENV_DEBUG, "")
    flag = settings.parse_flag(value) if value.strip() else False
    if flag is not None:
        return flag
    raise ValueError(f"{ENV_DEBUG}={os.environ[ENV_DEBUG]!r}: use 1 (or true, yes, on) or 0")
