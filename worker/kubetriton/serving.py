"""Triton: bind inference callables to a Triton server and serve them.

`Triton()` launches a local `tritonserver` by default. Inside a pod rendered by the kubetriton operator
(`KUBETRITON_MODE=attach`), it attaches to the Triton sidecar instead, and `RemoteTriton` attaches to any
Triton prepared the same way. The same script runs unchanged in all places: `bind()` writes the model into
the repository Triton reads, starts the worker instances that execute the callable, and loads the model
through Triton's repository API.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import logging
import os
import secrets
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from kubetriton import podenv
from kubetriton.control import TritonControl
from kubetriton.drain import client_connections, request_sidecar_stop
from kubetriton.health import HealthServer
from kubetriton.model_repository import ModelSpec, check_model_name, name_tensors, write_model
from kubetriton.server import (
    LocalTritonServer,
    PublishedServer,
    claim,
    find_published,
    is_this_machine,
    publish,
    remove_abandoned,
    remove_owned,
)
from kubetriton.sidecar.bootstrap import install_runtime
from kubetriton.triton_home import locate
from kubetriton.warmup import warmup_samples
from kubetriton.worker import WORKER_RESTART_WAIT_S, ModelWorker, TransportSettings

from pytriton.client._url import parse_url
from pytriton.exceptions import (
    PyTritonBadParameterError,
    PyTritonError,
    PyTritonInvalidOperationError,
    PyTritonModelConfigError,
    PyTritonRuntimeError,
    PyTritonValidationError,
)
from pytriton.model_config import ModelConfig, Tensor
from pytriton.settings import (
    DEFAULT_PROTECTED_ENDPOINTS,
    ENV_CONFIG_PREFIX,
    VALID_TRITON_ENDPOINTS,
    DefaultTritonLifecyclePolicy,
    TritonConfig,
    TritonLifecyclePolicy,
    TritonSecurityConfig,
    VertextAILifecyclePolicy,
    given_access_token,
    is_default_security,
)

__all__ = [
    "DEFAULT_PROTECTED_ENDPOINTS",
    "ENV_CONFIG_PREFIX",
    "TRITON_ACCESS_HEADER",
    "VALID_TRITON_ENDPOINTS",
    "DefaultTritonLifecyclePolicy",
    "RemoteTriton",
    "Triton",
    "TritonConfig",
    "TritonLifecyclePolicy",
    "TritonSecurityConfig",
    "VertextAILifecyclePolicy",
]

LOGGER = logging.getLogger(__name__)

TRITON_ACCESS_HEADER = podenv.ACCESS_TOKEN_HEADER
SIDECAR_WAIT_S = 600.0
SUPERVISOR_WAIT_S = 300.0
"""How long a worker process waits for the local tritonserver that its supervisor launches."""
REMOTE_WAIT_S = 120.0
"""How long RemoteTriton waits for its Triton to become live and, when it is a local `Triton()`, for that
one to publish its record."""
PUBLISHED_POLL_S = 0.05
"""How often RemoteTriton looks for the record of a local `Triton()` that answers already."""
REMOTE_DRAIN_S = 30.0
"""How long a stopping RemoteTriton waits for requests in flight before it unloads its models."""
SAGEMAKER_PORT = 8080
VERTEX_AI_PORT = 8080
"""Triton's default ports for the SageMaker and Vertex AI endpoints."""
DRAIN_QUIET_S = 0.5
DRAIN_POLL_S = 0.1
SIDECAR_UNLOAD_S = 10.0
"""Attach mode: how long beyond Triton's exit timeout a stopping worker waits for its models to unload."""
RELOAD_CHECK_S = 2.0
"""Attach mode: how often the worker checks that Triton still has its models loaded."""
RELOAD_PAUSE_MAX_S = 60.0
"""The longest pause between tries while loading a model again keeps failing."""
DEFAULT_CACHE_CONFIG = [podenv.DEFAULT_CACHE_CONFIG]
"""Local mode enables Triton's response cache (16 MiB) unless `cache_config` says otherwise; only models
bound with `ModelConfig(response_cache=True)` use it."""
LOAD_ERROR_LOG_LINES = 200


def _is_generator_callable(func: Callable[..., Any]) -> bool:
    target = func if inspect.isfunction(func) or inspect.ismethod(func) else getattr(func, "__call__", func)  # noqa: B004
    target = inspect.unwrap(target)
    return inspect.isgeneratorfunction(target) or inspect.isasyncgenfunction(target)


def _model_trace_settings(model_name: str, trace_config: Sequence[str]) -> dict[str, Any]:
    """The settings of Triton's per-model trace API for `bind(trace_config=...)`, written as Triton's
    `--trace-config` entries: `level=`, `rate=`, `count=` and `triton,log-frequency=`. The trace mode, file
    and OpenTelemetry settings are the server's alone (`TritonConfig.trace_config`)."""
    settings: dict[str, Any] = {}
    for entry in trace_config:
        key, _, value = entry.removeprefix("triton,").partition("=")
        if key == "level" and value:
            settings.setdefault("trace_level", []).append(value)
        elif key in _TRACE_SETTING_NAMES and value:
            settings[_TRACE_SETTING_NAMES[key]] = value
        else:
            raise PyTritonBadParameterError(
                f"Model '{model_name}': trace_config entry {entry!r} is not a per-model trace setting "
                "(level=, rate=, count=, triton,log-frequency=); the trace mode, file and OpenTelemetry "
                "settings belong to the server: TritonConfig(trace_config=[...])"
            )
    return settings


_TRACE_SETTING_NAMES = {"rate": "trace_rate", "count": "trace_count", "log-frequency": "log_frequency"}


def _restricted_apis(group: str) -> set[str]:
    """The APIs of a Triton restricted-API group `<apis>:<header>=<value>`."""
    return set(group.split(":", 1)[0].split(","))


class _Serving:
    """What Triton and RemoteTriton share: binding callables, loading them into Triton with their workers,
    serving, keeping them loaded and stopping. A subclass says how Triton is reached (`_start_triton`, which
    sets the control and the transport) and how it is left (`_leave_triton`)."""

    def __init__(self, *, workspace: Path, lifecycle: TritonLifecyclePolicy, debug: bool) -> None:
        self._workspace = workspace
        self._lifecycle = lifecycle
        self._debug = debug
        self._control: TritonControl | None = None
        self._model_repository = workspace / podenv.MODELS_SUBDIR
        self._runtime = workspace / podenv.RUNTIME_SUBDIR
        self._transport: TransportSettings | None = None
        self._pending: list[tuple[ModelSpec, list[Callable[..., Any]]]] = []
        self._workers: dict[str, ModelWorker] = {}
        self._trace_settings: dict[str, dict[str, Any]] = {}
        self._fatal: BaseException | None = None
        self._stop_requested = threading.Event()
        self._signalled = False
        self._draining = False
        self._group = _process_group()
        self._started = False
        self._connected = False
        self._stopped = False
        self._lock = threading.RLock()

    def __enter__(self) -> Any:
        if self._lifecycle.launch_triton_on_startup:
            try:
                self.connect()
            except BaseException:
                self.stop()
                raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def bind(
        self,
        model_name: str,
        infer_func: Callable[..., Any] | Sequence[Callable[..., Any]],
        inputs: Sequence[Tensor],
        outputs: Sequence[Tensor],
        model_version: int = 1,
        config: ModelConfig | None = None,
        strict: bool = False,
        trace_config: list[str] | None = None,
    ) -> None:
        """Serve `infer_func` as version `model_version` of `model_name`. A list of callables gives one
        Triton instance each. `trace_config` sets Triton's trace settings for this model."""
        try:
            check_model_name(model_name)
            named_inputs = name_tensors(inputs, "INPUT")
            named_outputs = name_tensors(outputs, "OUTPUT")
        except ValueError as error:
            raise PyTritonValidationError(str(error)) from None
        if isinstance(model_version, bool) or not isinstance(model_version, int) or model_version < 1:
            raise PyTritonValidationError(
                f"Model '{model_name}': model_version must be a positive integer, not {model_version!r}"
            )
        config = config or ModelConfig()
        funcs = list(infer_func) if isinstance(infer_func, (list, tuple)) else [infer_func]
        if not funcs or not all(callable(func) for func in funcs):
            raise PyTritonValidationError(
                f"infer_func of model '{model_name}' must be a callable or a list of callables"
            )
        if not config.decoupled and any(_is_generator_callable(func) for func in funcs):
            raise PyTritonModelConfigError(
                f"Model '{model_name}' callable is a generator; "
                "bind it with ModelConfig(decoupled=True) to stream"
            )
        if config.batching and config.max_batch_size < 1:
            raise PyTritonModelConfigError(
                f"Model '{model_name}': max_batch_size must be at least 1 when batching is on "
                "(use batching=False)"
            )
        self._check_model_config(model_name, config)
        trace_settings = _model_trace_settings(model_name, trace_config or ())
        spec = ModelSpec(
            model_name,
            named_inputs,
            named_outputs,
            config,
            instances=len(funcs) * self._group.count,
            strict=strict,
            version=model_version,
            warmups=warmup_samples(
                model_name, named_inputs, config.model_warmup or (), batching=config.batching
            ),
        )
        with self._lock:
            known = {pending.name for pending, _ in self._pending} | set(self._workers)
            if model_name in known:
                raise PyTritonValidationError(f"A model named '{model_name}' is already bound")
            if trace_settings:
                self._trace_settings[model_name] = trace_settings
            if not self._connected:
                self._pending.append((spec, funcs))
                return
            try:
                self._load(spec, funcs)
            except BaseException:
                self._trace_settings.pop(model_name, None)
                raise

    def _check_model_config(self, model_name: str, config: ModelConfig) -> None:
        """What this kind of Triton cannot serve, refused at bind()."""

    def connect(self) -> None:
        """Reach Triton (launching it in local mode) and load every bound model."""
        self._start()
        with self._lock:
            pending, self._pending = self._pending, []
            for spec, funcs in pending:
                self._load(spec, funcs)
            self._connected = True

    def is_connected(self) -> bool:
        return self._connected and not self._stopped

    def serve(self, monitoring_period_s: float = 1.0) -> None:
        """Serve until SIGINT or SIGTERM, then drain and stop. Exits non-zero after an unrecoverable error."""
        self.connect()
        previous = {}
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                previous[signum] = signal.signal(signum, self._on_stop_signal)
        try:
            self._check_bound()
            while not self._stop_requested.wait(monitoring_period_s):
                self._check_triton()
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            self.stop()
        if self._fatal is not None:
            raise SystemExit(f"Serving stopped after an unrecoverable error: {self._fatal}")

    def _check_bound(self) -> None:
        """Exit when a model that must be served is not bound once serving starts (serve() checks once)."""

    def _check_triton(self) -> None:
        """Raise when Triton can no longer serve (serve() checks every monitoring period)."""

    def _on_stop_signal(self, *_: object) -> None:
        self._signalled = True
        self._stop_requested.set()

    def is_alive(self) -> bool:
        return self._control is not None and not self._stopped and self._control.is_live()

    def stop(self) -> bool:
        """Drain in-flight requests, leave Triton, stop the workers and free shared memory. True when this
        call stopped serving, False when it was stopped already."""
        with self._lock:
            if self._stopped:
                return False
            self._stopped = True
            self._draining = True
            self._stop_requested.set()
        if self._started:
            self._leave_triton()
        for worker in self._workers.values():
            worker.stop()
        self._release()
        if self._control is not None:
            self._control.close()
        return True

    def _leave_triton(self) -> None:
        raise NotImplementedError

    def _release(self) -> None:
        """What the subclass holds beyond Triton and the workers."""

    def _wait_until_idle(self, budget_s: float, clients: Callable[[], int] = lambda: 0) -> int:
        """Wait, within `budget_s`, until no request is in flight and `clients()` counts no connection for a
        short while; returns the connections still counted."""
        deadline = time.monotonic() + budget_s
        quiet_since = time.monotonic()
        connected = 0
        while time.monotonic() < deadline:
            connected = clients()
            if connected or any(worker.in_flight for worker in self._workers.values()):
                quiet_since = time.monotonic()
            elif time.monotonic() - quiet_since >= DRAIN_QUIET_S:
                break
            time.sleep(DRAIN_POLL_S)
        return connected

    def _unrecoverable(self, error: BaseException) -> None:
        LOGGER.error("Unrecoverable error, stopping: %s", error)
        self._fatal = error
        self._stop_requested.set()
        if threading.current_thread() is not threading.main_thread():
            threading.Thread(target=self._stop_after_reply, daemon=True).start()

    def _stop_after_reply(self) -> None:
        """Outside serve(), nothing waits for the stop request: stop here once the error reply is out."""
        time.sleep(0.2)
        if not self._stopped and threading.main_thread().is_alive():
            self.stop()

    def _start(self) -> None:
        with self._lock:
            if self._started:
                return
            if self._stopped:
                raise PyTritonInvalidOperationError("This Triton object was stopped; create a new one")
            self._started = True
            try:
                self._start_triton()
            except BaseException:
                self.stop()  # leaves whatever started; this object does not start again
                raise
        self._warn_if_verbose()

    def _start_triton(self) -> None:
        raise NotImplementedError

    def _warn_if_verbose(self) -> None:
        assert self._control is not None
        try:
            level = self._control.log_verbose_level()
        except PyTritonError as error:
            LOGGER.debug("Could not read Triton's log settings: %s", error)
            return
        if level > 0:
            LOGGER.warning(
                "Triton at %s logs verbosely (log_verbose_level=%d), which slows inference down",
                self._control.url,
                level,
            )

    def _attach(self, shm_dir: Path) -> None:
        """Use a Triton that runs already, prepared by `kubetriton bootstrap` in the shared workspace."""
        assert self._control is not None
        token_file = self._workspace / podenv.REPOSITORY_TOKEN_FILE
        try:
            repository_token = token_file.read_text().strip()
        except FileNotFoundError:
            raise PyTritonRuntimeError(
                f"{token_file} is missing: the workspace must be the one the Triton at {self._control.url} "
                "serves its model repository from, prepared by `kubetriton bootstrap`"
            ) from None
        self._serve_through(repository_token, self._workspace / podenv.SOCKETS_SUBDIR, shm_dir / "kubetriton")

    def _serve_through(self, repository_token: str, sockets: Path, arena_dir: Path) -> None:
        """Serve the bound models through the running Triton whose repository token is given, with the
        workers' sockets and arenas in these directories; keep the models loaded while it runs."""
        assert self._control is not None
        self._control.repository_token = repository_token
        sockets.mkdir(parents=True, exist_ok=True)
        self._transport = self._transport_settings(sockets, arena_dir)
        if self._group.loads_models:
            threading.Thread(
                target=self._keep_models_loaded, name="kubetriton-model-keeper", daemon=True
            ).start()

    def _transport_settings(self, sockets: Path, arena_dir: Path) -> TransportSettings:
        """Where this process's instances listen and put tensors; the proxies of a model that several
        processes serve wait for a restarting one."""
        arena_bytes = int(os.environ.get(podenv.ENV_ARENA_BYTES, podenv.DEFAULT_ARENA_BYTES))
        wait_s = WORKER_RESTART_WAIT_S if self._group.count > 1 else 0.0
        return TransportSettings(sockets, arena_dir, arena_bytes, worker_wait_s=wait_s)

    def _keep_models_loaded(self) -> None:
        """Load the bound models again when Triton restarted and came back without them.

        Triton loads models only when asked (explicit model control), so after a restart it serves none of
        them until the worker asks again. The check runs while Triton is live (it stops answering as soon as
        it shuts down); failed loads are retried with a growing pause."""
        assert self._control is not None
        pause = RELOAD_CHECK_S
        while not self._stop_requested.wait(pause):
            if not self.is_alive():
                continue
            unloaded = [name for name in list(self._workers) if not self._control.is_model_ready(name)]
            failed = False
            for name in unloaded:
                LOGGER.warning("Model '%s' is not loaded in Triton (did Triton restart?); loading it", name)
                try:
                    self._load_into_triton(name)
                except (PyTritonModelConfigError, PyTritonRuntimeError) as error:
                    failed = True
                    LOGGER.error("Loading model '%s' again failed: %s", name, error)
            pause = min(pause * 2, RELOAD_PAUSE_MAX_S) if failed else RELOAD_CHECK_S

    def _prepare(self, spec: ModelSpec, funcs: list[Callable[..., Any]]) -> tuple[ModelWorker, bool]:
        """Start this process's instances of the model, which answer its warm-up samples first, and write
        the model into the repository when this process loads models. With the worker, whether Triton has
        to load the model: False when it serves the very files written already (a restarted process)."""
        assert self._transport is not None
        parameters = self._transport.model_parameters(spec.name, spec.instances)
        worker = ModelWorker(
            spec,
            funcs,
            self._transport,
            debug=self._debug,
            on_unrecoverable=self._unrecoverable,
            first_instance=self._group.first_instance(len(funcs)),
        )
        worker.start()
        if not self._group.loads_models:
            return worker, False
        try:
            changed = write_model(self._model_repository, spec, parameters, self._runtime)
        except BaseException:
            worker.stop()
            raise
        return worker, changed

    def _load(self, spec: ModelSpec, funcs: list[Callable[..., Any]]) -> None:
        assert self._control is not None
        worker, changed = self._prepare(spec, funcs)
        try:
            if changed or (self._group.loads_models and not self._control.is_model_ready(spec.name)):
                self._load_into_triton(spec.name)
        except BaseException:
            worker.stop()
            raise
        self._workers[spec.name] = worker

    def _load_into_triton(self, name: str) -> None:
        assert self._control is not None
        try:
            self._control.load(name)
        except PyTritonModelConfigError as error:
            raise PyTritonModelConfigError(f"{error}{self._log_lines_about(name)}") from None
        try:
            self._apply_trace_settings(name)
        except PyTritonError:
            with contextlib.suppress(PyTritonError):
                self._control.unload(name)
            raise

    def _apply_trace_settings(self, name: str) -> None:
        assert self._control is not None
        if name in self._trace_settings:
            self._control.update_trace_settings(name, self._trace_settings[name])

    def _log_lines_about(self, model: str) -> str:
        """Triton's log lines about a model whose load failed, where kubetriton has the log."""
        return ""


class Triton(_Serving):
    """Serves bound callables through Triton: a local `tritonserver` it launches, or in a pod the sidecar.
    Use as a context manager, or call run() and stop()."""

    def __init__(
        self,
        *,
        config: TritonConfig | None = None,
        workspace: str | Path | None = None,
        triton_lifecycle_policy: TritonLifecyclePolicy | None = None,
        security_config: TritonSecurityConfig | None = None,
    ) -> None:
        self._config = (config or TritonConfig()).merged_over(TritonConfig.from_env())
        lifecycle = triton_lifecycle_policy or (
            VertextAILifecyclePolicy if self._config.allow_vertex_ai else DefaultTritonLifecyclePolicy
        )
        self._pod = podenv.AttachSettings.from_environ()
        self._supervisor = None if self._pod else os.environ.get(podenv.ENV_SUPERVISOR)
        self._workspace_given = workspace
        debug = (self._config.log_verbose or 0) > 0 or os.environ.get("KUBETRITON_DEBUG") == "1"
        self._workspace_lock: int | None = None
        if self._pod is not None:
            self._refuse_what_a_pod_cannot_apply(lifecycle, security_config)
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
        self._security = security_config or TritonSecurityConfig()
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

    def run(self) -> None:
        """Start serving in the background: launch or attach to Triton and load every bound model."""
        self.connect()

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

    def _leave_triton(self) -> None:
        if self._publication is not None:
            record, lock = self._publication
            record.unlink(missing_ok=True)
            os.close(lock)
            self._publication = None
        if self._server is not None:
            self._server.stop()
        elif self._pod is not None:
            self._drain()
        else:  # hosted: the supervisor stops Triton, which finishes what it passed on to this process
            self._wait_until_idle(REMOTE_DRAIN_S)

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
        deadline = time.monotonic() + podenv.SIDECAR_EXIT_TIMEOUT_S + SIDECAR_UNLOAD_S
        while any(worker.attached for worker in self._workers.values()) and time.monotonic() < deadline:
            time.sleep(DRAIN_POLL_S)

    def _start_local(self) -> None:
        config = self._config
        server_id = config.id or f"{os.getpid()}-{secrets.token_hex(4)}"
        shm_prefix = f"{podenv.SHM_MOUNT}/kubetriton-{server_id}"
        if config.model_repository is not None:
            self._model_repository = Path(config.model_repository)
        sockets = self._workspace / podenv.SOCKETS_SUBDIR
        for directory in (self._model_repository, sockets):
            directory.mkdir(parents=True, exist_ok=True)
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
                extra_args.append(f"--load-model={spec.name}")
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
            exit_timeout_s=config.exit_timeout_secs or podenv.DEFAULT_DRAIN_SECONDS,
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

    def _start_hosted(self, supervisor: str) -> None:
        """One of several worker processes on this machine: serve through the one tritonserver that their
        supervisor hosts, launched as the first process to ask configured it (`kubetriton.supervisor`)."""
        from kubetriton.supervisor import ask_for_server

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


def _process_group() -> podenv.ProcessGroup:
    try:
        return podenv.ProcessGroup.from_environ()
    except ValueError as error:
        raise PyTritonValidationError(str(error)) from None


def _local_address(bound: str | None) -> str:
    """Where this machine reaches a server bound to `bound`: loopback unless it is bound to one address."""
    return "127.0.0.1" if bound in (None, "", "0.0.0.0", "::") else bound


class RemoteTriton(_Serving):
    """Binds callables to a Triton that runs already: one that a `Triton()` of this user serves on this
    machine (PyTriton's remote mode between two scripts), or any Triton prepared like the pod's sidecar
    (kubetriton's attach mode, which `Triton()` uses inside a pod).

    Without a `workspace` (nor `KUBETRITON_WORKSPACE`), a local `Triton()` listening at `url` is looked up
    among the servers this user's processes publish (see `kubetriton.server`): its repository, sockets,
    arenas and tokens are used. Otherwise the Triton must run with kubetriton's arguments (explicit model
    control, its model repository in `<workspace>/models`, the repository token from
    `<workspace>/repository-token` on the model-repository API) and find the proxy's runtime, all of which
    `kubetriton bootstrap --workspace <workspace>` prepares (default workspace: /workspace, the pod's). The
    workspace must be the same directory for both, and the shared-memory directory (`KUBETRITON_SHM_DIR`,
    default /dev/shm) too: sockets and tensors pass through them, so the two run on one machine (in one pod,
    or containers sharing both volumes). `url` is how this process reaches Triton's HTTP or gRPC endpoint,
    and `access_token` what its protected endpoints demand.
    """

    def __init__(
        self, url: str, workspace: str | Path | None = None, access_token: str | None = None
    ) -> None:
        self._endpoint = parse_url(url)
        self._url = self._endpoint.url
        self._workspace_given = workspace or os.environ.get(podenv.ENV_WORKSPACE)
        super().__init__(
            workspace=Path(self._workspace_given or podenv.WORKSPACE_MOUNT),
            lifecycle=DefaultTritonLifecyclePolicy,
            debug=os.environ.get("KUBETRITON_DEBUG") == "1",
        )
        self._access_token = access_token

    def _start_triton(self) -> None:
        self._control = TritonControl(self._url, access_token=self._access_token)
        deadline = time.monotonic() + REMOTE_WAIT_S
        LOGGER.info("Waiting for Triton at %s", self._url)
        self._control.wait_until_live(REMOTE_WAIT_S)
        local = None if self._workspace_given else self._published_server(deadline)
        if local is None:
            if not self._workspace_given and not self._bootstrapped():
                raise PyTritonRuntimeError(
                    f"No Triton() of this user on this machine listens at {self._url}, and {self._workspace} "
                    "is no workspace prepared by `kubetriton bootstrap`; for such a Triton elsewhere, give "
                    "RemoteTriton(url, workspace=...)"
                )
            self._attach(Path(os.environ.get(podenv.ENV_SHM_DIR, podenv.SHM_MOUNT)))
            return
        LOGGER.info("Binding to the Triton() of this user at %s", self._url)
        self._model_repository = Path(local.model_repository)
        self._runtime = Path(local.runtime)
        self._control.access_token = local.access_token
        self._serve_through(local.repository_token, Path(local.sockets), Path(local.arena_dir))

    def _published_server(self, deadline: float) -> PublishedServer | None:
        """The Triton() of this user that listens at the URL. One started at the same moment as this process
        answers before it has published its record: unless there is a workspace prepared by `kubetriton
        bootstrap` to attach to instead, or the URL names another machine, wait for the record until
        `deadline`."""
        local = find_published(self._endpoint)
        if local is not None or self._bootstrapped() or not is_this_machine(self._endpoint.host):
            return local
        LOGGER.info("Waiting for the Triton() at %s to publish where it serves from", self._url)
        while local is None and time.monotonic() < deadline:
            time.sleep(PUBLISHED_POLL_S)
            local = find_published(self._endpoint)
        return local

    def _bootstrapped(self) -> bool:
        return (self._workspace / podenv.REPOSITORY_TOKEN_FILE).is_file()

    def _leave_triton(self) -> None:
        """Finish what is in flight, then unload the models: nothing is left in Triton to serve them."""
        assert self._control is not None
        self._wait_until_idle(REMOTE_DRAIN_S)
        if not self._group.loads_models:
            return
        for name in self._workers:
            try:
                self._control.unload(name)
            except PyTritonError as error:
                LOGGER.warning("Unloading model '%s' failed: %s", name, error)
