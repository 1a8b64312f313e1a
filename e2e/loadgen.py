"""Inputs for any model from its own configuration, and clients that query without pause, counting failures.

The e2e tests import `sample_inputs` to query each example model through a port-forward. The same
source runs inside the cluster (`python -c`, in the worker image) as the load while pods stop: its
requests go through the model's Service, as real clients' do. Four kinds of clients run side by side, each
in its own thread: ModelClient over HTTP and over gRPC, a plain tritonclient HTTP client that keeps its
keep-alive connection, and a DecoupledModelClient stream. Every second it prints one JSON line with each
client's answers and failures so far. Only numpy, tritonclient and pytriton's client are used, all in the
worker image.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import tritonclient.http
from pytriton.client import DecoupledModelClient, ModelClient
from tritonclient.utils import np_to_triton_dtype

SEQUENCE = b"MKTAYIAKQRQISFVKSHFSRQ"
"""Bytes inputs get a short protein sequence (the ESM example reads sequences)."""
KEPT_FAILURES = 20


def sample_inputs(model_config: Any, batch: int = 1) -> dict[str, np.ndarray]:
    """One small valid batch for every input the model declares (variable dimensions become 4)."""
    inputs = {}
    for spec in model_config.inputs:
        shape = [4 if dim == -1 else dim for dim in spec.shape]
        if model_config.batching:
            shape = [batch, *shape]
        if spec.dtype.kind in "OS":
            inputs[spec.name] = np.full(shape, SEQUENCE, dtype=np.object_)
        else:
            inputs[spec.name] = np.ones(shape, dtype=spec.dtype)
    return inputs


def infer(client: ModelClient, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """One request: a batch when the model batches, otherwise one sample."""
    if client.model_config.batching:
        return client.infer_batch(**inputs)
    return client.infer_sample(**inputs)


class Counter:
    """One client's answers and failures, updated by its thread and read by the reporter."""

    def __init__(self) -> None:
        self.ok = 0
        self.failures: list[str] = []

    def summary(self) -> dict[str, Any]:
        return {"ok": self.ok, "failed": len(self.failures), "failures": self.failures[:KEPT_FAILURES]}


def _loop(call: Callable[[], None], counter: Counter, deadline: float) -> None:
    while time.monotonic() < deadline:
        try:
            call()
            counter.ok += 1
        except Exception as error:  # every failure counts, whatever its type
            counter.failures.append(f"{time.time():.3f} {type(error).__name__}: {error}")


def clients(http_url: str, grpc_url: str, model: str, stream_model: str) -> dict[str, Callable[[], None]]:
    """The four kinds of clients, each as a function that sends one request and checks its answer."""
    timeout = 600.0
    http = ModelClient(http_url, model, init_timeout_s=timeout, inference_timeout_s=30)
    grpc = ModelClient(grpc_url, model, init_timeout_s=timeout, inference_timeout_s=30)
    stream = DecoupledModelClient(grpc_url, stream_model, init_timeout_s=timeout, inference_timeout_s=30)
    inputs = sample_inputs(http.model_config)
    plain = tritonclient.http.InferenceServerClient(http_url.removeprefix("http://"), network_timeout=30)
    tensors = []
    for name, array in inputs.items():
        tensor = tritonclient.http.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        tensor.set_data_from_numpy(array)
        tensors.append(tensor)

    def streamed() -> None:
        answers = list(stream.infer_sample(np.ones(1, np.float32)))
        if len(answers) != 3:
            raise AssertionError(f"the stream gave {len(answers)} answers, not 3")

    return {
        "ModelClient http": lambda: infer(http, inputs),
        "ModelClient grpc": lambda: infer(grpc, inputs),
        "tritonclient http keep-alive": lambda: plain.infer(model, tensors),
        "DecoupledModelClient stream": streamed,
    }


def run(http_url: str, grpc_url: str, model: str, stream_model: str, seconds: float) -> None:
    calls = clients(http_url, grpc_url, model, stream_model)
    counters = {name: Counter() for name in calls}
    deadline = time.monotonic() + seconds
    threads = [
        threading.Thread(target=_loop, args=(call, counters[name], deadline), daemon=True)
        for name, call in calls.items()
    ]
    for thread in threads:
        thread.start()
    print(json.dumps({"started": time.time()}), flush=True)
    while any(thread.is_alive() for thread in threads):
        time.sleep(1)
        summary = {name: counter.summary() for name, counter in counters.items()}
        print(json.dumps({"at": time.time(), "clients": summary}), flush=True)


if __name__ == "__main__":
    run(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], float(sys.argv[5]))
