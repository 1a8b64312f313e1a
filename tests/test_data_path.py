"""The data path against a real tritonserver: proxy model, ZeroMQ, shared-memory arenas and the worker.

Queries go through plain `tritonclient` over HTTP and gRPC, so these tests hold for any Triton client.
"""

from __future__ import annotations

import fcntl
import os
import queue
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from kubetriton.server import OWNER_LOCK, claim, remove_abandoned
from kubetriton.transport import HOP_DATAGRAM_BYTES, INLINE_LIMIT
from pytriton.client import DecoupledModelClient, ModelClient
from pytriton.decorators import batch
from pytriton.exceptions import PyTritonRuntimeError
from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from tests.conftest import free_ports, shm_entries

ARENA_BYTES = 8 * 1024 * 1024
RETAINED: list[np.ndarray] = []
ANSWERED_BATCHES: list[int] = []


def double(requests):
    return [{"y": request["x"] * 2} for request in requests]


def echo_bytes(requests):
    return [{"out": request["text"]} for request in requests]


def decodes_text(requests):
    return [
        {"out": np.array([[item.decode() for item in row] for row in request["text"]])}
        for request in requests
    ]


def fails(requests):
    raise ValueError("the model cannot do that")


def answers_what_it_has(requests):
    """PyTriton's optional-input pattern: `b_out` for the requests that brought `b`, and only for those."""
    ANSWERED_BATCHES.append(len(requests))
    return [
        {"a_out": request["a"] * 2, **({"b_out": request["b"] * 3} if "b" in request else {})}
        for request in requests
    ]


def streams_what_it_has(requests):
    yield answers_what_it_has(requests)


def negate_three(requests):
    return [{f"{name}_negated": -request[name] for name in "abc"} for request in requests]


def writes_into_input(requests):
    for request in requests:
        request["x"][...] = 0
    return [{"y": request["x"]} for request in requests]


def retains_input(requests):
    RETAINED.extend(request["x"] for request in requests)
    return [{"y": request["x"].copy()} for request in requests]


@batch
def doubles_and_counts(x):
    """`y`, twice `x`, and `row`, each row's place in the batch: both outputs cross as one array each."""
    ANSWERED_BATCHES.append(len(x))
    return {"y": x * 2, "row": np.arange(len(x), dtype=np.int64).reshape(-1, 1)}


@batch
def sums_rows(x):
    """Each row's sum: small outputs of large inputs, as a classifier's."""
    ANSWERED_BATCHES.append(len(x))
    return {"y": x.sum(axis=1, keepdims=True)}


def rewrites_the_last_answer(infer_func):
    """A decorator above `@batch` that replaces one response's array after `@batch` split the outputs."""

    def rewritten(requests):
        responses = infer_func(requests)
        responses[-1]["y"] = np.full_like(responses[-1]["y"], -1)
        return responses

    return rewritten


@batch
def returns_a_rank_too_many(x):
    return {"y": x[:, None, :], "row": np.zeros((len(x), 1), np.int64)}


def spoils_the_last(requests):
    """Every request's answer right, but the last one's with a rank too many."""
    responses = [
        {"y": request["x"] * 2, "row": np.zeros((len(request["x"]), 1), np.int64)} for request in requests
    ]
    responses[-1]["y"] = responses[-1]["y"][:, None, :]
    ANSWERED_BATCHES.append(sum(len(request["x"]) for request in requests))
    return responses


def names_requested_outputs(requests):
    """Answers, in `asked`, which outputs Triton says each request's client asked for."""
    return [
        {
            "asked": np.array([[",".join(request.requested_output_names or []).encode()]], object),
            "y": request["x"],
        }
        for request in requests
    ]


FLOAT_IN = [Tensor(name="x", shape=(-1,), dtype=np.float32)]
FLOAT_OUT = [Tensor(name="y", shape=(-1,), dtype=np.float32)]
ROW_OUT = Tensor(name="row", shape=(1,), dtype=np.int64)
OPTIONAL_B_IN = [
    Tensor(name="a", shape=(-1,), dtype=np.float32),
    Tensor(name="b", shape=(-1,), dtype=np.float32, optional=True),
]
OPTIONAL_B_OUT = [
    Tensor(name="a_out", shape=(-1,), dtype=np.float32),
    Tensor(name="b_out", shape=(-1,), dtype=np.float32),
]


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
            triton.bind(
                "decodes_text",
                decodes_text,
                [Tensor(name="text", shape=(-1,), dtype=bytes)],
                [Tensor(name="out", shape=(-1,), dtype=bytes)],
                config=batching,
            )
            triton.bind("fails", fails, FLOAT_IN, FLOAT_OUT, config=batching)
            for name, infer_func, config in (
                ("answers_what_it_has", answers_what_it_has, batching),
                (
                    "answers_pairs_of_requests",
                    answers_what_it_has,
                    ModelConfig(
                        max_batch_size=8,
                        batcher=DynamicBatcher(
                            max_queue_delay_microseconds=60_000_000, preferred_batch_size=[2]
                        ),
                    ),
                ),
                ("streams_what_it_has", streams_what_it_has, ModelConfig(max_batch_size=8, decoupled=True)),
            ):
                triton.bind(name, infer_func, OPTIONAL_B_IN, OPTIONAL_B_OUT, config=config)
            three_rows = ModelConfig(
                max_batch_size=8,
                batcher=DynamicBatcher(max_queue_delay_microseconds=60_000_000, preferred_batch_size=[3]),
            )
            for name, infer_func in (
                ("doubles_pairs", doubles_and_counts),
                ("rewrites_pairs", rewrites_the_last_answer(doubles_and_counts)),
                ("a_rank_too_many", returns_a_rank_too_many),
                ("spoils_the_last", spoils_the_last),
            ):
                triton.bind(name, infer_func, FLOAT_IN, [*FLOAT_OUT, ROW_OUT], config=three_rows)
            four_requests = ModelConfig(
                max_batch_size=8,
                batcher=DynamicBatcher(max_queue_delay_microseconds=60_000_000, preferred_batch_size=[4]),
            )
            triton.bind("sums_fours", sums_rows, FLOAT_IN, FLOAT_OUT, config=four_requests)
            triton.bind(
                "negate_three",
                negate_three,
                [Tensor(name=name, shape=(-1,), dtype=np.float32) for name in "abc"],
                [Tensor(name=f"{name}_negated", shape=(-1,), dtype=np.float32) for name in "abc"],
                config=batching,
            )
            triton.bind(
                "names_requested_outputs",
                names_requested_outputs,
                FLOAT_IN,
                [Tensor(name="asked", shape=(-1,), dtype=bytes), *FLOAT_OUT],
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
    result = _infer_asking(server, protocol, model, inputs, [])
    return {name: result.as_numpy(name) for name in _output_names(result)}


PROTOCOLS = ["http", "grpc"]


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("size", [16, 100_000], ids=["inline", "arena"])
def test_numeric_round_trip(server, protocol, size):
    x = np.random.default_rng(size).standard_normal((2, size)).astype(np.float32)
    assert np.array_equal(infer(server, protocol, "double", {"x": x})["y"], x * 2)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_inline_tensors_larger_together_than_a_datagram(server, protocol):
    size = INLINE_LIMIT // 4 - 16
    assert 3 * size * 4 > HOP_DATAGRAM_BYTES
    inputs = {name: np.full((1, size), index, np.float32) for index, name in enumerate("abc")}
    outputs = infer(server, protocol, "negate_three", inputs)
    for name, array in inputs.items():
        assert np.array_equal(outputs[f"{name}_negated"], -array)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_bytes_round_trip_keeps_trailing_nuls(server, protocol):
    text = np.array([[b"\xff\x00", b"", b"plain", b"tail\x00\x00"]], dtype=object)
    out = infer(server, protocol, "echo_bytes", {"text": text})["out"]
    assert out.dtype == object
    assert out.tolist() == text.tolist()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_str_outputs_reach_the_client_as_their_utf8_bytes(server, protocol):
    text = np.array([["żółw".encode(), b"", b"plain"], [b"a", "\u00e9t\u00e9".encode(), b"zz"]], dtype=object)
    out = infer(server, protocol, "decodes_text", {"text": text})["out"]
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
@pytest.mark.parametrize(
    "requested, seen",
    [(["y", "asked"], "asked,y"), (["asked"], "asked"), ([], "asked,y")],  # none named: Triton asks for all
    ids=["both", "one", "none"],
)
def test_requested_outputs_reach_the_callable(server, protocol, requested, seen):
    result = _infer_asking(
        server, protocol, "names_requested_outputs", {"x": np.ones((1, 2), np.float32)}, requested
    )
    assert result.as_numpy("asked").tolist() == [[seen.encode()]]


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


def _infer_asking(server, protocol: str, model: str, inputs: dict[str, np.ndarray], asked: list[str]):
    """One request through tritonclient that names the outputs `asked` (all when empty)."""
    module = httpclient if protocol == "http" else grpcclient
    client = module.InferenceServerClient(server[protocol])
    try:
        return client.infer(model, _inputs(module, inputs), outputs=_asked(module, asked))
    finally:
        client.close()


def _inputs(module, inputs: dict[str, np.ndarray]) -> list:
    tensors = []
    for name, array in inputs.items():
        tensor = module.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        tensor.set_data_from_numpy(array)
        tensors.append(tensor)
    return tensors


def _asked(module, asked: list[str]) -> list | None:
    return [module.InferRequestedOutput(name) for name in asked] or None


def _output_names(result) -> list[str]:
    response = result.get_response()
    if isinstance(response, dict):
        return [output["name"] for output in response["outputs"]]
    return [output.name for output in response.outputs]


A = np.array([[1.0, 2.0]], np.float32)


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize(
    "asked", [[], ["a_out"], ["a_out", "b_out"]], ids=["none-named", "a_out", "every-one"]
)
def test_outputs_the_callable_does_not_return_are_absent(server, protocol, asked):
    result = _infer_asking(server, protocol, "answers_what_it_has", {"a": A}, asked)
    assert _output_names(result) == ["a_out"]
    assert result.as_numpy("a_out").tolist() == [[2.0, 4.0]]
    both = _infer_asking(server, protocol, "answers_what_it_has", {"a": A, "b": A}, asked)
    assert sorted(_output_names(both)) == sorted(asked or ["a_out", "b_out"])


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_an_output_the_client_named_and_did_not_get_is_an_error(server, protocol):
    with pytest.raises(
        InferenceServerException, match=r"did not return \['b_out'\], which the request asked for"
    ):
        _infer_asking(server, protocol, "answers_what_it_has", {"a": A}, ["b_out"])
    assert _output_names(_infer_asking(server, protocol, "answers_what_it_has", {"a": A}, [])) == ["a_out"]


def test_the_pytriton_client_gets_the_outputs_returned(server):
    with ModelClient(f"http://{server['http']}", "answers_what_it_has", init_timeout_s=30) as client:
        result = client.infer_sample(a=np.array([1.5], np.float32))
    assert list(result) == ["a_out"] and result["a_out"].tolist() == [3.0]
    with DecoupledModelClient(f"grpc://{server['grpc']}", "streams_what_it_has", init_timeout_s=30) as client:
        (streamed,) = client.infer_sample(a=np.array([1.5], np.float32))
    assert list(streamed) == ["a_out"] and streamed["a_out"].tolist() == [3.0]


def test_only_the_request_that_named_a_missing_output_fails_in_its_batch(server):
    """Two requests without `b` batched together: the one that named `b_out` fails, the one that named no
    output gets `a_out`."""
    ANSWERED_BATCHES.clear()
    client = httpclient.InferenceServerClient(server["http"], concurrency=2)
    try:
        failing = client.async_infer(
            "answers_pairs_of_requests", _inputs(httpclient, {"a": A}), outputs=_asked(httpclient, ["b_out"])
        )
        served = client.async_infer("answers_pairs_of_requests", _inputs(httpclient, {"a": A}))
        result = served.get_result()
        with pytest.raises(InferenceServerException, match=r"did not return \['b_out'\]"):
            failing.get_result()
    finally:
        client.close()
    assert ANSWERED_BATCHES == [2], "the two requests reached the callable as one batch"
    assert _output_names(result) == ["a_out"] and result.as_numpy("a_out").tolist() == [[2.0, 4.0]]


def _infer_pair(server, model: str, first: np.ndarray, second: np.ndarray) -> list:
    """Two requests of 1 and 2 rows, sent together to a model that waits for batches of 3 rows: each one's
    result or error."""
    ANSWERED_BATCHES.clear()
    client = httpclient.InferenceServerClient(server["http"], concurrency=2)
    try:
        pending = [client.async_infer(model, _inputs(httpclient, {"x": x})) for x in (first, second)]
        results = []
        for request in pending:
            try:
                results.append(request.get_result())
            except InferenceServerException as error:
                results.append(error)
    finally:
        client.close()
    assert ANSWERED_BATCHES in ([], [3]), "the two requests reached the callable as one batch of 3 rows"
    return results


@pytest.mark.parametrize("width", [4, INLINE_LIMIT // 4], ids=["inline", "arena"])
def test_batch_outputs_cross_once_for_the_whole_batch(server, width):
    """A batch of requests of 1 and 2 rows, whose inputs cross in one column and whose outputs cross as one
    array each, inline or through the arena: every request gets its own rows."""
    first = np.arange(width, dtype=np.float32).reshape(1, width)
    second = -np.arange(2 * width, dtype=np.float32).reshape(2, width)
    one, two = _infer_pair(server, "doubles_pairs", first, second)
    assert ANSWERED_BATCHES == [3]
    assert np.array_equal(one.as_numpy("y"), first * 2) and one.as_numpy("row").tolist() == [[0]]
    assert np.array_equal(two.as_numpy("y"), second * 2) and two.as_numpy("row").tolist() == [[1], [2]]


def test_batch_outputs_a_decorator_rewrote_reach_the_client_as_rewritten(server):
    first, second = np.ones((1, 4), np.float32), np.ones((2, 4), np.float32)
    one, two = _infer_pair(server, "rewrites_pairs", first, second)
    assert one.as_numpy("y").tolist() == [[2.0] * 4] and two.as_numpy("y").tolist() == [[-1.0] * 4] * 2
    assert two.as_numpy("row").tolist() == [[1], [2]]


def test_batch_outputs_that_do_not_fit_fail_each_request_with_its_own_shape(server):
    one, two = _infer_pair(
        server, "a_rank_too_many", np.ones((1, 4), np.float32), np.ones((2, 4), np.float32)
    )
    assert isinstance(one, InferenceServerException) and isinstance(two, InferenceServerException)
    assert "output 'y' has shape (1, 1, 4), declared [batch] + [-1] for a request of batch size 1" in str(one)


def test_a_wrong_response_fails_its_request_alone(server):
    first, second = np.ones((1, 4), np.float32), np.ones((2, 4), np.float32)
    one, two = _infer_pair(server, "spoils_the_last", first, second)
    assert ANSWERED_BATCHES == [3], "one batch"
    assert not isinstance(one, Exception) and np.array_equal(one.as_numpy("y"), first * 2)
    assert isinstance(two, InferenceServerException)
    assert "output 'y' has shape (2, 1, 4), declared [batch] + [-1] for a request of batch size 2" in str(two)


def test_a_stream_fails_for_the_request_that_named_a_missing_output(server):
    """gRPC streaming: the request that named `b_out` gets an error, the one that did not its outputs."""
    received: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server["grpc"])
    try:
        client.start_stream(callback=lambda result, error: received.put((result, error)))
        for request_id, asked in (("named", ["b_out"]), ("unnamed", [])):
            client.async_stream_infer(
                "streams_what_it_has",
                _inputs(grpcclient, {"a": A}),
                outputs=_asked(grpcclient, asked),
                request_id=request_id,
            )
        answers = [received.get(timeout=60) for _ in range(2)]
    finally:
        client.stop_stream()
        client.close()
    errors = [error for _, error in answers if error is not None]
    results = [result for result, error in answers if error is None]
    assert len(errors) == 1 and "did not return ['b_out'], which the request asked for" in str(errors[0])
    assert len(results) == 1 and _output_names(results[0]) == ["a_out"]


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
    with pytest.raises(
        InferenceServerException, match=r"cannot be sent: .* the shared-memory arena of .*ARENA_BYTES"
    ):
        infer(server, "http", "double", {"x": too_big})
    fits = np.ones((1, ARENA_BYTES // 16), np.float32)
    for _ in range(4):  # would exhaust the arena if the failed request had leaked its blocks
        assert np.array_equal(infer(server, "http", "double", {"x": fits})["y"], fits * 2)


def test_a_batch_larger_than_the_arena_is_sent_in_parts_that_fit(server):
    """Four requests of 0.3 of the request arena each, which Triton batches: the whole batch does not fit,
    each half does; every request gets its own answer."""
    width = int(ARENA_BYTES * 0.3) // 4
    arrays = [np.full((1, width), value, np.float32) for value in (1, 2, 3, 4)]
    ANSWERED_BATCHES.clear()
    client = httpclient.InferenceServerClient(server["http"], concurrency=4)
    try:
        pending = [client.async_infer("sums_fours", _inputs(httpclient, {"x": x})) for x in arrays]
        sums = [request.get_result().as_numpy("y").tolist() for request in pending]
    finally:
        client.close()
    assert sums == [[[float(value * width)]] for value in (1, 2, 3, 4)]
    assert ANSWERED_BATCHES == [2, 2], "one batch of four, sent as two halves"


def test_inputs_kept_by_the_callable_stay_intact(server):
    RETAINED.clear()
    first = np.arange(50_000, dtype=np.float32)[None]
    infer(server, "http", "retains_input", {"x": first})
    for seed in range(5):
        other = np.full((1, 50_000), seed, np.float32)
        assert np.array_equal(infer(server, "http", "retains_input", {"x": other})["y"], other)
    assert np.array_equal(RETAINED[0], first)
    assert not RETAINED[0].flags.writeable


def test_what_killed_servers_left_is_removed_and_nothing_else(tmp_path):
    region = "0d19aa2b-47b9-4bdd-a5e2-1e28e88a419b"
    abandoned = tmp_path / "kubetriton-1-0a1b2c3d"
    os.close(claim(abandoned))  # its owner is gone: the lock is free
    (abandoned / "arenas").mkdir()
    (tmp_path / f"{abandoned.name}{region}").write_bytes(b"x")
    live = tmp_path / "kubetriton-2-0a1b2c3d"
    live_lock = claim(live)
    (tmp_path / f"{live.name}{region}").write_bytes(b"x")
    (tmp_path / f"{abandoned.name}-not-a-region").write_bytes(b"x")
    (tmp_path / "kubetriton-without-a-lock").mkdir()
    try:
        with pytest.raises(PyTritonRuntimeError, match="belongs to a running server"):
            claim(live)
        remove_abandoned(tmp_path)
        assert sorted(path.name for path in tmp_path.iterdir()) == sorted(
            [live.name, f"{live.name}{region}", f"{abandoned.name}-not-a-region", "kubetriton-without-a-lock"]
        )
    finally:
        os.close(live_lock)


KILLED_SERVER = """
import sys

import numpy as np
from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig

http, grpc, metrics = map(int, sys.argv[1:])
triton = Triton(config=TritonConfig(http_port=http, grpc_port=grpc, metrics_port=metrics))
tensors = [Tensor(name="x", shape=(1,), dtype=np.float32)], [Tensor(name="y", shape=(1,), dtype=np.float32)]
triton.bind("m", lambda requests: requests, *tensors, config=ModelConfig(max_batch_size=2))
triton.run()
print("serving", flush=True)
sys.stdin.read()
"""


def wait_until_unheld(lock: Path, timeout_s: float = 60) -> None:
    """Until no process holds the owner lock (a killed server's tritonserver follows it, PR_SET_PDEATHSIG,
    as soon as the machine lets it)."""
    deadline = time.monotonic() + timeout_s
    fd = os.open(lock, os.O_RDWR)
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                fcntl.flock(fd, fcntl.LOCK_UN)
                return
            except BlockingIOError:
                assert time.monotonic() < deadline, f"{lock} is still held"
                time.sleep(0.1)
    finally:
        os.close(fd)


def test_a_killed_local_server_leaves_nothing_after_the_next_start(tmp_path, monkeypatch):
    # Its own temporary folder, and only its server's regions: other processes on the machine start and
    # stop servers of their own meanwhile.
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temporary))
    script = tmp_path / "serve.py"
    script.write_text(KILLED_SERVER)
    shm_before = shm_entries()
    process = subprocess.Popen(
        [sys.executable, str(script), *map(str, free_ports(3))],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "TMPDIR": str(temporary)},
    )
    assert process.stdout.readline().strip() == "serving"
    (workspace,) = (lock.parent for lock in temporary.glob(f"kubetriton-*/{OWNER_LOCK}"))
    left_in_shm = {
        name for name in shm_entries() - shm_before if name.startswith(f"kubetriton-{process.pid}-")
    }
    assert left_in_shm
    process.kill()
    process.wait()
    wait_until_unheld(workspace / OWNER_LOCK)
    assert workspace.is_dir() and left_in_shm <= shm_entries()  # SIGKILL: nothing was cleaned up
    Triton().stop()  # the next server on the machine sweeps what nobody holds any more
    assert not workspace.exists()
    assert not shm_entries() & left_in_shm


def test_a_port_in_use_is_refused_before_tritonserver_starts():
    http, grpc, metrics = free_ports(3)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", grpc))
        taken.listen()
        triton = Triton(config=TritonConfig(http_port=http, grpc_port=grpc, metrics_port=metrics))
        with pytest.raises(PyTritonRuntimeError, match=rf"gRPC port {grpc} is in use"):
            triton.run()
        triton.stop()
