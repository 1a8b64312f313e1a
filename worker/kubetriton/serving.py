"""Serving bound callables through a Triton: what `Triton()` and `RemoteTriton` share, whichever Triton
they serve through.

`Serving` binds callables (their `ModelSpec` and the worker instances that run them), loads them into
Triton through its repository API, keeps them loaded while Triton runs (a restarted Triton comes back
without them), serves until SIGINT or SIGTERM, and stops: it drains what is in flight, leaves Triton and
stops the workers. Attaching to a Triton that runs already, through the workspace `kubetriton bootstrap`
prepared or through a local server's published record, is here too (`_attach`, `_serve_through`): the
pod's worker, a worker process of several and `RemoteTriton` all do it.

How Triton is reached and how it is left belong to the subclasses: `TritonServing` (`triton_serving`)
launches a local tritonserver, asks its supervisor for the one it hosts, or waits for the pod's sidecar;
`RemoteServing` (`remote_serving`) binds to one that runs already. `pytriton.triton` hands PyTriton's
calls to them.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pytriton.exceptions import (
    PyTritonBadParameterError,
    PyTritonError,
    PyTritonInvalidOperationError,
    PyTritonModelConfigError,
    PyTritonRuntimeError,
    PyTritonValidationError,
)
from pytriton.model_config import ModelConfig, Tensor
from pytriton.settings import TritonLifecyclePolicy

from kubetriton import podenv
from kubetriton.control import TritonControl
from kubetriton.model_repository import ModelSpec, write_model
from kubetriton.private_files import private_folder
from kubetriton.warmup import warmup_samples
from kubetriton.worker import WORKER_RESTART_WAIT_S, ModelWorker, TransportSettings, arena_bytes

LOGGER = logging.getLogger(__name__)

LEAVE_DRAIN_S = 30.0
"""How long a process that leaves a Triton it does not own (a `RemoteTriton`, one worker process of
several) waits for the requests in flight."""
DRAIN_QUIET_S = 0.5
DRAIN_POLL_S = 0.1
SIGNAL_CHECK_S = 0.1
"""How often serve() looks whether SIGINT or SIGTERM came. Its handler only notes the signal: a handler that
takes a lock (`Event.set`) waits forever when the signal interrupts the main thread while that thread holds
the lock, inside `Event.wait` or inside the handler of a signal just before (a held Ctrl-C; a worker process
whose supervisor was killed with -9 was seen taking three SIGTERMs at once, and serving on)."""
RELOAD_CHECK_S = 2.0
"""Attach mode: how often the worker checks that Triton still has its models loaded."""
RELOAD_PAUSE_MAX_S = 60.0
"""The longest pause between tries while loading a model again keeps failing."""


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


def debug_requested() -> bool:
    """KUBETRITON_DEBUG, refused with PyTritonValidationError when it cannot be read."""
    try:
        return podenv.debug_requested()
    except ValueError as error:
        raise PyTritonValidationError(str(error)) from None


def _process_group() -> podenv.ProcessGroup:
    try:
        return podenv.ProcessGroup.from_environ()
    except ValueError as error:
        raise PyTritonValidationError(str(error)) from None


class Serving:
    """Bound callables served through one Triton: binding them, loading them into Triton with their
    workers, serving, keeping them loaded and stopping. A subclass says how Triton is reached
    (`_start_triton`, which sets the control and the transport) and how it is left (`_leave_triton`)."""

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

    def bind(
        self,
        model_name: str,
        funcs: list[Callable[..., Any]],
        inputs: tuple[Tensor, ...],
        outputs: tuple[Tensor, ...],
        *,
        version: int,
        config: ModelConfig,
        strict: bool,
        trace_config: Sequence[str],
    ) -> None:
        """Serve `funcs`, one instance each in this process, as version `version` of `model_name`, whose
        arguments `pytriton.triton` checked and whose tensors it named; `trace_config` sets Triton's trace
        settings for this model."""
        self._check_model_config(model_name, config)
        trace_settings = _model_trace_settings(model_name, trace_config)
        spec = ModelSpec(
            model_name,
            inputs,
            outputs,
            config,
            instances=len(funcs) * self._group.count,
            strict=strict,
            version=version,
            warmups=warmup_samples(model_name, inputs, config.model_warmup or (), batching=config.batching),
        )
        with self._lock:
            self._refuse_when_stopped()
            known = {pending.name for pending, _ in self._pending} | set(self._workers)
            if model_name in known:
                raise PyTritonInvalidOperationError(f"A model named '{model_name}' is already bound")
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
            next_check = time.monotonic() + monitoring_period_s
            while not self._signalled and not self._stop_requested.wait(
                min(SIGNAL_CHECK_S, monitoring_period_s)
            ):
                if time.monotonic() >= next_check:
                    self._check_triton()
                    next_check = time.monotonic() + monitoring_period_s
        finally:
            try:
                self.stop()  # with the handlers in place: a second signal cannot cut the drain short
            finally:
                for signum, handler in previous.items():
                    signal.signal(signum, handler)
        if self._fatal is not None:
            raise SystemExit(f"Serving stopped after an unrecoverable error: {self._fatal}")

    def _check_bound(self) -> None:
        """Exit when a model that must be served is not bound once serving starts (serve() checks once)."""

    def _check_triton(self) -> None:
        """Raise when Triton can no longer serve (serve() checks every monitoring period)."""

    def _on_stop_signal(self, *_: object) -> None:
        """Note the signal, which serve() acts on: see SIGNAL_CHECK_S."""
        if self._signalled:
            LOGGER.warning("Already stopping: in-flight requests are being finished")
        self._signalled = True

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
            self._refuse_when_stopped()
            if self._started:
                return
            self._started = True
            try:
                self._start_triton()
            except BaseException:
                self.stop()  # leaves whatever started; this object does not start again
                raise
        self._warn_if_verbose()

    def _refuse_when_stopped(self) -> None:
        if self._stopped:
            raise PyTritonInvalidOperationError("This Triton object was stopped; create a new one")

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
        private_folder(sockets)
        self._transport = self._transport_settings(sockets, arena_dir)
        if self._group.loads_models:
            threading.Thread(
                target=self._keep_models_loaded, name="kubetriton-model-keeper", daemon=True
            ).start()

    def _transport_settings(self, sockets: Path, arena_dir: Path) -> TransportSettings:
        """Where this process's instances listen and put tensors; the proxies of a model that several
        processes serve wait for a restarting one."""
        wait_s = WORKER_RESTART_WAIT_S if self._group.count > 1 else 0.0
        return TransportSettings(sockets, arena_dir, arena_bytes(), worker_wait_s=wait_s)

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
