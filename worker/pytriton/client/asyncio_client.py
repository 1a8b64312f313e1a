"""asyncio PyTriton clients: the same requests as ModelClient and DecoupledModelClient, awaited on an event
loop through tritonclient's aiohttp and grpc.aio clients.

The tritonclient connection is created inside the running loop on first use, so a client may be
constructed outside a coroutine. Every call is bounded by `inference_timeout_s` with `asyncio.wait_for`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from types import ModuleType
from typing import Any, TypeVar

import numpy as np
import tritonclient.grpc
import tritonclient.grpc.aio
import tritonclient.http
import tritonclient.http.aio
from kubetriton import replicas as replica_sets

from pytriton.client import _protocol
from pytriton.client._protocol import BaseModelClient
from pytriton.client._url import parse_url
from pytriton.client.exceptions import (
    PyTritonClientClosedError,
    PyTritonClientError,
    PyTritonClientModelDoesntSupportBatchingError,
    PyTritonClientModelUnavailableError,
    PyTritonClientTimeoutError,
    PyTritonClientValueError,
)
from pytriton.client.triton_model_config import TritonModelConfig

_T = TypeVar("_T")


class AsyncioModelClient(BaseModelClient):
    """asyncio client of one model on a Triton server; see ModelClient for the waiting, timeout and error
    rules, and for how a name with several addresses is balanced per request. Use `async with`, or
    `await close()`. With `lazy_init=False`, entering the context waits for the model and reads its
    configuration."""

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
        self._lazy_init = lazy_init
        self._init_timeout_s = _protocol.DEFAULT_INIT_TIMEOUT_S if init_timeout_s is None else init_timeout_s
        self._inference_timeout_s = (
            _protocol.DEFAULT_INFERENCE_TIMEOUT_S if inference_timeout_s is None else inference_timeout_s
        )
        self._model_config = TritonModelConfig.of(model_config)
        self._model_ready = _protocol.ready_without_waiting(self._model_config, ensure_model_is_ready)
        self._access_token = access_token
        self._clients: dict[str, Any] = {}
        """The connection to each host requests go to: the URL's, or the replicas of a balanced name."""
        self._connected_at: dict[str, float] = {}
        self._in_flight: dict[Any, int] = {}
        self._retired: list[Any] = []
        """Connections replaced for their age (HTTP) or to a replica that left, each closed once its
        requests in flight are answered."""
        self._replicas = (
            replica_sets.shared(self._endpoint.host, self._endpoint.port)
            if _protocol.balanced(self._endpoint)
            else None
        )
        self._init_lock = asyncio.Lock()
        self._closed = False

    async def __aenter__(self) -> AsyncioModelClient:
        if not self._lazy_init:
            try:
                await self._initialize()
            except BaseException:
                await self.close()
                raise
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Release the connection; later calls raise PyTritonClientClosedError."""
        if self._closed:
            return
        self._closed = True
        clients = [*self._retired, *self._clients.values()]
        self._clients, self._retired = {}, []
        for client in clients:
            await client.close()

    @property
    def model_config(self) -> Awaitable[TritonModelConfig]:
        """`await client.model_config`: the model's configuration, read from the server on first use; once
        read, a closed client still has it, as PyTriton's does."""
        return self.get_model_config()

    async def get_model_config(self) -> TritonModelConfig:
        if self._closed and self._model_config is not None:
            return self._model_config
        return await self._initialize()

    async def wait_for_model(self, timeout_s: float) -> None:
        """Wait until the server and the model are ready; PyTritonClientTimeoutError after `timeout_s`."""
        self._check_open()
        await self._wait_until_ready(timeout_s)
        self._model_ready = True

    async def infer_sample(
        self,
        *inputs: Any,
        parameters: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        **named_inputs: Any,
    ) -> dict[str, np.ndarray]:
        """Infer one sample (batch axis added and removed when the model batches)."""
        config, arrays = await self._prepare(inputs, named_inputs, batch=False)
        return await self._infer(config, arrays, parameters, headers, strip_batch_axis=config.batching)

    async def infer_batch(
        self,
        *inputs: Any,
        parameters: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        **named_inputs: Any,
    ) -> dict[str, np.ndarray]:
        """Infer a batch: the first axis of every input is the batch axis."""
        config, arrays = await self._prepare(inputs, named_inputs, batch=True)
        return await self._infer(config, arrays, parameters, headers, strip_batch_axis=False)

    def get_lib(self) -> ModuleType:
        """The tritonclient module of the client's protocol: tritonclient.http.aio or .grpc.aio."""
        return tritonclient.grpc.aio if self._is_grpc else tritonclient.http.aio

    @property
    def _is_grpc(self) -> bool:
        return self._endpoint.protocol == "grpc"

    @property
    def _version(self) -> str:
        return self._model_version or ""

    def _headers(self, headers: Mapping[str, str] | None = None) -> dict[str, str]:
        return _protocol.merged_headers(self._endpoint, self._access_token, headers)

    def _check_open(self) -> None:
        if self._closed:
            raise PyTritonClientClosedError(f"The client of model {self._model_name} at {self.url} is closed")

    def _connection(self, host: str | None = None) -> Any:
        """The connection to `host` (the URL's by default), made on first use."""
        self._check_open()
        host = host or self._endpoint.host
        client = self._clients.get(host)
        if client is None:
            endpoint = dataclasses.replace(self._endpoint, host=host)
            self._connected_at[host] = time.monotonic()
            if self._is_grpc:
                client = tritonclient.grpc.aio.InferenceServerClient(endpoint.address, ssl=endpoint.ssl)
            else:
                client = tritonclient.http.aio.InferenceServerClient(
                    endpoint.address, conn_timeout=self._inference_timeout_s, ssl=endpoint.ssl
                )
            self._clients[host] = client
        return client

    def _retire(self, host: str) -> None:
        """Stop using the connection to `host`; it is closed once its requests in flight are answered."""
        client = self._clients.pop(host, None)
        if client is not None:
            self._retired.append(client)

    async def _call(self, awaitable: Awaitable[_T], timeout_s: float, host: str | None = None) -> _T:
        """Await a tritonclient call within `timeout_s`, translating its failures."""
        try:
            return await asyncio.wait_for(awaitable, timeout_s)
        except (PyTritonClientError, StopAsyncIteration):
            raise
        except Exception as error:
            raise self._failure(error, host, timeout_s) from error

    def _failure(
        self, error: Exception, host: str | None, timeout_s: float | None = None
    ) -> PyTritonClientError:
        """The client error for a failed call to `host` (a closed client's first); `asyncio.wait_for`'s
        timeout, which says nothing, says which it was (`inference_timeout_s` unless given)."""
        self._check_open()
        if isinstance(error, asyncio.TimeoutError) and not str(error):
            waited = self._inference_timeout_s if timeout_s is None else timeout_s
            return PyTritonClientTimeoutError(
                f"Model {self._model_name} at {self.url} sent no response within {waited:g} s"
            )
        endpoint = dataclasses.replace(self._endpoint, host=host or self._endpoint.host)
        return _protocol.translate_error(error, endpoint=endpoint, model_name=self._model_name)

    async def _resolved(self) -> replica_sets.ReplicaSet | None:
        """The replicas of a balanced name, looked up off the event loop the first time; None for a URL
        used as it is."""
        replicas = self._replicas
        if replicas is not None and not replicas.resolved:
            await asyncio.get_running_loop().run_in_executor(None, replicas.refresh)
        return replicas

    async def _replica(self) -> replica_sets.Replica | None:
        """The replica for the next request of a balanced name, or None."""
        replicas = await self._resolved()
        if replicas is None:
            return None
        for host in self._clients.keys() - replicas.hosts() - {self._endpoint.host}:
            self._retire(host)
        return replicas.acquire()

    async def _control_host(self) -> str | None:
        """Where to ask what every replica answers alike: the URL's host, or one replica of a balanced
        name."""
        replicas = await self._resolved()
        return None if replicas is None else replicas.any_host()

    async def _prepare(
        self, inputs: tuple[Any, ...], named_inputs: dict[str, Any], *, batch: bool
    ) -> tuple[TritonModelConfig, dict[str, np.ndarray]]:
        config = await self._initialize()
        _protocol.check_transaction_policy(config, streaming=self._streaming)
        if batch and not config.batching:
            raise PyTritonClientModelDoesntSupportBatchingError(
                f"Model {self._model_name} has no batch axis (max_batch_size 0); use infer_sample"
            )
        add_batch_axis = config.batching and not batch
        return config, _protocol.build_inputs(config, inputs, named_inputs, add_batch_axis=add_batch_axis)

    async def _infer(
        self,
        config: TritonModelConfig,
        arrays: dict[str, np.ndarray],
        parameters: Mapping[str, Any] | None,
        headers: Mapping[str, str] | None,
        *,
        strip_batch_axis: bool,
    ) -> dict[str, np.ndarray]:
        module: Any = tritonclient.grpc if self._is_grpc else tritonclient.http
        binary = not self._is_grpc
        kwargs: dict[str, Any] = {"client_timeout": self._inference_timeout_s} if self._is_grpc else {}
        request_headers = self._headers(headers)
        result = await self._balanced(
            lambda client: client.infer(
                config.model_name,
                _protocol.triton_inputs(module, arrays, binary=binary),
                model_version=self._version,
                outputs=_protocol.requested_outputs(module, config, binary=binary),
                request_id=_protocol.new_request_id(),
                headers=request_headers,
                parameters=dict(parameters) if parameters else None,
                **kwargs,
            )
        )
        return _protocol.result_outputs(result, strip_batch_axis=strip_batch_axis)

    async def _balanced(self, call: Callable[[Any], Awaitable[_T]]) -> _T:
        """Await `call` on the connection to the replica expected to answer first (the URL's host when it
        is not balanced), within `inference_timeout_s`; a replica that refuses the connection is held back
        and the call goes to another one, since it never reached a server. An HTTP connection older than
        HTTP_CONNECTION_MAX_AGE_S is replaced first."""
        while True:
            replica = await self._replica()
            host = replica.host if replica is not None else self._endpoint.host
            stale = time.monotonic() - self._connected_at.get(host, 0.0) > _protocol.HTTP_CONNECTION_MAX_AGE_S
            if not self._is_grpc and stale:
                self._retire(host)
            client = self._connection(host)
            self._in_flight[client] = self._in_flight.get(client, 0) + 1
            started, latency_s, refused = time.monotonic(), None, False
            failure: Exception | None = None
            try:
                result = await asyncio.wait_for(call(client), self._inference_timeout_s)
                latency_s = time.monotonic() - started
            except Exception as error:
                refused = _protocol.never_sent(error)
                failure = error
            finally:
                self._in_flight[client] -= 1
                if replica is not None and self._replicas is not None:
                    self._replicas.release(replica, latency_s=latency_s, unreachable=refused)
                await self._close_idle_retired()
            if failure is None:
                return result
            replicas = self._replicas
            if (
                refused
                and replica is not None
                and replicas is not None
                and replicas.others_reachable(replica)
            ):
                continue
            raise self._failure(failure, host) from failure

    async def _close_idle_retired(self) -> None:
        for client in [client for client in self._retired if not self._in_flight.get(client)]:
            self._retired.remove(client)
            self._in_flight.pop(client, None)
            await client.close()

    async def _initialize(self) -> TritonModelConfig:
        self._check_open()
        async with self._init_lock:
            self._check_open()
            if self._model_config is not None and self._model_ready:
                return self._model_config
            if not self._model_ready:
                await self._wait_until_ready(self._init_timeout_s)
                self._model_ready = True
            if self._model_config is None:
                headers = self._headers()
                if self._is_grpc:
                    raw = await self._balanced(
                        lambda client: client.get_model_config(
                            self._model_name, self._version, headers=headers, as_json=True
                        )
                    )
                else:
                    raw = await self._balanced(
                        lambda client: client.get_model_config(
                            self._model_name, self._version, headers=headers
                        )
                    )
                self._model_config = TritonModelConfig.from_triton_json(raw, self._model_version)
            return self._model_config

    async def _probe(self, timeout_s: float) -> str | None:
        """None when the model is ready, otherwise what is not ready yet (server liveness, not readiness,
        as in the synchronous client)."""
        client = self._connection(await self._control_host())
        headers = self._headers()
        if not await asyncio.wait_for(client.is_server_live(headers=headers), timeout_s):
            return f"Triton at {self.url} is not live"
        if not await asyncio.wait_for(
            client.is_model_ready(self._model_name, self._version, headers=headers), timeout_s
        ):
            return f"model {self._model_name} is not ready"
        return None

    async def _model_state(self, timeout_s: float) -> tuple[str, str] | None:
        client = self._connection(await self._control_host())
        if self._is_grpc:
            index = await asyncio.wait_for(
                client.get_model_repository_index(headers=self._headers(), as_json=True), timeout_s
            )
            models = index.get("models", [])
        else:
            models = await asyncio.wait_for(
                client.get_model_repository_index(headers=self._headers()), timeout_s
            )
        for model in models:
            if model.get("name") == self._model_name:
                return str(model.get("state", "")), str(model.get("reason", ""))
        return None

    async def _wait_until_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        probe_timeout = _protocol.probe_timeout_s(timeout_s)
        last_problem = "no answer yet"
        while True:
            try:
                problem = await self._probe(probe_timeout)
            except PyTritonClientClosedError:
                raise
            except Exception as error:
                problem = _protocol.describe_probe_failure(error, self._endpoint)
            if problem is None:
                return
            last_problem = problem
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            await asyncio.sleep(min(_protocol.READINESS_POLL_S, remaining))
        state = None
        with contextlib.suppress(Exception):
            state = await self._model_state(probe_timeout)
        if state is not None and state[0] == "UNAVAILABLE" and state[1]:
            raise PyTritonClientModelUnavailableError(
                f"Model {self._model_name} at {self.url} is unavailable: {state[1]}"
            )
        raise PyTritonClientTimeoutError(
            f"Model {self._model_name} at {self.url} was not ready within {timeout_s:g} s ({last_problem})"
        )


class AsyncioDecoupledModelClient(AsyncioModelClient):
    """asyncio client of a decoupled (streaming) model over gRPC: `infer_sample` and `infer_batch` are
    async iterators over the model's responses, zero or more (`async for result in client.infer_sample(x)`).
    Each call uses its own gRPC stream, which ends once the server has sent every response to the request.
    A server error in the middle of a stream raises PyTritonClientInferenceServerError after the earlier
    responses. `inference_timeout_s` bounds the wait for each response, not the whole stream.
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
                f"AsyncioDecoupledModelClient streams over gRPC only; use a grpc:// URL instead of {url!r}"
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

    async def infer_sample(  # type: ignore[override]
        self,
        *inputs: Any,
        parameters: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        **named_inputs: Any,
    ) -> AsyncIterator[dict[str, np.ndarray]]:
        """Stream the responses to one sample (batch axis added and removed when the model batches)."""
        config, arrays = await self._prepare(inputs, named_inputs, batch=False)
        async for outputs in self._stream(
            config, arrays, parameters, headers, strip_batch_axis=config.batching
        ):
            yield outputs

    async def infer_batch(  # type: ignore[override]
        self,
        *inputs: Any,
        parameters: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        **named_inputs: Any,
    ) -> AsyncIterator[dict[str, np.ndarray]]:
        """Stream the responses to a batch (the first axis of every input)."""
        config, arrays = await self._prepare(inputs, named_inputs, batch=True)
        async for outputs in self._stream(config, arrays, parameters, headers, strip_batch_axis=False):
            yield outputs

    async def _stream(
        self,
        config: TritonModelConfig,
        arrays: dict[str, np.ndarray],
        parameters: Mapping[str, Any] | None,
        headers: Mapping[str, str] | None,
        *,
        strip_batch_axis: bool,
    ) -> AsyncIterator[dict[str, np.ndarray]]:
        request = {
            "model_name": config.model_name,
            "inputs": _protocol.triton_inputs(tritonclient.grpc, arrays, binary=False),
            "model_version": self._version,
            "outputs": _protocol.requested_outputs(tritonclient.grpc, config, binary=False),
            "request_id": _protocol.new_request_id(),
            "parameters": dict(parameters) if parameters else None,
        }

        async def requests() -> AsyncIterator[dict[str, Any]]:
            yield request

        replica = await self._replica()
        host = replica.host if replica is not None else None
        responses = self._connection(host).stream_infer(requests(), headers=self._headers(headers))
        started, first_answer_s, refused = time.monotonic(), None, False
        ended = False
        try:
            while True:
                try:
                    result, error = await self._call(anext(responses), self._inference_timeout_s, host)
                except StopAsyncIteration:
                    ended = True
                    return
                if error is not None:
                    refused = _protocol.never_sent(error)
                    failure = self._failure(error, host)
                    ended = await self._drain(responses)
                    raise failure
                if first_answer_s is None:
                    first_answer_s = time.monotonic() - started
                if _protocol.has_outputs(result):
                    yield _protocol.result_outputs(result, strip_batch_axis=strip_batch_axis)
        finally:
            # Cancel only a stream the server is still working on (the consumer stopped early, or a timeout).
            if not ended:
                responses.cancel()
            if replica is not None and self._replicas is not None:
                self._replicas.release(replica, latency_s=first_answer_s, unreachable=refused)

    async def _drain(self, responses: AsyncIterator[Any]) -> bool:
        """Read what the server still sends after an error; True once it has ended the stream."""

        async def drain() -> None:
            async for _ in responses:
                pass

        try:
            await asyncio.wait_for(drain(), self._inference_timeout_s)
        except Exception:
            return False
        return True
