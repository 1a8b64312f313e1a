"""The PyTriton clients against a real Triton started through the project's own API (ports 31000-31099)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np
import pytest
from pytriton.client import (
    ModelClient,
    PyTritonClientClosedError,
    PyTritonClientInferenceServerError,
    PyTritonClientInvalidUrlError,
    PyTritonClientModelDoesntSupportBatchingError,
    PyTritonClientTimeoutError,
    PyTritonClientValueError,
)
from pytriton.client._protocol import parse_url
from pytriton.model_config import ModelConfig, Tensor
from pytriton.proxy.types import Request
from pytriton.triton import Triton, TritonConfig

HTTP_PORT, GRPC_PORT, METRICS_PORT = 31000, 31001, 31002
REFUSED_PORT = 31099
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
    time.sleep(SLOW_MODEL_S)
    return [{"y": request["x"]} for request in requests]


def _headers(requests: list[Request]) -> list[dict[str, np.ndarray]]:
    def value(request: Request, key: str) -> bytes:
        return str(request.parameters.get(key, "")).encode()

    return [
        {
            "authorization": np.array([[value(request, "authorization")]], dtype=object),
            "custom": np.array([[value(request, "x-custom")]], dtype=object),
            "parameter": np.array([[value(request, "level")]], dtype=object),
        }
        for request in requests
    ]


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
        http_header_forward_pattern="(authorization|x-.*)",
        grpc_header_forward_pattern="(authorization|x-.*)",
    )
    with Triton(config=config) as server:
        batching = ModelConfig(max_batch_size=8)
        server.bind("double", _double, [_float_tensor("x")], [_float_tensor("y")], config=batching)
        server.bind(
            "nobatch", _double, [_float_tensor("x")], [_float_tensor("y")], ModelConfig(batching=False)
        )
        server.bind(
            "subtract",
            _subtract,
            [_float_tensor("a"), _float_tensor("b")],
            [_float_tensor("difference")],
            batching,
        )
        server.bind(
            "echo_bytes", _echo_bytes, [_bytes_tensor("text")], [_bytes_tensor("text")], config=batching
        )
        server.bind("boom", _boom, [_float_tensor("x")], [_float_tensor("y")], config=batching)
        server.bind("slow", _slow, [_float_tensor("x")], [_float_tensor("y")], config=batching)
        server.bind(
            "headers",
            _headers,
            [_float_tensor("x")],
            [_bytes_tensor("authorization"), _bytes_tensor("custom"), _bytes_tensor("parameter")],
            config=batching,
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
    ["", "   ", "ftp://host:21", "http://host:notaport", "http://host:99999", "http://", "grpc://h:1/path"],
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
        with pytest.raises(PyTritonClientValueError, match="no input named"):
            client.infer_sample(a=a, c=b)
        with pytest.raises(PyTritonClientValueError, match="takes 2 inputs"):
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
    with ModelClient(url, "double", inference_timeout_s=0.3) as client:
        time.sleep(SLOW_MODEL_S)
        np.testing.assert_array_equal(client.infer_sample(np.array([1.0], np.float32))["y"], [2.0])


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


def test_missing_model_times_out_waiting(triton: Triton) -> None:
    missing = ModelClient(HTTP_URL, "no_such_model", init_timeout_s=0.5)
    with missing, pytest.raises(PyTritonClientTimeoutError, match="no_such_model"):
        missing.wait_for_model(0.5)
    with ModelClient(HTTP_URL, "double") as client:
        client.wait_for_model(5)


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


@BOTH_URLS
def test_token_headers_and_parameters_are_sent(triton: Triton, url: str) -> None:
    with ModelClient(url, "headers", access_token="s3cret") as client:
        result = client.infer_sample(
            np.array([1.0], np.float32), parameters={"level": 3}, headers={"x-custom": "yes"}
        )
    assert result["authorization"][0] == b"Bearer s3cret"
    assert result["custom"][0] == b"yes"
    assert result["parameter"][0] == b"3"


def test_from_existing_client_reuses_the_config(triton: Triton) -> None:
    with ModelClient(GRPC_URL, "double") as first:
        first.infer_sample(np.array([1.0], np.float32))
        with ModelClient.from_existing_client(first) as second:
            assert second.model_config is first.model_config
            np.testing.assert_array_equal(second.infer_sample(np.array([4.0], np.float32))["y"], [8.0])
