"""Decorators that adapt an inference callable to the list of requests the runtime hands it.

The runtime calls a bound callable as `infer_func(requests)` with one `Request` per client request and
expects back one {output name: array} dict per request (a generator of such lists for decoupled models,
an awaitable for coroutine callables). These decorators, with PyTriton's names and semantics, let the
callable work on batched keyword inputs instead, and they compose: decorators that take the request
list (`batch`, `sample`, `group_by_keys`, `fill_optionals`) go above those that take batched inputs
(`group_by_values`, `pad_batch`, `first_value`), with `triton_context` last.

Model context: a callable may return a list of arrays instead of a dict, and `pad_batch` needs the
batch sizes of the model. Both come from a `TritonContext` that the runtime makes active with
`use_triton_context(context)` on the thread that calls the model's callable; tests and direct calls can
do the same around a call. Every decorator reads the active context when it is called, before the
wrapped callable runs, so coroutine and generator callables see the context of their call. Without an
active context, a list returned under `@batch` or `@sample` becomes one `Request` per request whose
values the runtime maps positionally onto the declared outputs.

Request parameters (and the HTTP/gRPC headers Triton forwards as parameters) stay on the `Request`
objects that the request-list decorators pass on. Below `@batch`, the batched call sees them as
`triton_context.parameters`: the parameters whose value is the same in every request of the batch,
so all of them when the requests agree.

Inputs stay read-only: decorators never write into them, hand a single request's arrays through
as they are, and mark the arrays they build (concatenated or padded batches, filled defaults) read-only
too, so a callable behaves the same whatever the batch looks like.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
from kubetriton.transport import RequestBatch, SplitOutputs, join_adjacent, split_rows

from pytriton.exceptions import PyTritonBadParameterError, PyTritonRuntimeError, PyTritonValidationError
from pytriton.model_config import Tensor
from pytriton.model_config.tensor import shape_fits
from pytriton.proxy.context import ACTIVE_CONTEXT, TritonContext, active_context, use_triton_context
from pytriton.proxy.types import Request

__all__ = [
    "ConstantPadder",
    "InferenceRequest",
    "InferenceRequests",
    "InferenceResult",
    "InferenceResults",
    "InputNames",
    "TritonContext",
    "batch",
    "fill_optionals",
    "first_value",
    "get_inference_request_batch_size",
    "group_by_keys",
    "group_by_values",
    "pad_batch",
    "sample",
    "triton_context",
    "use_triton_context",
]

InputNames = list[str]
InferenceRequest = Mapping[str, np.ndarray]
"""One request's inputs by name, as a request-list decorator receives it (a `Request` is one)."""
InferenceRequests = list[InferenceRequest] | tuple[InferenceRequest, ...]
InferenceResult = dict[str, np.ndarray]
InferenceResults = list[InferenceResult] | tuple[InferenceResult, ...]

TRITON_CONTEXT_FIELD_NAME = "triton_context"
"""The keyword argument `@triton_context` adds; no input may have this name."""


def _with_parameters(context: TritonContext, parameters: Mapping[str, Any]) -> TritonContext:
    if parameters == context.parameters:
        return context
    return dataclasses.replace(context, parameters=parameters)


def _invoke(context: TritonContext, func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call `func` with `context` active, so decorators below it see the context of this call."""
    if ACTIVE_CONTEXT.get() is context:  # the model's own: every call whose requests carry no parameters
        return func(*args, **kwargs)
    token = ACTIVE_CONTEXT.set(context)
    try:
        return func(*args, **kwargs)
    finally:
        ACTIVE_CONTEXT.reset(token)


def _map_result(result: Any, transform: Callable[[Any], Any]) -> Any:
    """Apply `transform` to a callable's result, or to each item it yields, or to what it awaits."""
    if isinstance(result, (dict, list, tuple)):
        return transform(result)
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


def _call_each(
    calls: Sequence[Callable[[], Any]], combine: Callable[[list[Any]], Any], decorator: str
) -> Any:
    """Make the calls in order and combine their results, awaiting each when the callable is a coroutine.

    A single call may return a generator (each item is combined on its own); several cannot, since every
    streamed item must answer all requests of the call.
    """
    first = calls[0]()
    if len(calls) == 1:
        return _map_result(first, lambda result: combine([result]))
    if inspect.isgenerator(first) or inspect.isasyncgen(first):
        raise PyTritonValidationError(
            f"@{decorator} split this call into {len(calls)} calls, "
            "which a generator callable cannot answer; send requests that fall into one group"
        )
    if inspect.isawaitable(first):
        return _await_each(first, calls[1:], combine)
    return combine([first, *(call() for call in calls[1:])])


async def _await_each(
    first: Awaitable[Any], rest: Sequence[Callable[[], Any]], combine: Callable[[list[Any]], Any]
) -> Any:
    results = [await first]
    for call in rest:
        results.append(await call())
    return combine(results)


def _read_only(array: np.ndarray) -> np.ndarray:
    array.flags.writeable = False
    return array


def get_inference_request_batch_size(request: InferenceRequest) -> int:
    """The batch size of a request: the first axis of its first input."""
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
    joined = join_adjacent(arrays)
    if joined is not None:  # inputs that crossed one after another through the arena
        return joined
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
        inputs, sizes = _batch_inputs(requests)
        if kwargs:  # keyword arguments beside the requests are rare
            clashing = sorted(set(inputs) & set(kwargs))
            if clashing:
                raise PyTritonValidationError(
                    f"@batch inputs {clashing} clash with keyword arguments of the call"
                )
        context = _with_parameters(active_context(), _shared_parameters(requests))

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
            if not positional:  # the worker checks and sends each output once for the batch (`whole`)
                return SplitOutputs(outputs, sizes)
            names = list(outputs)
            columns = [split_rows(value, sizes) for value in outputs.values()]
            rows = zip(*columns, strict=True) if columns else [()] * len(sizes)  # no outputs: one empty each
            return [_response(dict(zip(names, row, strict=True)), positional) for row in rows]

        return _map_result(_invoke(context, func, *leading, **kwargs, **inputs), split)

    return wrapper


def _batch_inputs(requests: Sequence[Request]) -> tuple[dict[str, np.ndarray], list[int]]:
    """Each input of the requests as one array, and each request's batch size."""
    columns = requests.intact_columns() if type(requests) is RequestBatch else None
    if columns is not None:  # as the worker made them: names checked, sizes known, columns joined
        inputs = {
            name: columns[name]
            if name in columns
            else _concatenate(name, [request[name] for request in requests])
            for name in requests[0]
        }
        return inputs, requests.sizes
    names = list(requests[0].keys())
    for index, request in enumerate(requests[1:], start=1):
        if set(request.keys()) != set(names):
            raise PyTritonValidationError(
                f"Cannot batch requests with different inputs: request 0 has {sorted(names)}, "
                f"request {index} has {sorted(request.keys())}; put @group_by_keys above @batch"
            )
    inputs = {name: _concatenate(name, [request[name] for request in requests]) for name in names}
    return inputs, [get_inference_request_batch_size(request) for request in requests]


def triton_context(func: Callable[..., Any]) -> Callable[..., Any]:
    """Pass the active `TritonContext` to `func` as the `triton_context` keyword argument."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if TRITON_CONTEXT_FIELD_NAME in kwargs:
            raise PyTritonValidationError(
                f"@triton_context cannot pass '{TRITON_CONTEXT_FIELD_NAME}': "
                "the call already has an argument of that name"
            )
        return func(*args, **kwargs, **{TRITON_CONTEXT_FIELD_NAME: active_context()})

    return wrapper


def _batched_inputs(kwargs: Mapping[str, Any], decorator: str) -> dict[str, np.ndarray]:
    inputs = {name: value for name, value in kwargs.items() if name != TRITON_CONTEXT_FIELD_NAME}
    if not inputs:
        raise PyTritonValidationError(
            f"@{decorator} works on batched inputs given as keyword arguments; put it below @batch"
        )
    return inputs


def _check_keys(keys: tuple[str, ...], decorator: str) -> None:
    for key in keys:
        if not isinstance(key, str):
            raise PyTritonBadParameterError(f"@{decorator} input names must be strings, got {key!r}")
        if key == TRITON_CONTEXT_FIELD_NAME:
            raise PyTritonBadParameterError(
                f"@{decorator} cannot use '{key}': it names the context, not an input"
            )


def _check_declared(keys: Sequence[str], context: TritonContext, decorator: str) -> None:
    if not context.inputs:
        return
    declared = {tensor.name for tensor in context.inputs}
    unknown = [key for key in keys if key not in declared]
    if unknown:
        raise PyTritonBadParameterError(
            f"@{decorator} names inputs {unknown} that model '{context.model_name}' does not declare; "
            f"its inputs are {sorted(str(name) for name in declared)}"
        )


def _is_bytes_kind(dtype: np.dtype) -> bool:
    return dtype.kind in "OSU"


def _with_data(request: Mapping[str, Any], data: dict[str, Any]) -> Mapping[str, Any]:
    """A request like `request` (same parameters) with other inputs; the original stays as it was."""
    if isinstance(request, Request):
        return Request(
            data=data, parameters=request.parameters, requested_output_names=request.requested_output_names
        )
    return data


def sample(func: Callable[..., Any]) -> Callable[..., Any]:
    """Call `func` once per request, with that request's inputs as keyword arguments.

    Suits models without batching. `func` returns a dict of output name to array or a list of arrays in
    the order of the declared outputs; `triton_context.parameters` are the parameters of its request.
    """

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        leading, requests = _requests_argument(args, "sample")
        if not requests:
            return []
        base = active_context()

        def call(request: Mapping[str, Any]) -> Callable[[], Any]:
            clashing = sorted(set(request.keys()) & set(kwargs))
            if clashing:
                raise PyTritonValidationError(
                    f"@sample inputs {clashing} clash with keyword arguments of the call"
                )
            context = _with_parameters(base, getattr(request, "parameters", None) or {})
            return lambda: _invoke(context, func, *leading, **kwargs, **request)

        def combine(results: list[Any]) -> list[dict[str, Any] | Request]:
            return [_response(*_named_outputs(result, base, "sample")) for result in results]

        return _call_each([call(request) for request in requests], combine, "sample")

    return wrapper


def group_by_keys(func: Callable[..., Any]) -> Callable[..., Any]:
    """Call `func` once per group of requests with the same input names, keeping the responses in order.

    Put it above `@batch` when inputs are optional, since `@batch` needs every request to have the same
    inputs. Requests reach `func` unchanged, parameters included.
    """

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        leading, requests = _requests_argument(args, "group_by_keys")
        groups: dict[frozenset[str], list[int]] = {}
        for index, request in enumerate(requests):
            groups.setdefault(frozenset(request.keys()), []).append(index)
        if len(groups) <= 1:
            return func(*args, **kwargs)
        context = active_context()

        def call(indices: list[int]) -> Callable[[], Any]:
            group = [requests[index] for index in indices]
            return lambda: _invoke(context, func, *leading, group, **kwargs)

        def combine(results: list[Any]) -> list[Any]:
            responses: list[Any] = [None] * len(requests)
            for indices, result in zip(groups.values(), results, strict=True):
                if not isinstance(result, (list, tuple)) or len(result) != len(indices):
                    count = len(result) if isinstance(result, (list, tuple)) else type(result).__name__
                    raise PyTritonValidationError(
                        f"@group_by_keys callable answered a group of {len(indices)} requests "
                        f"with {count} responses"
                    )
                for index, response in zip(indices, result, strict=True):
                    responses[index] = response
            return responses

        return _call_each([call(indices) for indices in groups.values()], combine, "group_by_keys")

    return wrapper


class ConstantPadder:
    """A `pad_fn` for `@group_by_values`: pads each group's outputs to the largest shape among the groups.

    Numeric outputs are padded with `pad_value`, string outputs with empty strings, after the existing
    values of every axis but the batch axis.
    """

    def __init__(self, pad_value: int | float = 0) -> None:
        self.pad_value = pad_value

    def __call__(self, results: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
        names = list(dict.fromkeys(name for result in results for name in result))
        padded: list[dict[str, np.ndarray]] = [dict(result) for result in results]
        for name in names:
            arrays = [result[name] for result in results if name in result]
            if (
                len({array.ndim for array in arrays}) > 1
                or len({_is_bytes_kind(array.dtype) for array in arrays}) > 1
            ):
                raise PyTritonValidationError(
                    f"ConstantPadder cannot pad output '{name}': the groups return arrays "
                    f"of different ranks or kinds: {[(str(array.dtype), array.shape) for array in arrays]}"
                )
            target = tuple(int(dim) for dim in np.max([array.shape[1:] for array in arrays], axis=0))
            for result in padded:
                if name in result:
                    result[name] = self._pad(result[name], target)
        return padded

    def _pad(self, array: np.ndarray, target: tuple[int, ...]) -> np.ndarray:
        if array.shape[1:] == target:
            return array
        widths = [(0, 0)] + [(0, want - have) for have, want in zip(array.shape[1:], target, strict=True)]
        if array.dtype.kind == "O":
            padded = np.full((array.shape[0], *target), b"", dtype=object)
            padded[tuple(slice(0, dim) for dim in array.shape)] = array
            return padded
        fill = "" if array.dtype.kind == "U" else b"" if array.dtype.kind == "S" else self.pad_value
        return np.pad(array, widths, mode="constant", constant_values=fill)


def _row_key(values: np.ndarray, row: int) -> Any:
    sample_value = values[row]
    if values.dtype.kind == "O":
        return np.shape(sample_value), tuple(np.asarray(sample_value, dtype=object).ravel().tolist())
    return np.shape(sample_value), np.asarray(sample_value).tobytes()


def _merge_groups(
    groups: list[np.ndarray], results: list[dict[str, Any]], batch_size: int, padded: bool
) -> dict[str, np.ndarray]:
    merged = {}
    for name in dict.fromkeys(name for result in results for name in result):
        parts = []
        for indices, result in zip(groups, results, strict=True):
            value = result.get(name)
            if value is None and name not in result:
                raise PyTritonValidationError(
                    f"@group_by_values output '{name}' is returned for some groups only; "
                    "every group must return the same outputs"
                )
            if not isinstance(value, np.ndarray):
                got = "nothing" if value is None else type(value).__name__
                raise PyTritonValidationError(
                    f"@group_by_values output '{name}' must be a numpy array, got {got}"
                )
            if value.ndim < 1 or value.shape[0] != len(indices):
                raise PyTritonValidationError(
                    f"@group_by_values output '{name}' has shape {value.shape} "
                    f"for a group of {len(indices)} samples"
                )
            parts.append(value)
        trailing = {part.shape[1:] for part in parts}
        if len(trailing) > 1:
            hint = "" if padded else "; pass pad_fn=ConstantPadder() to pad them"
            raise PyTritonValidationError(
                f"@group_by_values cannot merge output '{name}': the groups return shapes "
                f"{sorted(part.shape for part in parts)}{hint}"
            )
        dtypes = [part.dtype for part in parts]
        dtype = np.dtype(object) if any(dtype.kind == "O" for dtype in dtypes) else np.result_type(*dtypes)
        out = np.empty((batch_size, *parts[0].shape[1:]), dtype=dtype)
        for indices, part in zip(groups, parts, strict=True):
            out[indices] = part
        merged[name] = out
    return merged


def group_by_values(
    *keys: str, pad_fn: Callable[[list[dict[str, np.ndarray]]], list[dict[str, np.ndarray]]] | None = None
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Split a batch into sub-batches whose samples have equal values on `keys`; call `func` per sub-batch.

    Put it below `@batch`. The outputs of the sub-batches are put back together in the order of the
    samples; when sub-batches return outputs of different shapes, `pad_fn` (such as `ConstantPadder()`)
    makes them fit first. Keys missing from a batch (optional inputs) are left out of the grouping.
    """
    _check_keys(keys, "group_by_values")

    def decorator(func: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            inputs = _batched_inputs(kwargs, "group_by_values")
            context = active_context()
            _check_declared(keys, context, "group_by_values")
            present = [key for key in keys if key in inputs]
            batch_size = get_inference_request_batch_size(inputs)
            key_arrays = [_batch_axis(inputs[key], key) for key in present]
            rows: dict[tuple[Any, ...], list[int]] = {}
            for row in range(batch_size):
                rows.setdefault(tuple(_row_key(values, row) for values in key_arrays), []).append(row)
            if len(rows) <= 1:
                return func(*args, **kwargs)
            others = {name: value for name, value in kwargs.items() if name not in inputs}
            groups = [np.array(indices) for indices in rows.values()]

            def call(indices: np.ndarray) -> Callable[[], Any]:
                part = {name: _read_only(value[indices]) for name, value in inputs.items()}
                return lambda: _invoke(context, func, *args, **others, **part)

            def combine(results: list[Any]) -> Any:
                positional = not isinstance(results[0], Mapping)
                named = [_positional_dict(result) if positional else dict(result) for result in results]
                if pad_fn is not None:
                    named = list(pad_fn(named))
                merged = _merge_groups(groups, named, batch_size, pad_fn is not None)
                return list(merged.values()) if positional else merged

            return _call_each([call(indices) for indices in groups], combine, "group_by_values")

        return wrapper

    return decorator


def _batch_axis(value: Any, name: str) -> np.ndarray:
    if not isinstance(value, np.ndarray) or value.ndim < 1:
        raise PyTritonValidationError(
            f"Input '{name}' must be a numpy array with a batch axis, got {value!r}"
        )
    return value


def _positional_dict(result: Any) -> dict[str, Any]:
    if not isinstance(result, (list, tuple)):
        raise PyTritonValidationError(
            "Callable must return a dict of output name to numpy array or a list of arrays, "
            f"got {type(result).__name__}"
        )
    return {f"OUTPUT_{index}": value for index, value in enumerate(result, start=1)}


def fill_optionals(**defaults: np.ndarray) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Give requests that lack an input its default, repeated over the request's batch axis.

    Defaults are numpy arrays without the batch axis. Put it at the top of the stack so the grouping
    decorators below see complete requests. When the model context declares the inputs, the defaults
    must name declared inputs and match their dtype and shape.
    """
    not_arrays = sorted(name for name, value in defaults.items() if not isinstance(value, np.ndarray))
    if not_arrays:
        raise PyTritonBadParameterError(
            f"@fill_optionals defaults must be numpy arrays: {', '.join(not_arrays)} are not"
        )
    values = {name: _read_only(np.array(value)) for name, value in defaults.items()}
    checked: set[tuple[Tensor, ...]] = set()

    def check(context: TritonContext) -> None:
        if not context.inputs or context.inputs in checked:
            return
        _check_declared(list(values), context, "fill_optionals")
        declared = {tensor.name: tensor for tensor in context.inputs}
        for name, value in values.items():
            tensor = declared[name]
            same_kind = _is_bytes_kind(value.dtype) and _is_bytes_kind(tensor.dtype)
            if not same_kind and value.dtype != tensor.dtype:
                raise PyTritonBadParameterError(
                    f"@fill_optionals default of '{name}' has dtype {value.dtype}, "
                    f"the input declares {tensor.dtype}"
                )
            if not shape_fits(value.shape, tensor.shape):
                raise PyTritonBadParameterError(
                    f"@fill_optionals default of '{name}' has shape {value.shape}, "
                    f"the input declares {tensor.shape}"
                )
        checked.add(context.inputs)

    def decorator(func: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            leading, requests = _requests_argument(args, "fill_optionals")
            context = active_context()
            check(context)
            batching = context.model_config is None or context.model_config.batching
            filled = []
            for request in requests:
                missing = [name for name in values if name not in request]
                if not missing:
                    filled.append(request)
                    continue
                size = get_inference_request_batch_size(request) if batching and len(request) else 1
                data = dict(request.items())
                for name in missing:
                    value = values[name]
                    data[name] = np.broadcast_to(value, (size, *value.shape)) if batching else value
                filled.append(_with_data(request, data))
            return func(*leading, filled, **kwargs)

        return wrapper

    return decorator


def _trim(result: Any, size: int, padded: int) -> Any:
    def trim(value: Any) -> Any:
        if isinstance(value, np.ndarray) and value.ndim and value.shape[0] == padded:
            return value[:size]
        return value

    if isinstance(result, Mapping):
        return {name: trim(value) for name, value in result.items()}
    if isinstance(result, (list, tuple)):
        return [trim(value) for value in result]
    return result


def pad_batch(func: Callable[..., Any]) -> Callable[..., Any]:
    """Pad the batch to the nearest preferred batch size at or above it, else to the max batch size.

    Padding repeats the last sample. Put it below `@batch`. Outputs whose batch axis has the padded size
    are cut back to the real samples, so the padding never reaches the clients.
    """

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        inputs = _batched_inputs(kwargs, "pad_batch")
        config = active_context().model_config
        if config is None or not config.batching:
            raise PyTritonValidationError(
                "@pad_batch needs the batch sizes of a batching model; call it with a model context active"
            )
        size = get_inference_request_batch_size(inputs)
        preferred = (config.batcher.preferred_batch_size if config.batcher else None) or []
        targets = sorted(
            {target for target in preferred if target <= config.max_batch_size} | {config.max_batch_size}
        )
        target = next((target for target in targets if target >= size), None)
        if target is None:
            raise PyTritonValidationError(
                f"@pad_batch got a batch of {size} samples, more than max_batch_size {config.max_batch_size}"
            )
        if target == size or size == 0:
            return func(*args, **kwargs)
        padded = {}
        for name, value in inputs.items():
            value = _batch_axis(value, name)
            if value.shape[0] != size:
                raise PyTritonValidationError(
                    f"@pad_batch input '{name}' has {value.shape[0]} samples, other inputs have {size}"
                )
            padded[name] = _read_only(np.concatenate([value, np.repeat(value[-1:], target - size, axis=0)]))
        result = func(*args, **{**kwargs, **padded})
        return _map_result(result, lambda outputs: _trim(outputs, size, target))

    return wrapper


def first_value(
    *keys: str, squeeze_single_values: bool = True, strict: bool = True
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Replace the named inputs by their first sample, for parameters sent as inputs (a temperature).

    Works below `@batch` on batched keyword inputs, or on the request list (each request on its own).
    With `strict`, every sample must hold the same value; with `squeeze_single_values`, a one-element
    first sample becomes a numpy scalar. Inputs missing from a call are left alone.
    """
    _check_keys(keys, "first_value")

    def first(name: str, value: Any) -> Any:
        values = _batch_axis(value, name)
        if strict and len(values) > 1 and not np.all(values == values[:1]):
            raise PyTritonRuntimeError(
                f"@first_value input '{name}' has different values across the batch: {values!r}; "
                "send equal values, group the batch with @group_by_values, "
                "or use first_value(..., strict=False)"
            )
        head = values[0]
        if squeeze_single_values and isinstance(head, np.ndarray) and head.size == 1:
            return head.reshape(())[()]
        return head

    def replaced(inputs: Mapping[str, Any]) -> dict[str, Any]:
        return {name: first(name, value) if name in keys else value for name, value in inputs.items()}

    def decorator(func: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            context = active_context()
            if context.model_config is not None and not context.model_config.batching:
                raise PyTritonRuntimeError(
                    "@first_value needs a model with batching; its inputs have no batch axis"
                )
            _check_declared(keys, context, "first_value")
            if any(name != TRITON_CONTEXT_FIELD_NAME for name in kwargs):
                return func(*args, **replaced(kwargs))
            leading, requests = _requests_argument(args, "first_value")
            updated = [
                _with_data(request, replaced(request)) if any(key in request for key in keys) else request
                for request in requests
            ]
            return func(*leading, updated, **kwargs)

        return wrapper

    return decorator
