"""What every client kind shares: its address and settings (and the copy `from_existing_client` makes of
them), turning call arguments into Triton tensors and results back into arrays, and translating
tritonclient and socket failures into the PyTriton client errors.

Error policy: a timeout (HTTP network timeout, gRPC deadline) raises PyTritonClientTimeoutError; a server
that cannot be reached (connection refused, gRPC UNAVAILABLE) raises PyTritonClientInferenceServerError
whose message starts with "connection refused"; any error the server reports raises
PyTritonClientInferenceServerError carrying the server's message.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import socket
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

import grpc
import numpy as np
from kubetriton.replicas import balanced_host
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from pytriton.client._url import Endpoint
from pytriton.client.auth import create_auth_headers
from pytriton.client.exceptions import (
    PyTritonClientError,
    PyTritonClientInferenceServerError,
    PyTritonClientInputError,
    PyTritonClientTimeoutError,
    PyTritonClientTransactionPolicyError,
    PyTritonClientValueError,
)
from pytriton.client.triton_model_config import TritonModelConfig

DEFAULT_INIT_TIMEOUT_S = 300.0
DEFAULT_INFERENCE_TIMEOUT_S = 60.0
READINESS_POLL_S = 0.25
READINESS_PROBE_TIMEOUT_S = 5.0
HTTP_CONNECTION_MAX_AGE_S = 5.0
"""An HTTP connection older than this is replaced before the next request. A server cannot end an HTTP/1.1
keep-alive connection between two requests (Triton has no way to), so renewing it is what moves a client
off a stopping pod: the Service sends each new connection to a pod that is not stopping. gRPC needs no
such care: the server ends its connections with GOAWAY (see `kubetriton.podenv.GRPC_MAX_CONNECTION_AGE_S`)."""

_request_ids = itertools.count(1)


class ModelAddress:
    """What every client names: the server's URL, the model and its version."""

    _endpoint: Endpoint
    _model_name: str
    _model_version: str | None

    @property
    def url(self) -> str:
        return self._endpoint.url

    @property
    def model_name(self) -> str:
        return self._model_name

    @property
    def model_version(self) -> str | None:
        return self._model_version


_Client = TypeVar("_Client", bound="BaseModelClient")


class BaseModelClient(ModelAddress):
    """The base of the clients of one model over one connection (not FuturesModelClient), under PyTriton's
    name: what such a client is given besides its address, which `from_existing_client` hands on."""

    _init_timeout_s: float
    _inference_timeout_s: float
    _model_config: TritonModelConfig | None
    _access_token: str | None

    @classmethod
    def from_existing_client(cls: type[_Client], existing_client: BaseModelClient) -> _Client:
        """A new client of this class for the same model, with the existing client's URL, timeouts and
        token. It takes the configuration the existing one has read and then skips the readiness wait."""
        config = existing_client._model_config
        return cls(
            existing_client.url,
            existing_client.model_name,
            existing_client.model_version,
            init_timeout_s=existing_client._init_timeout_s,
            inference_timeout_s=existing_client._inference_timeout_s,
            model_config=config,
            ensure_model_is_ready=config is None,
            access_token=existing_client._access_token,
        )


def ready_without_waiting(config: TritonModelConfig | None, ensure_model_is_ready: bool) -> bool:
    """As in PyTriton, only a client given the model's config may skip the readiness wait: without it,
    reading the config needs the model loaded anyway."""
    return config is not None and not ensure_model_is_ready


def version_text(model_version: str | int | None) -> str | None:
    """The model version as Triton's API takes it, a string: an int (as `bind(model_version=...)` takes
    one) is written out. tritonclient refuses anything else, and the readiness wait would retry that
    refusal until its timeout."""
    if model_version is None or isinstance(model_version, str):
        return model_version
    if isinstance(model_version, int) and not isinstance(model_version, bool):
        return str(model_version)
    raise PyTritonClientValueError(f"model_version must be a string such as '1', not {model_version!r}")


def probe_timeout_s(wait_s: float) -> float:
    """The bound on each readiness probe of a wait of `wait_s`."""
    return max(0.1, min(READINESS_PROBE_TIMEOUT_S, wait_s))


def new_request_id() -> str:
    return f"{os.getpid()}-{next(_request_ids)}"


def merged_headers(
    endpoint: Endpoint, access_token: str | None, headers: Mapping[str, str] | None
) -> dict[str, str]:
    """The access token's header for the endpoint's protocol, then the call's headers over it (the same
    header given with the call replaces the client's token). Names are lower case, as gRPC metadata
    demands, so that the callable sees the same names over HTTP and gRPC."""
    merged = create_auth_headers(access_token, endpoint.protocol) if access_token else {}
    merged.update({key.lower(): value for key, value in (headers or {}).items()})
    return merged


def _as_array(value: Any, expected: np.dtype | None) -> np.ndarray:
    """An input as an array Triton accepts; Python values take the dtype the model expects (bytes stay
    whole in object arrays, whereas numpy's fixed-width bytes arrays drop trailing NULs)."""
    if isinstance(value, np.ndarray):
        array = value
    elif expected is not None:
        array = np.array(value, dtype=expected)
    else:
        array = np.asarray(value)
    if array.dtype.kind == "U":
        array = np.char.encode(array, "utf-8").astype(object)
    elif array.dtype.kind == "S":
        array = array.astype(object)
    if np_to_triton_dtype(array.dtype) is None:
        raise PyTritonClientValueError(f"Arrays of dtype {array.dtype} cannot be sent to Triton")
    return array


def build_inputs(
    config: TritonModelConfig,
    inputs: Sequence[Any],
    named_inputs: Mapping[str, Any],
    *,
    add_batch_axis: bool,
) -> dict[str, np.ndarray]:
    """Map positional inputs to the model's inputs in configuration order, or named ones by name."""
    specs = {spec.name: spec for spec in config.inputs}
    if inputs and named_inputs:
        raise PyTritonClientValueError("Pass the inputs either positionally or by name, not both")
    if inputs:
        if len(inputs) > len(config.inputs):
            raise PyTritonClientInputError(
                f"Model {config.model_name} takes {len(config.inputs)} inputs ({', '.join(specs)}); "
                f"got {len(inputs)}"
            )
        pairs = list(zip([spec.name for spec in config.inputs][: len(inputs)], inputs, strict=True))
    else:
        unknown = sorted(set(named_inputs) - set(specs))
        if unknown and specs:
            raise PyTritonClientInputError(
                f"Model {config.model_name} has no input named {', '.join(unknown)} "
                f"(inputs: {', '.join(specs)})"
            )
        pairs = [(name, value) for name, value in named_inputs.items() if value is not None]
    if not pairs:
        raise PyTritonClientValueError(f"No inputs given for model {config.model_name}")
    arrays = {}
    for name, value in pairs:
        spec = specs.get(name)
        array = _as_array(value, spec.dtype if spec else None)
        arrays[name] = array[np.newaxis, ...] if add_batch_axis else array
    return arrays


def check_transaction_policy(config: TritonModelConfig, *, streaming: bool) -> None:
    """A request-response client cannot read a decoupled model's responses, nor a streaming one a coupled
    model's; say so instead of letting the call hang or fail obscurely."""
    if config.decoupled and not streaming:
        raise PyTritonClientTransactionPolicyError(
            f"Model {config.model_name} is decoupled (it streams responses): "
            "query it with DecoupledModelClient or AsyncioDecoupledModelClient over gRPC"
        )
    if streaming and not config.decoupled:
        raise PyTritonClientTransactionPolicyError(
            f"Model {config.model_name} is not decoupled: query it with ModelClient, FuturesModelClient "
            "or AsyncioModelClient"
        )


def triton_inputs(module: Any, arrays: Mapping[str, np.ndarray], *, binary: bool) -> list[Any]:
    """tritonclient InferInput objects from `module` (tritonclient.http or tritonclient.grpc)."""
    result = []
    for name, array in arrays.items():
        infer_input = module.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        if binary:
            infer_input.set_data_from_numpy(array, binary_data=True)
        else:
            infer_input.set_data_from_numpy(array)
        result.append(infer_input)
    return result


def requested_outputs(module: Any, config: TritonModelConfig, *, binary: bool) -> list[Any] | None:
    if not config.outputs:
        return None
    if binary:
        return [module.InferRequestedOutput(spec.name, binary_data=True) for spec in config.outputs]
    return [module.InferRequestedOutput(spec.name) for spec in config.outputs]


def result_outputs(result: Any, *, strip_batch_axis: bool) -> dict[str, np.ndarray]:
    """Every output of an HTTP or gRPC InferResult as an array; BYTES come back as object arrays of bytes."""
    response = result.get_response()
    if isinstance(response, Mapping):
        names = [output["name"] for output in response.get("outputs", ())]
    else:
        names = [output.name for output in response.outputs]
    outputs = {}
    for name in names:
        array = result.as_numpy(name)
        if array is None:
            continue
        outputs[name] = array[0] if strip_batch_axis and array.ndim > 0 else array
    return outputs


def is_final_response(result: Any) -> bool:
    """Whether a gRPC streaming result carries Triton's final-response flag."""
    parameters = result.get_response().parameters
    return "triton_final_response" in parameters and parameters["triton_final_response"].bool_param


def has_outputs(result: Any) -> bool:
    return len(result.get_response().outputs) > 0


def _is_connection_refused(error: BaseException) -> bool:
    """Refused by the socket layer, directly or wrapped (aiohttp keeps the cause in `os_error`)."""
    return isinstance(error, ConnectionRefusedError) or isinstance(
        getattr(error, "os_error", None), ConnectionRefusedError
    )


def balanced(endpoint: Endpoint) -> bool:
    """Whether the endpoint's requests are spread over the addresses of its host."""
    return balanced_host(endpoint.host, endpoint.ssl)


def never_sent(error: BaseException) -> bool:
    """Whether a request failed before it reached any server: its connection was refused. Such a request
    may go to another replica; one that failed after it was sent may have run, and is not sent again."""
    if _is_connection_refused(error):
        return True
    if isinstance(error, InferenceServerException):
        text = f"{error.status() or ''} {error.message() or error}"
    elif isinstance(error, grpc.RpcError) and hasattr(error, "code"):
        text = f"{error.code()} {error.details() if hasattr(error, 'details') else error}"
    else:
        return False
    return "UNAVAILABLE" in text and "failed to connect" in text.lower()


def _is_timeout(error: BaseException) -> bool:
    return isinstance(error, (TimeoutError, socket.timeout, asyncio.TimeoutError))


CUT_OFF_MARKS = ("stream removed", "socket closed", "goaway", "connection reset", "broken pipe")
"""What gRPC says of a connection that closed under a call it had sent (a server stopping, a pod going):
UNAVAILABLE, as for a server never reached, but the request may have run."""


def _is_unreachable(unavailable: bool, message: str) -> bool:
    """Whether a gRPC UNAVAILABLE status means the server was not reached: Triton answers with the same
    status a request that lacks the header of a restricted endpoint ("This protocol is restricted,
    expecting header ..."), and a connection that closed under a call sent already says so
    (`CUT_OFF_MARKS`)."""
    lowered = message.lower()
    return (
        unavailable
        and "is restricted, expecting header" not in message
        and not any(mark in lowered for mark in CUT_OFF_MARKS)
    )


def translate_error(error: BaseException, *, endpoint: Endpoint, model_name: str) -> PyTritonClientError:
    """The client error for a tritonclient, gRPC or socket failure (see the module docstring)."""
    if isinstance(error, PyTritonClientError):
        return error
    if isinstance(error, InferenceServerException):
        status = str(error.status() or "")
        message = error.message() or str(error)
        if "DEADLINE_EXCEEDED" in status or "Deadline Exceeded" in message:
            return PyTritonClientTimeoutError(
                f"Model {model_name} at {endpoint.url} did not answer in time: {message}"
            )
        if _is_unreachable("UNAVAILABLE" in status, message):
            return PyTritonClientInferenceServerError(
                f"connection refused: cannot reach Triton at {endpoint.url}: {message}"
            )
        return PyTritonClientInferenceServerError(f"Model {model_name} at {endpoint.url} failed: {message}")
    if isinstance(error, grpc.RpcError) and hasattr(error, "code"):
        code = error.code()
        details = error.details() if hasattr(error, "details") else str(error)
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return PyTritonClientTimeoutError(
                f"Model {model_name} at {endpoint.url} did not answer in time: {details}"
            )
        if _is_unreachable(code == grpc.StatusCode.UNAVAILABLE, details):
            return PyTritonClientInferenceServerError(
                f"connection refused: cannot reach Triton at {endpoint.url}: {details}"
            )
        return PyTritonClientInferenceServerError(f"Model {model_name} at {endpoint.url} failed: {details}")
    if _is_connection_refused(error):
        return PyTritonClientInferenceServerError(
            f"connection refused: nothing accepts connections at {endpoint.url} ({error})"
        )
    if _is_timeout(error):
        return PyTritonClientTimeoutError(
            f"Model {model_name} at {endpoint.url} did not answer in time: {error}"
        )
    if isinstance(error, OSError):
        return PyTritonClientInferenceServerError(f"Cannot talk to Triton at {endpoint.url}: {error}")
    return PyTritonClientInferenceServerError(
        f"Request to model {model_name} at {endpoint.url} failed: {error!r}"
    )


def describe_probe_failure(error: BaseException, endpoint: Endpoint) -> str:
    """One line for the readiness wait's timeout message."""
    if _is_connection_refused(error) or (
        isinstance(error, InferenceServerException)
        and _is_unreachable("UNAVAILABLE" in str(error.status() or ""), error.message() or str(error))
    ):
        return f"connection refused at {endpoint.url}"
    if _is_timeout(error):
        return f"{endpoint.url} did not answer"
    if isinstance(error, InferenceServerException):
        return error.message() or str(error)
    return f"{type(error).__name__}: {error}"
