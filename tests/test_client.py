"""The PyTriton clients against a real Triton started through the project's own API (ports 31000-31099)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import gc
import json
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator

import numpy as np
import pytest
import tritonclient.grpc
import tritonclient.grpc.aio
import tritonclient.http
import tritonclient.http.aio
import tritonclient.utils
from kubetriton.triton_home import locate
from pytriton.client import (
    AsyncioDecoupledModelClient,
    AsyncioModelClient,
    DecoupledModelClient,
    FuturesModelClient,
    ModelClient,
    PyTritonClientClosedError,
    PyTritonClientInferenceServerError,
    PyTritonClientInvalidUrlError,
    PyTritonClientModelDoesntSupportBatchingError,
    PyTritonClientQueueFullError,
    PyTritonClientTimeoutError,
    PyTritonClientValueError,
    _protocol,
)
from pytriton.client import client as client_module
from pytriton.client._url import parse_url
from pytriton.client.asyncio_utils import (
    asyncio_get_model_config,
    asyncio_get_model_state,
    asyncio_wait_for_model_ready,
    asyncio_wait_for_model_status_loaded,
    asyncio_wait_for_server_ready,
)
from pytriton.client.auth import (
    GRPC_ACCESS_TOKEN_HEADER,
    create_auth_headers,
    extract_access_token_from_headers,
)
from pytriton.client.utils import ModelState
from pytriton.model_config import ModelConfig, Tensor
from pytriton.proxy.types import Request
from pytriton.triton import Triton, TritonConfig

from tests.conftest import ServicePort, free_ports, plain_triton

HTTP_PORT, GRPC_PORT, METRICS_PORT, REFUSED_PORT = free_ports(4)
"""Claimed for this test process: nothing else on the machine listens on REFUSED_PORT."""
HTTP_URL = f"http://localhost:{HTTP_PORT}"
GRPC_URL = f"grpc://localhost:{GRPC_PORT}"
BOTH_URLS = pytest.mark.parametrize("url", [HTTP_URL, GRPC_URL], ids=["http", "grpc"])
SLOW_MODEL_S = 1.0


def _double(requests: list[Request]) -> list[dict[str, np.ndarray]]:
    return [{"y": request["x"] * 2} for request in requests]


def _subtract(requests: list[Request]) -> list[dict[str, np.ndarray]]:
    return [{"difference": request["a"] - request["b"]} for request in requests]


def _echo_bytes(requests: list[Request]) -> list[dict[str, np.ndarray]]:
    return [{"text": np.array(request["text"], dtype=object)} for request in requests]


def _boom(requests: list[Request]) -> list[dict[str, np.ndarray]]:
    raise ValueError("kaboom 42")


def _slow(requests: list[Request]) -> list[dict[str, np.ndarray]]:
    """Sleeps SLOW_MODEL_S unless every input is negative, then echoes."""
    if any(np.any(request["x"] >= 0) for request in requests):
        time.sleep(SLOW_MODEL_S)
    return [{"y": request["x"]} for request in requests]


_GATE = threading.Event()
"""Holds the requests of model "gated" until a test sets it (at most GATE_HELD_S)."""
GATE_HELD_S = 60.0


def _gated(requests: list[Request]) -> list[dict[str, np.ndarray]]:
    _GATE.wait(GATE_HELD_S)
    return [{"y": request["x"]} for request in requests]


@contextlib.contextmanager
def _gate_closed() -> Iterator[None]:
    """Model "gated" holds its requests until the block ends or `_GATE.set()`; name it after the client in
    a `with` statement, so that the requests are let go before the client waits for them."""
    _GATE.clear()
    try:
        yield
    finally:
        _GATE.set()


def _headers(requests: list[Request]) -> list[dict[str, np.ndarray]]:
    def value(request: Request, key: str) -> bytes:
        return str(request.parameters.get(key, "")).encode()

    return [
        {
            "token": np.array(
                [[value(request, "triton-access-token") or value(request, GRPC_ACCESS_TOKEN_HEADER)]],
                dtype=object,
            ),
            "custom": np.array([[value(request, "x-custom")]], dtype=object),
            "parameter": np.array([[value(request, "level")]], dtype=object),
        }
        for request in requests
    ]


def _paced(requests: list[Request]) -> Iterator[list[dict[str, np.ndarray]]]:
    """Two responses, each `x[0]` seconds after the one before (or the request)."""
    for _ in range(2):
        time.sleep(float(requests[0]["x"].flat[0]))
        yield [{"y": request["x"]} for request in requests]


def _stream(requests: list[Request]) -> Iterator[list[dict[str, np.ndarray]]]:
    """Yields `x[0]` responses `x + i` (the first request's `x[0]` counts for a whole batch); a negative
    `x[0]` yields one response, then fails."""
    first = float(requests[0]["x"].flat[0])
    for index in range(1 if first < 0 else int(first)):
        yield [{"y": request["x"] + index} for request in requests]
    if first < 0:
        raise ValueError("stream broke")


def _float_tensor(name: str) -> Tensor:
    return Tensor(name=name, shape=(-1,), dtype=np.float32)


def _bytes_tensor(name: str) -> Tensor:
    return Tensor(name=name, shape=(-1,), dtype=bytes)


@pytest.fixture(scope="module")
def triton() -> Iterator[Triton]:
    config = TritonConfig(
        http_port=HTTP_PORT,
        grpc_port=GRPC_PORT,
        metrics_port=METRICS_PORT,
        http_header_forward_pattern="(triton-.*|x-.*)",
        grpc_header_forward_pattern="(triton-.*|x-.*)",
    )
    with Triton(config=config) as server:
        batching = ModelConfig(max_batch_size=8)
        server.bind("double", _double, [_float_tensor("x")], [_float_tensor("y")], config=batching)
        server.bind(
            "nobatch", _double, [_float_tensor("x")], [_float_tensor("y")], config=ModelConfig(batching=False)
        )
        server.bind(
            "subtract",
            _subtract,
            [_float_tensor("a"), _float_tensor("b")],
            [_float_tensor("difference")],
            config=batching,
        )
        server.bind(
            "echo_bytes", _echo_bytes, [_bytes_tensor("text")], [_bytes_tensor("text")], config=batching
        )
        server.bind("boom", _boom, [_float_tensor("x")], [_float_tensor("y")], config=batching)
        server.bind("slow", _slow, [_float_tensor("x")], [_float_tensor("y")], config=batching)
        server.bind("gated", _gated, [_float_tensor("x")], [_float_tensor("y")], config=batching)
        server.bind(
            "headers",
            _headers,
            [_float_tensor("x")],
            [_bytes_tensor("token"), _bytes_tensor("custom"), _bytes_tensor("parameter")],
            config=batching,
        )
        server.bind(
            "stream", _stream, [_float_tensor("x")], [_float_tensor("y")], config=ModelConfig(decoupled=True)
        )
        server.bind(
            "paced", _paced, [_float_tensor("x")], [_float_tensor("y")], config=ModelConfig(decoupled=True)
        )
        yield server


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("localhost", "http://localhost:8000"),
        ("localhost:8010", "http://localhost:8010"),
        ("http://example.com:9000", "http://example.com:9000"),
        ("grpc://example.com", "grpc://example.com:8001"),
        ("grpc://10.0.0.1:9001", "grpc://10.0.0.1:9001"),
        ("https://triton.example.com", "https://triton.example.com:443"),
        ("http://[::1]:8000", "http://[::1]:8000"),
    ],
)
def test_url_forms(url: str, expected: str) -> None:
    assert parse_url(url).url == expected


@pytest.mark.parametrize(
    "url",
    [
        "",
        "   ",
        "ftp://host:21",
        "http://host:notaport",
        "http://host:99999",
        "http://host:0",
        "http://",
        "grpc://h:1/path",
    ],
)
def test_invalid_urls_raise(url: str) -> None:
    with pytest.raises(PyTritonClientInvalidUrlError):
        ModelClient(url, "double")


@pytest.mark.parametrize("url", [f"localhost:{HTTP_PORT}", HTTP_URL, GRPC_URL], ids=["bare", "http", "grpc"])
def test_sample_and_batch(triton: Triton, url: str) -> None:
    with ModelClient(url, "double", init_timeout_s=30) as client:
        sample = client.infer_sample(np.array([1.0, 2.0], dtype=np.float32))
        np.testing.assert_array_equal(sample["y"], [2.0, 4.0])
        batch = client.infer_batch(x=np.array([[1.0], [3.0]], dtype=np.float32))
        np.testing.assert_array_equal(batch["y"], [[2.0], [6.0]])
        assert client.is_batching_supported
        assert client.model_config.max_batch_size == 8
        assert [spec.name for spec in client.model_config.inputs] == ["x"]


@pytest.mark.parametrize("url", [HTTP_URL, GRPC_URL], ids=["http", "grpc"])
def test_a_model_version_given_as_a_number_is_sent_as_text(triton: Triton, url: str) -> None:
    with ModelClient(url, "double", model_version=1, init_timeout_s=30) as client:
        assert client.model_version == "1"
        np.testing.assert_array_equal(client.infer_sample(np.array([2.0], np.float32))["y"], [4.0])
    for client_type in (
        ModelClient,
        DecoupledModelClient,
        FuturesModelClient,
        AsyncioModelClient,
        AsyncioDecoupledModelClient,
    ):
        assert client_type(GRPC_URL, "double", model_version=2).model_version == "2"
        with pytest.raises(PyTritonClientValueError, match="model_version must be a string such as '1'"):
            client_type(GRPC_URL, "double", model_version=1.5)


def _requests_through_a_service(monkeypatch: pytest.MonkeyPatch, send: Callable[[str, int], None]) -> int:
    """Send requests for a while through a stand-in for a Service, HTTP connections aging fast; how many
    connections the client opened."""
    monkeypatch.setattr(_protocol, "HTTP_CONNECTION_MAX_AGE_S", 0.2)
    service = ServicePort(HTTP_PORT)
    try:
        send(f"http://127.0.0.1:{service.port}", 12)
    finally:
        service.close()
    return service.connections


@BOTH_URLS
def test_a_client_handed_to_another_thread_keeps_answering(triton: Triton, url: str) -> None:
    """One thread at a time, not always the same one: an HTTP connection made in one thread cannot be waited
    on in another (gevent), so the client makes a new one there."""
    with ModelClient(url, "double", init_timeout_s=30) as client:
        np.testing.assert_array_equal(client.infer_sample(np.array([1.0], np.float32))["y"], [2.0])
        with concurrent.futures.ThreadPoolExecutor(1) as other_thread:
            answer = other_thread.submit(client.infer_sample, np.array([2.0], np.float32)).result()
        np.testing.assert_array_equal(answer["y"], [4.0])
        np.testing.assert_array_equal(client.infer_sample(np.array([3.0], np.float32))["y"], [6.0])


def test_model_client_renews_its_http_connection(triton: Triton, monkeypatch: pytest.MonkeyPatch) -> None:
    """Triton cannot end a keep-alive connection between requests, so a client whose connection outlived
    HTTP_CONNECTION_MAX_AGE_S opens a new one (the Service then routes it to a pod that is not stopping)."""

    def send(url: str, count: int) -> None:
        with ModelClient(url, "double", init_timeout_s=30) as client:
            for value in range(count):
                answer = client.infer_sample(np.array([value], dtype=np.float32))
                np.testing.assert_array_equal(answer["y"], [2.0 * value])
                time.sleep(0.05)

    assert _requests_through_a_service(monkeypatch, send) >= 3


def test_asyncio_client_renews_its_http_connection(triton: Triton, monkeypatch: pytest.MonkeyPatch) -> None:
    async def requests(url: str, count: int) -> None:
        async with AsyncioModelClient(url, "double", init_timeout_s=30) as client:
            for value in range(count):
                both = await asyncio.gather(
                    *(client.infer_sample(np.array([value + k], dtype=np.float32)) for k in (0, 100))
                )
                assert [float(answer["y"][0]) for answer in both] == [2.0 * value, 2.0 * (value + 100)]
                await asyncio.sleep(0.05)
            assert not client._retired, "a replaced connection was left open"

    assert _requests_through_a_service(monkeypatch, lambda url, count: asyncio.run(requests(url, count))) >= 3


@BOTH_URLS
def test_positional_inputs_follow_config_order_and_named_inputs_match_by_name(
    triton: Triton, url: str
) -> None:
    a = np.array([10.0], dtype=np.float32)
    b = np.array([3.0], dtype=np.float32)
    with ModelClient(url, "subtract", lazy_init=False) as client:
        np.testing.assert_array_equal(client.infer_sample(a, b)["difference"], [7.0])
        np.testing.assert_array_equal(client.infer_sample(b=b, a=a)["difference"], [7.0])
        with pytest.raises(PyTritonClientValueError, match="either positionally or by name"):
            client.infer_sample(a, b=b)
        # also what PyTriton raises once the server refused them, for code that catches that
        for error in (PyTritonClientValueError, PyTritonClientInferenceServerError):
            with pytest.raises(error, match="no input named"):
                client.infer_sample(a=a, c=b)
            with pytest.raises(error, match="takes 2 inputs"):
                client.infer_sample(a, b, a)


@BOTH_URLS
def test_python_values_take_the_model_dtype(triton: Triton, url: str) -> None:
    with ModelClient(url, "double") as client:
        result = client.infer_sample([1.5, 2.5])
        assert result["y"].dtype == np.float32
        np.testing.assert_array_equal(result["y"], [3.0, 5.0])


@BOTH_URLS
def test_bytes_round_trip_keeps_trailing_nuls(triton: Triton, url: str) -> None:
    values = np.array([b"abc\x00\x00", b"\x00", b"", "żółw".encode(), b"\xff\xfe"], dtype=object)
    with ModelClient(url, "echo_bytes") as client:
        sample = client.infer_sample(values)["text"]
        assert sample.dtype == np.dtype(object)
        assert list(sample) == list(values)
        batch = client.infer_batch(text=np.stack([values, values]))["text"]
        assert batch.shape == (2, len(values))
        assert list(batch[1]) == list(values)
        strings = client.infer_sample(np.array(["hello", "wörld"]))["text"]
        assert list(strings) == [b"hello", "wörld".encode()]
        from_list = client.infer_sample(text=[b"x\x00\x00", "y"])["text"]
        assert list(from_list) == [b"x\x00\x00", b"y"]


@BOTH_URLS
def test_non_batching_model(triton: Triton, url: str) -> None:
    with ModelClient(url, "nobatch") as client:
        np.testing.assert_array_equal(client.infer_sample(np.array([1.0, 2.0], np.float32))["y"], [2.0, 4.0])
        assert not client.is_batching_supported
        with pytest.raises(PyTritonClientModelDoesntSupportBatchingError):
            client.infer_batch(np.array([[1.0]], np.float32))


@BOTH_URLS
def test_server_error_message_reaches_the_client(triton: Triton, url: str) -> None:
    server_error = PyTritonClientInferenceServerError
    with ModelClient(url, "boom") as client, pytest.raises(server_error, match="kaboom 42"):
        client.infer_sample(np.array([1.0], np.float32))
    with ModelClient(url, "double") as client, pytest.raises(server_error, match="FP64"):
        client.infer_sample(np.array([1.0]))


@BOTH_URLS
def test_inference_timeout_then_client_still_works(triton: Triton, url: str) -> None:
    with ModelClient(url, "slow", inference_timeout_s=0.3) as client:
        started = time.monotonic()
        with pytest.raises(PyTritonClientTimeoutError):
            client.infer_sample(np.array([1.0], np.float32))
        assert time.monotonic() - started < SLOW_MODEL_S
        time.sleep(SLOW_MODEL_S)
        np.testing.assert_array_equal(client.infer_sample(np.array([-7.0], np.float32))["y"], [-7.0])


def test_without_a_config_ensure_model_is_ready_false_still_waits(triton: Triton) -> None:
    """As in PyTriton: a client must read the model's config, so it waits for the model whatever the flag
    (a client started beside a server still loading its models waits, it does not fail)."""
    for client in (
        ModelClient(HTTP_URL, "absent", ensure_model_is_ready=False, init_timeout_s=0.5),
        FuturesModelClient(GRPC_URL, "absent", ensure_model_is_ready=False, init_timeout_s=0.5),
    ):
        with client:
            started = time.monotonic()
            with pytest.raises(PyTritonClientTimeoutError):
                result = client.infer_sample(_floats(1.0))
                result.result(timeout=30) if isinstance(client, FuturesModelClient) else result
            assert time.monotonic() - started >= 0.5


@pytest.mark.parametrize("scheme", ["http", "grpc"])
def test_connection_refused_is_not_a_timeout(triton: Triton, scheme: str) -> None:
    with ModelClient(HTTP_URL if scheme == "http" else GRPC_URL, "double") as known:
        config = known.model_config
    url = f"{scheme}://localhost:{REFUSED_PORT}"
    with ModelClient(url, "double", model_config=config, ensure_model_is_ready=False) as client:
        with pytest.raises(PyTritonClientInferenceServerError, match="connection refused") as caught:
            client.infer_sample(np.array([1.0], np.float32))
        assert not isinstance(caught.value, PyTritonClientTimeoutError)
    with ModelClient(url, "double", init_timeout_s=0.5) as client:
        started = time.monotonic()
        with pytest.raises(PyTritonClientTimeoutError, match="connection refused"):
            client.infer_sample(np.array([1.0], np.float32))
        assert time.monotonic() - started < 5


def test_eager_init_reports_an_unreachable_server_at_construction() -> None:
    with pytest.raises(PyTritonClientTimeoutError, match="connection refused"):
        ModelClient(f"localhost:{REFUSED_PORT}", "double", lazy_init=False, init_timeout_s=0.3)


def test_missing_model_times_out_waiting(triton: Triton) -> None:
    missing = ModelClient(HTTP_URL, "no_such_model", init_timeout_s=0.5)
    with missing, pytest.raises(PyTritonClientTimeoutError, match="no_such_model"):
        missing.wait_for_model(0.5)
    with ModelClient(HTTP_URL, "double") as client:
        client.wait_for_model(5)


def test_first_call_waits_for_a_model_loaded_later(triton: Triton) -> None:
    with FuturesModelClient(GRPC_URL, "late", init_timeout_s=60) as client:
        pending = client.infer_sample(_floats(1.5))
        time.sleep(0.5)
        assert not pending.done()
        triton.bind(
            "late", _double, [_float_tensor("x")], [_float_tensor("y")], config=ModelConfig(max_batch_size=2)
        )
        assert pending.result(timeout=60)["y"].tolist() == [3.0]


@BOTH_URLS
def test_closed_client_raises(triton: Triton, url: str) -> None:
    client = ModelClient(url, "double")
    client.infer_sample(np.array([1.0], np.float32))
    client.close()
    client.close()
    with pytest.raises(PyTritonClientClosedError):
        client.infer_sample(np.array([1.0], np.float32))
    with pytest.raises(PyTritonClientClosedError):
        client.wait_for_model(1)
    # what it read it still has, as PyTriton's client does
    assert client.model_config.max_batch_size == 8 and client.is_batching_supported
    never_read = ModelClient(url, "double")
    never_read.close()
    with pytest.raises(PyTritonClientClosedError):
        assert never_read.model_config is None

    async def asyncio_client() -> None:
        client = AsyncioModelClient(url, "double")
        await client.infer_sample(np.array([1.0], np.float32))
        await client.close()
        assert (await client.model_config).max_batch_size == 8
        with pytest.raises(PyTritonClientClosedError):
            await client.infer_sample(np.array([1.0], np.float32))

    asyncio.run(asyncio_client())


@BOTH_URLS
def test_token_headers_and_parameters_are_sent(triton: Triton, url: str) -> None:
    with ModelClient(url, "headers", access_token="s3cret") as client:
        result = client.infer_sample(
            np.array([1.0], np.float32), parameters={"level": 3}, headers={"x-custom": "yes"}
        )
    assert result["token"][0] == b"s3cret"
    assert result["custom"][0] == b"yes"
    assert result["parameter"][0] == b"3"


@BOTH_URLS
def test_an_access_token_header_of_the_call_replaces_the_clients_token(triton: Triton, url: str) -> None:
    protocol = "grpc" if url.startswith("grpc") else "http"
    call_headers = create_auth_headers("other", protocol)
    assert extract_access_token_from_headers(call_headers) == "other"
    with ModelClient(url, "headers", access_token="s3cret") as client:
        result = client.infer_sample(np.array([1.0], np.float32), headers=call_headers)
    assert result["token"][0] == b"other"


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_token_a_header_cannot_carry_is_refused_without_being_shown(protocol: str) -> None:
    """tritonclient would refuse it with `Invalid header value b'<the token>'`: the secret in a traceback."""
    with pytest.raises(ValueError, match="visible ASCII") as caught:
        create_auth_headers("s3cr3t\nt0ken", protocol)
    assert "s3cr3t" not in str(caught.value) and "t0ken" not in str(caught.value)


def test_from_existing_client_reuses_the_config(triton: Triton) -> None:
    with ModelClient(GRPC_URL, "double") as first:
        first.infer_sample(np.array([1.0], np.float32))
        with ModelClient.from_existing_client(first) as second:
            assert (type(second), second.url) == (ModelClient, GRPC_URL)
            assert second.model_config is first.model_config
            np.testing.assert_array_equal(second.infer_sample(np.array([4.0], np.float32))["y"], [8.0])
    with DecoupledModelClient(GRPC_URL, "stream") as first:
        assert len(list(first.infer_sample(_floats(2.0)))) == 2
        with DecoupledModelClient.from_existing_client(first) as second:
            assert second.model_config is first.model_config
            assert [result["y"].tolist() for result in second.infer_sample(_floats(2.0))] == [[2.0], [3.0]]


@BOTH_URLS
def test_asyncio_clients_from_existing_client(triton: Triton, url: str) -> None:
    """The copy is of the class it is called on, with the URL, model, version, timeouts and token of the
    existing client (asyncio or not) and the configuration it has read."""

    async def scenario() -> None:
        async with AsyncioModelClient(url, "headers", access_token="t0k") as first:
            await first.infer_sample(_floats(1.0))
            async with AsyncioModelClient.from_existing_client(first) as second:
                assert (type(second), second.url, second.model_name) == (AsyncioModelClient, url, "headers")
                assert await second.model_config is await first.model_config
                assert (await second.infer_sample(_floats(1.0)))["token"][0] == b"t0k"
        with ModelClient(url, "slow", "1", inference_timeout_s=0.3) as synchronous:
            async with AsyncioModelClient.from_existing_client(synchronous) as copy:
                assert copy.model_version == "1"
                with pytest.raises(PyTritonClientTimeoutError, match=r"sent no response within 0\.3 s$"):
                    await copy.infer_sample(_floats(1.0))
        if url == GRPC_URL:
            async with AsyncioDecoupledModelClient(url, "stream") as first:
                assert len([result async for result in first.infer_sample(_floats(2.0))]) == 2
                async with AsyncioDecoupledModelClient.from_existing_client(first) as second:
                    assert type(second) is AsyncioDecoupledModelClient
                    assert await second.model_config is await first.model_config
                    assert [result["y"].tolist() async for result in second.infer_sample(_floats(2.0))] == [
                        [2.0],
                        [3.0],
                    ]

    asyncio.run(scenario())
    time.sleep(SLOW_MODEL_S)


def test_an_asyncio_copy_of_a_client_with_the_config_skips_the_readiness_wait(triton: Triton) -> None:
    """A client given the configuration waits for readiness (here in vain: nothing listens); its copy sends
    the inference at once, which is refused."""
    with ModelClient(GRPC_URL, "double") as known:
        config = known.model_config

    async def scenario() -> None:
        url = f"grpc://localhost:{REFUSED_PORT}"
        async with AsyncioModelClient(url, "double", init_timeout_s=30, model_config=config) as first:
            copy = AsyncioModelClient.from_existing_client(first)
            async with copy:
                with pytest.raises(PyTritonClientInferenceServerError, match="connection refused") as caught:
                    await copy.infer_sample(_floats(1.0))
                assert not isinstance(caught.value, PyTritonClientTimeoutError)

    asyncio.run(scenario())


LOADED_CONFIG = json.dumps(
    {
        "backend": "python",
        "max_batch_size": 4,
        "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [1]}],
        "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": [1]}],
    }
)


@BOTH_URLS
def test_model_client_loads_and_unloads_its_model(triton: Triton, url: str) -> None:
    """A model in no repository, loaded from the configuration and files given, then unloaded; the
    repository endpoint wants the server's token. Each protocol loads a model of its own name: Triton 2.51
    died once (Signal 11) just after both had loaded and unloaded the same one, and loading and unloading
    one Python-backend model again and again is a known crash of Triton's (its server#6223)."""
    files = {"file:1/model.py": GOOD_MODEL.encode()}
    name = f"loaded_{parse_url(url).protocol}"
    with (
        ModelClient(url, name) as anonymous,
        pytest.raises(PyTritonClientInferenceServerError, match=rf"^Model {name} at .* is restricted"),
    ):
        anonymous.load_model(config=LOADED_CONFIG, files=files)
    with ModelClient(url, name, access_token=triton.get_access_token(), init_timeout_s=30) as client:
        assert client.get_lib() is (tritonclient.grpc if url == GRPC_URL else tritonclient.http)
        client.load_model(config=LOADED_CONFIG, files=files)
        assert client.infer_sample(_floats(1.5))["y"].tolist() == [1.5]
        client.unload_model()
        raw = client.get_lib().InferenceServerClient(parse_url(url).address)
        try:
            deadline = time.monotonic() + 30
            while raw.is_model_ready(name) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert not raw.is_model_ready(name)
        finally:
            raw.close()


def test_model_client_waits_for_the_server(triton: Triton) -> None:
    with ModelClient(GRPC_URL, "double") as client:
        assert client.wait_for_server(10) is None
    with (
        ModelClient(f"http://localhost:{REFUSED_PORT}", "double") as client,
        pytest.raises(PyTritonClientTimeoutError, match=r"^Waiting for server to be ready timed out\.$"),
    ):
        client.wait_for_server(0.5)
    with pytest.raises(PyTritonClientClosedError):
        client.wait_for_server(0.5)


def test_pytriton_client_client_holds_pytritons_names() -> None:
    """Every client, the asyncio ones imported only when asked for, their base and the default inference
    timeout, where PyTriton has them."""
    loaded = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys\n"
            "from pytriton.client.client import DEFAULT_INFERENCE_TIMEOUT_S, BaseModelClient, ModelClient\n"
            "print('aiohttp' in sys.modules, DEFAULT_INFERENCE_TIMEOUT_S)\n"
            "from pytriton.client.client import AsyncioModelClient, AsyncioDecoupledModelClient\n"
            "print('aiohttp' in sys.modules)",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert loaded.split() == ["False", "60.0", "True"]
    for client in (ModelClient, DecoupledModelClient, AsyncioModelClient, AsyncioDecoupledModelClient):
        assert getattr(client_module, client.__name__) is client
        assert issubclass(client, client_module.BaseModelClient)
    assert client_module.FuturesModelClient is FuturesModelClient
    assert not issubclass(FuturesModelClient, client_module.BaseModelClient)
    with pytest.raises(AttributeError, match="has no attribute 'AsyncioFuturesModelClient'"):
        client_module.AsyncioFuturesModelClient  # noqa: B018


@BOTH_URLS
def test_pytritons_asyncio_utils_wait_for_and_describe_a_model(triton: Triton, url: str) -> None:
    protocol = parse_url(url).protocol
    library = tritonclient.grpc.aio if protocol == "grpc" else tritonclient.http.aio
    headers = create_auth_headers(triton.get_access_token(), protocol)

    async def scenario() -> None:
        client = library.InferenceServerClient(parse_url(url).address)
        refused = library.InferenceServerClient(f"localhost:{REFUSED_PORT}")
        try:
            await asyncio.wait_for(asyncio_wait_for_server_ready(client, 0.1), 10)
            await asyncio_wait_for_model_ready(client, "double", timeout_s=10)
            assert await asyncio_get_model_state(client, "double", headers=headers) is ModelState.READY
            assert await asyncio_get_model_state(client, "double", "1", headers=headers) is ModelState.READY
            assert await asyncio_get_model_state(client, "unknown", headers=headers) is ModelState.UNAVAILABLE
            config = await asyncio_get_model_config(client, "double", timeout_s=10)
            assert config.max_batch_size == 8 and [spec.name for spec in config.inputs] == ["x"]
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio_wait_for_model_status_loaded(client, "unknown", 0.05), 0.3)
            with pytest.raises(PyTritonClientTimeoutError, match=r"model unknown/<latest> to be ready"):
                await asyncio_wait_for_model_ready(client, "unknown", timeout_s=0.5)
            with pytest.raises(PyTritonClientTimeoutError, match=r"model double/1 to be ready"):
                await asyncio_get_model_config(refused, "double", "1", timeout_s=0.5)
        finally:
            await client.close()
            await refused.close()

    asyncio.run(scenario())


def test_the_asyncio_clients_name_their_tritonclient_module() -> None:
    assert AsyncioModelClient(HTTP_URL, "double").get_lib() is tritonclient.http.aio
    assert AsyncioDecoupledModelClient(GRPC_URL, "stream").get_lib() is tritonclient.grpc.aio


def _floats(*values: float) -> np.ndarray:
    return np.array(values, dtype=np.float32)


@BOTH_URLS
def test_request_response_clients_refuse_a_decoupled_model(triton: Triton, url: str) -> None:
    with (
        ModelClient(url, "stream", init_timeout_s=30) as client,
        pytest.raises(PyTritonClientValueError, match="decoupled"),
    ):
        client.infer_sample(_floats(2.0))

    async def query() -> None:
        async with AsyncioModelClient(url, "stream") as client:
            await client.infer_sample(_floats(2.0))

    with pytest.raises(PyTritonClientValueError, match="decoupled"):
        asyncio.run(query())


def test_decoupled_clients_need_grpc_and_a_decoupled_model(triton: Triton) -> None:
    with pytest.raises(PyTritonClientValueError, match="gRPC"):
        DecoupledModelClient(HTTP_URL, "stream")
    with pytest.raises(PyTritonClientValueError, match="gRPC"):
        AsyncioDecoupledModelClient(HTTP_URL, "stream")
    with DecoupledModelClient(GRPC_URL, "double") as client:
        for _ in range(2):  # a refused call leaves the client free for the next one
            with pytest.raises(PyTritonClientValueError, match="not decoupled"):
                list(client.infer_sample(_floats(1.0)))


def test_decoupled_streaming(triton: Triton) -> None:
    with DecoupledModelClient(GRPC_URL, "stream", init_timeout_s=30) as client:
        several = list(client.infer_sample(_floats(3.0, 1.0)))
        assert [result["y"].tolist() for result in several] == [[3.0, 1.0], [4.0, 2.0], [5.0, 3.0]]
        assert list(client.infer_sample(_floats(0.0))) == []
        batch = list(client.infer_batch(x=np.array([[2.0], [2.0]], np.float32)))
        assert [result["y"].tolist() for result in batch] == [[[2.0], [2.0]], [[3.0], [3.0]]]

        received = []
        with pytest.raises(PyTritonClientInferenceServerError, match="stream broke"):
            for result in client.infer_sample(_floats(-1.0)):
                received.append(result)
        assert [result["y"].tolist() for result in received] == [[-1.0]]

        assert len(list(client.infer_sample(_floats(2.0)))) == 2
        partial = client.infer_sample(_floats(5.0))
        assert next(partial)["y"].tolist() == [5.0]
        partial.close()
        assert len(list(client.infer_sample(_floats(1.0)))) == 1


def test_decoupled_timeout_bounds_each_response_not_the_stream(triton: Triton) -> None:
    """Responses 0.3 s apart with a 0.5 s timeout: the stream lasts longer than the timeout and ends well;
    a response 1.5 s late times out. (The model has one instance: the slow streams come last.)"""

    async def stream(inference_timeout_s: float, gap: float) -> int:
        async with AsyncioDecoupledModelClient(
            GRPC_URL, "paced", inference_timeout_s=inference_timeout_s
        ) as client:
            return len([result async for result in client.infer_sample(_floats(gap))])

    with DecoupledModelClient(GRPC_URL, "paced", inference_timeout_s=0.5) as client:
        started = time.monotonic()
        assert len(list(client.infer_sample(_floats(0.3)))) == 2
        assert time.monotonic() - started > 0.5, "the stream outlasted the timeout"
        assert asyncio.run(stream(0.5, 0.3)) == 2
        with pytest.raises(PyTritonClientTimeoutError, match=r"no response within 0\.5 s"):
            list(client.infer_sample(_floats(1.5)))
    with pytest.raises(PyTritonClientTimeoutError, match=r"paced at .* sent no response within 0\.5 s$"):
        asyncio.run(stream(0.5, 1.5))


def test_a_decoupled_client_streams_one_call_at_a_time(triton: Triton) -> None:
    with DecoupledModelClient(GRPC_URL, "stream", init_timeout_s=30) as client:
        first = client.infer_sample(_floats(2.0))
        with pytest.raises(PyTritonClientInferenceServerError, match=r"^Inference is already in progress$"):
            client.infer_sample(_floats(1.0))
        assert len(list(first)) == 2
        unread = client.infer_batch(np.array([[1.0]], np.float32))
        with pytest.raises(PyTritonClientInferenceServerError, match="already in progress"):
            client.infer_batch(np.array([[1.0]], np.float32))
        del unread  # dropping a stream ends it
        gc.collect()
        partial = client.infer_sample(_floats(3.0))
        next(partial)
        partial.close()
        with pytest.raises(PyTritonClientInferenceServerError, match="stream broke"):
            list(client.infer_sample(_floats(-1.0)))
        assert len(list(client.infer_sample(_floats(1.0)))) == 1, "a failed stream ends too"


def test_asyncio_decoupled_streaming(triton: Triton) -> None:
    async def collect(results: AsyncIterator[dict[str, np.ndarray]]) -> list[list[float]]:
        return [result["y"].tolist() async for result in results]

    async def scenario() -> None:
        async with AsyncioDecoupledModelClient(GRPC_URL, "stream", init_timeout_s=30) as client:
            assert await collect(client.infer_sample(_floats(3.0))) == [[3.0], [4.0], [5.0]]
            assert await collect(client.infer_sample(_floats(0.0))) == []
            assert await collect(client.infer_batch(np.array([[1.0]], np.float32))) == [[[1.0]]]
            received = []
            with pytest.raises(PyTritonClientInferenceServerError, match="stream broke"):
                async for result in client.infer_sample(_floats(-2.0)):
                    received.append(result["y"].tolist())
            assert received == [[-2.0]]
            first, second = await asyncio.gather(
                collect(client.infer_sample(_floats(2.0, 10.0))),
                collect(client.infer_sample(_floats(2.0, 20.0))),
            )
            assert (first, second) == ([[2.0, 10.0], [3.0, 11.0]], [[2.0, 20.0], [3.0, 21.0]])

    asyncio.run(scenario())


@BOTH_URLS
def test_futures_client(triton: Triton, url: str) -> None:
    with FuturesModelClient(url, "double", max_workers=4) as client:
        futures = [client.infer_sample(_floats(float(value))) for value in range(8)]
        results = [future.result(timeout=30)["y"].tolist() for future in futures]
        assert results == [[2.0 * value] for value in range(8)]
        batch = client.infer_batch(x=np.array([[1.0], [2.0]], np.float32)).result(timeout=30)
        assert batch["y"].tolist() == [[2.0], [4.0]]
        assert client.model_config().result(timeout=30).max_batch_size == 8
        assert client.wait_for_model(5).result(timeout=30) is None
        failed = client.infer_sample(np.array([1.0]))
        with pytest.raises(PyTritonClientInferenceServerError):
            failed.result(timeout=30)
    with pytest.raises(PyTritonClientClosedError):
        client.infer_sample(_floats(1.0))


def test_futures_client_close_without_waiting(triton: Triton) -> None:
    """close(wait=False) returns at once; what was submitted still runs, the queued request too (as in
    PyTriton), and the connections go once it has."""
    client = FuturesModelClient(HTTP_URL, "slow", max_workers=1)
    client.wait_for_model(30).result(timeout=30)
    running = client.infer_sample(_floats(1.0))
    queued = client.infer_sample(_floats(2.0))
    while not running.running():
        time.sleep(0.01)
    started = time.monotonic()
    client.close(wait=False)
    assert time.monotonic() - started < SLOW_MODEL_S / 2
    with pytest.raises(PyTritonClientClosedError):
        client.infer_sample(_floats(1.0))
    assert running.result(timeout=30)["y"].tolist() == [1.0]
    assert queued.result(timeout=30)["y"].tolist() == [2.0]
    deadline = time.monotonic() + 30
    while client._clients and time.monotonic() < deadline:
        time.sleep(0.05)
    assert client._clients == []


def test_futures_client_runs_requests_in_parallel(triton: Triton) -> None:
    with FuturesModelClient(GRPC_URL, "slow", max_workers=3) as client:
        client.wait_for_model(30).result()
        started = time.monotonic()
        futures = [client.infer_sample(_floats(1.0)) for _ in range(3)]
        concurrent.futures.wait(futures, timeout=30)
        assert all(future.result()["y"].tolist() == [1.0] for future in futures)
        assert time.monotonic() - started < 2.5 * SLOW_MODEL_S


def test_futures_client_queues_max_queue_size_requests_beyond_its_workers(triton: Triton) -> None:
    with (
        FuturesModelClient(GRPC_URL, "gated", max_workers=1, max_queue_size=2, non_blocking=True) as client,
        _gate_closed(),
    ):
        held = [client.infer_sample(_floats(float(value))) for value in range(3)]
        with pytest.raises(PyTritonClientQueueFullError, match="Queue is full: 2 requests"):
            client.infer_sample(_floats(3.0))
        _GATE.set()
        assert [future.result(timeout=30)["y"].tolist() for future in held] == [[0.0], [1.0], [2.0]]
        assert client.infer_sample(_floats(4.0)).result(timeout=30)["y"].tolist() == [4.0]


def test_futures_client_defaults_to_128_threads_and_128_queued_requests(triton: Triton) -> None:
    with FuturesModelClient(GRPC_URL, "gated", non_blocking=True) as client, _gate_closed():
        held = [client.infer_sample(_floats(float(value))) for value in range(256)]
        with pytest.raises(PyTritonClientQueueFullError, match=r"128 requests .* one of 128 threads"):
            client.infer_sample(_floats(1.0))
        _GATE.set()
        assert [future.result(timeout=60)["y"][0] for future in held] == list(range(256))


@pytest.mark.parametrize(
    "limits",
    [{"max_workers": 1, "max_queue_size": None}, {"max_workers": None, "max_queue_size": 1}],
    ids=["unbounded-queue", "unbounded-threads"],
)
def test_futures_client_without_a_limit_refuses_nothing(
    triton: Triton, limits: dict[str, int | None]
) -> None:
    with FuturesModelClient(GRPC_URL, "gated", non_blocking=True, **limits) as client, _gate_closed():
        held = [client.infer_sample(_floats(float(value))) for value in range(20)]
        _GATE.set()
        assert [future.result(timeout=60)["y"][0] for future in held] == list(range(20))


def test_a_submission_waits_for_room_at_most_the_inference_timeout(triton: Triton) -> None:
    """Two readiness waits for a model that never loads fill one thread and a queue of one; a third request
    waits `inference_timeout_s` for room and is refused."""
    client = FuturesModelClient(GRPC_URL, "absent", max_workers=1, max_queue_size=1, inference_timeout_s=0.3)
    try:
        client.wait_for_model(10)
        queued = client.wait_for_model(10)
        started = time.monotonic()
        with pytest.raises(PyTritonClientQueueFullError, match=r"none left within 0\.3 s"):
            client.infer_sample(_floats(1.0))
        assert time.monotonic() - started >= 0.3
    finally:
        client.close(wait=False)
    assert not queued.cancelled(), "a close without waiting lets the submitted requests run"


@pytest.mark.parametrize("limit", ["max_workers", "max_queue_size"])
def test_futures_client_limits_below_one_raise_value_error(limit: str) -> None:
    with pytest.raises(ValueError, match=f"^{limit} must be greater than 0$"):
        FuturesModelClient(GRPC_URL, "double", **{limit: 0})


@BOTH_URLS
def test_asyncio_client(triton: Triton, url: str) -> None:
    async def scenario() -> None:
        async with AsyncioModelClient(url, "double", lazy_init=False) as client:
            assert (await client.model_config).max_batch_size == 8
            sample = await client.infer_sample(_floats(1.0, 2.0))
            assert sample["y"].tolist() == [2.0, 4.0]
            batch = await client.infer_batch(x=np.array([[1.0], [3.0]], np.float32))
            assert batch["y"].tolist() == [[2.0], [6.0]]
            results = await asyncio.gather(*(client.infer_sample(_floats(float(v))) for v in range(6)))
            assert [result["y"].tolist() for result in results] == [[2.0 * v] for v in range(6)]
            await client.wait_for_model(5)
        with pytest.raises(PyTritonClientClosedError):
            await client.infer_sample(_floats(1.0))
        async with AsyncioModelClient(url, "echo_bytes") as client:
            values = np.array([b"a\x00\x00", b""], dtype=object)
            assert list((await client.infer_sample(values))["text"]) == list(values)
        async with AsyncioModelClient(url, "nobatch") as client:
            with pytest.raises(PyTritonClientModelDoesntSupportBatchingError):
                await client.infer_batch(np.array([[1.0]], np.float32))
        async with AsyncioModelClient(url, "boom") as client:
            with pytest.raises(PyTritonClientInferenceServerError, match="kaboom 42"):
                await client.infer_sample(_floats(1.0))
        async with AsyncioModelClient(url, "slow", inference_timeout_s=0.3) as client:
            with pytest.raises(PyTritonClientTimeoutError):
                await client.infer_sample(_floats(1.0))
        async with AsyncioModelClient(url, "headers", access_token="t0k") as client:
            result = await client.infer_sample(_floats(1.0), headers={"x-custom": "async"})
            assert (result["token"][0], result["custom"][0]) == (b"t0k", b"async")

    asyncio.run(scenario())
    time.sleep(SLOW_MODEL_S)


@pytest.mark.parametrize("scheme", ["http", "grpc"])
def test_asyncio_connection_refused_is_not_a_timeout(triton: Triton, scheme: str) -> None:
    with ModelClient(HTTP_URL if scheme == "http" else GRPC_URL, "double") as known:
        config = known.model_config
    url = f"{scheme}://localhost:{REFUSED_PORT}"

    async def scenario() -> None:
        async with AsyncioModelClient(
            url, "double", model_config=config, ensure_model_is_ready=False
        ) as client:
            with pytest.raises(PyTritonClientInferenceServerError, match="connection refused") as caught:
                await client.infer_sample(_floats(1.0))
            assert not isinstance(caught.value, PyTritonClientTimeoutError)
        async with AsyncioModelClient(url, "double", init_timeout_s=0.5) as client:
            with pytest.raises(PyTritonClientTimeoutError, match="connection refused"):
                await client.infer_sample(_floats(1.0))

    asyncio.run(scenario())


GOOD_MODEL = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        inputs = [pb_utils.get_input_tensor_by_name(request, "x").as_numpy() for request in requests]
        return [pb_utils.InferenceResponse([pb_utils.Tensor("y", x)]) for x in inputs]
"""
BROKEN_MODEL = """
class TritonPythonModel:
    def initialize(self, args):
        raise RuntimeError("weights missing")
"""
PLAIN_CONFIG = """name: "{name}"
backend: "python"
max_batch_size: 4
input [ {{ name: "x" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "y" data_type: TYPE_FP32 dims: [ 1 ] }} ]
"""


@pytest.fixture(scope="module")
def plain_triton_with_a_broken_model(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """A plain Triton (no kubetriton models) where one model failed to load: with strict readiness the
    server reports not ready, while the other model serves."""
    with plain_triton(locate(), tmp_path_factory.mktemp("plain-triton")) as triton:
        for name, source in (("good", GOOD_MODEL), ("broken", BROKEN_MODEL)):
            triton.add_model(name, source, PLAIN_CONFIG.format(name=name))
        triton.load("good")
        with pytest.raises(tritonclient.utils.InferenceServerException, match="weights missing"):
            triton.load("broken")
        assert not triton.control.is_server_ready()
        yield f"http://localhost:{triton.http_port}", f"grpc://localhost:{triton.grpc_port}"


def test_a_model_serves_while_another_failed_to_load(plain_triton_with_a_broken_model) -> None:
    for url in plain_triton_with_a_broken_model:
        with ModelClient(url, "good", init_timeout_s=10) as client:
            assert client.infer_sample(_floats(2.5))["y"].tolist() == [2.5]

        async def query(url: str = url) -> None:
            async with AsyncioModelClient(url, "good", init_timeout_s=10) as client:
                assert (await client.infer_sample(_floats(3.5)))["y"].tolist() == [3.5]

        asyncio.run(query())
        broken = ModelClient(url, "broken", init_timeout_s=0.5)
        with broken, pytest.raises(PyTritonClientTimeoutError, match="model broken is not ready"):
            broken.infer_sample(_floats(1.0))


def test_failed_eager_asyncio_init_closes_the_client() -> None:
    async def scenario() -> None:
        client = AsyncioModelClient(
            f"localhost:{REFUSED_PORT}", "double", lazy_init=False, init_timeout_s=0.3
        )
        with pytest.raises(PyTritonClientTimeoutError, match="connection refused"):
            async with client:
                pass
        with pytest.raises(PyTritonClientClosedError):
            await client.infer_sample(_floats(1.0))

    asyncio.run(scenario())


def test_futures_client_names_its_model_and_server() -> None:
    with FuturesModelClient("grpc://localhost:9001", "double", model_version="2") as client:
        assert (client.url, client.model_name, client.model_version) == (
            "grpc://localhost:9001",
            "double",
            "2",
        )


def test_a_triton_not_started_is_not_alive() -> None:
    triton = Triton()
    assert triton.is_alive() is False
    triton.stop()


@pytest.mark.parametrize(
    ("message", "said"),
    [
        (
            "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:1: Connection refused",
            "connection refused: cannot reach Triton at grpc://localhost:1",
        ),
        (
            "Stream removed (Socket closed (GOAWAY received))",
            "Model m at grpc://localhost:1 failed: Stream removed",
        ),
    ],
    ids=["never reached", "cut off in flight"],
)
def test_only_a_request_that_never_reached_triton_reads_connection_refused(message: str, said: str) -> None:
    error = tritonclient.utils.InferenceServerException(message, status="StatusCode.UNAVAILABLE")
    translated = _protocol.translate_error(error, endpoint=parse_url("grpc://localhost:1"), model_name="m")
    assert isinstance(translated, PyTritonClientInferenceServerError)
    assert str(translated).startswith(said), "a request cut off may have run: it is not 'refused'"
