"""Triton: bind inference callables to a Triton server and serve them.

`Triton()` launches a local `tritonserver` by default. Inside a pod rendered by the kubetriton operator
(`KUBETRITON_MODE=attach`), it attaches to the Triton sidecar instead. The same script runs unchanged
in both places: `bind()` writes the model into the repository Triton reads, starts the worker instances
that execute the callable, and loads the model through Triton's repository API.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import json
import logging
import os
import secrets
import signal
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from kubetriton import podenv
from kubetriton.drain import client_connections, request_sidecar_stop
from kubetriton.health import HealthServer
from kubetriton.model_repository import ModelSpec, check_model_name, name_tensors, write_model
from kubetriton.server import (
    LocalTritonServer,
    claim,
    http_ok,
    remove_abandoned,
    remove_owned,
    wait_until_live,
)
from kubetriton.sidecar.bootstrap import install_runtime
from kubetriton.triton_home import locate
from kubetriton.worker import ModelWorker, TransportSettings

from pytriton.exceptions import (
    PyTritonInvalidOperationError,
    PyTritonModelConfigError,
    PyTritonRuntimeError,
    PyTritonValidationError,
)
from pytriton.model_config import ModelConfig, Tensor

LOGGER = logging.getLogger(__name__)

ENV_CONFIG_PREFIX = "PYTRITON_TRITON_CONFIG_"
SIDECAR_WAIT_S = 600.0
MODEL_LOAD_TIMEOUT_S = 300.0
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


@dataclasses.dataclass
class TritonConfig:
    """Settings of the local Triton server. Each field can also be set from the environment as
    `PYTRITON_TRITON_CONFIG_<FIELD>` (for example `PYTRITON_TRITON_CONFIG_HTTP_PORT=8010`);
    a value given here wins over the environment.

    Header forwarding is opt-in, as in PyTriton: HTTP/gRPC headers whose names match
    `http_header_forward_pattern` / `grpc_header_forward_pattern` reach `Request.parameters`.
    `cache_config` defaults to a 16 MiB local response cache; `[]` turns the cache off.
    """

    id: str | None = None
    model_repository: Path | None = None
    log_verbose: int | None = None
    log_file: Path | None = None
    exit_timeout_secs: int | None = None
    http_port: int | None = None
    grpc_port: int | None = None
    metrics_port: int | None = None
    http_address: str | None = None
    grpc_address: str | None = None
    metrics_address: str | None = None
    http_header_forward_pattern: str | None = None
    grpc_header_forward_pattern: str | None = None
    allow_metrics: bool | None = None
    cache_config: list[str] | None = None
    cache_directory: str | None = None
    buffer_manager_thread_count: int | None = None

    @classmethod
    def from_env(cls) -> TritonConfig:
        values: dict[str, Any] = {}
        for field in dataclasses.fields(cls):
            raw = os.environ.get(ENV_CONFIG_PREFIX + field.name.upper())
            if raw is None:
                continue
            if field.name in (
                "log_verbose",
                "exit_timeout_secs",
                "buffer_manager_thread_count",
            ) or field.name.endswith("_port"):
                values[field.name] = int(raw)
            elif field.name == "allow_metrics":
                values[field.name] = raw.lower() in ("1", "true", "yes")
            elif field.name == "cache_config":
                values[field.name] = [item for item in raw.split(";") if item]
            elif field.name in ("model_repository", "log_file"):
                values[field.name] = Path(raw)
            else:
                values[field.name] = raw
        return cls(**values)

    def __post_init__(self) -> None:
        for name in ("model_repository", "log_file"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, Path):
                setattr(self, name, Path(value))

    def merged_over(self, base: TritonConfig) -> TritonConfig:
        return dataclasses.replace(
            base,
            **{
                f.name: getattr(self, f.name)
                for f in dataclasses.fields(self)
                if getattr(self, f.name) is not None
            },
        )

    def extra_args(self) -> list[str]:
        """tritonserver arguments for the optional fields (the rest come from the pod contract)."""
        args = []
        for name in (
            "http_address",
            "grpc_address",
            "metrics_address",
            "http_header_forward_pattern",
            "grpc_header_forward_pattern",
            "cache_directory",
            "buffer_manager_thread_count",
        ):
            value = getattr(self, name)
            if value is not None:
                args.append(f"--{name.replace('_', '-')}={value}")
        if self.allow_metrics is False:
            args.append("--allow-metrics=false")
        args += [f"--cache-config={item}" for item in self.cache_config or ()]
        return args


def _is_generator_callable(func: Callable[..., Any]) -> bool:
    target = func if inspect.isfunction(func) or inspect.ismethod(func) else getattr(func, "__call__", func)  # noqa: B004
    target = inspect.unwrap(target)
    return inspect.isgeneratorfunction(target) or inspect.isasyncgenfunction(target)


class Triton:
    """Serves bound callables through Triton. Use as a context manager, or call run() and stop()."""

    def __init__(self, *, config: TritonConfig | None = None, workspace: str | Path | None = None) -> None:
        self._config = (config or TritonConfig()).merged_over(TritonConfig.from_env())
        self._attach = podenv.AttachSettings.from_environ()
        self._debug = (self._config.log_verbose or 0) > 0 or os.environ.get("KUBETRITON_DEBUG") == "1"
        self._workspace_lock: int | None = None
        if self._attach is not None:
            self._workspace = Path(self._attach.workspace)
        elif workspace is None:
            for parent in (tempfile.gettempdir(), podenv.SHM_MOUNT):
                remove_abandoned(Path(parent))
            self._workspace = Path(tempfile.mkdtemp(prefix="kubetriton-"))
            self._workspace_lock = claim(self._workspace)
        else:
            self._workspace = Path(workspace)
        self._server: LocalTritonServer | None = None
        self._http_url = ""
        self._repository_token = ""
        self._model_repository = self._workspace / podenv.MODELS_SUBDIR
        self._runtime = self._workspace / podenv.RUNTIME_SUBDIR
        self._transport: TransportSettings | None = None
        self._pending: list[tuple[ModelSpec, list[Callable[..., Any]]]] = []
        self._workers: dict[str, ModelWorker] = {}
        self._fatal: BaseException | None = None
        self._stop_requested = threading.Event()
        self._signalled = False
        self._health: HealthServer | None = None
        self._draining = False
        self._started = False
        self._stopped = False
        self._lock = threading.RLock()

    def __enter__(self) -> Triton:
        self._start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def bind(
        self,
        model_name: str,
        infer_func: Callable[..., Any] | Sequence[Callable[..., Any]],
        inputs: Sequence[Tensor],
        outputs: Sequence[Tensor],
        config: ModelConfig | None = None,
        strict: bool = False,
    ) -> None:
        """Serve `infer_func` as `model_name`. A list of callables gives one Triton instance each."""
        try:
            check_model_name(model_name)
            named_inputs = name_tensors(inputs, "INPUT")
            named_outputs = name_tensors(outputs, "OUTPUT")
        except ValueError as error:
            raise PyTritonValidationError(str(error)) from None
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
        if config.response_cache and self._attach is None and self._config.cache_config == []:
            raise PyTritonModelConfigError(
                f"Model '{model_name}' asks for the response cache, "
                "but TritonConfig(cache_config=[]) turned it off"
            )
        spec = ModelSpec(model_name, named_inputs, named_outputs, config, instances=len(funcs), strict=strict)
        with self._lock:
            known = {pending.name for pending, _ in self._pending} | set(self._workers)
            if model_name in known:
                raise PyTritonValidationError(f"A model named '{model_name}' is already bound")
            if self._started:
                self._load(spec, funcs)
            else:
                self._pending.append((spec, funcs))

    def run(self) -> None:
        """Start serving in the background: launch or attach to Triton and load every bound model."""
        self._start()
        with self._lock:
            pending, self._pending = self._pending, []
            for spec, funcs in pending:
                self._load(spec, funcs)

    def serve(self, monitoring_period_s: float = 1.0) -> None:
        """Serve until SIGINT or SIGTERM, then drain and stop. Exits non-zero after an unrecoverable error."""
        self.run()
        previous = {}
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                previous[signum] = signal.signal(signum, self._on_stop_signal)
        try:
            while not self._stop_requested.wait(monitoring_period_s):
                if self._server is not None and not self._server.is_running():
                    raise PyTritonRuntimeError(
                        f"tritonserver exited unexpectedly. Last lines of its log:\n{self._server.log_tail()}"
                    )
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            self.stop()
        if self._fatal is not None:
            raise SystemExit(f"Serving stopped after an unrecoverable error: {self._fatal}")

    def _on_stop_signal(self, *_: object) -> None:
        self._signalled = True
        self._stop_requested.set()

    def is_alive(self) -> bool:
        return bool(self._http_url) and http_ok(f"{self._http_url}/v2/health/live", timeout_s=1)

    def stop(self) -> None:
        """Drain in-flight requests, stop Triton (local mode) and the workers, and free shared memory."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
            self._draining = True
            self._stop_requested.set()
        if self._server is not None:
            self._server.stop()
        else:
            self._drain()
        for worker in self._workers.values():
            worker.stop()
        if self._health is not None:
            self._health.stop()
        if self._workspace_lock is not None:
            remove_owned(self._workspace)
            os.close(self._workspace_lock)
            self._workspace_lock = None

    def _drain(self) -> None:
        """Attach mode: finish what is in flight within the drain budget. After SIGTERM (the pod stops),
        first wait for the clients to leave, then stop the sidecar's Triton while still serving, as
        `kubetriton.drain` explains; after an unrecoverable error the sidecar keeps running for the
        restarted worker."""
        if self._attach is None:
            return
        deadline = time.monotonic() + self._attach.drain_seconds
        ports = (podenv.HTTP_PORT, podenv.GRPC_PORT)
        quiet_since = time.monotonic()
        clients = 0
        while time.monotonic() < deadline:
            clients = (client_connections(ports) or 0) if self._signalled else 0
            if clients or any(worker.in_flight for worker in self._workers.values()):
                quiet_since = time.monotonic()
            elif time.monotonic() - quiet_since >= DRAIN_QUIET_S:
                break
            time.sleep(DRAIN_POLL_S)
        if not self._signalled:
            return
        if clients:
            LOGGER.warning(
                "%d client connection(s) still open after the %g s drain budget; Triton closes them",
                clients,
                self._attach.drain_seconds,
            )
        if not request_sidecar_stop(self._workspace / podenv.SIDECAR_STOP_FIFO):
            return
        deadline = time.monotonic() + podenv.SIDECAR_EXIT_TIMEOUT_S + SIDECAR_UNLOAD_S
        while any(worker.attached for worker in self._workers.values()) and time.monotonic() < deadline:
            time.sleep(DRAIN_POLL_S)

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
            if self._attach is not None:
                self._start_attached()
            else:
                self._start_local()
            self._started = True

    def _start_local(self) -> None:
        server_id = self._config.id or f"{os.getpid()}-{secrets.token_hex(4)}"
        shm_prefix = f"{podenv.SHM_MOUNT}/kubetriton-{server_id}"
        arena_bytes = int(os.environ.get(podenv.ENV_ARENA_BYTES, podenv.DEFAULT_ARENA_BYTES))
        if self._config.model_repository is not None:
            self._model_repository = Path(self._config.model_repository)
        sockets = self._workspace / podenv.SOCKETS_SUBDIR
        for directory in (self._model_repository, sockets):
            directory.mkdir(parents=True, exist_ok=True)
        self._transport = TransportSettings(sockets, Path(shm_prefix) / "arenas", arena_bytes)
        self._repository_token = secrets.token_urlsafe(24)
        exit_timeout = self._config.exit_timeout_secs or podenv.DEFAULT_DRAIN_SECONDS
        home = locate()
        install_runtime(self._runtime, home.stub_python.wheels, home.stub_python.version)
        server_config = self._config
        if server_config.cache_config is None:
            server_config = dataclasses.replace(server_config, cache_config=list(DEFAULT_CACHE_CONFIG))
        if (
            server_config.cache_config
            and server_config.cache_directory is None
            and (home.path / "caches").is_dir()
        ):
            server_config = dataclasses.replace(server_config, cache_directory=str(home.path / "caches"))
        self._server = LocalTritonServer(
            home,
            model_repository=self._model_repository,
            repository_token=self._repository_token,
            shm_prefix=shm_prefix,
            log_path=self._config.log_file or self._workspace / "tritonserver.log",
            http_port=self._config.http_port or podenv.HTTP_PORT,
            grpc_port=self._config.grpc_port or podenv.GRPC_PORT,
            metrics_port=self._config.metrics_port or podenv.METRICS_PORT,
            exit_timeout_s=exit_timeout,
            log_verbose=self._config.log_verbose or 0,
            extra_args=server_config.extra_args(),
        )
        self._server.start()
        self._http_url = self._server.http_url

    def _start_attached(self) -> None:
        settings = self._attach
        assert settings is not None
        self._http_url = f"http://{settings.triton_host}:{podenv.HTTP_PORT}"
        self._health = HealthServer(
            settings.health_port,
            triton_http_url=self._http_url,
            declared_models=settings.models,
            workers=lambda: self._workers,
            draining=lambda: self._draining,
        )
        self._health.start()
        LOGGER.info("Waiting for the Triton sidecar at %s", self._http_url)
        wait_until_live(self._http_url, SIDECAR_WAIT_S)
        token_file = self._workspace / podenv.REPOSITORY_TOKEN_FILE
        self._repository_token = token_file.read_text().strip()
        sockets = self._workspace / podenv.SOCKETS_SUBDIR
        sockets.mkdir(parents=True, exist_ok=True)
        arena_bytes = int(os.environ.get(podenv.ENV_ARENA_BYTES, podenv.DEFAULT_ARENA_BYTES))
        self._transport = TransportSettings(sockets, Path(settings.shm_dir) / "kubetriton", arena_bytes)
        threading.Thread(target=self._keep_models_loaded, name="kubetriton-model-keeper", daemon=True).start()

    def _keep_models_loaded(self) -> None:
        """Attach mode: load the bound models again when the sidecar restarted and came back without them.

        Triton loads models only when asked (explicit model control), so after its container restarts
        it serves none of them until the worker asks again. The check runs while Triton is live (it stops
        answering as soon as it shuts down); failed loads are retried with a growing pause."""
        pause = RELOAD_CHECK_S
        while not self._stop_requested.wait(pause):
            if not self.is_alive():
                continue
            unloaded = [
                name
                for name in list(self._workers)
                if not http_ok(f"{self._http_url}/v2/models/{name}/ready")
            ]
            failed = False
            for name in unloaded:
                LOGGER.warning(
                    "Model '%s' is not loaded in Triton (did the sidecar restart?); loading it", name
                )
                try:
                    self._repository_call(f"/v2/repository/models/{name}/load")
                except (PyTritonModelConfigError, PyTritonRuntimeError) as error:
                    failed = True
                    LOGGER.error("Loading model '%s' again failed: %s", name, error)
            pause = min(pause * 2, RELOAD_PAUSE_MAX_S) if failed else RELOAD_CHECK_S

    def _load(self, spec: ModelSpec, funcs: list[Callable[..., Any]]) -> None:
        assert self._transport is not None
        worker = ModelWorker(
            spec, funcs, self._transport, debug=self._debug, on_unrecoverable=self._unrecoverable
        )
        worker.start()
        try:
            write_model(
                self._model_repository, spec, self._transport.model_parameters(spec.name), self._runtime
            )
            self._repository_call(f"/v2/repository/models/{spec.name}/load")
        except BaseException:
            worker.stop()
            raise
        self._workers[spec.name] = worker

    def _repository_call(self, path: str) -> None:
        request = urllib.request.Request(
            f"{self._http_url}{path}",
            data=b"{}",
            method="POST",
            headers={
                podenv.REPOSITORY_TOKEN_HEADER: self._repository_token,
                "Content-Type": "application/json",
            },
        )
        try:
            with urllib.request.urlopen(request, timeout=MODEL_LOAD_TIMEOUT_S):
                return
        except urllib.error.HTTPError as error:
            detail = error.read().decode(errors="replace")
            with contextlib.suppress(ValueError):
                detail = json.loads(detail).get("error", detail)
            raise PyTritonModelConfigError(f"Triton refused {path}: {detail}{self._load_log(path)}") from None
        except OSError as error:  # connection refused or reset, timeout
            reason = getattr(error, "reason", error)
            raise PyTritonRuntimeError(
                f"Triton at {self._http_url} did not answer {path}: {reason}"
            ) from None

    def _load_log(self, path: str) -> str:
        """Local mode: the Triton log lines about the model, which say why a load failed."""
        if self._server is None:
            return ""
        model = path.split("/")[-2]
        lines = [
            line
            for line in self._server.log_tail(LOAD_ERROR_LOG_LINES).splitlines()
            if line.startswith("E") and (f"'{model}'" in line or f" {model}" in line)
        ]
        return "\n" + "\n".join(lines) if lines else ""
