"""Every kind of PyTriton callable, request parameters and headers, strict outputs and the response cache,
served by a real tritonserver and queried with plain `tritonclient` over HTTP and gRPC.

One server hosts all models; header forwarding is on for headers named `x-*`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import queue
import re
import secrets
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from pytriton.client.auth import create_auth_headers
from pytriton.decorators import batch, triton_context
from pytriton.exceptions import (
    PyTritonBadParameterError,
    PyTritonInvalidOperationError,
    PyTritonModelConfigError,
    PyTritonRuntimeError,
)
from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig
from tritonclient.utils import InferenceServerException

from tests.conftest import free_ports, shm_entries

STREAM_TIMEOUT_S = 20.0
INSTANCE_SLEEP_S = 0.4
ARENA_BYTES = 8 * 1024 * 1024
BIG_BLOCK = 256 * 1024
X = [Tensor(name="x", shape=(-1,), dtype=np.float32)]
Y = [Tensor(name="y", shape=(-1,), dtype=np.float32)]
STREAM_IN = [Tensor(name="n", shape=(1,), dtype=np.int32), Tensor(name="fail_at", shape=(1,), dtype=np.int32)]
STREAM_OUT = [Tensor(name="i", shape=(1,), dtype=np.int32)]
TEXT_OUT = [Tensor(name="text", shape=(1,), dtype=bytes)]
CACHED_CALLS: list[int] = []
ENDLESS: dict[str, Any] = {}
LINEAR_DEVICES: list[str] = []
INSTANCE_SPANS: list[tuple[str, float, float]] = []


async def async_double(requests):
    await asyncio.sleep(0.01)
    return [{"y": request["x"] * 2} for request in requests]


def _count(request) -> tuple[int, int]:
    return int(request["n"][0]), int(request["fail_at"][0])


def stream(requests):
    """Yields request n's values 0..n-1, one response each; raises at `fail_at` when it is in range."""
    ((n, fail_at),) = (_count(request) for request in requests)
    for i in range(n):
        if i == fail_at:
            raise RuntimeError(f"stream broke at {i}")
        yield [{"i": np.array([i], np.int32)}]


async def async_stream(requests):
    ((n, fail_at),) = (_count(request) for request in requests)
    for i in range(n):
        await asyncio.sleep(0.001)
        if i == fail_at:
            raise RuntimeError(f"async stream broke at {i}")
        yield [{"i": np.array([i * 10], np.int32)}]


@batch
async def batched_async_stream(n, fail_at):
    """`@batch` over an async generator, with positional outputs mapped through the model context."""
    for i in range(int(n[0][0])):
        await asyncio.sleep(0)
        yield [np.full((len(n), 1), i * 100, np.int32)]


def big_stream(requests):
    """Streams n responses of 1 MiB each: more than the response arena holds at once."""
    ((n, _),) = (_count(request) for request in requests)
    for i in range(n):
        yield [{"block": np.full(BIG_BLOCK, i, np.float32)}]


def endless(requests):
    """Streams up to 10 s of responses; records how many it made and whether it was closed."""
    ENDLESS["made"] = 0
    try:
        for i in range(1000):
            time.sleep(0.01)
            ENDLESS["made"] += 1
            yield [{"i": np.array([i], np.int32)} for _ in requests]
    finally:
        ENDLESS["closed"] = True


GAPPED: dict[str, Any] = {}
GAP_S = 2.0


def gapped(requests):
    """Three responses, GAP_S apart; records how many it made and whether it was closed."""
    GAPPED["made"] = 0
    try:
        for i in range(3):
            if i:
                time.sleep(GAP_S)
            GAPPED["made"] += 1
            yield [{"i": np.array([i], np.int32)} for _ in requests]
    finally:
        GAPPED["closed"] = time.monotonic()


async def async_endless(requests):
    ENDLESS["made"] = 0
    try:
        for i in range(1000):
            await asyncio.sleep(0.01)
            ENDLESS["made"] += 1
            yield [{"i": np.array([i], np.int32)} for _ in requests]
    finally:
        ENDLESS["closed"] = True


def spanned(requests):
    """PyTriton's tracing guide instruments a callable with `traced_span`; it serves without tracing."""
    responses = []
    for request in requests:
        with request.traced_span("double"):
            responses.append({"y": request["x"] * 2})
    return responses


def returns_a_generator(requests):
    return (item for item in [[{"y": request["x"]} for request in requests]] * 2)


def parameters_as_json(requests):
    return [
        {"text": np.array([[json.dumps(request.parameters, sort_keys=True).encode()]], object)}
        for request in requests
    ]


@batch
@triton_context
def batched_parameters(x, triton_context):
    text = json.dumps(dict(triton_context.parameters), sort_keys=True).encode()
    return {"text": np.full((len(x), 1), text, object)}


def ignores_the_request_shape(requests):
    """mode 0: int64 in the request's shape; 1: a [3, 3, 3] int64 array whatever the request; 2: one
    dimension too few; 3: another batch size."""
    responses = []
    for request in requests:
        mode = int(request["x"].ravel()[0])
        y = {0: request["x"], 1: np.ones((3, 3, 3)), 2: request["x"][:, 0], 3: np.ones((2, 2))}[mode]
        responses.append({"y": y.astype(np.int64)})
    return responses


def returns_numbers(requests):
    """x[0, 0] as a number for a BYTES output: x[0, 1] 0 an int32, 1 a float64, 2 a bool, 3 a float32."""
    dtypes = (np.int32, np.float64, bool, np.float32)
    return [{"text": request["x"][:, :1].astype(dtypes[int(request["x"][0, 1])])} for request in requests]


def returns_float64(requests):
    """mode 0: the declared float32; 1: float64; 2: one dimension too many."""
    responses = []
    for request in requests:
        mode = int(request["x"].ravel()[0])
        y = request["x"].astype(np.float64 if mode == 1 else np.float32)
        responses.append({"y": y[..., None] if mode == 2 else y})
    return responses


def extra_output(requests):
    return [{"y": request["x"], "z": request["x"]} for request in requests]


class UnreadableError(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no message")


MISBEHAVIOURS = {
    1: SystemExit(3),
    2: KeyboardInterrupt(),
    3: UnreadableError(),
    4: ValueError("caf\udcff"),
    5: ValueError("x" * 1_000_000),
}


def misbehaves(requests):
    """x[0] 0: answers; else raises what MISBEHAVIOURS holds for it."""
    mode = int(requests[0]["x"].ravel()[0])
    if mode in MISBEHAVIOURS:
        raise MISBEHAVIOURS[mode]
    return [{"y": request["x"]} for request in requests]


def cached(requests):
    CACHED_CALLS.append(len(requests))
    return [{"y": request["x"] + 1} for request in requests]


def sleeper(requests):
    started = time.monotonic()
    time.sleep(INSTANCE_SLEEP_S)
    INSTANCE_SPANS.append((threading.current_thread().name, started, time.monotonic()))
    return [{"y": request["x"]} for request in requests]


class LinearWrapper:
    """Seed 002's multi-instance pattern without torch: one callable object per device, `@batch` on
    `__call__`, positional outputs."""

    def __init__(self, weights: np.ndarray, device: str) -> None:
        self._weights = weights
        self._device = device

    @batch
    def __call__(self, **inputs):
        (input1_batch,) = inputs.values()
        time.sleep(0.05)
        LINEAR_DEVICES.append(self._device)
        return [input1_batch @ self._weights]


def linear_factory(devices: list[str]) -> list[LinearWrapper]:
    weights = np.arange(20 * 30, dtype=np.float32).reshape(20, 30) / 600
    return [LinearWrapper(weights, device) for device in devices]


def flags(requests):
    return [{"inverted": ~request["flag"], "half": request["value"] / 2} for request in requests]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    http, grpc, metrics = free_ports(3)
    server_id = f"api-{os.getpid()}-{secrets.token_hex(4)}"
    config = TritonConfig(
        id=server_id,
        http_port=http,
        grpc_port=grpc,
        metrics_port=metrics,
        http_header_forward_pattern="x-.*",
        grpc_header_forward_pattern="x-.*",
        trace_config=[f"triton,file={tmp_path_factory.mktemp('traces') / 'trace.json'}"],
    )
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setenv("KUBETRITON_ARENA_BYTES", str(ARENA_BYTES))
        triton = Triton(config=config)
        triton.run()
    with triton:
        decoupled = ModelConfig(decoupled=True, batching=False)
        triton.bind("async_double", async_double, X, Y, config=ModelConfig(max_batch_size=8))
        triton.bind("stream", stream, STREAM_IN, STREAM_OUT, config=decoupled)
        triton.bind("async_stream", async_stream, STREAM_IN, STREAM_OUT, config=decoupled)
        triton.bind(
            "big_stream",
            big_stream,
            STREAM_IN,
            [Tensor(name="block", shape=(BIG_BLOCK,), dtype=np.float32)],
            config=decoupled,
        )
        triton.bind(
            "batched_async_stream",
            batched_async_stream,
            STREAM_IN,
            STREAM_OUT,
            config=ModelConfig(decoupled=True, max_batch_size=4),
        )
        triton.bind("endless", endless, STREAM_IN, STREAM_OUT, config=decoupled)
        triton.bind("gapped", gapped, STREAM_IN, STREAM_OUT, config=decoupled)
        triton.bind("async_endless", async_endless, STREAM_IN, STREAM_OUT, config=decoupled)
        triton.bind("returns_a_generator", returns_a_generator, X, Y)
        triton.bind("parameters", parameters_as_json, X, TEXT_OUT)
        triton.bind(
            "batched_parameters", batched_parameters, X, TEXT_OUT, config=ModelConfig(max_batch_size=8)
        )
        triton.bind("strict", returns_float64, X, Y, strict=True)
        triton.bind("lenient", returns_float64, X, Y)
        triton.bind("numbers_as_text", returns_numbers, X, TEXT_OUT)
        triton.bind("strict_numbers_as_text", returns_numbers, X, TEXT_OUT, strict=True)
        triton.bind("lenient_shapes", ignores_the_request_shape, X, Y)
        triton.bind("extra_output", extra_output, X, Y)
        triton.bind("misbehaves", misbehaves, X, Y)
        triton.bind("cached", cached, X, Y, config=ModelConfig(response_cache=True))
        triton.bind(
            "Linear",
            linear_factory(devices=["device0", "device1"]),
            [Tensor(dtype=np.float32, shape=(-1,))],
            [Tensor(dtype=np.float32, shape=(-1,))],
            config=ModelConfig(max_batch_size=16),
        )
        triton.bind(
            "decoupled_plain",
            lambda requests: [{"i": r["n"]} for r in requests],
            STREAM_IN,
            STREAM_OUT,
            config=decoupled,
        )
        triton.bind("two_instances", [sleeper, sleeper], X, Y, config=ModelConfig(batching=False))
        triton.bind(
            "string_and_bool_dtypes",
            flags,
            [Tensor(name="flag", shape=(1,), dtype=bool), Tensor(name="value", shape=(1,), dtype="float32")],
            [
                Tensor(name="inverted", shape=(1,), dtype=bool),
                Tensor(name="half", shape=(1,), dtype="float32"),
            ],
        )
        triton.bind("spanned", spanned, X, Y)
        triton.bind("versioned", async_double, X, Y, model_version=2, config=ModelConfig(max_batch_size=8))
        triton.bind(
            "traced",
            async_double,
            X,
            Y,
            config=ModelConfig(max_batch_size=8),
            trace_config=["level=TIMESTAMPS", "rate=2", "count=5", "triton,log-frequency=3"],
        )
        yield {"triton": triton, "http": f"localhost:{http}", "grpc": f"localhost:{grpc}"}
    leaked = {name for name in shm_entries() if name.startswith(f"kubetriton-{server_id}")}
    assert not leaked, f"shared memory left behind after stop: {leaked}"


def _inputs(module: Any, arrays: dict[str, np.ndarray]) -> list[Any]:
    tensors = []
    for name, array in arrays.items():
        dtype = {np.float32: "FP32", np.int32: "INT32", np.bool_: "BOOL"}[array.dtype.type]
        tensor = module.InferInput(name, list(array.shape), dtype)
        tensor.set_data_from_numpy(array)
        tensors.append(tensor)
    return tensors


def infer(server, protocol: str, model: str, arrays: dict[str, np.ndarray], **kwargs: Any) -> Any:
    module = httpclient if protocol == "http" else grpcclient
    client = module.InferenceServerClient(server[protocol])
    try:
        return client.infer(model, _inputs(module, arrays), **kwargs)
    finally:
        client.close()


def stream_once(
    server, model: str, n: int, fail_at: int = -1, *, batched: bool = False
) -> tuple[list[int], str | None]:
    """One streamed request over gRPC: the values of its responses, and the error that ended it, if any."""
    arrays, error = stream_arrays(server, model, n, fail_at, "i", batched=batched)
    return [int(array.ravel()[0]) for array in arrays], error


def stream_arrays(
    server, model: str, n: int, fail_at: int, output: str, *, batched: bool = False
) -> tuple[list[np.ndarray], str | None]:
    events: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server["grpc"])
    values: list[np.ndarray] = []
    try:
        client.start_stream(callback=lambda result, error: events.put((result, error)))
        arrays = {"n": np.array([n], np.int32), "fail_at": np.array([fail_at], np.int32)}
        if batched:
            arrays = {name: array[None] for name, array in arrays.items()}
        client.async_stream_infer(model, _inputs(grpcclient, arrays), enable_empty_final_response=True)
        while True:
            result, error = events.get(timeout=STREAM_TIMEOUT_S)
            if error is not None:
                return values, str(error)
            response = result.get_response()
            if response.outputs:
                values.append(result.as_numpy(output))
            if response.parameters["triton_final_response"].bool_param:
                return values, None
    finally:
        client.stop_stream()
        client.close()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_bind_serves_the_model_version_given(server, protocol):
    x = {"x": np.array([[1.5]], np.float32)}
    for version in ("2", ""):  # "" asks for the latest
        assert infer(server, protocol, "versioned", x, model_version=version).as_numpy("y").tolist() == [
            [3.0]
        ]
    with pytest.raises(InferenceServerException, match="version 1"):
        infer(server, protocol, "versioned", x, model_version="1")


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_bind_trace_config_sets_the_models_trace_settings(server, protocol):
    module = httpclient if protocol == "http" else grpcclient
    client = module.InferenceServerClient(server[protocol])
    headers = create_auth_headers(server["triton"].get_access_token(), protocol)
    extra = {"as_json": True} if protocol == "grpc" else {}
    try:
        traced = client.get_trace_settings("traced", headers=headers, **extra)
        untouched = client.get_trace_settings("versioned", headers=headers, **extra)
    finally:
        client.close()
    if protocol == "grpc":  # {"settings": {name: {"value": [...]}}}
        traced, untouched = (
            {name: entry["value"] for name, entry in settings["settings"].items()}
            for settings in (traced, untouched)
        )
    values = {name: value if isinstance(value, list) else [value] for name, value in traced.items()}
    assert values["trace_level"] == ["TIMESTAMPS"]
    assert (values["trace_rate"], values["log_frequency"]) == (["2"], ["3"])
    assert untouched["trace_level"] == ["OFF"]


def test_trace_settings_of_the_server_are_refused_at_bind(server):
    for entry in (
        "mode=opentelemetry",
        "opentelemetry,url=http://collector:4318/v1/traces",
        "triton,file=/t.json",
    ):
        with pytest.raises(PyTritonBadParameterError, match="TritonConfig\\(trace_config"):
            server["triton"].bind("untraced", async_double, X, Y, trace_config=[entry])


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_callable_with_traced_spans_serves(server, protocol):
    result = infer(server, protocol, "spanned", {"x": np.array([[1.5]], np.float32)})
    assert result.as_numpy("y").tolist() == [[3.0]]


def test_pytriton_version_and_submodules():
    import pytriton

    assert pytriton.__version__ == "0.7.0"
    assert pytriton.triton.Triton is Triton and pytriton.model_config.ModelConfig is ModelConfig
    assert pytriton.client.ModelClient.__name__ == "ModelClient"


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_coroutine_callable(server, protocol):
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert np.array_equal(infer(server, protocol, "async_double", {"x": x}).as_numpy("y"), x * 2)


@pytest.mark.parametrize(("model", "scale"), [("stream", 1), ("async_stream", 10)])
def test_generator_streams_one_response_per_yield(server, model, scale):
    assert stream_once(server, model, 4) == ([0, scale, 2 * scale, 3 * scale], None)


@pytest.mark.parametrize("model", ["stream", "async_stream"])
def test_generator_may_yield_nothing(server, model):
    assert stream_once(server, model, 0) == ([], None)


@pytest.mark.parametrize(("model", "scale"), [("stream", 1), ("async_stream", 10)])
def test_failure_mid_stream_ends_it_with_the_error_and_the_next_request_succeeds(server, model, scale):
    values, error = stream_once(server, model, 5, fail_at=2)
    assert values == [0, scale]
    assert error is not None and f"RuntimeError: {model.replace('_', ' ')} broke at 2" in error
    assert stream_once(server, model, 2) == ([0, scale], None)


def test_batch_decorated_async_generator_streams(server):
    assert stream_once(server, "batched_async_stream", 3, batched=True) == ([0, 100, 200], None)


def test_stream_larger_than_the_response_arena(server):
    blocks, error = stream_arrays(server, "big_stream", 3 * ARENA_BYTES // (BIG_BLOCK * 4), -1, "block")
    assert error is None
    assert len(blocks) == 24
    for i, block in enumerate(blocks):
        assert block.shape == (BIG_BLOCK,)
        assert np.all(block == i)


def cancel_after(server, model: str, items: int, closed: dict[str, Any], wait_s: float) -> float:
    """Stream from `model` over gRPC, cancel after `items` responses, and wait up to `wait_s` for the
    generator to record in `closed` that it was closed; when the cancel was sent."""
    events: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server["grpc"])
    try:
        client.start_stream(callback=lambda result, error: events.put((result, error)))
        arrays = {"n": np.array([0], np.int32), "fail_at": np.array([-1], np.int32)}
        client.async_stream_infer(model, _inputs(grpcclient, arrays))
        for _ in range(items):
            assert events.get(timeout=STREAM_TIMEOUT_S)[1] is None
        cancelled = time.monotonic()
    finally:
        client.stop_stream(cancel_requests=True)
        client.close()
    deadline = time.monotonic() + wait_s
    while "closed" not in closed and time.monotonic() < deadline:
        time.sleep(0.02)
    return cancelled


@pytest.mark.parametrize("model", ["endless", "async_endless"])
def test_cancelled_stream_closes_the_generator(server, model):
    ENDLESS.clear()
    cancel_after(server, model, 2, ENDLESS, 5)
    assert ENDLESS.get("closed"), "the generator still runs after its client cancelled"
    assert ENDLESS["made"] < 200
    assert stream_once(server, "stream", 2) == ([0, 1], None)


def test_a_stream_cancelled_between_two_items_is_not_resumed_for_a_third(server):
    """The client cancels while the generator waits for its next item: once it yields that item, it is
    closed, not resumed to make one more."""
    GAPPED.clear()
    cancelled = cancel_after(server, "gapped", 1, GAPPED, 4 * GAP_S)
    assert GAPPED.get("made") == 2, "resumed once more after its clients cancelled"
    assert GAPPED["closed"] - cancelled < GAP_S + 1


def test_generator_without_decoupled_is_refused_at_bind(server):
    with pytest.raises(PyTritonModelConfigError, match="decoupled=True"):
        server["triton"].bind("undecoupled", stream, STREAM_IN, STREAM_OUT)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_generator_returned_to_a_non_decoupled_model_is_an_error(server, protocol):
    with pytest.raises(InferenceServerException, match=r"decoupled=True"):
        infer(server, protocol, "returns_a_generator", {"x": np.ones((1, 2), np.float32)})
    x = np.ones((1, 2), np.float32)
    assert np.array_equal(infer(server, protocol, "async_double", {"x": x}).as_numpy("y"), x * 2)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_decoupled_model_without_streaming_gets_a_clear_error(server, protocol):
    arrays = {"n": np.array([1], np.int32), "fail_at": np.array([-1], np.int32)}
    with pytest.raises(InferenceServerException, match="decoupled transaction policy"):
        infer(server, protocol, "stream", arrays)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_parameters_and_forwarded_headers_reach_the_callable(server, protocol):
    result = infer(
        server,
        protocol,
        "parameters",
        {"x": np.ones((1, 1), np.float32)},
        parameters={"temperature": 0.5, "mode": "fast", "beams": 3, "greedy": True},
        headers={"x-tenant": "blue", "authorization": "secret"},
    )
    seen = json.loads(result.as_numpy("text")[0][0])
    assert seen == {"temperature": 0.5, "mode": "fast", "beams": 3, "greedy": True, "x-tenant": "blue"}


def test_batch_decorator_sees_parameters_in_the_triton_context(server):
    result = infer(
        server, "grpc", "batched_parameters", {"x": np.ones((2, 1), np.float32)}, parameters={"top_k": 5}
    )
    assert [json.loads(row[0]) for row in result.as_numpy("text")] == [{"top_k": 5}] * 2


def test_strict_outputs_match_the_declaration(server):
    x = np.zeros((1, 2), np.float32)
    assert infer(server, "http", "strict", {"x": x}).as_numpy("y").dtype == np.float32
    with pytest.raises(InferenceServerException, match=r"output 'y' has dtype float64, declared float32"):
        infer(server, "http", "strict", {"x": x + 1})
    with pytest.raises(
        InferenceServerException, match=r"output 'y' has shape \(1, 2, 1\), declared \[batch\] \+ \[-1\]"
    ):
        infer(server, "grpc", "strict", {"x": x + 2})


def test_non_strict_numeric_outputs_are_cast_to_the_declared_dtype(server):
    result = infer(server, "http", "lenient", {"x": np.ones((1, 2), np.float32)})
    assert result.as_numpy("y").dtype == np.float32
    assert result.get_output("y")["datatype"] == "FP32"


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_non_strict_numbers_for_a_bytes_output_travel_as_their_text(server, protocol):
    for mode, value, text in ((0, 1, b"1"), (1, 1.5, b"1.5"), (2, 1, b"True"), (3, 0.1, b"0.1")):
        result = infer(server, protocol, "numbers_as_text", {"x": np.array([[value, mode]], np.float32)})
        assert result.as_numpy("text").tolist() == [[text]], mode
    with pytest.raises(InferenceServerException, match="output 'text' has dtype int32, declared object"):
        infer(server, protocol, "strict_numbers_as_text", {"x": np.array([[1, 0]], np.float32)})


def test_non_strict_outputs_keep_the_request_batch_size_and_the_declared_rank(server):
    x = np.zeros((1, 2), np.float32)
    result = infer(server, "http", "lenient_shapes", {"x": x})
    assert result.as_numpy("y").dtype == np.float32 and result.as_numpy("y").shape == (1, 2)
    declared = r"declared \[batch\] \+ \[-1\] for a request of batch size 1"
    for mode, shape in ((1, r"\(3, 3, 3\)"), (2, r"\(1,\)"), (3, r"\(2, 2\)")):
        for protocol in ("http", "grpc"):
            with pytest.raises(InferenceServerException, match=rf"output 'y' has shape {shape}, {declared}"):
                infer(server, protocol, "lenient_shapes", {"x": x + mode})


def test_undeclared_output_is_an_error(server):
    with pytest.raises(InferenceServerException, match=r"returned undeclared outputs \['z'\]"):
        infer(server, "http", "extra_output", {"x": np.ones((1, 2), np.float32)})


@pytest.mark.parametrize(
    ("mode", "said"),
    [
        (1, "SystemExit: 3"),
        (2, "KeyboardInterrupt: "),
        (3, r"UnreadableError \(its message could not be read\)"),
        (4, r"ValueError: caf\\udcff"),
        (5, r"ValueError: x+\n\.\.\. \(996016 characters left out\) \.\.\.\nx+$"),
    ],
    ids=["SystemExit", "KeyboardInterrupt", "an unreadable message", "unencodable", "a huge message"],
)
def test_whatever_a_callable_raises_fails_its_request_alone(server, mode, said):
    for protocol in ("http", "grpc"):
        with pytest.raises(InferenceServerException) as raised:
            infer(server, protocol, "misbehaves", {"x": np.full((1, 1), mode, np.float32)})
        message = raised.value.message()
        assert re.search(said, message) and len(message) < 4200, message[:200]
        answered = infer(server, protocol, "misbehaves", {"x": np.zeros((1, 1), np.float32)})
        assert answered.as_numpy("y").tolist() == [[0.0]], "the instance serves on"


def test_response_cache_serves_repeated_requests(server):
    CACHED_CALLS.clear()
    x = np.full((1, 3), 7, np.float32)
    for _ in range(3):
        assert np.array_equal(infer(server, "http", "cached", {"x": x}).as_numpy("y"), x + 1)
    assert len(CACHED_CALLS) == 1
    infer(server, "http", "cached", {"x": x + 1})
    assert len(CACHED_CALLS) == 2


def test_a_list_of_callables_runs_as_concurrent_instances(server):
    INSTANCE_SPANS.clear()
    with urllib.request.urlopen(f"http://{server['http']}/v2/models/two_instances/config") as response:
        config = json.load(response)
    assert config["max_batch_size"] == 0
    assert [(group["count"], group["kind"]) for group in config["instance_group"]] == [(2, "KIND_CPU")]
    client = httpclient.InferenceServerClient(server["http"], concurrency=2)
    try:
        started = time.monotonic()
        pending = [
            client.async_infer("two_instances", _inputs(httpclient, {"x": np.ones(2, np.float32)}))
            for _ in range(2)
        ]
        for request in pending:
            request.get_result()
        elapsed = time.monotonic() - started
    finally:
        client.close()
    assert len({name for name, _, _ in INSTANCE_SPANS}) == 2
    (_, start_a, end_a), (_, start_b, end_b) = INSTANCE_SPANS
    assert max(start_a, start_b) < min(end_a, end_b), "the two instances did not overlap"
    assert elapsed < 1.8 * INSTANCE_SLEEP_S


def test_plain_callable_on_a_decoupled_model_streams_one_response(server):
    assert stream_once(server, "decoupled_plain", 7) == ([7], None)


def test_instance_factory_serves_from_every_instance(server):
    LINEAR_DEVICES.clear()
    x = np.ones((1, 20), np.float32)
    done: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server["grpc"])
    try:
        for index in range(8):
            inputs = _inputs(grpcclient, {"INPUT_1": x})
            client.async_infer("Linear", inputs, callback=lambda result, error: done.put((result, error)))
            if index == 0:
                # Let the first request occupy one instance (it sleeps 50 ms), so that the dynamic batcher
                # hands the others to the idle one instead of batching all eight together.
                time.sleep(0.02)
        results = [done.get(timeout=STREAM_TIMEOUT_S) for _ in range(8)]
    finally:
        client.close()
    assert [error for _, error in results] == [None] * 8
    expected = x @ linear_factory(["cpu"])[0]._weights
    for result, _ in results:
        assert np.allclose(result.as_numpy("OUTPUT_1"), expected)
    assert set(LINEAR_DEVICES) == {"device0", "device1"}


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_string_dtype_names_and_python_bool(server, protocol):
    result = infer(
        server,
        protocol,
        "string_and_bool_dtypes",
        {"flag": np.array([[True], [False]]), "value": np.array([[3], [5]], np.float32)},
    )
    assert result.as_numpy("inverted").tolist() == [[False], [True]]
    assert result.as_numpy("half").tolist() == [[1.5], [2.5]]


UNRECOVERABLE_SCRIPT = """
import sys

import numpy as np

from pytriton.exceptions import PyTritonUnrecoverableError
from pytriton.model_config import Tensor
from pytriton.triton import Triton, TritonConfig


def broken(requests):
    raise PyTritonUnrecoverableError("the device is gone")


http, grpc, metrics = map(int, sys.argv[1:4])
config = TritonConfig(id=sys.argv[4], http_port=http, grpc_port=grpc, metrics_port=metrics)
with Triton(config=config) as triton:
    tensor = [Tensor(name="x", shape=(1,), dtype=np.float32)]
    triton.bind("broken", broken, tensor, [Tensor(name="y", shape=(1,), dtype=np.float32)])
    print("serving", flush=True)
    triton.serve()
"""


def _children(pid: int) -> list[int]:
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == pid:
                children.append(int(stat.parent.name))
    return children


def test_unrecoverable_error_stops_serving_and_exits_non_zero(tmp_path):
    script = tmp_path / "serve.py"
    script.write_text(UNRECOVERABLE_SCRIPT)
    ports = free_ports(3)
    server_id = f"unrecoverable-{secrets.token_hex(4)}"
    process = subprocess.Popen(
        [sys.executable, str(script), *map(str, ports), server_id],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    client = httpclient.InferenceServerClient(f"localhost:{ports[0]}")  # stays connected, as a client does
    try:
        assert process.stdout.readline().strip() == "serving"
        tritonserver = _children(process.pid)
        assert tritonserver, "no tritonserver child process"
        with pytest.raises(InferenceServerException, match="PyTritonUnrecoverableError: the device is gone"):
            client.infer("broken", _inputs(httpclient, {"x": np.ones((1, 1), np.float32)}))
        started = time.monotonic()
        returncode = process.wait(timeout=60)
        stopped_after = time.monotonic() - started
        stderr = process.stderr.read()
    finally:
        client.close()
        if process.poll() is None:
            process.kill()
            process.wait()
    assert returncode != 0
    assert stopped_after < 15, "a broken model is not drained (Triton's exit timeout is 30 s)"
    assert "unrecoverable error: the device is gone" in stderr
    assert not [pid for pid in tritonserver if Path(f"/proc/{pid}").exists()], "tritonserver left running"
    assert not [name for name in shm_entries() if name.startswith(f"kubetriton-{server_id}")]


SLOW_SCRIPT = """
import sys
import time

import numpy as np

from pytriton.model_config import Tensor
from pytriton.triton import Triton, TritonConfig


SLEEP_S = float(sys.argv[5]) if len(sys.argv) > 5 else 2.0


def slow(requests):
    print("called", flush=True)
    time.sleep(SLEEP_S)
    return [{"y": request["x"]} for request in requests]


http, grpc, metrics = map(int, sys.argv[1:4])
exit_timeout = int(sys.argv[4]) if len(sys.argv) > 4 else None
config = TritonConfig(http_port=http, grpc_port=grpc, metrics_port=metrics, exit_timeout_secs=exit_timeout)
with Triton(config=config) as triton:
    tensor = [Tensor(name="x", shape=(1,), dtype=np.float32)]
    triton.bind("slow", slow, tensor, [Tensor(name="y", shape=(1,), dtype=np.float32)])
    print("serving", flush=True)
    triton.serve()
"""


def test_a_second_interrupt_does_not_cut_the_drain_short(tmp_path):
    script = tmp_path / "serve.py"
    script.write_text(SLOW_SCRIPT)
    ports = free_ports(3)
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
    process = subprocess.Popen([sys.executable, str(script), *map(str, ports)], **pipes)
    answers: queue.Queue[Any] = queue.Queue()
    try:
        assert process.stdout.readline().strip() == "serving"
        request = threading.Thread(
            target=lambda: answers.put(
                infer(
                    {"http": f"localhost:{ports[0]}"}, "http", "slow", {"x": np.full((1, 1), 7, np.float32)}
                )
            )
        )
        request.start()
        assert process.stdout.readline().strip() == "called"  # the request is in the callable, for 2 s
        process.send_signal(signal.SIGINT)
        time.sleep(0.2)
        process.send_signal(signal.SIGINT)  # as a terminal does when Ctrl-C is pressed again
        request.join(30)
        returncode = process.wait(timeout=60)
        stderr = process.stderr.read()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert answers.get_nowait().as_numpy("y").tolist() == [[7.0]], "the request in flight was answered"
    assert returncode == 0 and "Traceback" not in stderr, stderr
    assert "Already stopping: in-flight requests are being finished" in stderr


@pytest.mark.parametrize(
    ("stop", "said"),
    [
        ("Ctrl-C", "when Triton stopped at the end of its exit timeout"),  # 1 s, the callable takes 8
        ("tritonserver killed", "when tritonserver exited"),  # it drained nothing
    ],
)
def test_requests_still_in_the_callable_as_triton_stops_are_reported(tmp_path, stop, said):
    script = tmp_path / "serve.py"
    script.write_text(SLOW_SCRIPT)
    ports = free_ports(3)
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
    process = subprocess.Popen([sys.executable, str(script), *map(str, ports), "1", "8"], **pipes)

    def abandoned_request() -> None:
        with contextlib.suppress(Exception):  # its connection closes with Triton
            infer({"http": f"localhost:{ports[0]}"}, "http", "slow", {"x": np.ones((1, 1), np.float32)})

    request = threading.Thread(target=abandoned_request)
    try:
        assert process.stdout.readline().strip() == "serving"
        (tritonserver,) = _children(process.pid)
        request.start()
        assert process.stdout.readline().strip() == "called"  # in the callable for 8 s
        if stop == "Ctrl-C":
            process.send_signal(signal.SIGINT)
        else:
            os.kill(tritonserver, signal.SIGKILL)
        returncode = process.wait(timeout=60)
        stderr = process.stderr.read()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        request.join(30)
    assert f"1 request(s) were still in the callable {said}" in stderr
    if stop != "Ctrl-C":
        assert returncode != 0 and "tritonserver exited unexpectedly" in stderr
        assert "at the end of its exit timeout" not in stderr


def test_bind_after_tritonserver_died_says_so_and_stops_cleanly():
    http, grpc, metrics = free_ports(3)
    server_id = f"gone-{secrets.token_hex(4)}"
    triton = Triton(config=TritonConfig(id=server_id, http_port=http, grpc_port=grpc, metrics_port=metrics))
    tensor = [Tensor(name="x", shape=(1,), dtype=np.float32)]
    try:
        triton.run()
        (tritonserver,) = [
            pid
            for pid in _children(os.getpid())
            if f"--http-port={http}".encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
        ]
        os.kill(tritonserver, signal.SIGKILL)
        with pytest.raises(
            PyTritonRuntimeError, match=f"Triton at http://.*:{http} did not answer .*/late/load"
        ):
            triton.bind("late", lambda requests: requests, tensor, tensor)
        assert not triton.is_alive()
        with pytest.raises(PyTritonRuntimeError) as raised:
            triton.serve(monitoring_period_s=0.1)
        assert str(raised.value).startswith(
            "tritonserver exited unexpectedly.\nIt was killed by SIGKILL (the kernel's out-of-memory killer"
        ), "the report says how it ended, before its log's last lines"
    finally:
        triton.stop()
    assert not [name for name in shm_entries() if name.startswith(f"kubetriton-{server_id}")]


def test_a_stopped_triton_does_not_start_or_bind_again():
    http, grpc, metrics = free_ports(3)
    triton = Triton(config=TritonConfig(http_port=http, grpc_port=grpc, metrics_port=metrics))
    tensor = [Tensor(name="x", shape=(1,), dtype=np.float32)]
    with triton:
        triton.bind("served", lambda requests: requests, tensor, tensor)
    assert not triton.is_alive()
    for again in (triton.run, triton.connect, triton.__enter__):
        with pytest.raises(PyTritonInvalidOperationError, match="was stopped; create a new one"):
            again()
    with pytest.raises(PyTritonInvalidOperationError, match="was stopped; create a new one"):
        triton.bind("late", lambda requests: requests, tensor, tensor)
    assert not triton.is_connected()


def test_a_triton_started_from_a_thread_that_ended_keeps_serving():
    """An application's start-up hook may start Triton from a thread of its own, which then ends."""
    http, grpc, metrics = free_ports(3)
    triton = Triton(config=TritonConfig(http_port=http, grpc_port=grpc, metrics_port=metrics))
    tensor = [Tensor(name="x", shape=(1,), dtype=np.float32)]
    starter = threading.Thread(target=triton.run)
    starter.start()
    starter.join()
    try:
        time.sleep(1)  # the kernel's signal to a server whose starting thread ended comes at once
        triton.bind("served", lambda requests: requests, tensor, tensor)
        answered = infer({"http": f"localhost:{http}"}, "http", "served", {"x": np.ones((1, 1), np.float32)})
        assert answered.as_numpy("x").tolist() == [[1.0]]
        assert triton.is_alive()
    finally:
        triton.stop()
