"""What a callable returned, checked against what its model declares, and the messages clients get.

Triton passes on whatever the proxy gives it, so a response that does not match the model's outputs would
reach the client as a success. The worker's instance threads check every response here (`ResponseChecker`)
before it is encoded, and turn a callable's exception into the client's message (`format_error`).
"""

from __future__ import annotations

import traceback
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from pytriton.proxy.types import Request

from kubetriton.model_repository import ModelSpec
from kubetriton.transport import is_bytes_dtype


class ResponseError(ValueError):
    """A callable's responses do not match what the model declares."""


class SomeRequestsFailed(ResponseError):
    """Some requests of a batch failed and the others have their responses."""

    def __init__(self, responses: Sequence[dict[str, np.ndarray] | ResponseError]) -> None:
        self.errors = {
            index: format_error(response, debug=False)
            for index, response in enumerate(responses)
            if isinstance(response, ResponseError)
        }
        """The client's message for each request that failed, by its place in the batch."""
        self.outputs = [{} if isinstance(response, ResponseError) else response for response in responses]
        """The outputs of each request in the batch; none for those that failed."""
        super().__init__(
            f"{len(self.errors)} of {len(responses)} requests failed: {next(iter(self.errors.values()))}"
        )


class _OutputsLeftOut(Exception):
    """A response lacks declared outputs: whether that is an error depends on what its request asked for."""

    def __init__(self, response: Mapping[str, Any]) -> None:
        super().__init__()
        self.response = response


ERROR_TEXT_LIMIT = 4096
"""The most characters of a callable's error a client gets: Triton sends it over gRPC in a trailer, and
gRPC ends a call whose trailers pass 16 KiB with an error of its own."""


def format_error(error: BaseException, *, debug: bool) -> str:
    """The message a client sees for a callable's exception: its type and text, a traceback only in debug.

    Whatever the exception holds, the message can be sent: an exception whose text cannot be read is named
    by its type, characters that UTF-8 cannot carry are escaped, and a message over ERROR_TEXT_LIMIT keeps
    its start and its end (a traceback's last lines)."""
    try:
        message = f"{type(error).__name__}: {error}"
        if debug:
            message += "\n" + "".join(traceback.format_exception(type(error), error, error.__traceback__))
    except Exception:
        message = f"{type(error).__name__} (its message could not be read)"
    message = message.encode("utf-8", "backslashreplace").decode("utf-8")
    if len(message) > ERROR_TEXT_LIMIT:
        head = ERROR_TEXT_LIMIT // 4
        tail = ERROR_TEXT_LIMIT - head - 100
        left_out = len(message) - head - tail
        message = f"{message[:head]}\n... ({left_out} characters left out) ...\n{message[-tail:]}"
    return message


class ResponseChecker:
    """Turns what a callable returned into one {output name: array} dict per request, or says why not.

    Every output must have the declared rank, and with batching the batch size of its request: Triton
    passes on whatever shape the proxy gives it, so a wrong one would reach the client as a success.
    `strict` also demands the declared dtype and every fixed dimension; without it, numeric outputs are
    cast to the declared dtype, as PyTriton does.

    A response may leave declared outputs out (a model with optional inputs, say): as in PyTriton, they are
    absent from what the client gets. A client that named the outputs it wants and does not get one of them
    gets an error instead, its request alone (`SomeRequestsFailed`). Triton tells the model the same
    names when a client names every output as when it names none, so only a client that named fewer than
    all of them can be told apart. Responses that hold every declared output, the common case, are never
    compared with their requests."""

    def __init__(self, spec: ModelSpec) -> None:
        self._spec = spec
        self.outputs = {tensor.name: tensor for tensor in spec.outputs}
        """The declared outputs by name, in their order."""
        self._names = [tensor.name for tensor in spec.outputs]
        self._batching = bool(spec.max_batch_size)
        self._dtypes = {tensor.name: np.dtype(tensor.dtype) for tensor in spec.outputs}
        self._ranks = {tensor.name: len(tensor.shape) + self._batching for tensor in spec.outputs}

    def check(
        self, result: Any, batch_sizes: Sequence[int | None], requests: Sequence[Request]
    ) -> list[dict[str, np.ndarray]]:
        """`batch_sizes` holds each request's batch size (None when the model does not batch, or the
        request has no input to tell it); `requests` are the requests the callable was given."""
        count = len(batch_sizes)
        if not isinstance(result, (list, tuple)):
            if not (isinstance(result, Mapping) and count == 1):
                raise ResponseError(
                    f"Model '{self._spec.name}' callable must return a list with one response per request, "
                    f"got {type(result).__name__}"
                )
            result = [result]
        if len(result) != count:
            raise ResponseError(
                f"Model '{self._spec.name}' callable returned {len(result)} responses for {count} requests"
            )
        responses: list[dict[str, np.ndarray] | ResponseError] = []
        failed = False
        for response, batch_size, request in zip(result, batch_sizes, requests, strict=True):
            try:
                responses.append(self._check_response(response, batch_size))
                continue
            except _OutputsLeftOut as left_out:  # some declared outputs left out: those it returned
                try:
                    checked = self._check_returned(left_out.response, batch_size, request)
                except ResponseError as error:
                    checked = error
            except ResponseError as error:  # this request's response alone is wrong: it alone fails
                checked = error
            failed = failed or isinstance(checked, ResponseError)
            responses.append(checked)
        if failed:
            raise SomeRequestsFailed(responses)
        return responses  # type: ignore[return-value]

    def _check_returned(
        self, response: Mapping[str, Any], batch_size: int | None, request: Request
    ) -> dict[str, np.ndarray] | ResponseError:
        """The outputs a response holds, or the error of a request that named one it lacks."""
        asked = request.requested_output_names
        if asked and len(asked) < len(self._names):
            missing = [name for name in asked if name not in response]
            if missing:
                return ResponseError(
                    f"Model '{self._spec.name}' callable did not return {missing}, "
                    "which the request asked for"
                )
        return {
            name: self.check_array(name, response[name], batch_size)
            for name in self._names
            if name in response
        }

    def _check_response(self, response: Any, batch_size: int | None) -> dict[str, np.ndarray]:
        if isinstance(response, Request):
            values = list(response.values())
            if len(values) != len(self._names):
                raise ResponseError(
                    f"Model '{self._spec.name}' callable returned a request with {len(values)} inputs "
                    f"as a response, but the model declares {len(self._names)} outputs"
                )
            response = dict(zip(self._names, values, strict=True))
        if type(response) is not dict and not isinstance(response, Mapping):
            raise ResponseError(
                f"Model '{self._spec.name}' callable must return dicts of output name to numpy array, "
                f"got {type(response).__name__}"
            )
        if self.outputs.keys() != response.keys():
            unknown = [name for name in response if name not in self.outputs]
            if unknown:
                raise ResponseError(
                    f"Model '{self._spec.name}' callable returned undeclared outputs {unknown}; "
                    f"declared outputs are {self._names}"
                )
            raise _OutputsLeftOut(response)
        return {name: self.check_array(name, response[name], batch_size) for name in self._names}

    def check_array(self, name: str, value: Any, batch_size: int | None) -> np.ndarray:
        """The output `name` of a response with `batch_size` (or of a whole batch of that size), cast to the
        declared dtype where allowed; ResponseError when it does not fit."""
        declared = self._dtypes[name]
        if not isinstance(value, np.ndarray):
            raise ResponseError(
                f"Model '{self._spec.name}' output '{name}' must be a numpy array, got {type(value).__name__}"
            )
        dtype = value.dtype
        if dtype != declared:
            # numbers for a BYTES output travel as their text (1 as b"1"), as they do in PyTriton
            as_text = is_bytes_dtype(declared) and dtype.kind in "biuf"
            if (
                is_bytes_dtype(declared) != is_bytes_dtype(dtype) and not as_text
            ) or dtype.kind not in "biufOSU":
                raise self._dtype_error(name, value)
            if self._spec.strict and (as_text or not is_bytes_dtype(declared)):
                raise self._dtype_error(name, value)
        self._check_shape(name, value, batch_size)
        if dtype != declared and not is_bytes_dtype(dtype):
            # numbers as text: numpy's shortest for their own type (float32 0.1 as "0.1")
            value = value.astype(str).astype(object) if is_bytes_dtype(declared) else value.astype(declared)
        return value

    def _dtype_error(self, name: str, value: np.ndarray) -> ResponseError:
        declared = self.outputs[name].dtype
        return ResponseError(
            f"Model '{self._spec.name}' output '{name}' has dtype {value.dtype}, declared {declared}"
        )

    def _check_shape(self, name: str, value: np.ndarray, batch_size: int | None) -> None:
        shape = value.shape
        fits = len(shape) == self._ranks[name]
        if fits and self._batching and batch_size is not None:
            fits = shape[0] == batch_size
        declared = self.outputs[name].shape
        if fits and self._spec.strict:
            sample_shape = shape[1:] if self._batching else shape
            fits = all(want in (-1, got) for want, got in zip(declared, sample_shape, strict=True))
        if not fits:
            batching = self._batching
            request = (
                f" for a request of batch size {batch_size}" if batching and batch_size is not None else ""
            )
            raise ResponseError(
                f"Model '{self._spec.name}' output '{name}' has shape {shape}, declared "
                f"{'[batch] + ' if batching else ''}{list(declared)}{request}"
            )
