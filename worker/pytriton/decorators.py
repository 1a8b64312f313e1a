"""Decorators that adapt an inference callable to the list of requests the runtime hands it.

The runtime calls a bound callable as `infer_func(requests)` with one `Request` per client request and
expects back one {output name: array} dict per request (a generator of such lists for decoupled models,
an awaitable for coroutine callables). These decorators, with PyTriton's names and semantics, let the
callable work on batched keyword inputs instead, and they compose: decorators that take the request
list (`batch`, `sample`, `group_by_keys`, `fill_optionals`) go above those that take batched inputs
(`group_by_values`, `pad_batch`, `first_value`), with `triton_context` last.

Model context: a callable may return a list of arrays instead of a dict, and `pad_batch` needs the
batch sizes of the model. Both come from a `TritonContext` that the runtime makes active around each
call with `use_triton_context(context)`; tests and direct calls can do the same. Every decorator reads
the active context when it is called, before the wrapped callable runs, so coroutine and generator
callables see the context of their call. Without an active context, a list returned under `@batch` or
`@sample` becomes one `Request` per request whose values the runtime maps positionally onto the
declared outputs.

Request parameters (and the HTTP/gRPC headers Triton forwards as parameters) stay on the `Request`
objects that the request-list decorators pass on. Below `@batch`, the batched call sees them as
`triton_context.parameters`: the parameters whose value is the same in every request of the batch,
so all of them when the requests agree.

Inputs stay read-only: decorators never write into them, hand a single request's arrays through
as they are, and mark the arrays they build (concatenated or padded batches, filled defaults) read-only
too, so a callable behaves the same whatever the batch looks like.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from pytriton.exceptions import PyTritonValidationError
from pytriton.model_config import ModelConfig, Tensor
from pytriton.proxy.types import Request

__all__ = ["TritonContext", "batch", "triton_context", "use_triton_context"]

TRITON_CONTEXT_FIELD_NAME = "triton_context"
"""The keyword argument `@triton_context` adds; no input may have this name."""


@dataclasses.dataclass(frozen=True)
class TritonContext:
    """What a callable may know about the model it serves and the call it is in.

    `model_config` is None when the callable runs outside a bound model (a direct call without
    `use_triton_context`). `parameters` holds the request parameters of the current call.
    """

    model_name: str = ""
    model_config: ModelConfig | None = None
    inputs: tuple[Tensor, ...] = ()
    outputs: tuple[Tensor, ...] = ()
    parameters: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def output_names(self) -> list[str]:
        return [str(tensor.name) for tensor in self.outputs]


_ACTIVE: contextvars.ContextVar[TritonContext | None] = contextvars.ContextVar(
    "pytriton_context", default=None
)


@contextlib.contextmanager
def use_triton_context(context: TritonContext) -> Iterator[TritonContext]:
    """Make `context` the model context of the decorated callables called inside the block."""
    token = _ACTIVE.set(context)
    try:
        yield context
    finally:
        _ACTIVE.reset(token)


def _active_context() -> TritonContext:
    return _ACTIVE.get() or TritonContext()


def _invoke(context: TritonContext, func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call `func` with `context` active, so decorators below it see the context of this call."""
    token = _ACTIVE.set(context)
    try:
        return func(*args, **kwargs)
    finally:
        _ACTIVE.reset(token)


def _map_result(result: Any, transform: Callable[[Any], Any]) -> Any:
    """Apply `transform` to a callable's result, or to each item it yields, or to what it awaits."""
    if inspect.isgenerator(result):
        return _map_generator(result, transform)
    if inspect.isasyncgen(result):
        return _map_async_generator(result, transform)
    if inspect.isawaitable(result):
        return _map_awaitable(result, transform)
    return transform(result)


def _map_generator(generator: Iterator[Any], transform: Callable[[Any], Any]) -> Iterator[Any]:
    for item in generator:
        yield transform(item)


async def _map_async_generator(
    generator: AsyncIterator[Any], transform: Callable[[Any], Any]
) -> AsyncIterator[Any]:
    async for item in generator:
        yield transform(item)


async def _map_awaitable(awaitable: Awaitable[Any], transform: Callable[[Any], Any]) -> Any:
    return transform(await awaitable)


def _read_only(array: np.ndarray) -> np.ndarray:
    array.flags.writeable = False
    return array


def _batch_size(request: Mapping[str, np.ndarray]) -> int:
    for value in request.values():
        if getattr(value, "ndim", 0) < 1:
            raise PyTritonValidationError(
                "Cannot find the batch size of a request whose inputs have no batch axis"
            )
        return int(value.shape[0])
    raise PyTritonValidationError("Cannot find the batch size of a request without inputs")


def _requests_argument(args: tuple[Any, ...], decorator: str) -> tuple[tuple[Any, ...], Sequence[Request]]:
    """Split a call into the leading arguments (`self` for a method) and the request list."""
    if not args or not isinstance(args[-1], (list, tuple)):
        raise PyTritonValidationError(
            f"@{decorator} expects the list of requests as the last positional argument"
        )
    return args[:-1], args[-1]


def _named_outputs(result: Any, context: TritonContext, decorator: str) -> tuple[dict[str, Any], bool]:
    """The outputs of one call by name, and whether the names are positional stand-ins."""
    if isinstance(result, Mapping):
        return dict(result), False
    if isinstance(result, (list, tuple)):
        names = context.output_names
        if not names:
            return {f"OUTPUT_{index}": value for index, value in enumerate(result, start=1)}, True
        if len(result) != len(names):
            raise PyTritonValidationError(
                f"@{decorator} callable returned {len(result)} outputs, "
                f"but the model declares {len(names)}: {names}"
            )
        return dict(zip(names, result, strict=True)), False
    raise PyTritonValidationError(
        f"@{decorator} callable must return a dict of output name to numpy array or a list of arrays, "
        f"got {type(result).__name__}"
    )


def _response(outputs: dict[str, Any], positional: bool) -> dict[str, Any] | Request:
    return Request(data=outputs) if positional else outputs


def _shared_parameters(requests: Sequence[Request]) -> Mapping[str, Any]:
    parameters = [getattr(request, "parameters", None) or {} for request in requests]
    first = parameters[0]
    if all(other == first for other in parameters[1:]):
        return first
    return {
        key: value
        for key, value in first.items()
        if all(key in other and other[key] == value for other in parameters[1:])
    }


def _concatenate(name: str, arrays: list[np.ndarray]) -> np.ndarray:
    if len(arrays) == 1:
        return arrays[0]
    try:
        return _read_only(np.concatenate(arrays))
    except ValueError:
        shapes = [tuple(array.shape) for array in arrays]
        raise PyTritonValidationError(
            f"Cannot batch input '{name}': the requests' arrays have shapes {shapes}, "
            "which differ beyond the batch axis"
        ) from None


def batch(func: Callable[..., Any]) -> Callable[..., Any]:
    """Call `func` once with each input concatenated over all requests, and split its outputs back.

    The requests must have the same input names (put `@group_by_keys` above `@batch` if they may not).
    `func` returns a dict of output name to array, or a list of arrays in the order of the declared
    outputs; each output's batch axis must have the total batch size of the requests. Generator
    callables yield such results; each becomes one list of per-request responses.
    """

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        leading, requests = _requests_argument(args, "batch")
        if not requests:
            return []
        names = list(requests[0].keys())
        for index, request in enumerate(requests[1:], start=1):
            if set(request.keys()) != set(names):
                raise PyTritonValidationError(
                    f"Cannot batch requests with different inputs: request 0 has {sorted(names)}, "
                    f"request {index} has {sorted(request.keys())}; put @group_by_keys above @batch"
                )
        clashing = sorted(set(names) & set(kwargs))
        if clashing:
            raise PyTritonValidationError(
                f"@batch inputs {clashing} clash with keyword arguments of the call"
            )
        inputs = {name: _concatenate(name, [request[name] for request in requests]) for name in names}
        sizes = [_batch_size(request) for request in requests]
        context = dataclasses.replace(_active_context(), parameters=_shared_parameters(requests))

        def split(result: Any) -> list[dict[str, Any] | Request]:
            outputs, positional = _named_outputs(result, context, "batch")
            total = sum(sizes)
            for name, value in outputs.items():
                if not isinstance(value, np.ndarray):
                    raise PyTritonValidationError(
                        f"@batch output '{name}' must be a numpy array, got {type(value).__name__}"
                    )
                if value.ndim < 1 or value.shape[0] != total:
                    raise PyTritonValidationError(
                        f"@batch output '{name}' has shape {value.shape}; its batch axis must match the "
                        f"{total} samples of the requests"
                    )
            if len(sizes) == 1:
                return [_response(outputs, positional)]
            responses = []
            start = 0
            for size in sizes:
                responses.append(
                    _response(
                        {name: value[start : start + size] for name, value in outputs.items()}, positional
                    )
                )
                start += size
            return responses

        return _map_result(_invoke(context, func, *leading, **kwargs, **inputs), split)

    return wrapper


def triton_context(func: Callable[..., Any]) -> Callable[..., Any]:
    """Pass the active `TritonContext` to `func` as the `triton_context` keyword argument."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if TRITON_CONTEXT_FIELD_NAME in kwargs:
            raise PyTritonValidationError(
                f"@triton_context cannot pass '{TRITON_CONTEXT_FIELD_NAME}': "
                "the call already has an argument of that name"
            )
        return func(*args, **kwargs, **{TRITON_CONTEXT_FIELD_NAME: _active_context()})

    return wrapper
