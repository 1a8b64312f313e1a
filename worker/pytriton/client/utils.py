"""PyTriton 0.7's helpers around a plain tritonclient client: parse a server URL, create a client from it,
wait for the server or a model, and read a model's state and configuration.

Scripts written for PyTriton import these next to `ModelClient`; the clients of this package need none of
them. Every function takes a `tritonclient.http` or `tritonclient.grpc` `InferenceServerClient`, and
`headers` carries what restricted endpoints demand (see `pytriton.client.auth.create_auth_headers`).
"""

from __future__ import annotations

import dataclasses
import enum
import time
import warnings
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import tritonclient.grpc
import tritonclient.http
from grpc import RpcError
from kubetriton.endpoint import DEFAULT_PORTS
from tritonclient.utils import InferenceServerException

from pytriton.client._url import parse_url
from pytriton.client.exceptions import (
    PyTritonClientInvalidUrlError,  # noqa: F401 (PyTriton's utils has it)
    PyTritonClientTimeoutError,
)
from pytriton.client.triton_model_config import TritonModelConfig
from pytriton.client.warnings import NotSupportedTimeoutWarning

_TritonSyncClientType = tritonclient.grpc.InferenceServerClient | tritonclient.http.InferenceServerClient

DEFAULT_HTTP_PORT = DEFAULT_PORTS["http"]
DEFAULT_GRPC_PORT = DEFAULT_PORTS["grpc"]
"""The ports a URL without one gets, as in PyTriton."""
DEFAULT_NETWORK_TIMEOUT_S = 60.0
DEFAULT_WAIT_FOR_SERVER_READY_TIMEOUT_S = 60.0
DEFAULT_WAIT_FOR_MODEL_TIMEOUT_S = 300.0
LATEST_MODEL_VERSION = "<latest>"
"""How messages name the version when none was given: the server's latest."""
_POLL_S = 0.25
_UNREACHABLE = (InferenceServerException, RpcError, OSError)
"""What a probe of a server that does not answer (yet) raises: refused, unresolved, timed out."""


class ModelState(enum.Enum):
    """A model version's state in the server's repository index."""

    LOADING = "LOADING"
    UNLOADING = "UNLOADING"
    UNAVAILABLE = "UNAVAILABLE"
    READY = "READY"


def _states(entries: Iterable[tuple[str, str, str]]) -> dict[tuple[str, str], ModelState]:
    """(name, version) -> state for the index entries that name a version; an entry without a state is
    still loading."""
    return {
        (name, version): ModelState(state) if state else ModelState.LOADING
        for name, version, state in entries
        if version
    }


def parse_http_response(models: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], ModelState]:
    """The states in the repository index as the HTTP client returns it (a list of dicts)."""
    return _states(
        (model.get("name", ""), model.get("version", ""), model.get("state", "")) for model in models
    )


def parse_grpc_response(models: Iterable[Any]) -> dict[tuple[str, str], ModelState]:
    """The states in the repository index as the gRPC client returns it (`index.models`, protobuf
    messages)."""
    return _states((model.name, model.version, model.state) for model in models)


def get_model_state(
    client: _TritonSyncClientType,
    model_name: str,
    model_version: str | None = None,
    headers: dict[str, str] | None = None,
) -> ModelState:
    """The state of a version of the model, or of its latest version (the greatest number) without one;
    UNAVAILABLE when the index does not list it."""
    return _state_in_index(client.get_model_repository_index(headers=headers), model_name, model_version)


def _state_in_index(index: Any, model_name: str, model_version: str | None) -> ModelState:
    """`get_model_state` of a repository index as either client returns it (HTTP: a list of dicts, gRPC:
    a protobuf message)."""
    states = parse_http_response(index) if isinstance(index, list) else parse_grpc_response(index.models)
    if model_version is not None:
        return states.get((model_name, model_version), ModelState.UNAVAILABLE)
    versions = {version: state for (name, version), state in states.items() if name == model_name}
    if not versions:
        return ModelState.UNAVAILABLE
    return versions[max(versions, key=int)]


def get_model_config(
    client: _TritonSyncClientType,
    model_name: str,
    model_version: str | None = None,
    timeout_s: float | None = None,
    headers: dict[str, str] | None = None,
) -> TritonModelConfig:
    """Wait (at most `timeout_s`, 300 s by default) for the server and the model to be ready, then read
    its configuration. PyTritonClientTimeoutError when they are not ready in time."""
    wait_for_model_ready(client, model_name, model_version, timeout_s=timeout_s, headers=headers)
    if isinstance(client, tritonclient.grpc.InferenceServerClient):
        config = client.get_model_config(model_name, model_version or "", headers=headers, as_json=True)
    else:
        config = client.get_model_config(model_name, model_version or "", headers=headers)
    return TritonModelConfig.from_triton_json(config, model_version)


def wait_for_server_ready(
    client: _TritonSyncClientType,
    timeout_s: float | None = None,
    headers: dict[str, str] | None = None,
) -> None:
    """Poll until the server is live and ready; PyTritonClientTimeoutError after `timeout_s` (60 s by
    default). A server that cannot be reached yet is polled again."""
    timeout_s = DEFAULT_WAIT_FOR_SERVER_READY_TIMEOUT_S if timeout_s is None else timeout_s
    if not _poll(
        lambda: client.is_server_live(headers=headers) and client.is_server_ready(headers=headers), timeout_s
    ):
        raise PyTritonClientTimeoutError("Waiting for server to be ready timed out.")


def wait_for_model_ready(
    client: _TritonSyncClientType,
    model_name: str,
    model_version: str | None = None,
    timeout_s: float | None = None,
    headers: dict[str, str] | None = None,
) -> None:
    """Poll until the server and the model version (the latest without one) are ready;
    PyTritonClientTimeoutError after `timeout_s` (300 s by default) for both together."""
    timeout_s = DEFAULT_WAIT_FOR_MODEL_TIMEOUT_S if timeout_s is None else timeout_s
    deadline = time.monotonic() + timeout_s
    wait_for_server_ready(client, timeout_s=timeout_s, headers=headers)
    if not _poll(
        lambda: client.is_model_ready(model_name, model_version or "", headers=headers),
        max(0.0, deadline - time.monotonic()),
    ):
        raise PyTritonClientTimeoutError(
            f"Waiting for model {model_name}/{model_version or LATEST_MODEL_VERSION} to be ready timed out."
        )


def _poll(ready: Callable[[], bool], timeout_s: float) -> bool:
    """Whether `ready()` became true within `timeout_s` (tried at least once); failures to reach the
    server count as not ready."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if ready():
                return True
        except _UNREACHABLE:
            pass
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        time.sleep(min(_POLL_S, remaining))


def create_client_from_url(url: str, network_timeout_s: float | None = None) -> _TritonSyncClientType:
    """A tritonclient client of the server at `url` (the forms `ModelClient` takes): HTTP with
    `network_timeout_s` as its connection and network timeouts, or gRPC, which has no such timeout
    (NotSupportedTimeoutWarning when one is given). PyTritonClientInvalidUrlError for a URL that does
    not parse."""
    endpoint = parse_url(url)
    if endpoint.protocol == "grpc":
        if network_timeout_s is not None:
            warnings.warn(
                "tritonclient's gRPC client has no network timeout; "
                f"ignoring network_timeout_s={network_timeout_s}",
                NotSupportedTimeoutWarning,
                stacklevel=2,
            )
        return tritonclient.grpc.InferenceServerClient(endpoint.address, ssl=endpoint.ssl)
    timeout = DEFAULT_NETWORK_TIMEOUT_S if network_timeout_s is None else network_timeout_s
    return tritonclient.http.InferenceServerClient(
        endpoint.address, connection_timeout=timeout, network_timeout=timeout, ssl=endpoint.ssl
    )


@dataclasses.dataclass
class TritonUrl:
    """A server URL split as PyTriton splits it: `scheme` (`http`, `https`, `grpc` or `grpcs`),
    `hostname` and `port` (the scheme's default when none is given)."""

    scheme: str
    hostname: str
    port: int

    @classmethod
    def from_url(cls, url: str) -> TritonUrl:
        """PyTritonClientInvalidUrlError for a URL that does not parse."""
        endpoint = parse_url(url)
        return cls(endpoint.url.split("://", 1)[0], endpoint.host, endpoint.port)

    @property
    def with_scheme(self) -> str:
        return f"{self.scheme}://{self.without_scheme}"

    @property
    def without_scheme(self) -> str:
        host = f"[{self.hostname}]" if ":" in self.hostname else self.hostname
        return f"{host}:{self.port}"
