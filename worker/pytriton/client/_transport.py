"""One connection of the blocking clients to one Triton server, over HTTP or gRPC through tritonclient.

`ModelClient` and its siblings talk to a server through a `Transport`: the same calls whichever protocol
the URL names, and an HTTP connection renewed before each request once it is older than
`_protocol.HTTP_CONNECTION_MAX_AGE_S` or was made in another thread.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Any

import numpy as np
import tritonclient.grpc
import tritonclient.http

from pytriton.client import _protocol
from pytriton.client._url import Endpoint
from pytriton.client.triton_model_config import TritonModelConfig


class Transport:
    """One tritonclient connection (HTTP or gRPC) behind a protocol-neutral interface."""

    def __init__(self, endpoint: Endpoint, timeout_s: float) -> None:
        self.endpoint = endpoint
        self.timeout_s = timeout_s
        self.module: Any = tritonclient.grpc if self.is_grpc else tritonclient.http
        self.client: Any = self._connect()

    def _connect(self) -> Any:
        self._connected_at = time.monotonic()
        self._connected_in = threading.get_ident()
        if self.is_grpc:
            return tritonclient.grpc.InferenceServerClient(self.endpoint.address, ssl=self.endpoint.ssl)
        return tritonclient.http.InferenceServerClient(
            self.endpoint.address,
            connection_timeout=self.timeout_s,
            network_timeout=self.timeout_s,
            ssl=self.endpoint.ssl,
        )

    @property
    def is_grpc(self) -> bool:
        return self.endpoint.protocol == "grpc"

    def _timeout_kwargs(self) -> dict[str, float]:
        return {"client_timeout": self.timeout_s} if self.is_grpc else {}

    def is_ready(self, model_name: str, model_version: str, headers: dict[str, str]) -> str | None:
        """None when the model is ready, otherwise what is not ready yet.

        Server liveness, not readiness: with strict readiness one model that failed to load makes the
        whole server not ready, and the model asked for may serve all the same."""
        if not self.client.is_server_live(headers=headers, **self._timeout_kwargs()):
            return f"Triton at {self.endpoint.url} is not live"
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
        return self._current().infer(
            config.model_name,
            _protocol.triton_inputs(self.module, arrays, binary=binary),
            model_version=model_version,
            outputs=_protocol.requested_outputs(self.module, config, binary=binary),
            request_id=_protocol.new_request_id(),
            headers=headers,
            parameters=dict(parameters) if parameters else None,
            **self._timeout_kwargs(),
        )

    def load_model(
        self, model_name: str, headers: dict[str, str], config: str | None, files: dict[str, bytes] | None
    ) -> None:
        self._current().load_model(
            model_name, headers=headers, config=config, files=files, **self._timeout_kwargs()
        )

    def unload_model(self, model_name: str, headers: dict[str, str]) -> None:
        self._current().unload_model(model_name, headers=headers, **self._timeout_kwargs())

    def _current(self) -> Any:
        """The connection, replaced first when it is a stale HTTP one."""
        if not self.is_grpc and self._stale():
            self.client.close()
            self.client = self._connect()
        return self.client

    def _stale(self) -> bool:
        """Whether the HTTP connection must be replaced before the next request: it is older than
        HTTP_CONNECTION_MAX_AGE_S, or it was made in another thread (its gevent socket belongs to that
        thread's hub, and waiting on it here fails)."""
        too_old = time.monotonic() - self._connected_at > _protocol.HTTP_CONNECTION_MAX_AGE_S
        return too_old or self._connected_in != threading.get_ident()

    def close(self) -> None:
        self.client.close()
