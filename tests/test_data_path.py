"""The data path against a real tritonserver: proxy model, ZeroMQ, shared-memory arenas and the worker.

Queries go through plain `tritonclient` over HTTP and gRPC, so these tests hold for any Triton client.
"""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from kubetriton.server import remove_abandoned_shared_memory
from pytriton.exceptions import PyTritonRuntimeError
from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from tests.conftest import free_ports, shm_entries

ARENA_BYTES = 8 * 1024 * 1024
RETAINED: list[np.ndarray] = []


def double(requests):
    return [{"y": request["x"] * 2} for request in requests]


def echo_bytes(requests):
    return [{"out": request["text"]} for request in requests]


def fails(requests):
    raise ValueError("the model cannot do that")


def forgets_an_output(requests):
    return [{"first": request["x"]} for request in requests]


def writes_into_input(requests):
    for request in requests:
        request["x"][...] = 0
    return [{"y": request["x"]} for request in requests]


def retains_input(requests):
    RETAINED.extend(request["x"] for request in requests)
    return [{"y": request["x"].copy()} for request in requests]


FLOAT_IN = [Tensor(name="x", shape=(-1,), dtype=np.float32)]
FLOAT_OUT = [Tensor(name="y", shape=(-1,), dtype=np.float32)]


@pytest.fixture(scope="module")
def server() -> Iterator[dict[str, str]]:
    http, grpc, metrics = free_ports(3)
    shm_before = shm_entries()
    previous = os.environ.get("KUBETRITON_ARENA_BYTES")
    os.environ["KUBETRITON_ARENA_BYTES"] = str(ARENA_BYTES)
    try:
        triton = Triton(config=TritonConfig(http_port=http, grpc_port=grpc, metrics_port=metrics))
        with triton:
            batching = ModelConfig(max_batch_size=8)
            triton.bind("double", double, FLOAT_IN, FLOAT_OUT, config=batching)
            triton.bind(
                "echo_bytes",
                echo_bytes,
                [Tensor(name="text", shape=(-1,), dtype=object)],
                [Tensor(name="out", shape=(-1,), dtype=bytes)],
                config=batching,
            )
            triton.bind("fails", fails, FLOAT_IN, FLOAT_OUT, config=batching)
            triton.bind(
                "forgets_an_output",
                forgets_an_output,
                FLOAT_IN,
                [
                    Tensor(name="first", shape=(-1,), dtype=np.float32),
                    Tensor(name="second", shape=(-1,), dtype=np.float32),
                ],
                config=batching,
            )
            triton.bind("writes_into_input", writes_into_input, FLOAT_IN, FLOAT_OUT, config=batching)
            triton.bind("retains_input", retains_input, FLOAT_IN, FLOAT_OUT, config=batching)
            triton.bind(
                "Identity",
                lambda requests: requests,
                [Tensor(dtype=np.float32, shape=(1,))],
                [Tensor(dtype=np.float32, shape=(1,))],
                config=batching,
            )
            yield {"http": f"localhost:{http}", "grpc": f"localhost:{grpc}"}
    finally:
        if previous is None:
            os.environ.pop("KUBETRITON_ARENA_BYTES", None)
        else:
            os.environ["KUBETRITON_ARENA_BYTES"] = previous
    leaked = {name for name in shm_entries() - shm_before if name.startswith(f"kubetriton-{os.getpid()}-")}
    assert not leaked, f"shared memory left behind after stop: {leaked}"


def infer(server, protocol: str, model: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """One request through tritonclient over `protocol`, outputs as numpy arrays."""
    module = httpclient if protocol == "http" else grpcclient
    client = module.InferenceServerClient(server[protocol])
    try:
        tensors = []
        for name, array in inputs.items():
            tensor = module.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
            tensor.set_data_from_numpy(array)
            tensors.append(tensor)
        result = client.infer(model, tensors)
        response = result.get_response()
        outputs = response["outputs"] if protocol == "http" else [{"name": o.name} for o in response.outputs]
        return {output["name"]: result.as_numpy(output["name"]) for output in outputs}
    finally:
        client.close()


PROTOCOLS = ["http", "grpc"]


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("size", [16, 100_000], ids=["inline", "arena"])
def test_numeric_round_trip(server, protocol, size):
    x = np.random.default_rng(size).standard_normal((2, size)).astype(np.float32)
    assert np.array_equal(infer(server, protocol, "double", {"x": x})["y"], x * 2)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_bytes_round_trip_keeps_trailing_nuls(server, protocol):
    text = np.array([[b"\xff\x00", b"", b"plain", b"tail\x00\x00"]], dtype=object)
    out = infer(server, protocol, "echo_bytes", {"text": text})["out"]
    assert out.dtype == object
    assert out.tolist() == text.tolist()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_large_bytes_go_through_the_arena(server, protocol):
    text = np.array([[bytes([i % 256]) * 400 for i in range(300)]], dtype=object)
    assert infer(server, protocol, "echo_bytes", {"text": text})["out"].tolist() == text.tolist()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_identity_lambda_returns_its_requests(server, protocol):
    x = np.array([[1.5], [2.5]], dtype=np.float32)
    assert np.array_equal(infer(server, protocol, "Identity", {"INPUT_1": x})["OUTPUT_1"], x)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_callable_exception_reaches_client_without_traceback(server, protocol):
    with pytest.raises(InferenceServerException) as caught:
        infer(server, protocol, "fails", {"x": np.ones((1, 2), np.float32)})
    message = caught.value.message()
    assert "ValueError: the model cannot do that" in message
    assert "Traceback" not in message and ".py" not in message
    assert np.array_equal(
        infer(server, protocol, "double", {"x": np.ones((1, 2), np.float32)})["y"], [[2, 2]]
    )


def test_missing_declared_output_is_an_error(server):
    with pytest.raises(InferenceServerException, match=r"did not return declared outputs \['second'\]"):
        infer(server, "http", "forgets_an_output", {"x": np.ones((1, 2), np.float32)})


def test_inputs_are_read_only(server):
    with pytest.raises(InferenceServerException, match="read-only"):
        infer(server, "http", "writes_into_input", {"x": np.ones((1, 2), np.float32)})


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        ({"wrong_name": np.ones((1, 2), np.float32)}, "wrong_name"),
        ({"x": np.ones((1, 2), np.int64)}, "INT64"),
        ({"x": np.ones((1, 2, 3), np.float32)}, "shape"),
        ({"x": np.ones((9, 2), np.float32)}, "batch"),
    ],
    ids=["name", "dtype", "rank", "batch-size"],
)
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_bad_input_gets_a_clear_error_and_the_server_keeps_serving(server, protocol, inputs, message):
    with pytest.raises(InferenceServerException, match=message) as caught:
        infer(server, protocol, "double", inputs)
    if protocol == "http":
        assert caught.value.status() == "400"
    assert np.array_equal(
        infer(server, protocol, "double", {"x": np.ones((1, 2), np.float32)})["y"], [[2, 2]]
    )


def test_tensor_larger_than_the_arena_gets_a_clear_error_and_nothing_leaks(server):
    too_big = np.ones((1, ARENA_BYTES // 4 + 1024), np.float32)
    with pytest.raises(InferenceServerException, match=r"too large.*arena"):
        infer(server, "http", "double", {"x": too_big})
    fits = np.ones((1, ARENA_BYTES // 16), np.float32)
    for _ in range(4):  # would exhaust the arena if the failed request had leaked its blocks
        assert np.array_equal(infer(server, "http", "double", {"x": fits})["y"], fits * 2)


def test_inputs_kept_by_the_callable_stay_intact(server):
    RETAINED.clear()
    first = np.arange(50_000, dtype=np.float32)[None]
    infer(server, "http", "retains_input", {"x": first})
    for seed in range(5):
        other = np.full((1, 50_000), seed, np.float32)
        assert np.array_equal(infer(server, "http", "retains_input", {"x": other})["y"], other)
    assert np.array_equal(RETAINED[0], first)
    assert not RETAINED[0].flags.writeable


def test_shared_memory_of_killed_servers_is_removed_and_nothing_else(tmp_path):
    exited = subprocess.Popen(["true"])
    exited.wait()
    abandoned = tmp_path / f"kubetriton-{exited.pid}-0a1b2c3d"
    (abandoned / "arenas").mkdir(parents=True)
    abandoned_region = tmp_path / f"kubetriton-{exited.pid}-0a1b2c3d_model_ref"
    abandoned_region.write_bytes(b"x")
    live = tmp_path / f"kubetriton-{os.getpid()}-0a1b2c3d"
    live.mkdir()
    foreign = tmp_path / "kubetriton-someone-else"
    foreign.mkdir()
    remove_abandoned_shared_memory(tmp_path)
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted([live.name, foreign.name])


def test_a_port_in_use_is_refused_before_tritonserver_starts():
    http, grpc, metrics = free_ports(3)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", grpc))
        taken.listen()
        triton = Triton(config=TritonConfig(http_port=http, grpc_port=grpc, metrics_port=metrics))
        with pytest.raises(PyTritonRuntimeError, match=rf"gRPC port {grpc} is in use"):
            triton.run()
        triton.stop()
