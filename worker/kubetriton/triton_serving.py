"""How `Triton()` serves: through a local tritonserver it launches, through the one its supervisor hosts
for several worker processes, or through the pod's Triton sidecar, as the environment says.

Each step has its three paths side by side in `TritonServing`: starting (`_start_local` launches and
publishes the server, `_start_hosted` asks the supervisor for it, `_start_attached` waits for the sidecar
and serves the pod's probes), serving (the local server must keep running, the pod's declared models must
be bound: `_check_triton`, `_check_bound`) and stopping (`_leave_triton`: the local server stops, a worker
process of several that stops with the others serves on until their supervisor's Triton, stopped next,
lets go of it, a pod's worker drains as `kubetriton.drain` explains).
A worker process asks with `ask_for_server`; its supervisor's `ServerHost` launches the server as a
`TritonServing` of its own and answers.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import re
import secrets
import shutil
import socket
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pytriton.exceptions import PyTritonModelConfigError, PyTritonRuntimeError, PyTritonValidationError
from pytriton.model_config import ModelConfig
from pytriton.settings import (
    DEFAULT_PROTECTED_ENDPOINTS,
    ENV_CONFIG_PREFIX,
    TritonConfig,
    TritonLifecyclePolicy,
    TritonSecurityConfig,
    given_access_token,
    is_default_security,
)

from kubetriton import podenv
from kubetriton.control import TritonControl
from kubetriton.drain import client_connections, request_sidecar_stop
from kubetriton.health import HealthServer
from kubetriton.model_repository import PROXY_MODEL_MARKER
from kubetriton.private_files import create_missing, private_folder
from kubetriton.server import (
    LocalTritonServer,
    PublishedServer,
    claim,
    publish,
    remove_abandoned,
    remove_owned,
)
from kubetriton.serving import DRAIN_POLL_S, LEAVE_DRAIN_S, Serving, debug_requested
from kubetriton.sidecar.bootstrap import install_runtime
from kubetriton.triton_home import locate

LOGGER = logging.getLogger(__name__)

SIDECAR_WAIT_S = 600.0
SUPERVISOR_WAIT_S = 300.0
"""How long a worker process waits for the local tritonserver that its supervisor launches."""
SAGEMAKER_PORT = 8080
VERTEX_AI_PORT = 8080
"""Triton's default ports for the SageMaker and Vertex AI endpoints."""
UNRECOVERABLE_STOP_S = 2.0
"""How long a local tritonserver may take to stop after an unrecoverable error before it is killed: its
model cannot answer any more, so no client connection is worth Triton's exit timeout."""
SIDECAR_UNLOAD_S = 10.0
"""Attach mode: how long beyond Triton's exit timeout a stopping worker waits for its models to unload."""
DEFAULT_CACHE_CONFIG = [podenv.DEFAULT_CACHE_CONFIG]
"""Local mode enables Triton's response cache (16 MiB) unless `cache_config` says otherwise; only models
bound with `ModelConfig(response_cache=True)` use it."""
LOAD_ERROR_LOG_LINES = 200


def _shm_name(server_id: str) -> str:
    """The server id as one name in /dev/shm: other characters as '-' ('team/svc' made a folder of it),
    and then a digest of the id, so that 'team/svc' and 'team-svc' stay two servers."""
    name = re.sub(r"[^A-Za-z0-9._-]", "-", server_id)
    return name if name == server_id else f"{name}-{hashlib.sha256(server_id.encode()).hexdigest()[:8]}"


def _users_models(repository: Path) -> list[str]:
    """The models of a repository of the user's that Triton loads as it starts, as PyTriton's `*` does:
    every folder but those of kubetriton's proxy models, which a server that did not stop may have left
    and which no worker serves (a bound model's folder is written again when it is bound)."""
    return sorted(
        folder.name
        for folder in repository.iterdir()
        if folder.is_dir()
        and not folder.name.startswith(".")
        and not any(
            PROXY_MODEL_MARKER in model.read_text(errors="replace") for model in folder.glob("*/model.py")
        )
    )


class TritonServing(Serving):
    """`Triton()`'s runtime: serves bound callables through a local `tritonserver` it launches, the one its
    supervisor hosts, or in a pod the sidecar, as the environment says. `config` and `lifecycle` are
    settled already: the script's configuration laid over the environment's, and the policy that applies."""

    def __init__(
        self,
        *,
        config: TritonConfig,
        workspace: str | Path | None,
        lifecycle: TritonLifecyclePolicy,
        security: TritonSecurityConfig | None,
    ) -> None:
        self._config = config
        self._pod = podenv.AttachSettings.from_environ()
        self._supervisor = None if self._pod else os.environ.get(podenv.ENV_SUPERVISOR)
        self._workspace_given = workspace
        debug = debug_requested() or (self._config.log_verbose or 0) > 0  # refused before claiming anything
        self._workspace_lock: int | None = None
        if self._pod is not None:
            self._refuse_what_a_pod_cannot_apply(lifecycle, security)
            root = Path(self._pod.workspace)
        elif self._supervisor is not None:
            if lifecycle.local_model_store:
                raise PyTritonValidationError(
                    "TritonLifecyclePolicy(local_model_store=True) cannot apply with several worker "
                    "processes: their Triton is launched before they bind their models (run the script alone)"
                )
            root = Path(workspace or tempfile.gettempdir())  # until the supervisor names the server's
        elif workspace is None:
            for parent in (tempfile.gettempdir(), podenv.SHM_MOUNT):
                remove_abandoned(Path(parent))
            root = Path(tempfile.mkdtemp(prefix="kubetriton-"))
            self._workspace_lock = claim(root)
        else:
            root = Path(workspace)
        super().__init__(workspace=root, lifecycle=lifecycle, debug=debug)
        self._security = security or TritonSecurityConfig()
        if self._pod is None:
            self._check_local_config()
        self._server: LocalTritonServer | None = None
        self._published: PublishedServer | None = None
        self._publication: tuple[Path, int] | None = None
        self._health: HealthServer | None = None

    def _refuse_what_a_pod_cannot_apply(
        self, lifecycle: TritonLifecyclePolicy, security: TritonSecurityConfig | None
    ) -> None:
        """In a pod the server is the sidecar, launched before the worker with the PyTritonModel's
        arguments: settings of the server cannot apply there, and are refused rather than ignored."""
        server_fields = [
            field.name
            for field in dataclasses.fields(self._config)
            if field.name != "log_verbose" and getattr(self._config, field.name) is not None
        ]
        if server_fields:
            raise PyTritonValidationError(
                f"TritonConfig {', '.join(server_fields)} cannot apply in a pod: Triton runs there as the "
                "sidecar the operator launches. Set its arguments in the PyTritonModel (spec.triton.args) "
                f"and leave these fields unset (in code and in {ENV_CONFIG_PREFIX}* variables)"
            )
        if lifecycle.local_model_store:
            raise PyTritonValidationError(
                "TritonLifecyclePolicy(local_model_store=True) cannot apply in a pod: the sidecar runs "
                "before the worker, so models are loaded through its repository API"
            )
        if security is not None and not is_default_security(security):
            raise PyTritonValidationError(
                "TritonSecurityConfig other than the default cannot apply in a pod: the sidecar protects "
                f"{', '.join(DEFAULT_PROTECTED_ENDPOINTS)} with the pod's own token "
                "(Triton().get_access_token() returns it)"
            )

    def _check_local_config(self) -> None:
        config = self._config
        if config.allow_http is False and (config.grpc_use_ssl or config.grpc_use_ssl_mutual):
            raise PyTritonValidationError(
                "TritonConfig(allow_http=False) with gRPC over SSL: kubetriton manages Triton over plain "
                "gRPC when HTTP is off. Keep HTTP on (it may listen on this machine only: "
                "http_address='127.0.0.1')"
            )
        own = {
            api
            for group in podenv.restricted_api_groups(
                "-", self._security.access_token, self._restricted(), access_token_opens_repository=True
            )
            for api in _restricted_apis(group)
        }
        for field in ("http_restricted_api", "grpc_restricted_protocol"):
            group = getattr(config, field)
            overlap = sorted(_restricted_apis(group) & own) if group else []
            if overlap:
                raise PyTritonValidationError(
                    f"TritonConfig({field}=...) restricts {', '.join(overlap)}, which the "
                    "TritonSecurityConfig (or, for model-repository, kubetriton itself) restricts already; "
                    "Triton lets an API have one restriction only"
                )

    def _restricted(self) -> list[str]:
        return list(self._security.restricted_endpoints or ())

    def get_access_token(self) -> str | None:
        """The token of the protected endpoints: the TritonSecurityConfig's, or in a pod the pod's."""
        if self._pod is not None:
            token_file = self._workspace / podenv.ACCESS_TOKEN_FILE
            return token_file.read_text().strip() if token_file.is_file() else None
        return self._security.access_token

    def _start_triton(self) -> None:
        if self._pod is not None:
            self._start_attached()
        elif self._supervisor is not None:
            self._start_hosted(self._supervisor)
        else:
            self._start_local()

    def _check_bound(self) -> None:
        """In a pod, every model its spec declares must be bound before serve(): the pod is never ready
        otherwise, and no restart binds it. The worker says which models the script bound instead, on
        stderr and as the container's termination message, and exits with its own status."""
        missing = [model for model in self._pod.models if model not in self._workers] if self._pod else []
        if not missing:
            return
        message = (
            f"spec.models declares {', '.join(missing)}, which the script does not bind before serve() "
            f"(it binds {', '.join(sorted(self._workers)) or 'no model'}): bind it, or declare the models "
            "the script binds (kubetriton deploy --model NAME)"
        )
        LOGGER.error("%s", message)
        podenv.write_termination_message(message)
        raise SystemExit(podenv.MODEL_NOT_BOUND_EXIT_CODE)

    def _check_triton(self) -> None:
        if self._server is not None and not self._server.is_running():
            raise PyTritonRuntimeError(f"tritonserver exited unexpectedly.\n{self._server.exit_report()}")

    def failure(self) -> str | None:
        """Why the local server cannot serve any more (it exited), or None."""
        try:
            self._check_triton()
        except PyTritonRuntimeError as error:
            return str(error)
        return None

    def _leave_triton(self) -> None:
        if self._publication is not None:
            record, lock = self._publication
            record.unlink(missing_ok=True)
            os.close(lock)
            self._publication = None
        if self._server is not None:
            when = (
                "when Triton stopped at the end of its exit timeout (TritonConfig(exit_timeout_secs=...) "
                "waits longer)"
                if self._server.is_running()
                else "when tritonserver exited"  # killed, say: it drained nothing
            )
            # After an unrecoverable error the model cannot answer: Triton need not keep its clients'
            # connections open for its exit timeout.
            self._server.stop(None if self._fatal is None else UNRECOVERABLE_STOP_S)
            self._report_abandoned(when)
            if self._config.model_repository is not None:  # the user's: it keeps its own models only
                for name in self._workers:
                    shutil.rmtree(self._model_repository / name, ignore_errors=True)
        elif self._pod is not None:
            self._drain()
        elif supervisor_stops(self._supervisor):  # with every process; the supervisor stops Triton next
            told = time.monotonic()
            self._wait_until_detached(told + self._exit_timeout_s() + SIDECAR_UNLOAD_S)
            self._report_abandoned(
                f"when this process stopped, {time.monotonic() - told:.0f} s after it was told to"
            )
        else:  # alone (killed, an unrecoverable error, the script's own stop): Triton serves the others on
            self._wait_until_idle(LEAVE_DRAIN_S)
            self._report_abandoned(f"after {LEAVE_DRAIN_S:g} s of drain, as this process stops")

    def _report_abandoned(self, when: str) -> None:
        """Say how many requests a stop left unanswered in the callable (not after an unrecoverable error,
        which fails them on purpose)."""
        abandoned = sum(worker.in_flight for worker in self._workers.values())
        if abandoned and self._fatal is None:
            LOGGER.warning(
                "%d request(s) were still in the callable %s; their clients got an error", abandoned, when
            )

    def _release(self) -> None:
        if self._health is not None:
            self._health.stop()
        if self._workspace_lock is not None:
            remove_owned(self._workspace)
            os.close(self._workspace_lock)
            self._workspace_lock = None

    def _check_model_config(self, model_name: str, config: ModelConfig) -> None:
        if config.response_cache and self._pod is None and self._config.cache_config == []:
            raise PyTritonModelConfigError(
                f"Model '{model_name}' asks for the response cache, "
                "but TritonConfig(cache_config=[]) turned it off"
            )

    def _drain(self) -> None:
        """Attach mode: finish what is in flight within the drain budget. After SIGTERM (the pod stops),
        first wait for the clients to leave, then stop the sidecar's Triton while still serving, as
        `kubetriton.drain` explains; after an unrecoverable error the sidecar keeps running for the
        restarted worker."""
        assert self._pod is not None
        ports = (self._pod.triton_http_port, self._pod.triton_grpc_port)
        clients = self._wait_until_idle(
            self._pod.drain_seconds, lambda: (client_connections(ports) or 0) if self._signalled else 0
        )
        if not self._signalled:
            return
        if clients:
            LOGGER.warning(
                "%d client connection(s) still open after the %g s drain budget; Triton closes them",
                clients,
                self._pod.drain_seconds,
            )
        fifo = self._workspace / podenv.SIDECAR_STOP_FIFO
        if not request_sidecar_stop(fifo) and not fifo.exists():
            return  # no sidecar; one whose FIFO nobody reads was asked to stop already (by another process)
        self._wait_until_detached(time.monotonic() + podenv.SIDECAR_EXIT_TIMEOUT_S + SIDECAR_UNLOAD_S)

    def _wait_until_detached(self, deadline: float) -> None:
        """Serve on until the stopping Triton has finished what it passed on and unloaded the models (their
        proxy instances detached), or until `deadline`."""
        while any(worker.attached for worker in self._workers.values()) and time.monotonic() < deadline:
            time.sleep(DRAIN_POLL_S)

    def _start_local(self) -> None:
        config = self._config
        server_id = config.id or f"{os.getpid()}-{secrets.token_hex(4)}"
        shm_prefix = f"{podenv.SHM_MOUNT}/kubetriton-{_shm_name(server_id)}"
        if config.model_repository is not None:  # the user's folder: created where missing, else left alone
            self._model_repository = Path(config.model_repository)
            create_missing(self._model_repository)
        else:
            private_folder(self._model_repository)
        sockets = private_folder(self._workspace / podenv.SOCKETS_SUBDIR)
        self._transport = self._transport_settings(sockets, Path(shm_prefix) / "arenas")
        home = locate()
        install_runtime(self._runtime, home.stub_python.wheels, home.stub_python.version)
        server_config = config
        if server_config.cache_config is None:
            server_config = dataclasses.replace(server_config, cache_config=list(DEFAULT_CACHE_CONFIG))
        if (
            server_config.cache_config
            and server_config.cache_directory is None
            and (home.path / "caches").is_dir()
        ):
            server_config = dataclasses.replace(server_config, cache_directory=str(home.path / "caches"))
        ports = {
            "HTTP": config.http_port or podenv.HTTP_PORT,
            "gRPC": config.grpc_port or podenv.GRPC_PORT,
            "metrics": config.metrics_port or podenv.METRICS_PORT,
            "SageMaker": config.sagemaker_port or SAGEMAKER_PORT,
            "Vertex AI": config.vertex_ai_port or VERTEX_AI_PORT,
        }
        enabled = {
            "HTTP": config.allow_http is not False,
            "gRPC": config.allow_grpc is not False,
            "metrics": config.allow_metrics is not False,
            "SageMaker": bool(config.allow_sagemaker),
            "Vertex AI": bool(config.allow_vertex_ai),
        }
        if config.allow_http is False:
            control_url = f"grpc://{_local_address(config.grpc_address)}:{ports['gRPC']}"
        else:
            control_url = f"http://{_local_address(config.http_address)}:{ports['HTTP']}"
        extra_args = server_config.extra_args()
        preloaded = []
        if self._lifecycle.local_model_store:
            preloaded, self._pending = self._pending, []
            for spec, funcs in preloaded:
                self._workers[spec.name] = self._prepare(spec, funcs)[0]
        startup_models = [spec.name for spec, _ in preloaded]
        if config.model_repository is not None:  # the models it holds load with Triton, as PyTriton's do
            startup_models += _users_models(self._model_repository)
        extra_args += [f"--load-model={name}" for name in startup_models]
        repository_token = secrets.token_urlsafe(24)
        self._server = LocalTritonServer(
            home,
            model_repository=self._model_repository,
            repository_token=repository_token,
            access_token=self._security.access_token,
            protected_endpoints=self._restricted(),
            shm_prefix=shm_prefix,
            log_path=config.log_file or self._workspace / "tritonserver.log",
            http_port=ports["HTTP"],
            grpc_port=ports["gRPC"],
            metrics_port=ports["metrics"],
            exit_timeout_s=self._exit_timeout_s(),
            log_verbose=config.log_verbose or 0,
            extra_args=extra_args,
            control_url=control_url,
            listening={name: port for name, port in ports.items() if enabled[name]},
        )
        self._control = self._server.control
        self._server.start()
        for spec, _ in preloaded:
            self._apply_trace_settings(spec.name)
        self._published = published = PublishedServer(
            ports={
                protocol: ports[name]
                for protocol, name in (("http", "HTTP"), ("grpc", "gRPC"))
                if enabled[name]
            },
            model_repository=str(self._model_repository),
            runtime=str(self._runtime),
            sockets=str(sockets),
            arena_dir=str(self._transport.arena_dir),
            repository_token=repository_token,
            access_token=self._security.access_token,
        )
        try:
            self._publication = publish(published)
        except (OSError, PyTritonRuntimeError) as error:
            LOGGER.warning("RemoteTriton of other processes cannot find this server: %s", error)

    def _exit_timeout_s(self) -> float:
        """How long a local server, once told to stop, serves the requests in flight."""
        timeout = self._config.exit_timeout_secs
        return podenv.DEFAULT_DRAIN_SECONDS if timeout is None else timeout

    def _start_hosted(self, supervisor: str) -> None:
        """One of several worker processes on this machine: serve through the one tritonserver that their
        supervisor hosts, launched as the first process to ask configured it (`kubetriton.supervisor`)."""
        security = self._security
        settings = {
            "process": self._group.index,
            "config": {
                name: str(value) if isinstance(value, Path) else value
                for name, value in self._config.to_dict().items()
            },
            "workspace": None if self._workspace_given is None else str(self._workspace_given),
            "security": {
                "access_token": given_access_token(security),
                "restricted_endpoints": self._restricted(),
            },
        }
        try:
            reply = ask_for_server(supervisor, settings, SUPERVISOR_WAIT_S)
        except (OSError, RuntimeError, ValueError) as error:
            raise PyTritonRuntimeError(
                f"The supervisor of the worker processes provides no Triton: {error}"
            ) from None
        server = PublishedServer(**reply["server"])
        self._control = TritonControl(reply["control_url"], access_token=server.access_token)
        security.access_token = server.access_token
        self._model_repository = Path(server.model_repository)
        self._runtime = Path(server.runtime)
        self._serve_through(server.repository_token, Path(server.sockets), Path(server.arena_dir))

    def hosted_reply(self) -> dict[str, Any]:
        """What the supervisor's `ServerHost` answers each worker process's `ask_for_server` once this
        local server runs: its published record and the URL it is managed at."""
        assert self._published is not None and self._control is not None
        return {"server": dataclasses.asdict(self._published), "control_url": self._control.url}

    def _start_attached(self) -> None:
        settings = self._pod
        assert settings is not None
        self._control = TritonControl(
            f"http://{settings.triton_host}:{settings.triton_http_port}", access_token=self.get_access_token()
        )
        self._health = HealthServer(
            settings.health_port,
            model_ready=self._control.is_model_ready,
            declared_models=settings.models,
            workers=lambda: self._workers,
            draining=lambda: self._draining,
            address="127.0.0.1" if self._group.count > 1 else "0.0.0.0",
        )
        self._health.start()
        LOGGER.info("Waiting for the Triton sidecar at %s", self._control.url)
        self._control.wait_until_live(SIDECAR_WAIT_S)
        self._attach(Path(settings.shm_dir))
        if self._config.log_verbose is not None:
            self._control.set_log_verbose_level(self._config.log_verbose)

    def _log_lines_about(self, model: str) -> str:
        """Local mode: the Triton log lines about the model, which say why a load failed."""
        if self._server is None:
            return ""
        lines = [
            line
            for line in self._server.log_tail(LOAD_ERROR_LOG_LINES).splitlines()
            if line.startswith("E") and (f"'{model}'" in line or f" {model}" in line)
        ]
        return "\n" + "\n".join(lines) if lines else ""


def _restricted_apis(group: str) -> set[str]:
    """The APIs of a Triton restricted-API group `<apis>:<header>=<value>`."""
    return set(group.split(":", 1)[0].split(","))


def _local_address(bound: str | None) -> str:
    """Where this machine reaches a server bound to `bound`: loopback unless it is bound to one address."""
    return "127.0.0.1" if bound in (None, "", "0.0.0.0", "::") else bound


def supervisor_stopping_mark(supervisor: str | Path) -> Path:
    """The file that the supervisor whose socket is `supervisor` makes once it stops every process, before
    it tells them (`ServerHost.mark_stopping`)."""
    return Path(supervisor).with_name("stopping")


def supervisor_stops(supervisor: str | None) -> bool:
    return supervisor is not None and supervisor_stopping_mark(supervisor).exists()


def ask_for_server(path: str, settings: Mapping[str, Any], timeout_s: float) -> dict[str, Any]:
    """A worker process's ask to its supervisor's `ServerHost`: where the server is (the host's reply);
    PyTritonValidationError when the host refuses the settings, RuntimeError with its reason when it fails."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
        connection.settimeout(timeout_s)
        connection.connect(path)
        with connection.makefile("rwb") as stream:
            stream.write(json.dumps(settings).encode() + b"\n")
            stream.flush()
            reply = json.loads(stream.readline() or b"{}")
    if reply.get("refused"):
        raise PyTritonValidationError(reply["error"])
    if "error" in reply:
        raise RuntimeError(reply["error"])
    return reply
