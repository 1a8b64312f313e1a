"""Synchronous PyTriton clients: query a model on any Triton server over HTTP or gRPC with numpy arrays.

`ModelClient` sends one request at a time, `FuturesModelClient` runs requests on a thread pool and returns
futures, and `DecoupledModelClient` streams the responses of a decoupled model over gRPC. Each reads the
model configuration once (after waiting for the server and the model to be ready) and uses it to name
positional inputs and to add or strip the batch axis.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import importlib
import queue
import sys
import threading
import time
import weakref
from collections.abc import Callable, Generator, Iterator, Mapping
from types import ModuleType
from typing import Any, TypeVar

import numpy as np
import tritonclient.grpc
import tritonclient.http
from kubetriton import replicas as replica_sets
from kubetriton.replicas import Replica, ReplicaSet

from pytriton.client import _protocol, utils
from pytriton.client._protocol import BaseModelClient
from pytriton.client._transport import Transport
from pytriton.client._url import Endpoint, parse_url
from pytriton.client.exceptions import (
    PyTritonClientClosedError,
    PyTritonClientError,
    PyTritonClientInferenceServerError,
    PyTritonClientModelDoesntSupportBatchingError,
    PyTritonClientModelUnavailableError,
    PyTritonClientQueueFullError,
    PyTritonClientTimeoutError,
    PyTritonClientValueError,
)
from pytriton.client.triton_model_config import TritonModelConfig

DEFAULT_INFERENCE_TIMEOUT_S = _protocol.DEFAULT_INFERENCE_TIMEOUT_S
"""The default of `inference_timeout_s`, under the name and in the module where PyTriton has it."""
_T = TypeVar("_T")
_SLOT_POLL_S = 0.1
_UNLIMITED_THREADS = sys.maxsize
"""A thread pool of this size starts a thread whenever a request finds none idle: PyTriton's meaning of
`max_workers=None`."""


def __getattr__(name: str) -> Any:
    """PyTriton keeps its asyncio clients in this module too; they are imported from `asyncio_client` only
    when asked for, so that the blocking clients never import asyncio's HTTP stack."""
    if name in ("AsyncioModelClient", "AsyncioDecoupledModelClient"):
        return getattr(importlib.import_module("pytriton.client.asyncio_client"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class ModelClient(BaseModelClient):
    """Synchronous client of one model on a Triton server.

    The first call that needs the model waits for the server and the model to be ready (at most
    `init_timeout_s`, 300 s by default) and reads its configuration; `lazy_init=False` does that at once.
    Inferences time out after `inference_timeout_s` (60 s by default) with PyTritonClientTimeoutError.
    A server that refuses connections during inference raises PyTritonClientInferenceServerError whose
    message starts with "connection refused"; while initializing, the client keeps trying until
    `init_timeout_s` and then raises PyTritonClientTimeoutError naming the last failure.

    One client serves one thread at a time; FuturesModelClient gives each worker thread its own.

    Given a name that resolves to several addresses, such as a model's `<model>-pods.<namespace>.svc`
    on a cluster, each inference goes to the address expected to answer first, and a new address is
    used within seconds of appearing (`kubetriton.replicas`); an address, a name with one address and
    a TLS URL are used as they are.
    """

    _streaming = False

    def __init__(
        self,
        url: str,
        model_name: str,
        model_version: str | None = None,
        *,
        lazy_init: bool = True,
        init_timeout_s: float | None = None,
        inference_timeout_s: float | None = None,
        model_config: TritonModelConfig | None = None,
        ensure_model_is_ready: bool = True,
        access_token: str | None = None,
    ) -> None:
        self._endpoint = parse_url(url)
        self._model_name = model_name
        self._model_version = _protocol.version_text(model_version)
        self._init_timeout_s = _protocol.DEFAULT_INIT_TIMEOUT_S if init_timeout_s is None else init_timeout_s
        self._inference_timeout_s = (
            _protocol.DEFAULT_INFERENCE_TIMEOUT_S if inference_timeout_s is None else inference_timeout_s
        )
        self._model_config = TritonModelConfig.of(model_config)
        self._model_ready = _protocol.ready_without_waiting(self._model_config, ensure_model_is_ready)
        self._access_token = access_token
        self._lock = threading.RLock()
        self._close_lock = threading.Lock()
        self._closed = False
        self._transport = Transport(self._endpoint, self._inference_timeout_s)
        """The connection to the URL's host: readiness, configuration, model control, and inference when
        the host is not balanced over its addresses."""
        self._replicas = (
            replica_sets.shared(self._endpoint.host, self._endpoint.port)
            if _protocol.balanced(self._endpoint)
            else None
        )
        self._replica_transports: dict[str, Transport] = {}
        self._replicas_seen = 0
        if not lazy_init:
            try:
                self._initialize()
            except BaseException:
                self.close()
                raise

    def __enter__(self) -> ModelClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Release the connection; later calls raise PyTritonClientClosedError. A wait for the model in
        another thread stops at its next poll."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
            self._transport.close()
            for transport in self._replica_transports.values():
                transport.close()
            self._replica_transports.clear()

    @property
    def model_config(self) -> TritonModelConfig:
        """The model's configuration, read from the server on first use; once read, a closed client still
        has it, as PyTriton's does."""
        if self._closed and self._model_config is not None:
            return self._model_config
        return self._initialize()

    @property
    def is_batching_supported(self) -> bool:
        return self.model_config.batching

    def wait_for_model(self, timeout_s: float) -> None:
        """Wait until the server and the model are ready; PyTritonClientTimeoutError after `timeout_s`."""
        self._check_open()
        self._wait_until_ready(timeout_s)
        self._model_ready = True

    def wait_for_server(self, timeout_s: float) -> None:
        """Wait until the server is live and ready; PyTritonClientTimeoutError after `timeout_s`."""
        self._check_open()
        probe = Transport(self._control_endpoint(), _protocol.probe_timeout_s(timeout_s))
        try:
            utils.wait_for_server_ready(probe.client, timeout_s, headers=self._headers())
        finally:
            probe.close()

    def load_model(self, config: str | None = None, files: dict[str, bytes] | None = None) -> None:
        """Have the server load (or reload) the model, as under explicit model control: from its repository,
        or from `config` (the configuration as JSON) and `files` ("file:<path in the model directory>" to
        content) when given. The repository endpoint may need the client's `access_token`."""
        self._request(lambda: self._transport.load_model(self._model_name, self._headers(), config, files))

    def unload_model(self) -> None:
        """Have the server unload the model."""
        self._request(lambda: self._transport.unload_model(self._model_name, self._headers()))

    def get_lib(self) -> ModuleType:
        """The tritonclient module of the client's protocol: tritonclient.http or tritonclient.grpc."""
        return self._transport.module

    def infer_sample(
        self,
        *inputs: Any,
        parameters: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        **named_inputs: Any,
    ) -> dict[str, np.ndarray]:
        """Infer one sample: the batch axis is added to the inputs and removed from the outputs when the
        model batches."""
        config, arrays = self._prepare(inputs, named_inputs, batch=False)
        return self._infer(config, arrays, parameters, headers, strip_batch_axis=config.batching)

    def infer_batch(
        self,
        *inputs: Any,
        parameters: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        **named_inputs: Any,
    ) -> dict[str, np.ndarray]:
        """Infer a batch: the first axis of every input is the batch axis."""
        config, arrays = self._prepare(inputs, named_inputs, batch=True)
        return self._infer(config, arrays, parameters, headers, strip_batch_axis=False)

    def _prepare(
        self, inputs: tuple[Any, ...], named_inputs: dict[str, Any], *, batch: bool
    ) -> tuple[TritonModelConfig, dict[str, np.ndarray]]:
        config = self._initialize()
        _protocol.check_transaction_policy(config, streaming=self._streaming)
        if batch and not config.batching:
            raise PyTritonClientModelDoesntSupportBatchingError(
                f"Model {self._model_name} has no batch axis (max_batch_size 0); use infer_sample"
            )
        add_batch_axis = config.batching and not batch
        return config, _protocol.build_inputs(config, inputs, named_inputs, add_batch_axis=add_batch_axis)

    def _infer(
        self,
        config: TritonModelConfig,
        arrays: dict[str, np.ndarray],
        parameters: Mapping[str, Any] | None,
        headers: Mapping[str, str] | None,
        *,
        strip_batch_axis: bool,
    ) -> dict[str, np.ndarray]:
        result = self._balanced(
            lambda transport: transport.infer(
                config, self._version, arrays, parameters, self._headers(headers)
            )
        )
        return _protocol.result_outputs(result, strip_batch_axis=strip_batch_axis)

    def _balanced(self, send: Callable[[Transport], _T]) -> _T:
        """Send a request to the replica expected to answer first; a replica that refuses the connection
        is held back and the request goes to another one, since it never reached a server."""
        replicas = self._replicas
        if replicas is None:
            return self._request(lambda: send(self._transport))
        while True:
            self._check_open()
            replica = replicas.acquire()
            transport = self._transport_to(replica.host)
            started = time.monotonic()
            try:
                result = send(transport)
            except Exception as error:
                refused = _protocol.never_sent(error)
                replicas.release(replica, unreachable=refused)
                if refused and replicas.others_reachable(replica):
                    continue
                self._check_open()
                raise _protocol.translate_error(
                    error, endpoint=transport.endpoint, model_name=self._model_name
                ) from error
            finally:
                self._close_departed(replicas)
            replicas.release(replica, latency_s=time.monotonic() - started)
            return result

    def _control_endpoint(self) -> Endpoint:
        """Where to ask what every replica answers alike: the URL, or one replica of a balanced name."""
        if self._replicas is None:
            return self._endpoint
        return dataclasses.replace(self._endpoint, host=self._replicas.any_host())

    def _transport_to(self, host: str) -> Transport:
        if host == self._endpoint.host:
            return self._transport
        transport = self._replica_transports.get(host)
        if transport is None:
            endpoint = dataclasses.replace(self._endpoint, host=host)
            transport = self._replica_transports[host] = Transport(endpoint, self._inference_timeout_s)
        return transport

    def _close_departed(self, replicas: ReplicaSet) -> None:
        """Close the connections to replicas that left the name's answer: a stopping pod then sees its
        clients go as soon as their requests are answered. Looked at only when the replicas changed."""
        if replicas.changes == self._replicas_seen:
            return
        self._replicas_seen = replicas.changes
        for host in self._replica_transports.keys() - replicas.hosts():
            self._replica_transports.pop(host).close()

    def _request(self, send: Callable[[], _T]) -> _T:
        """Send a request on the connection; its failure raises the client error for it (a closed
        client's first)."""
        self._check_open()
        try:
            return send()
        except Exception as error:
            self._check_open()
            raise _protocol.translate_error(
                error, endpoint=self._endpoint, model_name=self._model_name
            ) from error

    @property
    def _version(self) -> str:
        return self._model_version or ""

    def _headers(self, headers: Mapping[str, str] | None = None) -> dict[str, str]:
        return _protocol.merged_headers(self._endpoint, self._access_token, headers)

    def _check_open(self) -> None:
        if self._closed:
            raise PyTritonClientClosedError(f"The client of model {self._model_name} at {self.url} is closed")

    def _initialize(self) -> TritonModelConfig:
        """Wait for the model (once) and read its configuration (once)."""
        self._check_open()
        with self._lock:
            self._check_open()
            if self._model_config is not None and self._model_ready:
                return self._model_config
            deadline = time.monotonic() + self._init_timeout_s
            if not self._model_ready:
                self._wait_until_ready(self._init_timeout_s)
                self._model_ready = True
            if self._model_config is None:
                self._model_config = self._read_config(deadline)
            return self._model_config

    def _read_config(self, deadline: float) -> TritonModelConfig:
        headers = self._headers()
        try:
            raw = self._balanced(
                lambda transport: transport.model_config(self._model_name, self._version, headers)
            )
        except PyTritonClientError as error:
            if time.monotonic() > deadline and not isinstance(error, PyTritonClientClosedError):
                raise PyTritonClientTimeoutError(
                    f"Reading the configuration of model {self._model_name} at {self.url} timed out: {error}"
                ) from error
            raise
        return TritonModelConfig.from_triton_json(raw, self._model_version)

    def _wait_until_ready(self, timeout_s: float) -> None:
        """Poll readiness with a short-timeout connection until ready or `timeout_s` has passed."""
        deadline = time.monotonic() + timeout_s
        last_problem = "no answer yet"
        probe = Transport(self._control_endpoint(), _protocol.probe_timeout_s(timeout_s))
        try:
            while True:
                self._check_open()
                endpoint = self._control_endpoint()
                if endpoint != probe.endpoint:
                    probe.close()
                    probe = Transport(endpoint, _protocol.probe_timeout_s(timeout_s))
                try:
                    problem = probe.is_ready(self._model_name, self._version, self._headers())
                except Exception as error:
                    problem = _protocol.describe_probe_failure(error, self._endpoint)
                if problem is None:
                    return
                last_problem = problem
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                time.sleep(min(_protocol.READINESS_POLL_S, remaining))
            state = None
            with contextlib.suppress(Exception):
                state = probe.model_state(self._model_name, self._headers())
        finally:
            probe.close()
        if state is not None and state[0] == "UNAVAILABLE" and state[1]:
            raise PyTritonClientModelUnavailableError(
                f"Model {self._model_name} at {self.url} is unavailable: {state[1]}"
            )
        raise PyTritonClientTimeoutError(
            f"Model {self._model_name} at {self.url} was not ready within {timeout_s:g} s ({last_problem})"
        )


class _Stream:
    """One streamed call over its own gRPC connection: the request is sent when the stream is opened, and
    the responses queue up until they are read."""

    def __init__(
        self, endpoint: Endpoint, headers: dict[str, str], replica: tuple[ReplicaSet, Replica] | None = None
    ) -> None:
        """`replica`: the replica the stream went to, released when the stream ends (its latency: the
        wait for the first response)."""
        self.responses: queue.SimpleQueue[tuple[Any, BaseException | None]] = queue.SimpleQueue()
        self.answered = False
        self.endpoint = endpoint
        self._replica = replica
        self._started = time.monotonic()
        self._first_answer_s: float | None = None
        self._client: Any = tritonclient.grpc.InferenceServerClient(endpoint.address, ssl=endpoint.ssl)
        self._client.start_stream(lambda result, error: self.responses.put((result, error)), headers=headers)

    def answer_arrived(self) -> None:
        if self._first_answer_s is None:
            self._first_answer_s = time.monotonic() - self._started

    def send(
        self, config: TritonModelConfig, version: str, arrays: dict[str, np.ndarray], parameters: Any
    ) -> None:
        self._client.async_stream_infer(
            config.model_name,
            _protocol.triton_inputs(tritonclient.grpc, arrays, binary=False),
            model_version=version,
            outputs=_protocol.requested_outputs(tritonclient.grpc, config, binary=False),
            request_id=_protocol.new_request_id(),
            enable_empty_final_response=True,
            parameters=dict(parameters) if parameters else None,
        )

    def end(self, *, refused: bool = False) -> None:
        """Close the connection; once. A stream the server is still working on (the reader stopped early,
        or a timeout) is cancelled; an answered one is closed gracefully, so the server sees a normal end.
        `refused`: the replica refused the connection."""
        client, self._client = self._client, None
        if client is not None:
            client.stop_stream(cancel_requests=not self.answered)
            client.close()
            if self._replica is not None:
                replicas, replica = self._replica
                replicas.release(replica, latency_s=self._first_answer_s, unreachable=refused)


class _OpenStream(Iterator[dict[str, np.ndarray]]):
    """The responses of one streamed call. The client takes no other call while it is open: until its last
    response, an error, or until it is closed or dropped."""

    def __init__(
        self,
        responses: Generator[dict[str, np.ndarray], None, None],
        stream: _Stream,
        release: Callable[[], None],
    ) -> None:
        self._responses = responses
        self._end = weakref.finalize(self, _end_stream, stream, release)

    def __iter__(self) -> _OpenStream:
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        try:
            return next(self._responses)
        except BaseException:
            self._end()
            raise

    def close(self) -> None:
        """Stop reading: a stream the server is still sending is cancelled."""
        self._responses.close()
        self._end()


def _end_stream(stream: _Stream, release: Callable[[], None]) -> None:
    stream.end()
    release()


class DecoupledModelClient(ModelClient):
    """Client of a decoupled (streaming) model over gRPC: `infer_sample` and `infer_batch` send the request
    and return an iterator over the model's responses, zero or more. Each call uses its own gRPC stream, so
    an error in one call never leaks into the next. A server error in
    the middle of a stream raises PyTritonClientInferenceServerError after the earlier responses.

    `inference_timeout_s` bounds the wait for each response, not the whole stream. One stream at a time: a
    call while the previous call's stream is open raises PyTritonClientInferenceServerError.
    """

    _streaming = True

    def __init__(
        self,
        url: str,
        model_name: str,
        model_version: str | None = None,
        *,
        lazy_init: bool = True,
        init_timeout_s: float | None = None,
        inference_timeout_s: float | None = None,
        model_config: TritonModelConfig | None = None,
        ensure_model_is_ready: bool = True,
        access_token: str | None = None,
    ) -> None:
        if parse_url(url).protocol != "grpc":
            raise PyTritonClientValueError(
                f"DecoupledModelClient streams over gRPC only; use a grpc:// URL instead of {url!r}"
            )
        super().__init__(
            url,
            model_name,
            model_version,
            lazy_init=lazy_init,
            init_timeout_s=init_timeout_s,
            inference_timeout_s=inference_timeout_s,
            model_config=model_config,
            ensure_model_is_ready=ensure_model_is_ready,
            access_token=access_token,
        )
        self._stream_open = threading.Lock()

    def infer_sample(  # type: ignore[override]
        self,
        *inputs: Any,
        parameters: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        **named_inputs: Any,
    ) -> Iterator[dict[str, np.ndarray]]:
        """Stream the responses to one sample (batch axis added and removed when the model batches)."""
        return self._open_stream(inputs, named_inputs, parameters, headers, batch=False)

    def infer_batch(  # type: ignore[override]
        self,
        *inputs: Any,
        parameters: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        **named_inputs: Any,
    ) -> Iterator[dict[str, np.ndarray]]:
        """Stream the responses to a batch (the first axis of every input)."""
        return self._open_stream(inputs, named_inputs, parameters, headers, batch=True)

    def _open_stream(
        self,
        inputs: tuple[Any, ...],
        named_inputs: dict[str, Any],
        parameters: Mapping[str, Any] | None,
        headers: Mapping[str, str] | None,
        *,
        batch: bool,
    ) -> _OpenStream:
        """Send the request at once, as PyTriton does, and return the iterator over its responses."""
        if not self._stream_open.acquire(blocking=False):
            raise PyTritonClientInferenceServerError("Inference is already in progress")
        try:
            config, arrays = self._prepare(inputs, named_inputs, batch=batch)
            self._check_open()
            stream = self._send(config, arrays, parameters, headers)
        except BaseException:
            self._stream_open.release()
            raise
        responses = self._responses(stream, strip_batch_axis=config.batching and not batch)
        return _OpenStream(responses, stream, self._stream_open.release)

    def _send(
        self,
        config: TritonModelConfig,
        arrays: dict[str, np.ndarray],
        parameters: Mapping[str, Any] | None,
        headers: Mapping[str, str] | None,
    ) -> _Stream:
        replicas, endpoint, replica = self._replicas, self._endpoint, None
        if replicas is not None:
            replica = (replicas, replicas.acquire())
            endpoint = dataclasses.replace(endpoint, host=replica[1].host)
        stream = None
        try:
            stream = _Stream(endpoint, self._headers(headers), replica)
            stream.send(config, self._version, arrays, parameters)
        except Exception as error:
            if stream is not None:
                stream.end(refused=_protocol.never_sent(error))
            elif replica is not None:
                replicas.release(replica[1], unreachable=_protocol.never_sent(error))
            raise _protocol.translate_error(error, endpoint=endpoint, model_name=self._model_name) from error
        return stream

    def _responses(
        self, stream: _Stream, *, strip_batch_axis: bool
    ) -> Generator[dict[str, np.ndarray], None, None]:
        try:
            while True:
                try:
                    result, error = stream.responses.get(timeout=self._inference_timeout_s)
                except queue.Empty:
                    raise PyTritonClientTimeoutError(
                        f"Model {self._model_name} sent no response within {self._inference_timeout_s:g} s"
                    ) from None
                self._check_open()
                if error is not None:
                    stream.answered = True
                    refused = _protocol.never_sent(error)
                    stream.end(refused=refused)
                    raise _protocol.translate_error(
                        error, endpoint=stream.endpoint, model_name=self._model_name
                    )
                stream.answer_arrived()
                if _protocol.has_outputs(result):
                    yield _protocol.result_outputs(result, strip_batch_axis=strip_batch_axis)
                if _protocol.is_final_response(result):
                    stream.answered = True
                    return
        except PyTritonClientError:
            raise
        except Exception as error:
            raise _protocol.translate_error(
                error, endpoint=stream.endpoint, model_name=self._model_name
            ) from error
        finally:
            stream.end()


class FuturesModelClient(_protocol.ModelAddress):
    """Runs requests on a thread pool and returns `concurrent.futures.Future` objects.

    Each worker thread has its own ModelClient (tritonclient connections are not shared between threads);
    the configuration read by the first one is reused by the others. At most `max_workers` requests run
    and `max_queue_size` more wait for a thread (None: no limit). A submission that finds the queue full
    waits for room; it raises PyTritonClientQueueFullError at once when `non_blocking=True`, or once
    `inference_timeout_s` has passed when that is given.
    """

    def __init__(
        self,
        url: str,
        model_name: str,
        model_version: str | None = None,
        *,
        max_workers: int | None = 128,
        max_queue_size: int | None = 128,
        non_blocking: bool = False,
        init_timeout_s: float | None = None,
        inference_timeout_s: float | None = None,
        model_config: TritonModelConfig | None = None,
        ensure_model_is_ready: bool = True,
        access_token: str | None = None,
    ) -> None:
        if max_workers is not None and max_workers < 1:
            raise ValueError("max_workers must be greater than 0")
        if max_queue_size is not None and max_queue_size < 1:
            raise ValueError("max_queue_size must be greater than 0")
        self._endpoint = parse_url(url)
        self._model_name = model_name
        self._model_version = _protocol.version_text(model_version)
        self._init_timeout_s = init_timeout_s
        self._inference_timeout_s = inference_timeout_s
        self._model_config = TritonModelConfig.of(model_config)
        self._model_ready = _protocol.ready_without_waiting(self._model_config, ensure_model_is_ready)
        self._access_token = access_token
        self._max_workers = max_workers
        self._max_queue_size = max_queue_size
        self._non_blocking = non_blocking
        self._slots = (
            None
            if max_workers is None or max_queue_size is None
            else threading.BoundedSemaphore(max_workers + max_queue_size)
        )
        """Room for the requests running or waiting; None when either is unbounded (with threads without
        limit, no request ever waits for one)."""
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers or _UNLIMITED_THREADS, thread_name_prefix=f"pytriton-client-{model_name}"
        )
        self._local = threading.local()
        self._clients: list[ModelClient] = []
        self._lock = threading.Lock()
        self._closed = False

    def __enter__(self) -> FuturesModelClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self, wait: bool = True) -> None:
        """Stop accepting requests; the submitted ones still run, as in PyTriton, and the connections are
        released once they end: with `wait`, before this returns."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if wait:
            self._shutdown()
        else:
            threading.Thread(target=self._shutdown, daemon=True).start()

    def _shutdown(self) -> None:
        self._executor.shutdown(wait=True)
        with self._lock:
            clients, self._clients = self._clients, []
        for client in clients:
            client.close()

    def wait_for_model(self, timeout_s: float) -> concurrent.futures.Future[None]:
        return self._submit(lambda client: client.wait_for_model(timeout_s))

    def model_config(self) -> concurrent.futures.Future[TritonModelConfig]:
        return self._submit(lambda client: client.model_config)

    def infer_sample(
        self,
        *inputs: Any,
        parameters: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        **named_inputs: Any,
    ) -> concurrent.futures.Future[dict[str, np.ndarray]]:
        """Submit one sample; the future holds the outputs (see ModelClient.infer_sample)."""
        return self._submit(
            lambda client: client.infer_sample(
                *inputs, parameters=parameters, headers=headers, **named_inputs
            )
        )

    def infer_batch(
        self,
        *inputs: Any,
        parameters: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        **named_inputs: Any,
    ) -> concurrent.futures.Future[dict[str, np.ndarray]]:
        """Submit a batch; the future holds the outputs (see ModelClient.infer_batch)."""
        return self._submit(
            lambda client: client.infer_batch(*inputs, parameters=parameters, headers=headers, **named_inputs)
        )

    def _check_open(self) -> None:
        if self._closed:
            raise PyTritonClientClosedError(
                f"The client of model {self._model_name} at {self._endpoint.url} is closed"
            )

    def _submit(self, call: Callable[[ModelClient], _T]) -> concurrent.futures.Future[_T]:
        self._check_open()
        slots = self._slots
        if slots is None:
            return self._executor.submit(self._run, call)
        self._take_slot(slots)
        try:
            self._check_open()
            future = self._executor.submit(self._run, call)
        except BaseException:
            slots.release()
            raise
        future.add_done_callback(lambda _: slots.release())
        return future

    def _take_slot(self, slots: threading.BoundedSemaphore) -> None:
        """Wait for room for one more request: not at all with `non_blocking`, at most
        `inference_timeout_s` when given, and only while the client is open."""
        if self._non_blocking:
            if not slots.acquire(blocking=False):
                raise self._queue_full()
            return
        timeout_s = self._inference_timeout_s
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            remaining = _SLOT_POLL_S if deadline is None else min(_SLOT_POLL_S, deadline - time.monotonic())
            if slots.acquire(timeout=max(0.0, remaining)):
                return
            self._check_open()
            if deadline is not None and time.monotonic() >= deadline:
                raise self._queue_full(waited_s=timeout_s)

    def _queue_full(self, waited_s: float | None = None) -> PyTritonClientQueueFullError:
        message = (
            f"Queue is full: {self._max_queue_size} requests to model {self._model_name} wait for one of "
            f"{self._max_workers} threads"
        )
        if waited_s is not None:
            message += f", and none left within {waited_s:g} s"
        return PyTritonClientQueueFullError(message)

    def _run(self, call: Callable[[ModelClient], _T]) -> _T:
        client = getattr(self._local, "client", None)
        if client is None:
            with self._lock:
                self._check_open()
                client = ModelClient(
                    self._endpoint.url,
                    self._model_name,
                    self._model_version,
                    init_timeout_s=self._init_timeout_s,
                    inference_timeout_s=self._inference_timeout_s,
                    model_config=self._model_config,
                    ensure_model_is_ready=not self._model_ready,
                    access_token=self._access_token,
                )
                self._clients.append(client)
            self._local.client = client
        result = call(client)
        if client._model_config is not None and client._model_ready:
            self._model_config = client._model_config
            self._model_ready = True
        return result
