"""The queue time of closed-loop clients on one instance, for several dynamic batchers: the floor that a
queue-time target meets, whatever the number of pods.

One local Triton (`Triton()` in local mode) serves the same callable, which takes 20 ms per batch, in one
instance, as several models that differ only in their dynamic batcher: the largest batch and how long
Triton may hold a request to fill one. Each model in turn gets three demands of closed-loop gRPC clients,
each client in its own process, sending requests back to back for a fixed time: one client; two that
send their first requests at the same moment (in step); and two whose first requests are half a batch
apart (out of step). The queue time per request is Triton's own count (`nv_inference_queue_duration_us`
over `nv_inference_request_success`, read from its metrics before and after), the figure the operator's
autoscaler reads from each pod.

What it shows: two clients out of step take turns on the instance (each request arrives while the
other's batch runs), unless the batcher holds a request until the other client's next one comes; Triton
counts that hold from the moment the held request arrived, so a hold shorter than a batch does not bring
them together, and a longer one is what a lone client waits, unless the batch is full at two.

Usage: python bench/queue_floor.py [--seconds 8]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient
from kubetriton.operator import signals
from pytriton.decorators import batch
from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.multi_process import free_ports

BATCH_SECONDS = 0.02
BATCHERS = (
    ("no hold, 4 a batch", 4, 0),
    ("3 ms hold, 4 a batch", 4, 3_000),
    ("10 ms hold, 4 a batch", 4, 10_000),
    ("25 ms hold, 4 a batch", 4, 25_000),
    ("25 ms hold, 2 a batch", 2, 25_000),
    ("3 ms hold, 16 a batch", 16, 3_000),
)
"""Name, max_batch_size, max_queue_delay_microseconds."""
DEMANDS = (("1 client", (0.0,)), ("2 in step", (0.0, 0.0)), ("2 out of step", (0.0, BATCH_SECONDS / 2)))
"""Name, and when each client sends its first request, in seconds after the first."""


@batch
def slow(x: np.ndarray) -> dict[str, np.ndarray]:
    time.sleep(BATCH_SECONDS)
    return {"y": x}


def model_name(index: int) -> str:
    return f"batcher{index}"


def client(url: str, model: str, start_at: float, stop_at: float, results: multiprocessing.Queue) -> None:
    """One closed-loop client: requests back to back from `start_at` to `stop_at`; their latencies."""
    connection = grpcclient.InferenceServerClient(url)
    connection.is_server_live()  # connected before the start
    tensor = grpcclient.InferInput("x", [1, 1], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 1), np.float32))
    latencies = []
    try:
        time.sleep(max(0.0, start_at - time.time()))
        while time.time() < stop_at:
            sent = time.perf_counter()
            connection.infer(model, [tensor])
            latencies.append(time.perf_counter() - sent)
    finally:
        connection.close()
    results.put(latencies)


def queue_counts(metrics_url: str, model: str) -> tuple[float, float]:
    """(microseconds waited in the queue, requests served) so far by `model`."""
    with urllib.request.urlopen(metrics_url, timeout=10) as response:
        page = response.read().decode()
    found = signals.parse(page, signals.QUEUE_TIME_METRICS)
    return found[signals.QUEUE_DURATION].get(model, 0.0), found[signals.REQUESTS].get(model, 0.0)


def measure(
    grpc_url: str, metrics_url: str, model: str, offsets: tuple[float, ...], seconds: float
) -> tuple[float, float]:
    """(queue ms per request, client latency p50 ms) of closed-loop clients starting at `offsets`."""
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    before = queue_counts(metrics_url, model)
    start_at = time.time() + 3  # the clients' processes start meanwhile
    processes = [
        context.Process(target=client, args=(grpc_url, model, start_at + offset, start_at + seconds, results))
        for offset in offsets
    ]
    for process in processes:
        process.start()
    latencies = [latency for _ in processes for latency in results.get(timeout=seconds + 120)]
    for process in processes:
        process.join()
    (waited_before, served_before), (waited, served) = before, queue_counts(metrics_url, model)
    return (waited - waited_before) / (served - served_before) / 1000, statistics.median(latencies) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8.0)
    args = parser.parse_args()
    http, grpc, metrics = free_ports(3)
    config = TritonConfig(http_port=http, grpc_port=grpc, metrics_port=metrics)
    print(
        f"{os.cpu_count()} CPUs; one instance, {BATCH_SECONDS * 1000:g} ms per batch; closed-loop gRPC "
        f"clients, {args.seconds:g} s each; queue time per request (Triton's count), client latency p50"
    )
    with Triton(config=config) as triton:
        for index, (_, max_batch_size, delay_us) in enumerate(BATCHERS):
            triton.bind(
                model_name(index),
                slow,
                [Tensor(name="x", dtype=np.float32, shape=(1,))],
                [Tensor(name="y", dtype=np.float32, shape=(1,))],
                config=ModelConfig(
                    max_batch_size=max_batch_size,
                    batcher=DynamicBatcher(max_queue_delay_microseconds=delay_us),
                ),
            )
        triton.run()
        print(f"{'batcher':<22}" + "".join(f"  {name + ': queue / latency':>29}" for name, _ in DEMANDS))
        grpc_url, metrics_url = f"localhost:{grpc}", f"http://localhost:{metrics}/metrics"
        for index, (name, _, _) in enumerate(BATCHERS):
            model, cells = model_name(index), []
            for _, offsets in DEMANDS:
                queue_ms, latency_ms = measure(grpc_url, metrics_url, model, offsets, args.seconds)
                cells.append(f"{queue_ms:.1f} ms / {latency_ms:.1f} ms")
            print(f"{name:<22}" + "".join(f"  {cell:>29}" for cell in cells), flush=True)


if __name__ == "__main__":
    main()
