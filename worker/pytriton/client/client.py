"""Synchronous PyTriton clients: query a model on any Triton server over HTTP or gRPC with numpy arrays.

`ModelClient` sends one request at a time, `FuturesModelClient` runs requests on a thread pool and returns
futures, and `DecoupledModelClient` streams the responses of a decoupled model over gRPC. Each reads the
model configuration once (after waiting for the server and the model to be ready) and uses it to name
positional inputs and to add or strip the batch axis.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Mapping
from typing import Any

import numpy as np
import tritonclient.grpc
import tritonclient.http

from pytriton.client import _protocol
from pytriton.client._protocol import Endpoint
from pytriton.client.exceptions import (
    PyTritonClientClosedError,
    PyTritonClientModelDoesntSupportBatchingError,
    PyTritonClientModelUnavailableError,
    PyTritonClientTimeoutError,
    PyTritonClientValueError,
)
from pytriton.client.triton_model_config import TritonModelConfig


class _Transport:
    """One tritonclient connection (HTTP or gRPC) behind a protocol-neutral interface."""

    def __init__(self, endpoint: Endpoint, timeout_s: float) -> None:
        self.endpoint = endpoint
        self.timeout_s = timeout_s
        if endpoint.protocol == "grpc":
            self.module: Any = tritonclient.grpc
            self.client: Any = tritonclient.grpc.InferenceServerClient(endpoint.address, ssl=endpoint.ssl)
        else:
            self.module = tritonclient.http
            self.client = tritonclient.http.InferenceServerClient(
                endpoint.address, connection_timeout=timeout_s, network_timeout=timeout_s, ssl=endpoint.ssl
            )

    @property
    def is_grpc(self) -> bool:
        return self.endpoint.protocol == "grpc"

    def _timeout_kwargs(self) -> dict[str, float]:
        return {"client_timeout": self.timeout_s} if self.is_grpc else {}

    def is_ready(self, model_name: str, model_version: str, headers: dict[str, str]) -> str | None:
        """None when the server and the model are ready, otherwise what is not ready yet."""
        if not self.client.is_server_ready(headers=headers, **self._timeout_kwargs()):
            return f"Triton at {self.endpoint.url} is not ready"
        if not self.client.is_model_ready(
            model_name, model_version, headers=headers, **self._timeout_kwargs()
        ):
            return f"model {model_name} is not ready"
        return None

    def model_state(self, model_name: str, headers: dict[str, str]) -> tuple[str, str] | None:
        """The (state, reason) the repository index gives for the model, if the server tells."""
        if self.is_grpc:
            index = self.client.get_model_repository_index(
                headers=headers, as_json=True, client_timeout=self.timeout_s
            )
            models = index.get("models", [])
        else:
            models = self.client.get_model_repository_index(headers=headers)
        for model in models:
            if model.get("name") == model_name:
                return str(model.get("state", "")), str(model.get("reason", ""))
        return None

    def model_config(self, model_name: str, model_version: str, headers: dict[str, str]) -> dict[str, Any]:
        if self.is_grpc:
            return self.client.get_model_config(
                model_name, model_version, headers=headers, as_json=True, client_timeout=self.timeout_s
            )
        return self.client.get_model_config(model_name, model_version, headers=headers)

    def infer(
        self,
        config: TritonModelConfig,
        model_version: str,
        arrays: dict[str, np.ndarray],
        parameters: Mapping[str, Any] | None,
        headers: dict[str, str],
    ) -> Any:
        binary = not self.is_grpc
        return self.client.infer(
            config.model_name,
            _protocol.triton_inputs(self.module, arrays, binary=binary),
            model_version=model_version,
            outputs=_protocol.requested_outputs(self.module, config, binary=binary),
            request_id=_protocol.new_request_id(),
            headers=headers,
            parameters=dict(parameters) if parameters else None,
            **self._timeout_kwargs(),
        )

    def close(self) -> None:
        self.client.close()


class ModelClient:
    """Synchronous client of one model on a Triton server.

    The first call that needs the model waits for the server and the model to be ready (at most
    `init_timeout_s`, 300 s by default) and reads its configuration; `lazy_init=False` does that at once.
    Inferences time out after `inference_timeout_s` (60 s by default) with PyTritonClientTimeoutError.
    A server that refuses connections during inference raises PyTritonClientInferenceServerError whose
    message starts with "connection refused"; while initializing, the client keeps trying until
    `init_timeout_s` and then raises PyTritonClientTimeoutError naming the last failure.
    """

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
        self._endpoint = _protocol.parse_url(url)
        self._model_name = model_name
        self._model_version = model_version
        self._init_timeout_s = _protocol.DEFAULT_INIT_TIMEOUT_S if init_timeout_s is None else init_timeout_s
        self._inference_timeout_s = (
            _protocol.DEFAULT_INFERENCE_TIMEOUT_S if inference_timeout_s is None else inference_timeout_s
        )
        self._model_config = model_config
        self._model_ready = not ensure_model_is_ready
        self._access_token = access_token
        self._lock = threading.RLock()
        self._closed = False
        self._transport = _Transport(self._endpoint, self._inference_timeout_s)
        if not lazy_init:
            self._initialize()

    @classmethod
    def from_existing_client(cls, existing_client: ModelClient) -> ModelClient:
        """A new client for the same model, reusing the configuration the existing one already read."""
        config = existing_client._model_config
        return cls(
            existing_client._endpoint.url,
            existing_client._model_name,
            existing_client._model_version,
            init_timeout_s=existing_client._init_timeout_s,
            inference_timeout_s=existing_client._inference_timeout_s,
            model_config=config,
            ensure_model_is_ready=config is None,
            access_token=existing_client._access_token,
        )

    def __enter__(self) -> ModelClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Release the connection; later calls raise PyTritonClientClosedError."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._transport.close()

    @property
    def url(self) -> str:
        return self._endpoint.url

    @property
    def model_name(self) -> str:
        return self._model_name

    @property
    def model_version(self) -> str | None:
        return self._model_version

    @property
    def model_config(self) -> TritonModelConfig:
        """The model's configuration, read from the server on first use."""
        return self._initialize()

    @property
    def is_batching_supported(self) -> bool:
        return self.model_config.batching

    def wait_for_model(self, timeout_s: float) -> None:
        """Wait until the server and the model are ready; PyTritonClientTimeoutError after `timeout_s`."""
        self._check_open()
        self._wait_until_ready(timeout_s)
        self._model_ready = True

    def infer_sample(
        self,
        *inputs: Any,
        parameters: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        **named_inputs: Any,
    ) -> dict[str, np.ndarray]:
        """Infer one sample: the batch axis is added to the inputs and removed from the outputs when the
        model batches."""
        config = self._initialize()
        arrays = _protocol.build_inputs(config, inputs, named_inputs, add_batch_axis=config.batching)
        return self._infer(config, arrays, parameters, headers, strip_batch_axis=config.batching)

    def infer_batch(
        self,
        *inputs: Any,
        parameters: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        **named_inputs: Any,
    ) -> dict[str, np.ndarray]:
        """Infer a batch: the first axis of every input is the batch axis."""
        config = self._initialize()
        if not config.batching:
            raise PyTritonClientModelDoesntSupportBatchingError(
                f"Model {self._model_name} has no batch axis (max_batch_size 0); use infer_sample"
            )
        arrays = _protocol.build_inputs(config, inputs, named_inputs, add_batch_axis=False)
        return self._infer(config, arrays, parameters, headers, strip_batch_axis=False)

    def _infer(
        self,
        config: TritonModelConfig,
        arrays: dict[str, np.ndarray],
        parameters: Mapping[str, Any] | None,
        headers: Mapping[str, str] | None,
        *,
        strip_batch_axis: bool,
    ) -> dict[str, np.ndarray]:
        if config.decoupled:
            raise PyTritonClientValueError(
                f"Model {self._model_name} is decoupled (it streams responses); "
                "query it with DecoupledModelClient or AsyncioDecoupledModelClient over gRPC"
            )
        self._check_open()
        try:
            result = self._transport.infer(config, self._version, arrays, parameters, self._headers(headers))
        except Exception as error:
            self._check_open()
            raise _protocol.translate_error(
                error, endpoint=self._endpoint, model_name=self._model_name
            ) from error
        return _protocol.result_outputs(result, strip_batch_axis=strip_batch_axis)

    @property
    def _version(self) -> str:
        return self._model_version or ""

    def _headers(self, headers: Mapping[str, str] | None = None) -> dict[str, str]:
        return _protocol.merged_headers(self._access_token, headers, self._endpoint.protocol)

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
        try:
            raw = self._transport.model_config(self._model_name, self._version, self._headers())
        except Exception as error:
            self._check_open()
            if time.monotonic() > deadline:
                raise PyTritonClientTimeoutError(
                    f"Reading the configuration of model {self._model_name} at {self.url} timed out: {error}"
                ) from error
            raise _protocol.translate_error(
                error, endpoint=self._endpoint, model_name=self._model_name
            ) from error
        return TritonModelConfig.from_triton_json(raw, self._model_version)

    def _wait_until_ready(self, timeout_s: float) -> None:
        """Poll readiness with a short-timeout connection until ready or `timeout_s` has passed."""
        deadline = time.monotonic() + timeout_s
        last_problem = "no answer yet"
        probe_timeout = max(0.1, min(_protocol.READINESS_PROBE_TIMEOUT_S, timeout_s))
        probe = _Transport(self._endpoint, probe_timeout)
        try:
            while True:
                self._check_open()
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
