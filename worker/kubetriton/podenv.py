"""The pod contract: the names, paths and ports that the operator's pod builder and the runtime share.

The operator writes these into the pod spec; the worker (`Triton()` in attach mode), the bootstrap
step and the proxy model read them. Keeping them in one module is what keeps the two sides in step.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

TRITON_VERSION = "2.51.0"
TRITON_IMAGE = "nvcr.io/nvidia/tritonserver:24.10-py3"
"""The stock Triton image for the sidecar; 24.10 ships Triton 2.51, the version used in local mode."""

HTTP_PORT = 8000
GRPC_PORT = 8001
METRICS_PORT = 8002
HEALTH_PORT = 8080
"""The worker's own HTTP endpoint: /livez, /readyz and /metrics."""

WORKSPACE_MOUNT = "/workspace"
"""The shared emptyDir: model repository, sockets and the bootstrapped runtime for the proxy."""
SHM_MOUNT = "/dev/shm"
RUNTIME_SUBDIR = "runtime"
"""Below the workspace: what `kubetriton bootstrap` installs for the proxy (pyzmq, kubetriton)."""
MODELS_SUBDIR = "models"
SOCKETS_SUBDIR = "sockets"

RUN_AS_UID = 1000
"""Both containers run as this non-root UID so that each can use the other's files."""

ENV_MODE = "KUBETRITON_MODE"
"""`attach` makes `Triton()` attach to a sidecar; absent or `local` launches a local tritonserver."""
ENV_WORKSPACE = "KUBETRITON_WORKSPACE"
ENV_TRITON_HOST = "KUBETRITON_TRITON_HOST"
ENV_MODELS = "KUBETRITON_MODELS"
"""Comma-separated model names the worker must bind before it reports ready."""
ENV_REPOSITORY_TOKEN = "KUBETRITON_REPOSITORY_TOKEN"
"""Guards Triton's model-repository API: only holders of this value may load or unload models."""
ENV_DRAIN_SECONDS = "KUBETRITON_DRAIN_SECONDS"
ENV_ARENA_BYTES = "KUBETRITON_ARENA_BYTES"
ENV_HEALTH_PORT = "KUBETRITON_HEALTH_PORT"

REPOSITORY_TOKEN_HEADER = "kubetriton-repository-token"
DEFAULT_DRAIN_SECONDS = 30
DEFAULT_ARENA_BYTES = 256 * 1024 * 1024


@dataclass(frozen=True)
class AttachSettings:
    """What a worker container learns from its environment when it runs beside a Triton sidecar."""

    workspace: str
    triton_host: str
    models: tuple[str, ...]
    repository_token: str
    drain_seconds: float
    health_port: int

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
            repository_token=env.get(ENV_REPOSITORY_TOKEN, ""),
            drain_seconds=float(env.get(ENV_DRAIN_SECONDS, DEFAULT_DRAIN_SECONDS)),
            health_port=int(env.get(ENV_HEALTH_PORT, HEALTH_PORT)),
        )
