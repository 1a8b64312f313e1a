"""Model warm-up: `ModelConfig(model_warmup=[ModelWarmup(...)])` becomes Triton's `model_warmup`, and Triton
sends the warm-up requests through the proxy to the callable while it loads the model, before the model
reports ready over HTTP or gRPC.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from pytriton.exceptions import PyTritonBadParameterError, PyTritonModelConfigError
from pytriton.model_config import ModelConfig, Tensor
from pytriton.model_config.common import ModelWarmup, WarmupInput
from pytriton.triton import Triton, TritonConfig

from tests.conftest import free_ports

TOKENS = [Tensor(name="tokens", shape=(-1,), dtype=np.int32), Tensor(name="text", shape=(2,), dtype=bytes)]
SCORE = [Tensor(name="score", shape=(1,), dtype=np.float32)]


class Recorder:
    """A callable that records what it was called with, and when it returned."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.calls: list[tuple[float, list[dict[str, np.ndarray]]]] = []
        self.delay_s = delay_s

    def __call__(self, requests: list[Any]) -> list[dict[str, np.ndarray]]:
        time.sleep(self.delay_s)
        self.calls.append((time.monotonic(), [dict(request.items()) for request in requests]))
        return [{"score": np.ones((len(request["tokens"]), 1), np.float32)} for request in requests]


@pytest.fixture(scope="module")
def server() -> Iterator[dict[str, Any]]:
    http, grpc, metrics = free_ports(3)
    with Triton(config=TritonConfig(http_port=http, grpc_port=grpc, metrics_port=metrics)) as triton:
        yield {"triton": triton, "http": f"127.0.0.1:{http}", "grpc": f"127.0.0.1:{grpc}"}


def test_warmup_requests_reach_the_callable_before_the_model_is_ready(server):
    first_ready: dict[str, float] = {}
    binding = threading.Event()

    def watch(protocol: str) -> None:
        module = httpclient if protocol == "http" else grpcclient
        client = module.InferenceServerClient(server[protocol])
        while binding.is_set() or protocol not in first_ready:
            try:
                if client.is_model_ready("warmed"):
                    first_ready.setdefault(protocol, time.monotonic())
            except Exception:  # not known to Triton yet
                pass
            time.sleep(0.01)
        client.close()

    instances = [Recorder(delay_s=0.3), Recorder(delay_s=0.3)]
    warmup = ModelWarmup(
        name="long-prompts",
        batch_size=2,
        inputs={
            "tokens": WarmupInput(dtype=np.int32, shape=(16,), random_data=True),
            "text": WarmupInput(dtype=np.bytes_, shape=(2,), zero_data=True),
        },
        count=2,
    )
    watchers = [threading.Thread(target=watch, args=(protocol,)) for protocol in ("http", "grpc")]
    binding.set()
    for watcher in watchers:
        watcher.start()
    server["triton"].bind(
        "warmed", instances, TOKENS, SCORE, config=ModelConfig(max_batch_size=4, model_warmup=[warmup])
    )
    binding.clear()
    for watcher in watchers:
        watcher.join(10)
    warmup_calls = [call for instance in instances for call in instance.calls]
    assert len(warmup_calls) == 4, "Triton warms every instance, count times each"
    for _, requests in warmup_calls:
        assert len(requests) == 2, "batch_size requests per warm-up execution"
        for request in requests:
            assert request["tokens"].shape == (1, 16) and request["tokens"].dtype == np.int32
            assert request["text"].tolist() == [[b"", b""]], "zero_data of bytes: empty strings"
    last_warmup_end = max(ended for ended, _ in warmup_calls)
    assert set(first_ready) == {"http", "grpc"}
    assert all(ready > last_warmup_end for ready in first_ready.values()), (first_ready, last_warmup_end)

    for protocol, module in (("http", httpclient), ("grpc", grpcclient)):
        client = module.InferenceServerClient(server[protocol])
        config = client.get_model_config("warmed")
        served = config.get("model_warmup") if protocol == "http" else list(config.config.model_warmup)
        assert not served, "the worker runs the warm-up; Triton's model_warmup stays empty"
        tokens = module.InferInput("tokens", [1, 3], "INT32")
        tokens.set_data_from_numpy(np.array([[1, 2, 3]], np.int32))
        text = module.InferInput("text", [1, 2], "BYTES")
        text.set_data_from_numpy(np.array([[b"a", b"b"]], dtype=object))
        assert client.infer("warmed", [tokens, text]).as_numpy("score").tolist() == [[1.0]]
        client.close()


def test_warmup_data_from_files_reaches_the_callable(server, tmp_path: Path):
    np.save(tmp_path / "tokens.npy", np.arange(4, dtype=np.int64))
    np.save(tmp_path / "text.npy", np.array([b"hello", b"wor\x00ld"]))
    recorder = Recorder()
    warmup = ModelWarmup(
        name="from-files",
        batch_size=1,
        inputs={
            "tokens": WarmupInput(np.int32, (4,), input_data_file=str(tmp_path / "tokens.npy")),
            "text": WarmupInput(bytes, (2,), input_data_file=str(tmp_path / "text.npy")),
        },
        count=1,
    )
    server["triton"].bind("from_files", recorder, TOKENS, SCORE, config=ModelConfig(model_warmup=[warmup]))
    ((_, (request,)),) = recorder.calls
    assert request["tokens"].tolist() == [[0, 1, 2, 3]] and request["tokens"].dtype == np.int32
    assert request["text"].tolist() == [[b"hello", b"wor\x00ld"]]


def test_invalid_warmups_are_refused(server, tmp_path: Path):
    with pytest.raises(
        PyTritonBadParameterError, match="zero_data=True, random_data=True or input_data_file"
    ):
        WarmupInput(np.float32, (1,))
    with pytest.raises(PyTritonBadParameterError, match="at least one dimension"):
        WarmupInput(np.float32, (), zero_data=True)
    with pytest.raises(PyTritonBadParameterError, match=r"shape \(2, -1\): a sample has a fixed shape"):
        WarmupInput(np.float32, (2, -1), zero_data=True)
    zeros = WarmupInput(np.int32, (4,), zero_data=True)
    text = WarmupInput(bytes, (2,), zero_data=True)
    np.save(tmp_path / "other.npy", np.zeros((3, 5), np.int32))
    other = WarmupInput(np.int32, (4,), input_data_file=str(tmp_path / "other.npy"))
    warmup = ModelWarmup("x", 1, {"tokens": other, "text": text}, 1)
    with pytest.raises(
        PyTritonBadParameterError,
        match=r"holds shape \(3, 5\); it must hold one sample of shape \(4,\), or a",
    ):
        server["triton"].bind(
            "bad_file", Recorder(), TOKENS, SCORE, config=ModelConfig(model_warmup=[warmup])
        )
    np.save(tmp_path / "numbers.npy", np.arange(2))
    numbers = WarmupInput(bytes, (2,), input_data_file=str(tmp_path / "numbers.npy"))
    warmup = ModelWarmup("x", 1, {"tokens": zeros, "text": numbers}, 1)
    with pytest.raises(PyTritonBadParameterError, match="holds int64 values; a bytes input needs strings"):
        server["triton"].bind(
            "bad_file", Recorder(), TOKENS, SCORE, config=ModelConfig(model_warmup=[warmup])
        )
    refused = {
        "gives inputs the model lacks: nope": {"tokens": zeros, "text": text, "nope": zeros},
        r"gives input 'text' as int32 of shape \(2,\); the model declares bytes of shape \(2,\)": {
            "tokens": zeros,
            "text": WarmupInput(np.int32, (2,), zero_data=True),
        },
        r"gives input 'text' as bytes of shape \(3,\)": {
            "tokens": zeros,
            "text": WarmupInput(bytes, (3,), zero_data=True),
        },
    }
    recorder = Recorder()
    for message, inputs in refused.items():
        with pytest.raises(PyTritonModelConfigError, match=message):
            server["triton"].bind(
                "mismatched",
                recorder,
                TOKENS,
                SCORE,
                config=ModelConfig(model_warmup=[ModelWarmup("m", 1, inputs, 1)]),
            )
    assert not recorder.calls


def test_a_failing_warmup_fails_the_load(server):
    def broken(requests):
        raise RuntimeError("weights are missing")

    warmup = ModelWarmup(
        "w",
        1,
        {
            "tokens": WarmupInput(np.int32, (2,), zero_data=True),
            "text": WarmupInput(bytes, (2,), zero_data=True),
        },
        1,
    )
    for _ in range(10):  # a failure Triton answered itself crashed it in about one load in ten
        with pytest.raises(
            PyTritonModelConfigError, match="instance 0 failed its warm-up: RuntimeError: weights are missing"
        ):
            server["triton"].bind("cold", broken, TOKENS, SCORE, config=ModelConfig(model_warmup=[warmup]))
    client = httpclient.InferenceServerClient(server["http"])
    assert not client.is_model_ready("cold")
    recorder = Recorder()
    server["triton"].bind("cold", recorder, TOKENS, SCORE, config=ModelConfig(model_warmup=[warmup]))
    assert len(recorder.calls) == 1, "the name is free again, and the next bind warms up"
    assert client.is_model_ready("cold")
    client.close()


def test_a_streaming_model_streams_its_warmup_to_the_end(server):
    streamed: list[int] = []

    def stream(requests):
        for step in range(3):
            streamed.append(step)
            yield [{"score": np.full((1, 1), step, np.float32)} for _ in requests]

    warmup = ModelWarmup(
        "s",
        2,
        {
            "tokens": WarmupInput(np.int32, (3,), random_data=True),
            "text": WarmupInput(bytes, (2,), random_data=True),
        },
        1,
    )
    server["triton"].bind(
        "streaming", stream, TOKENS, SCORE, config=ModelConfig(decoupled=True, model_warmup=[warmup])
    )
    assert streamed == [0, 1, 2]
